"""Failure semantics where torch's agent misbehaves (the reference: torch/distributed/elastic)."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from tests.conftest import SCRIPTS, run_elastic


def test_torch_record_error_file_is_the_root_cause():
    out = run_elastic("--standalone", "--nproc-per-node=2", str(SCRIPTS / "torch_record_crash.py"))
    assert out.returncode == 1
    root = out.stderr.split("Root Cause (first observed failure):")[1]
    assert "rank      : 1 (local_rank: 1)" in root
    assert "ValueError: torch-recorded boom" in root and "Traceback" in root


def test_truncated_error_file_is_a_failure_and_restarts_still_happen():
    out = run_elastic("--standalone", "--max-restarts=2", str(SCRIPTS / "truncated_error_file.py"))
    assert out.returncode == 1
    assert re.findall(r"ATTEMPT (\d)", out.stdout) == ["0", "1", "2"]
    assert "is malformed" in out.stderr and "exit code 1" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.fixture(scope="module")
def dstate_binary(tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the D-state helper")
    binary = tmp_path_factory.mktemp("dstate") / "dstate"
    subprocess.run([cc, "-O0", "-o", str(binary), str(SCRIPTS / "dstate.c")], check=True)
    return binary


def test_worker_in_d_state_fails_the_run(dstate_binary):
    """torch reports UNHEALTHY, skips restarts and exits 0; we fail with exit code 1."""
    out = run_elastic("--standalone", "--no-python", "--max-restarts=1", "--monitor-interval=0.1",
                      "--shutdown-timeout=1", str(dstate_binary),
                      env={"TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT": "0.5"}, timeout=60)
    assert out.returncode == 1, out.stderr
    assert out.stdout.count("DSTATE") == 2  # restarted once, then failed
    assert "stuck in uninterruptible state (D)" in out.stderr


@pytest.mark.parametrize("method", [pytest.param("spawn", marks=pytest.mark.slow), "zygote"])
def test_restarts_succeed_every_time(method):
    """torch's shared store: 8 of 31 restarts succeed (pytorch#135712). Ours: all. Twice
    each (a regression to torch's rate, 8 in 31, fails it 14 times in 15; the slow soak runs 200).
    The store is the start method's to share, not to lose: the default run takes the default
    method (zygote), the slow run spawn too (7-13 s here, the suite's fifth costliest)."""
    for _ in range(2):
        out = run_elastic("--standalone", f"--start-method={method}", "--nproc-per-node=2", "--max-restarts=1",
                          str(SCRIPTS / "crash_once.py"))
        assert out.returncode == 0, out.stderr
        assert sorted(re.findall(r"SUM rank=(\d) attempt=1 value=2", out.stdout)) == ["0", "1"]


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_restart_soak_200():
    failures = []
    for i in range(200):
        out = run_elastic("--standalone", "--start-method=zygote", "--nproc-per-node=2", "--max-restarts=1",
                          str(SCRIPTS / "crash_once.py"))
        if out.returncode != 0 or len(re.findall(r"SUM rank=\d attempt=1 value=2", out.stdout)) != 2:
            failures.append((i, out.returncode, out.stderr[-500:]))
    assert not failures, failures[:3]

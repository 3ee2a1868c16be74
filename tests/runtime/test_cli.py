"""elastic-run end to end with real worker processes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest

from tests.conftest import SCRIPTS, run_elastic, survivors


def env_lines(stdout: str) -> list[dict]:
    return [json.loads(line[4:]) for line in stdout.splitlines() if line.startswith("ENV ")]


@pytest.mark.parametrize("nproc", [1, 2, 3])
def test_worker_environment(nproc):
    out = run_elastic("--standalone", f"--nproc-per-node={nproc}", str(SCRIPTS / "env_dump.py"), "x", "--y=1")
    assert out.returncode == 0, out.stderr
    rows = sorted(env_lines(out.stdout), key=lambda r: int(r["env"]["RANK"]))
    assert [r["env"]["RANK"] for r in rows] == [str(i) for i in range(nproc)]
    for i, row in enumerate(rows):
        env = row["env"]
        assert row["argv"] == ["x", "--y=1"]
        assert env["LOCAL_RANK"] == env["ROLE_RANK"] == str(i)
        assert env["WORLD_SIZE"] == env["ROLE_WORLD_SIZE"] == env["LOCAL_WORLD_SIZE"] == str(nproc)
        assert env["GROUP_RANK"] == "0" and env["GROUP_WORLD_SIZE"] == "1"
        assert env["TORCHELASTIC_RESTART_COUNT"] == "0" and env["TORCHELASTIC_MAX_RESTARTS"] == "0"
        assert env["TORCHELASTIC_USE_AGENT_STORE"] == "True"  # the agent hosts it, as torch
        assert env["ROLE_NAME"] == "default"
        assert env["TORCHELASTIC_ERROR_FILE"].endswith(f"attempt_0/{i}/error.json")
        assert env["OMP_NUM_THREADS"] == ("1" if nproc > 1 else None) or "OMP_NUM_THREADS" in os.environ
    assert len({r["env"]["MASTER_PORT"] for r in rows}) == 1
    assert len({r["env"]["TORCHELASTIC_RUN_ID"] for r in rows}) == 1


def test_gloo_all_reduce():
    out = run_elastic("--standalone", "--nproc-per-node=3", str(SCRIPTS / "allreduce.py"))
    assert out.returncode == 0, out.stderr
    sums = re.findall(r"SUM rank=(\d) world=3 value=(\d+)", out.stdout)
    assert sorted(sums) == [("0", "6"), ("1", "6"), ("2", "6")]


def test_crash_once_restarts_with_a_fresh_store():
    out = run_elastic("--standalone", "--nproc-per-node=2", "--max-restarts=2", str(SCRIPTS / "crash_once.py"))
    assert out.returncode == 0, out.stderr
    assert sorted(re.findall(r"START rank=(\d) attempt=(\d)", out.stdout)) == [
        ("0", "0"), ("0", "1"), ("1", "0"), ("1", "1")]
    assert sorted(re.findall(r"SUM rank=(\d) attempt=1 value=2", out.stdout)) == ["0", "1"]


def test_always_failing_exhausts_restarts_and_reports_root_cause():
    out = run_elastic("--standalone", "--nproc-per-node=2", "--max-restarts=2", "--shutdown-timeout=5",
                      str(SCRIPTS / "always_fail.py"))
    assert out.returncode == 1
    attempts = re.findall(r"ATTEMPT rank=0 attempt=(\d)", out.stdout)
    assert sorted(attempts) == ["0", "1", "2"]
    assert "always_fail.py FAILED" in out.stderr
    root = out.stderr.split("Root Cause (first observed failure):")[1]
    assert "rank      : 0 (local_rank: 0)" in root
    assert "RuntimeError: always broken" in root
    assert "<NO_OTHER_FAILURES>" in out.stderr  # the stopped peer is not a failure


def test_module_and_no_python(tmp_path):
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "job.py").write_text("import os, sys\n"
                                "os.write(1, f'MOD {os.environ[\"RANK\"]} {sys.argv[1:]}\\n'.encode())\n")
    out = run_elastic("--standalone", "--nproc-per-node=2", "-m", "mypkg.job", "a", cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert sorted(re.findall(r"MOD (\d) \['a'\]", out.stdout)) == ["0", "1"]

    out = run_elastic("--standalone", "--no-python", "--nproc-per-node=2", "sh", "-c", 'echo "SH $RANK"')
    assert out.returncode == 0, out.stderr
    assert sorted(re.findall(r"SH (\d)", out.stdout)) == ["0", "1"]


def test_run_path():
    out = run_elastic("--standalone", "--run-path", "--nproc-per-node=2", str(SCRIPTS / "env_dump.py"), "q")
    assert out.returncode == 0, out.stderr
    assert [r["argv"] for r in env_lines(out.stdout)] == [["q"], ["q"]]


def test_role_and_log_dir_redirects_tee(tmp_path):
    out = run_elastic("--standalone", "--nproc-per-node=2", "--role=trainer", f"--log-dir={tmp_path}",
                      "--redirects=3", "--tee=0:1", str(SCRIPTS / "env_dump.py"))
    assert out.returncode == 0, out.stderr
    # rank 0 stdout is tee'd with a prefix; rank 1 only goes to its file
    console = [l for l in out.stdout.splitlines() if "ENV " in l]
    assert len(console) == 1 and console[0].startswith("[trainer0]:ENV ")
    [run_dir] = list(tmp_path.iterdir())
    for rank in (0, 1):
        text = (run_dir / "attempt_0" / str(rank) / "stdout.log").read_text()
        assert json.loads(text[4:])["env"]["ROLE_NAME"] == "trainer"
        assert (run_dir / "attempt_0" / str(rank) / "stderr.log").exists()


def test_local_ranks_filter_hides_console_output():
    out = run_elastic("--standalone", "--nproc-per-node=3", "--local-ranks-filter=1", str(SCRIPTS / "env_dump.py"))
    assert out.returncode == 0, out.stderr
    assert [r["env"]["LOCAL_RANK"] for r in env_lines(out.stdout)] == ["1"]


@pytest.mark.parametrize("args,fragment", [
    (["--nnodes=4:1"], "nnodes='4:1' must have MIN <= MAX (from --nnodes)"),
    (["--nproc-per-node=0"], "nproc_per_node=0 must be >= 1 (from --nproc-per-node)"),
    (["--rdzv-backend=bogus", "--rdzv-endpoint=localhost:0"], "rdzv_backend='bogus' is not one of"),
    (["--max-restarts=-1"], "max_restarts=-1 must be an int >= 0 (from --max-restarts)"),
    (["--monitor-interval=0"], "monitor_interval=0.0 must be a number > 0 and at most 3600 (s) "
                               "(from --monitor-interval)"),
    (["--redirects=7"], "redirects='7' must be 0"),
    (["--local-ranks-filter=a"], "local_ranks_filter='a' must be comma-separated"),
    (["--signals-to-handle=SIGNOPE"], "unknown signal 'SIGNOPE'"),
    (["--rdzv-conf=oops"], "rdzv_conf='oops' must be key=value"),
])
def test_bad_input_is_one_line_and_fast(args, fragment):
    started = time.monotonic()
    out = run_elastic(*args, str(SCRIPTS / "env_dump.py"), timeout=20)
    assert out.returncode != 0
    assert fragment in out.stderr
    assert "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) <= 2
    assert "ENV " not in out.stdout
    assert time.monotonic() - started < 15


def test_missing_script_and_module():
    out = run_elastic("--standalone", "/no/such/script.py")
    assert out.returncode == 1 and "does not exist" in out.stderr and "Traceback" not in out.stderr
    out = run_elastic("--standalone", "-m", "no_such_module_xyz")
    assert out.returncode == 1 and "not an importable module" in out.stderr


def test_sigterm_ignoring_worker_is_killed_after_grace():
    out = run_elastic("--standalone", "--nproc-per-node=2", "--shutdown-timeout=1",
                      str(SCRIPTS / "ignore_sigterm.py"), timeout=30)
    assert out.returncode == 1
    assert "exitcode  : 5" in out.stderr


def test_agent_sigkill_takes_workers_with_it(tmp_path):
    """torch orphans workers when the agent dies; ours die with it (PDEATHSIG)."""
    script = tmp_path / "sleep.py"
    script.write_text("import os, time\nos.write(1, f'PID {os.getpid()}\\n'.encode())\ntime.sleep(60)\n")
    # a SIGKILLed agent cannot remove its temp dir: give it one the test owns
    agent = subprocess.Popen([sys.executable, "-m", "harness.run", "--standalone", "--nproc-per-node=2", str(script)],
                             stdout=subprocess.PIPE, text=True, env={**os.environ, "TMPDIR": str(tmp_path)})
    pids = []
    while len(pids) < 2:
        line = agent.stdout.readline()
        assert line, "agent ended early"
        if line.startswith("PID"):
            pids.append(int(line.split()[1]))
    agent.kill()
    agent.wait()
    agent.stdout.close()
    assert not survivors(pids, timeout=5)


def test_sigterm_to_agent_stops_workers(tmp_path):
    script = tmp_path / "sleep.py"
    script.write_text("import os, time\nos.write(1, f'PID {os.getpid()}\\n'.encode())\ntime.sleep(60)\n")
    agent = subprocess.Popen([sys.executable, "-m", "harness.run", "--standalone", "--nproc-per-node=2", str(script)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = 0
    while seen < 2:
        line = agent.stdout.readline()
        assert line
        seen += line.startswith("PID")
    agent.terminate()
    _, err = agent.communicate(timeout=20)
    agent.stdout.close()
    assert agent.returncode == 1
    assert "stopped by SIGTERM" in err


def test_log_line_prefix_template_on_teed_output():
    out = run_elastic("--standalone", "--nproc-per-node=2", "--role=trainer", "--tee=1", str(SCRIPTS / "env_dump.py"),
                      env={"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "<${role_name}|${rank}|${local_rank}> "})
    assert out.returncode == 0, out.stderr
    prefixes = sorted(l.split("ENV ")[0] for l in out.stdout.splitlines() if "ENV " in l)
    assert prefixes == ["<trainer|0|0> ", "<trainer|1|1> "]

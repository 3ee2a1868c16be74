"""``elastic-run`` under a cgroup memory limit (as a user runs it inside a container or a
systemd slice): a worker the kernel's OOM killer takes is reported as such, not as a bare
"Signal 9" (torchrun's report, checked beside it), and its ``worker_exit`` event says
``reason="oom"``. The limit is put on a cgroup the test makes (harness.sim.resources);
skipped, with what is missing, where this process may make none."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from harness.sim.resources import CgroupSupport, JobCgroup, probe
from tests.conftest import SCRIPTS

SUPPORT = probe()
pytestmark = pytest.mark.skipif(not isinstance(SUPPORT, CgroupSupport), reason=f"needs {SUPPORT}")


@pytest.fixture
def limited():
    """A cgroup with a memory limit; the command run with it starts inside (so do its children)."""
    assert isinstance(SUPPORT, CgroupSupport)
    job = JobCgroup(SUPPORT, "oomtest")
    node = job.node(0)
    try:
        yield node
    finally:
        assert not job.remove()


def run_in(cgroup, limit: int, *argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    cgroup.set_memory(limit)
    full_env = {**os.environ, **(env or {})}
    full_env.pop("TORCHELASTIC_ERROR_FILE", None)
    return subprocess.run(argv, preexec_fn=lambda: cgroup.add(os.getpid()), capture_output=True,
                          text=True, env=full_env, timeout=120)


#: the zygote imports torch (~400 MB): under it the limit must leave room for that
@pytest.mark.parametrize("start_method, limit_mb, allocate_mb", [("spawn", 200, 400), ("zygote", 800, 1500)])
def test_elastic_run_says_killed_by_the_oom_killer(limited, tmp_path, start_method, limit_mb, allocate_mb):
    events = tmp_path / "events.jsonl"
    out = run_in(limited, limit_mb << 20, sys.executable, "-m", "harness.run", "--nproc-per-node=2",
                 f"--start-method={start_method}", str(SCRIPTS / "allocate.py"), str(allocate_mb),
                 env={"HARNESS_EVENTS": str(events)})
    assert out.returncode == 1, out.stderr
    assert "killed by the OOM killer" in out.stderr, out.stderr[-3000:]
    assert "Signal 9" not in out.stderr
    exits = [e for e in map(json.loads, events.read_text().splitlines()) if e["kind"] == "worker_exit"]
    ooms = [e for e in exits if e.get("reason") == "oom"]
    assert ooms and all(e["exitcode"] == -signal.SIGKILL for e in ooms)
    assert len(ooms) <= limited.oom_kills()  # never more OOM verdicts than the kernel's kills


@pytest.mark.torchrun
def test_torchrun_only_says_signal_9(limited):
    """The oracle: torch's torchrun, a limit that leaves its agent and its worker room to
    import torch (each holds its own: 220 MB for torch 2.13's CPU build, 540 MB for 2.15's
    CUDA build), so the worker's allocation is what the kernel kills."""
    limit_mb = 2 * _torch_import_mb() + 200
    out = run_in(limited, limit_mb << 20, sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=1",
                 str(SCRIPTS / "allocate.py"), str(limit_mb + 700))
    assert "Signal 9 (SIGKILL) received by PID" in out.stderr, out.stderr[-3000:]
    assert "OOM" not in out.stderr


def _torch_import_mb() -> int:
    """What a process that imported this torch holds (its peak resident set), in MB."""
    code = ("import torch, torch.distributed.run; print(next(int(line.split()[1]) for line in "
            "open('/proc/self/status') if line.startswith('VmHWM')))")
    kb = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60).stdout
    return int(kb) // 1024


def test_a_zygote_the_oom_killer_took_is_named_so(limited, tmp_path):
    """The zygote holds torch for every worker: under a limit below that, it is what the
    kernel kills, and ``elastic-run`` says so (not a bare "closed the connection")."""
    # its own zygote, in the limited cgroup; far below what importing torch takes (~150 MB):
    # a limit near it makes the import thrash on its own page cache instead of being killed
    env = {"HARNESS_ZYGOTE": ""}
    out = run_in(limited, 60 << 20, sys.executable, "-m", "harness.run", "--nproc-per-node=1",
                 "--start-method=zygote", str(SCRIPTS / "allocate.py"), "1", env=env)
    assert out.returncode != 0
    assert "zygote" in out.stderr and "killed by the OOM killer" in out.stderr, out.stderr[-3000:]
    assert limited.oom_kills() >= 1

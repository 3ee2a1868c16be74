"""Store placement beside torchrun: with ``--master-port`` (static, one node) torch's agent
hosts the workers' store, so a group whose rank 0 exits without ``destroy_process_group``
while the others still use the store finishes cleanly. Ours must do the same."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys

import pytest

from tests.conftest import SCRIPTS

pytestmark = pytest.mark.torchrun

PROBE = str(SCRIPTS / "agent_store_probe.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _run(module: str, tmp_path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "TORCHELASTIC_"))}
    env["TMPDIR"] = str(tmp_path)
    args = ["--nnodes=1", "--nproc-per-node=3", "--master-addr=localhost",
            f"--master-port={_free_port()}", PROBE]
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True,
                          env=env, timeout=120)


def test_rank0_exits_first_without_destroy_like_torchrun(tmp_path):
    outcomes = {m: _run(m, tmp_path) for m in ("torch.distributed.run", "harness.run")}
    seen = {}
    for module, out in outcomes.items():
        assert out.returncode == 0, f"{module}: {out.stdout}{out.stderr}"
        seen[module] = sorted(re.findall(r"PROBE rank=(\d) attempt=0 agent_store=(\w+) stale=False"
                                         r"( after_rank0=ok)?", out.stdout))
    assert seen["harness.run"] == seen["torch.distributed.run"] == [
        ("0", "True", ""), ("1", "True", " after_rank0=ok"), ("2", "True", " after_rank0=ok")]

"""The workers' store lives in the agent (``TORCHELASTIC_USE_AGENT_STORE=True``, as torch),
fresh for every attempt (unlike torch's, pytorch#135712), on ``--master-port`` when given."""

from __future__ import annotations

import re
import socket

import pytest

from tests.conftest import SCRIPTS, run_elastic

PROBE = str(SCRIPTS / "agent_store_probe.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def probe_lines(stdout: str) -> list[tuple[str, ...]]:
    return sorted(re.findall(r"PROBE rank=(\d) attempt=(\d) agent_store=(\w+) stale=(\w+)"
                             r"( after_rank0=ok)?", stdout))


@pytest.mark.parametrize("launch", [
    pytest.param(["--standalone"], id="standalone"),
    pytest.param(["--nnodes=1", "--master-addr=localhost", "--master-port=PORT"], id="static-master-port"),
])
def test_store_outlives_rank0_and_restarts_start_empty(launch, warm_workers):
    launch = [a.replace("PORT", str(free_port())) for a in launch]
    out = run_elastic(*launch, "--nproc-per-node=3", "--max-restarts=1", PROBE,
                      "--crash-first-attempt", timeout=120, env=warm_workers)
    assert out.returncode == 0, out.stdout + out.stderr
    assert probe_lines(out.stdout) == [
        ("0", "1", "True", "False", ""),
        ("1", "1", "True", "False", " after_rank0=ok"),
        ("2", "1", "True", "False", " after_rank0=ok"),
    ]


def test_torch_opt_out_puts_the_store_back_in_rank0(warm_workers):
    """``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` (torch's opt-out) is honoured for c10d."""
    out = run_elastic("--standalone", "--nproc-per-node=2", PROBE,
                      env={**warm_workers, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}, timeout=120)
    assert "agent_store=False" in out.stdout, out.stdout + out.stderr

"""Fixed-size 2-node c10d job under torch's torchrun (the oracle) and ours: same env per rank."""

from __future__ import annotations

import json

import pytest

from tests.rendezvous.conftest import ENV_DUMP, Node, c10d_args, free_port

pytestmark = pytest.mark.torchrun

COMPARED = ("LOCAL_RANK", "RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "LOCAL_WORLD_SIZE",
            "WORLD_SIZE", "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "MASTER_ADDR",
            "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
            "TORCHELASTIC_USE_AGENT_STORE", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "OMP_NUM_THREADS")


def run_pair(launcher: str, tmp_path) -> dict[str, dict]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    port = free_port()
    # torch's shared agent store breaks restarts (pytorch#135712); ours never shares, so
    # compare against torch's non-shared mode, where USE_AGENT_STORE is False too
    env = {"TMPDIR": str(tmp_path), "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    args = c10d_args(port, "2", "diff", "--max-restarts=1", nproc=2) + [ENV_DUMP]
    agents = []
    try:
        for _ in range(2):
            module = "torch.distributed.run" if launcher == "torchrun" else "harness.run"
            agents.append(Node(args, env, module=module))
        assert [a.wait(90) for a in agents] == [0, 0], "\n".join(a.output for a in agents)
    finally:
        for agent in agents:
            agent.close()
    decoder = json.JSONDecoder()
    rows = [decoder.raw_decode(chunk)[0]["env"] for a in agents for chunk in a.output.split("ENV ")[1:]]
    return {r["RANK"]: {k: r.get(k) for k in COMPARED} for r in rows}


def test_two_node_env_matches_torchrun(tmp_path):
    ours = run_pair("ours", tmp_path / "ours")
    theirs = run_pair("torchrun", tmp_path / "torch")
    assert sorted(ours) == sorted(theirs) == ["0", "1", "2", "3"]
    assert ours == theirs

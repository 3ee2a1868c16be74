"""What every simulated node's environment has unless the user's ``env`` says otherwise
(``harness.sim.nodes.start.node_defaults``), wherever the node runs."""

from __future__ import annotations

from harness.agent._local import AgentEnv
from harness.sim.nodes.start import WORKER_NICE, node_defaults


def test_a_nodes_agent_computes_its_workers_ranks_from_its_group_rank():
    env: dict[str, str] = {}
    node_defaults(env, 1)
    assert AgentEnv.resolve(env).identical_workers  # the agent takes torch's shortcut
    assert env["HARNESS_WORKER_NICE"] == str(WORKER_NICE) and "OMP_NUM_THREADS" not in env


def test_the_users_values_win():
    env = {"TORCH_ELASTIC_WORKER_IDENTICAL": "0", "OMP_NUM_THREADS": "4", "HARNESS_WORKER_NICE": "0"}
    node_defaults(env, 4)
    assert not AgentEnv.resolve(env).identical_workers
    assert env["OMP_NUM_THREADS"] == "4" and env["HARNESS_WORKER_NICE"] == "0"


def test_several_workers_a_node_get_one_openmp_thread_each():
    env: dict[str, str] = {}
    node_defaults(env, 2)
    assert env["OMP_NUM_THREADS"] == "1"

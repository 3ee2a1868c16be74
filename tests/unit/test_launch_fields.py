"""The rendezvous settings the harness gives each node's agent (``launch_fields``): the first
round waits for every node it started, and a job of many nodes keeps alive more slowly."""

from __future__ import annotations

from harness.rendezvous import HEARTBEAT_TIMEOUT, KEEP_ALIVE_INTERVAL
from harness.sim.config import ClusterConfig
from harness.sim.nodes.start import (
    FIRST_ROUND_LAST_CALL_PER_NODE,
    KEEP_ALIVE_NODES,
    SETTLE_MAX,
    SETTLE_PER_NODE,
    launch_fields,
)

RDZV = {"backend": "c10d", "endpoint": "127.0.0.1:29400", "configs": {}}


def configs(nnodes: str, launched: int, **conf: object) -> dict:
    settings = ClusterConfig(nnodes=nnodes, nproc_per_node=1, rdzv_conf=conf or None)
    fields = launch_fields(settings, "job", 0, RDZV, "n0", "127.0.0.1", RDZV["endpoint"], launched=launched)
    return fields["rdzv_configs"]


def test_a_small_job_keeps_the_defaults_and_its_first_round_waits_for_the_nodes_it_started():
    assert configs("1:2", 2) == {"first_round_nodes": 2, "last_call_timeout": 1.0}


def test_many_nodes_get_a_longer_last_call_and_a_slower_keep_alive():
    got = configs("1:128", 128)
    assert got["first_round_nodes"] == 128
    assert got["last_call_timeout"] == FIRST_ROUND_LAST_CALL_PER_NODE * 128
    scale = 128 / KEEP_ALIVE_NODES
    assert (got["keep_alive_interval"], got["heartbeat_timeout"]) == (round(KEEP_ALIVE_INTERVAL * scale, 3),
                                                                        round(HEARTBEAT_TIMEOUT * scale, 3))
    assert (got["keep_alive_interval"], got["heartbeat_timeout"]) == (0.8, 6.4)  # 128 nodes: 8x the defaults
    assert "keep_alive_interval" not in configs(f"1:{KEEP_ALIVE_NODES}", KEEP_ALIVE_NODES)


def test_past_sixteen_nodes_the_state_settles_before_it_is_read_again_in_proportion_up_to_a_bound():
    """A round that N nodes join changes N times; without settling each waiter and keeper
    reads the whole state on every change. Small jobs read at once, as torch's agents do."""
    assert "settle_time" not in configs(f"1:{KEEP_ALIVE_NODES}", KEEP_ALIVE_NODES)
    assert configs("1:32", 32)["settle_time"] == round(SETTLE_PER_NODE * (32 - KEEP_ALIVE_NODES), 3) == 0.016
    assert configs("1:128", 128)["settle_time"] == SETTLE_MAX == 0.1


def test_the_users_rdzv_conf_wins():
    got = configs("1:128", 128, keep_alive_interval=0.2, last_call_timeout=3.0)
    assert (got["keep_alive_interval"], got["last_call_timeout"]) == (0.2, 3.0)

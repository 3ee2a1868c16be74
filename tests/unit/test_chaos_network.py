"""Chaos with network faults: every lasting fault it draws is healed before the job can end,
and network faults are data like the others (spec <-> fault, kinds in --elastic-faults)."""

from __future__ import annotations

import pytest

from harness.errors import ConfigError
from harness.sim.faults import Heal, PacketLoss, Partition, chaos, from_spec, to_spec


@pytest.mark.parametrize("seed", range(40))
def test_every_partition_and_loss_is_followed_by_a_heal_of_its_node(seed):
    schedule = chaos.generate_schedule(seed, ("partition", "packet_loss", "kill_worker"), min_nodes=1, max_nodes=3,
                                       nproc_per_node=1, max_restarts=4, initial_nodes=3)
    for i, entry in enumerate(schedule):
        if isinstance(entry.fault, (Partition, PacketLoss)):
            heal = schedule[i + 1]
            assert isinstance(heal.fault, Heal) and heal.fault.node == entry.fault.node
            assert heal.after_previous  # armed only once the fault itself fired


def test_chaos_kinds_include_partition_and_packet_loss():
    assert {"partition", "packet_loss"} <= set(chaos.FAULT_KINDS)
    assert chaos.parse_fault_kinds("partition,packet_loss") == ("partition", "packet_loss")


def test_network_fault_specs_round_trip():
    for spec in ({"kind": "partition", "node": 1, "peers": [0, 2], "direction": "in", "after_healthy": 1.0},
                 {"kind": "partition", "node": 2, "peers": "store", "after_healthy": 0.5},
                 {"kind": "heal", "node": 1, "after_healthy": 3.0, "after_previous": True},
                 {"kind": "heal", "after_healthy": 3.0},
                 {"kind": "packet_loss", "node": 2, "probability": 0.5, "after_healthy": 0.1},
                 {"kind": "bandwidth", "node": 1, "rate": "500kbit", "after_healthy": 0.1},
                 {"kind": "link_down", "node": 1, "after_healthy": 0.1}):
        assert to_spec(from_spec(spec)) == spec


@pytest.mark.parametrize("spec, says", [
    ({"kind": "partition", "peers": "everyone"}, "peers"),
    ({"kind": "partition", "direction": "sideways"}, "direction"),
    ({"kind": "packet_loss", "probability": 1.5}, "probability"),
    ({"kind": "bandwidth", "rate": "fast"}, "rate"),
])
def test_bad_network_fault_specs_name_the_key(spec, says):
    with pytest.raises(ConfigError, match=says):
        from_spec(spec)


def test_a_job_with_no_restart_to_spare_still_gets_faults_that_cost_none():
    """max_restarts=0 leaves no budget for failures, but a partition (or a join, a leave)
    uses no restart: chaos still draws those, and never a failure."""
    schedules = [chaos.generate_schedule(seed, ("partition", "kill_worker"), min_nodes=1, max_nodes=2,
                                         nproc_per_node=1, max_restarts=0, initial_nodes=2)
                 for seed in range(20)]
    kinds = {entry.fault.kind for schedule in schedules for entry in schedule}
    assert kinds == {"partition", "heal"}
    assert chaos.generate_schedule(1, ("kill_worker",), min_nodes=1, max_nodes=2, nproc_per_node=1,
                                   max_restarts=0, initial_nodes=2) == []

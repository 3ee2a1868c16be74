"""Chaos on top of a scenario's own faults: what chaos draws leaves the scenario's expected
outcome decidable (restarts, spare nodes, links)."""

from __future__ import annotations

import pytest

from harness.sim.faults import chaos
from harness.sim.faults.chaos import ChaosConfig
from harness.sim.schema import FAULT_KINDS
from pytest_elastic._scenarios import _chaos_around

TAKERS = ("kill_agent", "kill_node", "remove_node", "freeze_node", "partition")  # kinds that take a node out


def _takes_a_node(entry) -> bool:
    return FAULT_KINDS[entry.fault.kind].membership < 0


@pytest.mark.parametrize("reserved, some_take", [(0, True), (1, False)])
def test_chaos_keeps_the_reserved_nodes_spare(reserved, some_take):
    schedules = [chaos.generate_schedule(seed, TAKERS + ("kill_worker",), min_nodes=1, max_nodes=2,
                                         nproc_per_node=1, max_restarts=3, initial_nodes=2,
                                         reserved_nodes=reserved)
                 for seed in range(30)]
    took = any(_takes_a_node(entry) for schedule in schedules for entry in schedule)
    assert took is some_take
    assert all(schedules)  # with no node to spare, it still draws worker faults


def test_a_scenario_that_takes_nodes_reserves_each_once():
    faults = [{"kind": "partition", "node": 1, "peers": "store"}, {"kind": "heal", "node": 1},
              {"kind": "partition", "node": 1, "peers": "store"}, {"kind": "kill_node", "node": 2},
              {"kind": "kill_worker", "node": 0}]
    around = _chaos_around(ChaosConfig(seed=1, kinds=("kill_worker", "kill_node", "partition")), faults,
                           max_restarts=3)
    assert around.reserved_nodes == 2  # nodes 1 and 2
    assert around.max_faults == 0  # its crash and its two cuts each keep one of the job's three restarts
    assert around.kinds == ("kill_worker", "kill_node")  # it cuts links itself: no chaos cuts


def test_a_scenario_with_only_network_chaos_and_its_own_cuts_gets_none():
    faults = [{"kind": "packet_loss", "node": 1, "probability": 0.05}]
    assert _chaos_around(ChaosConfig(seed=1, kinds=("packet_loss",)), faults, max_restarts=0) is None


def test_a_scenario_cut_keeps_a_restart_for_the_worker_it_strands():
    """A peer partition strands a worker in a collective; the step timer reaps it: a restart of
    the job's. Chaos drew three crashes on top and the job ran out (max_restarts=3, seed
    1269083661): chaos now leaves one restart per cut, none per heal."""
    faults = [{"kind": "partition", "node": 1, "peers": [0]}, {"kind": "heal", "node": 1}]
    around = _chaos_around(ChaosConfig(seed=1, kinds=("kill_worker",)), faults, max_restarts=3)
    assert around.max_faults == 2


def test_a_scenario_that_slows_a_node_gets_no_chaos_slow_nodes_and_its_oom_keeps_a_restart():
    """Chaos slowed node 1 on top of the straggler scenario's own slow_node (seed 7): two
    straggler windows, and the one judged was chaos's. Its OOM kill costs a restart too."""
    straggler = [{"kind": "slow_node", "node": 1, "cpu": 0.1}, {"kind": "heal", "node": 1}]
    around = _chaos_around(ChaosConfig(seed=1, kinds=("kill_worker", "slow_node")), straggler, max_restarts=1)
    assert around.kinds == ("kill_worker",) and around.max_faults == 1
    assert _chaos_around(ChaosConfig(seed=1, kinds=("slow_node",)), straggler, max_restarts=1) is None
    oom = [{"kind": "memory_limit", "node": 0, "limit": "600M"}, {"kind": "heal", "node": 0}]
    assert _chaos_around(ChaosConfig(seed=1, kinds=("kill_worker",)), oom, max_restarts=1).max_faults == 0


def test_a_scenario_with_lasting_faults_of_its_own_gets_no_lasting_chaos_faults_and_says_why():
    """Chaos slowed node 1's disk (slow_io) and its heal of node 1 ended the scenario's own
    partition of node 1 seconds early: the scenario's heal never fired (seed 1578401809)."""
    faults = [{"kind": "partition", "node": 1, "peers": [0]}, {"kind": "heal", "node": 1}]
    around = _chaos_around(ChaosConfig(seed=1, kinds=("kill_worker", "slow_io", "slow_node", "packet_loss")),
                           faults, max_restarts=3)
    assert around.kinds == ("kill_worker",)
    left_out = dict(around.left_out)
    assert set(left_out) == {"slow_io", "slow_node", "packet_loss"}
    assert "a chaos heal ends every lasting fault of its node" in left_out["slow_io"]


def test_a_scenario_whose_faults_fire_on_world_sizes_gets_no_chaos_membership_changes():
    """Chaos added a node while the flapping node scenario removed one: the world never
    shrank to 1 and its own join and second leave never fired (seed 1808429877)."""
    faults = [{"kind": "remove_node", "node": 1, "at_step": 8, "rank": 0},
              {"kind": "add_node", "on_world_size": 1, "after_previous": True}]
    around = _chaos_around(ChaosConfig(seed=1, kinds=("kill_worker", "add_node", "kill_node")), faults,
                           max_restarts=1)
    assert around.kinds == ("kill_worker",)
    assert "fire on world sizes" in dict(around.left_out)["add_node"]


def test_a_scenario_that_orders_an_exact_exit_gets_no_chaos_membership_changes():
    faults = [{"kind": "kill_worker", "node": 0, "local_rank": 1, "exit_code": 3, "at_step": 5, "rank": 1}]
    around = _chaos_around(ChaosConfig(seed=1, kinds=("kill_worker", "remove_node", "add_node")), faults,
                           max_restarts=3)
    assert around.kinds == ("kill_worker",)
    assert "exact (rank, step)" in dict(around.left_out)["remove_node"]

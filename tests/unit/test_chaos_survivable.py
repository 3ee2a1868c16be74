"""Chaos draws only what the job can survive by its own configuration: a kind the job has
no means to survive is left out of its schedule, saying why (``chaos.survivable``)."""

from __future__ import annotations

from harness.sim.faults.chaos import NO_WATCHDOG, JobFacts, generate_schedule, survivable
from harness.sim.schema import CHAOS_KINDS, NETNS

EVERY = tuple(CHAOS_KINDS)


def test_a_hung_worker_is_drawn_only_where_a_watchdog_reaps_it():
    kinds, left_out = survivable(("kill_worker", "hang_worker"), JobFacts(1, 1, 1))
    assert kinds == ("kill_worker",) and left_out == {"hang_worker": NO_WATCHDOG}
    kinds, left_out = survivable(("kill_worker", "hang_worker"), JobFacts(1, 1, 1, watchdog=True))
    assert kinds == ("kill_worker", "hang_worker") and left_out == {}


def test_a_job_with_no_node_to_spare_loses_none_and_gains_none():
    kinds, left_out = survivable(EVERY, JobFacts(min_nodes=1, max_nodes=1, nodes=1, watchdog=True))
    takers = {k for k in EVERY if CHAOS_KINDS[k].membership != 0}
    assert takers and not takers & set(kinds)
    assert "no node to spare: it starts 1 and needs min_nodes=1" in left_out["kill_node"]
    assert "starts at its max_nodes (1)" in left_out["add_node"]


def test_a_node_the_tests_own_faults_take_is_not_spare():
    _, left_out = survivable(("kill_node",), JobFacts(min_nodes=1, max_nodes=2, nodes=2, reserved_nodes=1))
    assert "the test's own faults take 1" in left_out["kill_node"]


def test_a_node_may_join_where_chaos_may_take_one_out_first():
    kinds, _ = survivable(("remove_node", "add_node"), JobFacts(min_nodes=1, max_nodes=2, nodes=2))
    assert kinds == ("remove_node", "add_node")


def test_what_the_machine_lacks_is_said_first():
    why = "the job's nodes share one network (network='loopback')"
    kinds, left_out = survivable(("partition", "kill_worker"), JobFacts(1, 2, 2, missing={NETNS: why}))
    assert kinds == ("kill_worker",) and left_out == {"partition": why}


def test_node_0_hosting_the_store_is_never_taken_out():
    takers = ("kill_agent", "kill_node", "remove_node", "freeze_node")
    for seed in range(40):
        schedule = generate_schedule(seed, takers, min_nodes=1, max_nodes=3, nproc_per_node=1, max_restarts=3,
                                     protected_nodes=(0,))
        assert schedule and all(entry.fault.node != 0 for entry in schedule)  # type: ignore[attr-defined]



def test_all_names_every_chaos_kind():
    from harness.sim.schema import parse_chaos_kinds

    assert parse_chaos_kinds("all") == EVERY
    assert parse_chaos_kinds("kill_worker,all") == EVERY  # once each, in the table's order


def test_an_overloaded_schedule_says_the_failures_past_the_budget():
    """Under --elastic-chaos-overload the report says how far past its budget chaos went, so
    that a FAILED job reads as what its budget allows, not as a harness bug."""
    from types import SimpleNamespace

    from harness.faults import ScheduledFault, WorkerKill
    from pytest_elastic._session import _overload_lines

    job = SimpleNamespace(chaos_schedule=[ScheduledFault(WorkerKill()), ScheduledFault(WorkerKill())])
    record = SimpleNamespace(settings=SimpleNamespace(overload=True),
                             cluster=SimpleNamespace(config=SimpleNamespace(max_restarts=1), jobs=[job]))
    assert _overload_lines(record) == ["--elastic-chaos-overload: job 0's schedule has 2 failure(s), past its "
                                       "max_restarts=1: a job that ends FAILED did what its budget allows"]
    record.settings.overload = False
    assert _overload_lines(record) == []


def test_the_schedulers_own_kinds_are_drawn_only_on_slurm_nodes_an_operator_may_change():
    """``down_node`` and ``drain_node`` are chaos kinds of Slurm's: left out on this machine
    (its place lacks the scheduler, and says so), on SSH hosts (no scheduler) and on a Slurm
    allocation whose file lists no ``slurm_admin``; drawn where it does."""
    from harness.hosts import HostSpec, slurm_spec, stand_ins
    from harness.sim.config import ClusterConfig
    from harness.sim.places.here.place import Here
    from harness.sim.places.hosts.refusals import chaos_kinds

    slurms = ("down_node", "drain_node")
    assert [k for k in EVERY if CHAOS_KINDS[k].slurm_only] == list(slurms)
    here = Here(ClusterConfig(nnodes="1:3")).lacks("netns")
    kinds, left_out = survivable(("kill_worker", *slurms), JobFacts(1, 3, 3, missing=here))
    assert kinds == ("kill_worker",)
    assert left_out["down_node"] == left_out["drain_node"] == (
        "the job's nodes run on this machine, which no scheduler owns (the scheduler's own faults need "
        "--elastic-slurm)")
    ssh = [HostSpec(address="198.18.0.1", user="root", capabilities=frozenset({"slurm_admin"}))]
    kinds, left_out = chaos_kinds(("kill_worker", *slurms), ssh, None, 3)
    assert kinds == ("kill_worker",) and "an SSH host has no scheduler" in left_out["drain_node"]
    user = stand_ins(slurm_spec(controller_address="198.18.0.1"), 3)
    kinds, left_out = chaos_kinds(("kill_worker", *slurms), user, None, 3)
    assert kinds == ("kill_worker",) and "it needs slurm_admin" in left_out["down_node"]
    operator = stand_ins(slurm_spec(controller_address="198.18.0.1", capabilities=["slurm_admin"]), 3)
    assert chaos_kinds(("kill_worker", *slurms), operator, None, 3) == (("kill_worker", *slurms), {})

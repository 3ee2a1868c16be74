"""Invariants every elastic job must keep, checked on its timeline.

A violation raises ``InvariantViolation`` whose message lists every broken invariant and
then prints the timeline, so the failure explains itself.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from harness.sim.errors import InvariantViolation
from harness.sim.schema import kinds_where
from harness.sim.truth.net_invariants import cut_off_from_store, split_brain, unfenced_workers, unobserved
from harness.sim.truth.timeline import HARNESS, Timeline
from harness.states import WorkerState

__all__ = ["InvariantViolation", "JobFacts", "check_timeline", "LEGAL_TRANSITIONS"]

S = WorkerState
#: the agent's state machine (seeds): what may follow what for one node's worker group
LEGAL_TRANSITIONS: dict[WorkerState, frozenset[WorkerState]] = {
    S.INIT: frozenset({S.HEALTHY, S.FAILED, S.UNKNOWN}),
    S.HEALTHY: frozenset({S.UNHEALTHY, S.FAILED, S.SUCCEEDED, S.STOPPED, S.UNKNOWN}),
    S.UNHEALTHY: frozenset({S.HEALTHY, S.FAILED, S.SUCCEEDED, S.STOPPED, S.UNKNOWN}),
    S.FAILED: frozenset({S.STOPPED, S.UNKNOWN}),
    S.STOPPED: frozenset({S.HEALTHY, S.FAILED, S.UNKNOWN}),
    S.SUCCEEDED: frozenset(),
    S.UNKNOWN: frozenset(),
}

#: faults after which a node's agent is gone (or frozen) and cannot report its workers'
#: exits (their rows say so; ``kill_store_host`` names a target node only when a node
#: hosted the store). Live sets: a kind registered later is judged by its row too, and a
#: retired event name (``node_kill``) by its kind's
_AGENT_LOSING_FAULTS = kinds_where(lambda row: row.agent_losing, "agent-losing")
#: faults that are plain worker failures: each costs exactly one restart
_WORKER_FAILURES = kinds_where(lambda row: row.worker_failure, "worker failures")


@dataclass(frozen=True)
class JobFacts:
    """What the checker needs to know about the job beyond its events."""

    max_restarts: int
    nproc_per_node: int
    finished: bool = False
    succeeded: bool | None = None
    #: seconds within which a node cut off from the store must have stopped its workers:
    #: the keep-alive bound plus the stop grace (and slack for a loaded machine)
    fence_bound: float = 10.0


def _check_transitions(timeline: Timeline, problems: list[str]) -> None:
    """The agent's own states follow its state machine. The harness's terminal entry for a
    node it killed, froze or removed (``"source": "harness"``) may follow any state: it
    records what the harness did, not a step of the agent."""
    for node in timeline.nodes():
        states = [WorkerState(e["state"]) for e in timeline.events("state", node)
                  if e.get("source") != HARNESS]
        for before, after in zip(states, states[1:], strict=False):
            if after not in LEGAL_TRANSITIONS[before]:
                problems.append(f"{node}: illegal transition {before.value} -> {after.value}")
        if states and states[0] != S.INIT:
            problems.append(f"{node}: first state is {states[0].value}, not INIT")


def _rounds(timeline: Timeline) -> dict[int, list[dict[str, Any]]]:
    by_round: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for start in timeline.events("worker_start"):
        by_round[start.get("round", 0)].append(start)
    return by_round


def _check_ranks(timeline: Timeline, facts: JobFacts, problems: list[str]) -> None:
    """Ranks are unique and within WORLD_SIZE in every round. A round may be abandoned
    half-started (a node left before starting its workers; a newer round replaced it), so
    completeness (ranks exactly 0..W-1, W = the local world sizes summed) is required of
    the final round of a job that succeeded."""
    rounds = _rounds(timeline)
    last = max(rounds, default=None)
    for rnd, starts in sorted(rounds.items()):
        ranks = sorted(s["rank"] for s in starts)
        sizes = {s["world_size"] for s in starts}
        if len(sizes) != 1:
            problems.append(f"round {rnd}: workers disagree on WORLD_SIZE {sorted(sizes)}")
            continue
        world = sizes.pop()
        if len(set(ranks)) != len(ranks) or any(not 0 <= r < world for r in ranks):
            problems.append(f"round {rnd}: ranks {ranks} are not unique within 0..{world - 1}")
        elif rnd == last and facts.succeeded and ranks != list(range(world)):
            per_node: dict[str, int] = defaultdict(int)
            for s in starts:
                per_node[s["node"]] += 1
            problems.append(f"round {rnd}: ranks {ranks} are not contiguous 0..{world - 1}; "
                            f"WORLD_SIZE={world} but local world sizes sum to "
                            f"{sum(per_node.values())} ({dict(per_node)})")


def _check_no_overlap(timeline: Timeline, problems: list[str]) -> None:
    """No worker of an older round is alive once a newer round's workers start, except on a
    node cut off from the store at that moment: stopping those is the fencing's job, within
    its bound (``unfenced_workers``), and they cannot train meanwhile (``split_brain``). Under
    load the survivors' new round can start before a cut-off node's fence fires (seen once
    in ``scenarios/network/flapping_link.toml`` under chaos)."""
    agent_lost = {f.get("target_node") for f in timeline.events("fault")
                  if f.get("fault") in _AGENT_LOSING_FAULTS} | unobserved(timeline.events())
    cut_off = cut_off_from_store(timeline.events())
    exits = {(e["node"], e.get("worker_pid")): e["mono"] for e in timeline.events("worker_exit")}
    rounds = _rounds(timeline)
    for rnd in sorted(rounds):
        first_start = min(s["mono"] for s in rounds[rnd])
        for older in (r for r in rounds if r < rnd):
            for start in rounds[older]:
                if start["node"] in agent_lost:
                    continue
                if any(cut <= first_start < healed for cut, healed in cut_off.get(start["node"], ())):
                    continue
                ended = exits.get((start["node"], start["worker_pid"]))
                if ended is None or ended > first_start:
                    problems.append(
                        f"round {rnd} started while {start['node']} rank {start['rank']} "
                        f"(pid {start['worker_pid']}) of round {older} was still alive")


def _round_restart_counts(timeline: Timeline) -> dict[int, set[int]]:
    """round -> the restart counts its agents (``rendezvous``) and workers
    (``worker_start``: their ``TORCHELASTIC_RESTART_COUNT``) reported."""
    counts: dict[int, set[int]] = defaultdict(set)
    for event in timeline.events("rendezvous") + timeline.events("worker_start"):
        if "round" in event and "restart_count" in event:
            counts[event["round"]].add(event["restart_count"])
    return counts


def _check_restarts(timeline: Timeline, facts: JobFacts, problems: list[str]) -> None:
    """Restarts are the job's, agreed through the rendezvous: every node of a round runs
    with one count, no later round has a smaller one (no node can reset it), and the
    job's count stays within ``max_restarts``."""
    rounds = _round_restart_counts(timeline)
    floor, floor_round = 0, None
    for rnd, counts in sorted(rounds.items()):
        if len(counts) > 1:
            problems.append(f"round {rnd}: nodes ran with different restart counts "
                            f"{sorted(counts)}; the count is the job's, one per round")
        if min(counts) < floor:
            problems.append(f"round {rnd}: restart count {min(counts)} is below round "
                            f"{floor_round}'s {floor}; the job's count was reset")
        if max(counts) >= floor:
            floor, floor_round = max(counts), rnd
    used = max((max(c) for c in rounds.values()), default=0)
    if used > facts.max_restarts:
        problems.append(f"the job used {used} restarts > max_restarts={facts.max_restarts}")


def _check_outcome(timeline: Timeline, facts: JobFacts, problems: list[str]) -> None:
    if not facts.finished or facts.succeeded is None:
        return
    faults = timeline.events("fault")
    failures = [f for f in faults if f.get("fault") in _WORKER_FAILURES]
    if len(failures) != len(faults):
        return  # agent, node or hang faults: the outcome depends on more than restarts
    if len(failures) < facts.max_restarts and not facts.succeeded:
        problems.append(f"job failed with {len(failures)} injected worker failure(s) although "
                        f"max_restarts={facts.max_restarts} allows more")


def _check_fsynced_kept(timeline: Timeline, problems: list[str]) -> None:
    """``lose_unsynced`` takes what was never fsynced and nothing else: every file a crash
    rolled back keeps at least the length it had at its last fsync (what the undo log
    restores below it is the fsynced bytes themselves)."""
    for event in timeline.events("storage_lost"):
        for lost in event.get("files", []):
            after, synced = lost.get("size_after"), lost.get("synced_size")
            if isinstance(after, int) and isinstance(synced, int) and after < synced:
                problems.append(f"node {event.get('target_node')}'s crash lost fsynced data: {lost.get('path')} "
                                f"was fsynced at {synced} bytes and has {after} after the crash")


def check_timeline(timeline: Timeline, facts: JobFacts) -> list[str]:
    """Every broken invariant, as readable sentences (empty: all held)."""
    problems: list[str] = []
    _check_transitions(timeline, problems)
    _check_ranks(timeline, facts, problems)
    _check_no_overlap(timeline, problems)
    _check_restarts(timeline, facts, problems)
    _check_outcome(timeline, facts, problems)
    _check_fsynced_kept(timeline, problems)
    events = timeline.events()  # networks: no split brain, cut-off nodes fence themselves
    problems.extend(split_brain(events))
    problems.extend(unfenced_workers(events, facts.fence_bound))
    return problems

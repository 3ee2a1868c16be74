"""How a caller waits on a job (``Job.wait``, ``wait_for_state``, ``wait_for_recovery``).

Every wait sleeps on the job's event bus (``harness.sim.bus``) and re-checks what it waits
for as events arrive, never on a polling tick. Each also ends early, for a reason the caller
must hear at once rather than at its timeout:

* a scheduled fault that could not be applied: ``FaultError`` naming it and why;
* a hang (``harness.sim.truth.hangs``: a node still running past the exit barrier after its
  peers' training succeeded): ``JobHung``, with what the hung node's workers last did and
  their Python stacks (``harness.sim.truth.stacks``);
* a stall (``hangs.find_stall``: no event at all for the job's stall bound): ``JobHung``
  too, naming the fault that left it stuck and what the job lacks to survive it;
* at the job's end, faults of the caller's that never fired: ``FaultNotFired``, saying why
  for each (chaos faults never count: they may not fire).

What a node's state is now (``in_state``, ``first_healthy_time``: what the triggers of
scheduled faults ask) is read here from the timeline too.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from harness.errors import ElasticError
from harness.sim.errors import FaultError, FaultNotFired, JobHung
from harness.sim.truth.hangs import (
    GRACE_S,
    Hang,
    Stall,
    describe_workers,
    find_hang,
    find_stall,
    runs_watchdog,
    stall_cause,
    teardown_hint,
)
from harness.sim.truth.subject import Configured, PlacedNode, StackedJob
from harness.sim.truth.timeline import Timeline
from harness.states import WorkerState

if TYPE_CHECKING:
    from harness.sim.bus import EventBus
    from harness.sim.truth.job_result import JobResult

__all__ = ["WaitedJob", "first_healthy_time", "in_state", "never_fired", "wait_for_end", "wait_for_recovery",
           "wait_for_state"]


# -- what a wait needs of the job (``harness.sim.job.Job`` is the implementation) -------------


class _Described(Protocol):
    """A scheduled fault as a wait names it (``ScheduledFault``)."""

    def describe(self) -> str: ...


class _Faults(Protocol):
    """The job's scheduler as a wait asks it (``FaultScheduler``)."""

    def pending(self) -> Sequence[_Described]: ...

    def failures(self) -> Sequence[tuple[_Described, str]]: ...

    def never_fired(self) -> Sequence[tuple[_Described, str]]: ...

    def fire_at_end(self) -> None: ...

    def next_due(self) -> float | None: ...


class _Orders(Protocol):
    """The process part as the end of a wait asks it (``ProcessFaults``)."""

    def unobeyed(self) -> list[tuple[str, str]]: ...


class _Live(PlacedNode, Protocol):
    """A node's handle as a wait asks it (``NodeProcess``)."""

    def alive(self) -> bool: ...


class _Frozen(Protocol):
    """The node ledger as a wait asks it (``NodeLedger``)."""

    @property
    def frozen(self) -> Collection[int]:
        """The nodes the harness stopped (they never end on their own)."""
        ...


class WaitedJob(StackedJob, Protocol):
    """The job as a wait sees it: its bus, its timeline, its nodes and their workers, its
    scheduler's faults, its result; what ``stacks.job_workers`` reads too (a hang's report)."""

    @property
    def run_id(self) -> str: ...

    @property
    def stacks_dir(self) -> str: ...

    @property
    def bus(self) -> EventBus: ...

    @property
    def cluster(self) -> Configured: ...

    @property
    def nodes(self) -> Mapping[int, _Live]: ...

    @property
    def ledger(self) -> _Frozen: ...

    @property
    def scheduler(self) -> _Faults: ...

    @property
    def processes(self) -> _Orders: ...

    @property
    def chaos_schedule(self) -> Sequence[object]:
        """Chaos's faults (known by identity: they may never fire)."""
        ...

    def node(self, node: int) -> object:
        """Node ``node``'s handle; ``ConfigError`` naming the valid nodes if it has none."""
        ...

    def result(self) -> JobResult: ...

    def agent_log(self, node: int) -> str:
        """What node ``node``'s agent wrote to its log."""
        ...


def _until(job: WaitedJob, predicate: Callable[[], bool], timeout: float, lifecycle: bool = False) -> bool:
    """Sleep on the bus until ``predicate()`` or a fault failure (raised); False on timeout.
    ``lifecycle``: the predicate depends on agent exits only (wake on nothing else)."""
    done = job.bus.wait_until(lambda: bool(job.scheduler.failures()) or predicate(), timeout, lifecycle)
    failures = job.scheduler.failures()
    if failures:
        reasons = "; ".join(f"{entry.describe()}: {reason}" for entry, reason in failures)
        raise FaultError(f"{len(failures)} scheduled fault(s) could not be applied: {reasons}")
    return done


# -- states ---------------------------------------------------------------------------------


def _latest_state(job: WaitedJob, node: int) -> WorkerState | None:
    job.node(node)
    states = job.timeline.states(node)
    return states[-1] if states else None


def first_healthy_time(timeline: Timeline) -> float | None:
    """Monotonic time the job first had a HEALTHY node (None: not yet)."""
    for event in timeline.events("state"):
        if event["state"] == WorkerState.HEALTHY.value:
            mono: float = event["mono"]
            return mono
    return None


def in_state(job: WaitedJob, state: WorkerState, node: int | None = None) -> bool:
    """Is ``node`` (None: every running node) in ``state`` now, with live workers when the
    state is HEALTHY (an agent's HEALTHY outlives a worker killed a moment ago)?"""
    targets = [node] if node is not None else [i for i, n in job.nodes.items() if n.alive()]
    if not targets or not all(_latest_state(job, i) == state for i in targets):
        return False
    return state != WorkerState.HEALTHY or all(job.worker_pids(i) for i in targets)


def wait_for_state(job: WaitedJob, state: WorkerState, timeout: float, node: int | None) -> None:
    """Until ``node`` (None: every running node) is in ``state``; ``TimeoutError`` with
    every node's state and the timeline."""
    if node is not None:
        job.node(node)
    if not _until(job, lambda: in_state(job, state, node), timeout):
        current = {i: getattr(_latest_state(job, i), "value", None) for i in job.nodes}
        raise TimeoutError(f"nodes did not reach {state.value} within {timeout:g}s "
                           f"(now {current})\n{job.timeline.format()}")


def wait_for_recovery(job: WaitedJob, timeout: float) -> float:
    """Until the last fault's recovery (its scheduled faults fired first); its latency."""
    deadline = time.monotonic() + timeout
    if not _until(job, lambda: not job.scheduler.pending(), timeout):
        raise TimeoutError(f"scheduled faults never fired within {timeout:g}s: "
                           f"{[e.describe() for e in job.scheduler.pending()]}")
    if not job.timeline.faults():
        raise ElasticError("no fault has been injected into this job")

    def recovered() -> bool:
        return job.timeline.faults()[-1].recovery_latency is not None

    if not _until(job, recovered, max(0.0, deadline - time.monotonic())):
        raise TimeoutError(f"no recovery from {job.timeline.faults()[-1]['fault']} within "
                           f"{timeout:g}s\n{job.timeline.format()}")
    latency = job.timeline.faults()[-1].recovery_latency
    assert latency is not None
    return latency


# -- the end ----------------------------------------------------------------------------------


def _running(job: WaitedJob) -> list[int]:
    """Nodes whose agents still run, the frozen ones left out (they never end on their own).
    A snapshot: the fault thread may add a node (a join) while the caller waits."""
    return [i for i, n in list(job.nodes.items()) if i not in job.ledger.frozen and n.alive()]


def wait_for_end(job: WaitedJob, timeout: float, allow_unfired: bool) -> JobResult:
    """Until every running node's agent ended (``Job.wait``); the merged result."""
    hangs: list[Hang] = []
    stalls: list[Stall] = []
    watchdog = runs_watchdog(job.cluster.config.env)

    def over() -> bool:
        running = _running(job)
        if not running:
            return True
        now = time.monotonic()
        hang = find_hang(job.timeline, running, now, job.cluster.config.exit_barrier_timeout + GRACE_S,
                         lambda n: job.worker_pids(n).values())
        if hang is not None:
            hangs.append(hang)
            return True
        stall = find_stall(job.timeline, now, job.scheduler.next_due(), watchdog)
        if stall is not None:
            stalls.append(stall)
        return stall is not None

    if not _until(job, over, timeout, lifecycle=True):
        raise TimeoutError(f"job {job.run_id} did not finish within {timeout:g}s; nodes "
                           f"{_running(job)} still running\n{job.timeline.format()}")
    if hangs:
        raise JobHung(_hang_report(job, hangs[0]))
    if stalls:
        raise JobHung(_stall_report(job, stalls[0]))
    job.scheduler.fire_at_end()  # chaos's lasting faults end with the job
    if not allow_unfired:
        unfired = never_fired(job)
        if unfired:
            raise FaultNotFired(unfired)
    return job.result()


def never_fired(job: WaitedJob) -> list[tuple[str, str]]:
    """(fault, why) of every fault of the caller's own still not fired: scheduled ones
    pending (chaos faults excepted: they may not fire), and exit-code orders no worker
    obeyed (no ``report_step`` at that step)."""
    chaos = {id(e) for e in job.chaos_schedule}
    reasons = [(entry.describe(), why) for entry, why in job.scheduler.never_fired() if id(entry) not in chaos]
    return reasons + job.processes.unobeyed()


def _hang_report(job: WaitedJob, hang: Hang) -> str:
    """``JobHung``'s message: the hung node, what its workers last did, their stacks (read
    on its host when it runs on one)."""
    from harness.sim.truth.stacks import LocalWorkers, all_stacks

    alive = job.worker_pids(hang.node)
    access = job.nodes[hang.node].worker_access() or LocalWorkers(job.stacks_dir)
    status = access.states(list(alive.values()))
    lines, finished = describe_workers(job.timeline, hang.node, alive, status)
    t0 = job.timeline.events()[0]["mono"] if job.timeline.events() else hang.finished_at
    what = ("Its workers finished training and did not exit (their stacks say where: "
            "torch's process-group teardown, or the script's own end)" if finished else
            "Its workers stopped short of the steps their peers completed (a collective "
            "whose peers are gone, or the script's own wait)" if alive else
            "It has no live worker: its agent did not end (its log: agent.log)")
    head = (f"job {job.run_id} hung: node {hang.node} ({job.node_name(hang.node)}) is still "
            f"running {hang.waited:.1f}s after {hang.finished} succeeded (round "
            f"{hang.finished_round}, at {hang.finished_at - t0:.1f}s); the exit barrier "
            f"gives a slower node {job.cluster.config.exit_barrier_timeout:g}s. {what}.")
    stacks = all_stacks(job, job.stacks_dir, nodes=[hang.node], agents=[] if alive else [hang.node])
    hint = teardown_hint(stacks) if finished else None
    return "\n".join([head, *(f"  {line}" for line in lines), *([f"  Where: {hint}."] if hint else []),
                      "stacks:", stacks, "timeline:", job.timeline.format()])


#: lines of a stalled node's agent log in the report, where it has no live worker
STALL_LOG_LINES = 8


def _stall_report(job: WaitedJob, stall: Stall) -> str:
    """``JobHung``'s message for a stalled job: one line with the fault that left it stuck
    and what the job lacks to survive it, then what each running node's workers last did,
    their stacks and the timeline."""
    from harness.sim.truth.stacks import LocalWorkers, all_stacks

    running = _running(job)
    alive = {node: job.worker_pids(node) for node in running}
    cause = stall_cause(job.timeline, runs_watchdog(job.cluster.config.env),
                        idle=[node for node in running if not alive[node]])
    events = job.timeline.events()
    t0 = events[0]["mono"] if events else stall.last_event
    head = (f"job {job.run_id} stalled: no event from any node or worker for {stall.waited:.1f}s (since "
            f"{stall.last_event - t0:.1f}s; its step time is {stall.step_time:.3g}s, and a job is stalled after "
            f"{stall.bound:.1f}s without one): {cause}.")
    lines: list[str] = []
    for node in running:
        access = job.nodes[node].worker_access() or LocalWorkers(job.stacks_dir)
        status = access.states(list(alive[node].values()))
        described, _ = describe_workers(job.timeline, node, alive[node], status)
        lines += [f"node {node}:", *(f"  {line}" for line in described)]
        if not alive[node]:  # its agent is what is stuck: what it said last
            tail = job.agent_log(node).splitlines()[-STALL_LOG_LINES:]
            lines += ["  no live worker; its agent's log ends:", *(f"    {line}" for line in tail or ["(empty)"])]
    stacks = all_stacks(job, job.stacks_dir, nodes=running, agents=[node for node in running if not alive[node]])
    return "\n".join([head, *(f"  {line}" for line in lines), "stacks:", stacks, "timeline:",
                      job.timeline.format()])

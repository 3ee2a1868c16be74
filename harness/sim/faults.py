"""Faults as data: what to break, and when.

A ``Fault`` says what happens (a worker crash, a frozen node...), a ``Trigger`` says
when (now, after a delay, when a node reaches a state, when a rank reports a training
step). ``Job.inject(fault, trigger)`` schedules one; a schedule is a list of
``ScheduledFault`` and is plain data, so chaos mode can generate, print, replay and
shrink it.

Crashing with an *exit code* needs the worker's cooperation: ``harness.report_step``
checks for an order the harness left for its (rank, step) and exits with that code.
Signal crashes need nothing from the worker.
"""

from __future__ import annotations

import os
import signal
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from harness.agent import WorkerState

if TYPE_CHECKING:
    from harness.sim.cluster import Job

__all__ = [
    "Fault", "WorkerCrash", "WorkerHang", "AgentKill", "NodeKill", "NodeLeave", "NodeJoin",
    "NodeFreeze", "StoreHostLoss",
    "Trigger", "Immediately", "After", "HealthyThenAfter", "OnState", "AtStep", "OnWorldSize",
    "ScheduledFault", "ORDERS_ENV", "from_spec", "to_spec", "SPEC_KEYS",
]

ORDERS_ENV = "HARNESS_ORDERS"  # dir where exit-code orders for report_step are left


# -- what ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fault:
    kind: ClassVar[str] = "fault"
    #: whether the fault is a *failure* (uses a restart) rather than a membership change
    is_failure: ClassVar[bool] = True

    def apply(self, job: "Job") -> None:
        raise NotImplementedError

    def describe(self) -> str:
        args = ", ".join(f"{k}={v}" for k, v in asdict(self).items())
        return f"{type(self).__name__}({args})"


@dataclass(frozen=True)
class WorkerCrash(Fault):
    """A worker dies of ``sig`` (default SIGKILL), or exits with ``exit_code`` at its next
    ``report_step`` (exit codes need the worker to report steps)."""

    kind: ClassVar[str] = "worker_crash"
    node: int = 0
    local_rank: int = 0
    sig: int = int(signal.SIGKILL)
    exit_code: int | None = None

    def apply(self, job: "Job") -> None:
        if self.exit_code is None:
            job.kill_worker(self.node, self.local_rank, self.sig)
        else:
            job.order_exit(self.node, self.local_rank, self.exit_code)


@dataclass(frozen=True)
class WorkerHang(Fault):
    kind: ClassVar[str] = "worker_hang"
    node: int = 0
    local_rank: int = 0

    def apply(self, job: "Job") -> None:
        job.hang_worker(self.node, self.local_rank)


@dataclass(frozen=True)
class AgentKill(Fault):
    kind: ClassVar[str] = "agent_kill"
    is_failure: ClassVar[bool] = False
    node: int = 0

    def apply(self, job: "Job") -> None:
        job.kill_agent(self.node)


@dataclass(frozen=True)
class NodeKill(Fault):
    kind: ClassVar[str] = "node_kill"
    is_failure: ClassVar[bool] = False
    node: int = 0

    def apply(self, job: "Job") -> None:
        job.kill_node(self.node)


@dataclass(frozen=True)
class NodeLeave(Fault):
    kind: ClassVar[str] = "node_leave"
    is_failure: ClassVar[bool] = False
    node: int = 0

    def apply(self, job: "Job") -> None:
        job.remove_node(self.node)


@dataclass(frozen=True)
class NodeJoin(Fault):
    kind: ClassVar[str] = "node_join"
    is_failure: ClassVar[bool] = False

    def apply(self, job: "Job") -> None:
        job.join_node()


@dataclass(frozen=True)
class NodeFreeze(Fault):
    kind: ClassVar[str] = "node_freeze"
    is_failure: ClassVar[bool] = False
    node: int = 0

    def apply(self, job: "Job") -> None:
        job.freeze_node(self.node)


@dataclass(frozen=True)
class StoreHostLoss(Fault):
    kind: ClassVar[str] = "store_host_loss"
    is_failure: ClassVar[bool] = False

    def apply(self, job: "Job") -> None:
        job.kill_store_host()


# -- when ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Trigger:
    """When a fault fires. The scheduler evaluates ``ready`` whenever events arrive, and at
    ``deadline`` for triggers that come due with time alone (no polling tick)."""

    def ready(self, job: "Job", armed_at: float, now: float) -> bool:
        raise NotImplementedError

    def deadline(self, job: "Job", armed_at: float) -> float | None:
        """The monotonic time at which ``ready`` turns true if no event arrives before
        (None: only an event can make it ready)."""
        return None


@dataclass(frozen=True)
class Immediately(Trigger):
    def ready(self, job: "Job", armed_at: float, now: float) -> bool:
        return True


@dataclass(frozen=True)
class After(Trigger):
    seconds: float = 0.0

    def ready(self, job: "Job", armed_at: float, now: float) -> bool:
        return now - armed_at >= self.seconds

    def deadline(self, job: "Job", armed_at: float) -> float | None:
        return armed_at + self.seconds


@dataclass(frozen=True)
class OnState(Trigger):
    """When ``node`` (default: every running node) is in ``state`` with live workers."""

    state: WorkerState = WorkerState.HEALTHY
    node: int | None = None

    def ready(self, job: "Job", armed_at: float, now: float) -> bool:
        return job.in_state(self.state, self.node)


@dataclass(frozen=True)
class AtStep(Trigger):
    """When global ``rank`` has reported training ``step`` (``harness.report_step``)."""

    step: int = 0
    rank: int = 0

    def ready(self, job: "Job", armed_at: float, now: float) -> bool:
        for event in reversed(job.timeline.steps(self.rank)):  # newest first: stop at arming
            if event.get("mono", 0) < armed_at:
                return False
            if event.get("step", -1) >= self.step:
                return True
        return False


@dataclass(frozen=True)
class HealthyThenAfter(After):
    """``seconds`` after the job was first seen HEALTHY (so the fault meets live workers)."""

    def ready(self, job: "Job", armed_at: float, now: float) -> bool:
        first = job.first_healthy_time()
        return first is not None and now - max(first, armed_at) >= self.seconds

    def deadline(self, job: "Job", armed_at: float) -> float | None:
        first = job.first_healthy_time()
        return None if first is None else max(first, armed_at) + self.seconds


@dataclass(frozen=True)
class OnWorldSize(Trigger):
    """When a rendezvous round forms with WORLD_SIZE ``size`` (after the trigger is armed)."""

    size: int = 1

    def ready(self, job: "Job", armed_at: float, now: float) -> bool:
        return any(e["world_size"] == self.size and e.get("mono", 0) >= armed_at
                   for e in job.timeline.events("rendezvous"))


@dataclass(frozen=True)
class ScheduledFault:
    """A fault and its trigger. ``after_previous``: the trigger is armed only once the
    fault before it in the schedule fired (sequences that do not race the clock)."""

    fault: Fault
    trigger: Trigger = field(default_factory=Immediately)
    after_previous: bool = False

    def describe(self) -> str:
        trigger = type(self.trigger).__name__
        args = ", ".join(f"{k}={getattr(v, 'value', v)}" for k, v in asdict(self.trigger).items())
        chained = " after the previous" if self.after_previous else ""
        return f"{self.fault.describe()} @ {trigger}({args}){chained}"


def write_exit_order(orders_dir: str, rank: int, exit_code: int, step: int | None = None) -> None:
    """Leave an order ``report_step`` obeys: exit with ``exit_code`` (at ``step`` or the next)."""
    name = f"{rank}.{'any' if step is None else step}"
    path = os.path.join(orders_dir, name)
    with open(path + ".tmp", "w") as fp:
        fp.write(str(int(exit_code)))
    os.replace(path + ".tmp", path)


def to_json(entry: ScheduledFault) -> dict[str, Any]:
    trigger = {k: getattr(v, "value", v) for k, v in asdict(entry.trigger).items()}
    return {"fault": entry.fault.kind, **asdict(entry.fault),
            "trigger": type(entry.trigger).__name__, **{f"trigger_{k}": v for k, v in trigger.items()}}


# -- the scenario vocabulary (``[[fault]]`` tables, ``--elastic-schedule`` JSON) -----------

_KINDS = {cls.kind: cls for cls in (WorkerCrash, WorkerHang, AgentKill, NodeKill, NodeLeave,
                                    NodeJoin, NodeFreeze, StoreHostLoss)}
SPEC_KEYS = frozenset({"kind", "node", "local_rank", "sig", "exit_code", "at_step", "rank", "after",
                       "on_state", "state_node", "on_world_size", "after_previous"})


def from_spec(spec: dict[str, Any]) -> ScheduledFault:
    """``{"kind": "node_kill", "node": 1, "at_step": 8, "rank": 0}`` -> a ScheduledFault.
    Triggers: ``at_step`` (+ ``rank``), ``after`` (s after the job is first HEALTHY),
    ``on_state`` (+ ``state_node``), ``on_world_size``; default: when HEALTHY."""
    from harness.errors import ConfigError

    cls = _KINDS.get(spec.get("kind", ""))
    if cls is None:
        raise ConfigError("kind", spec.get("kind"), f"must be one of {sorted(_KINDS)}")
    fault = cls(**{k: spec[k] for k in ("node", "local_rank", "sig", "exit_code") if k in spec})
    trigger: Trigger
    if "at_step" in spec:
        trigger = AtStep(step=int(spec["at_step"]), rank=int(spec.get("rank", 0)))
    elif "after" in spec:
        trigger = HealthyThenAfter(seconds=float(spec["after"]))
    elif "on_state" in spec:
        trigger = OnState(WorkerState(spec["on_state"]), spec.get("state_node"))
    elif "on_world_size" in spec:
        trigger = OnWorldSize(size=int(spec["on_world_size"]))
    else:
        trigger = OnState(WorkerState.HEALTHY)
    return ScheduledFault(fault, trigger, after_previous=bool(spec.get("after_previous", False)))


def to_spec(entry: ScheduledFault) -> dict[str, Any] | None:
    """The inverse of ``from_spec`` (fields equal to their defaults left out); None when
    the trigger has no spelling in the vocabulary."""
    from dataclasses import fields

    fault = entry.fault
    data: dict[str, Any] = {"kind": fault.kind}
    for f in fields(fault):
        value = getattr(fault, f.name)
        if value != f.default:
            data[f.name] = value
    trigger = entry.trigger
    if isinstance(trigger, HealthyThenAfter):
        data["after"] = trigger.seconds
    elif isinstance(trigger, AtStep):
        data.update(at_step=trigger.step, rank=trigger.rank)
    elif isinstance(trigger, OnState):
        data["on_state"] = trigger.state.value
        if trigger.node is not None:
            data["state_node"] = trigger.node
    elif isinstance(trigger, OnWorldSize):
        data["on_world_size"] = trigger.size
    else:
        return None
    if entry.after_previous:
        data["after_previous"] = True
    return data

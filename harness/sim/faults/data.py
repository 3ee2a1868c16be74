"""Faults as data: what to break, and when.

A ``Fault`` says what happens (a worker crash, a frozen node...), a ``Trigger`` says
when (now, after a delay, when a node reaches a state, when a rank reports a training
step). ``Job.inject(fault, trigger)`` schedules one; a schedule is a list of
``ScheduledFault`` and is plain data, so chaos mode can generate, print, replay and
shrink it.

Crashing with an *exit code* needs the worker's cooperation: ``harness.report_step``
checks for an order the harness left for its (rank, step) and exits with that code.
Signal crashes need nothing from the worker.

A fault kind is its row in ``harness.sim.schema.FAULT_KINDS`` and its class here, paired
by ``register(row, cls)``: the built-in kinds at the bottom of this module, any other
module's with the same call (a class left out is made from the row). Every kind is
applied by the one ``Fault.apply`` (the part its row names, the method of its name), so a
class holds data, a docstring, and nothing a row could say.
"""

from __future__ import annotations

import signal
from dataclasses import asdict, dataclass, field, make_dataclass
from dataclasses import fields as dataclass_fields
from typing import TYPE_CHECKING, Any, ClassVar, cast

from harness.errors import ConfigError
from harness.sim import schema
from harness.sim.checks import number
from harness.sim.truth.progress import ORDERS_ENV
from harness.states import WorkerState

if TYPE_CHECKING:
    from harness.sim.faults.target import ScheduledJob

#: what ``harness.faults`` shows users (the rest of ``__all__`` serves the harness itself)
PUBLIC = [
    "Fault", "WorkerKill", "WorkerHang", "AgentKill", "NodeKill", "NodeRemove", "NodeAdd",
    "NodeFreeze", "StoreHostKill", "Partition", "Heal", "PacketLoss", "Bandwidth", "LinkDown",
    "SlowNode", "MemoryLimit", "DiskFull", "SlowIO", "IoError",
    "Trigger", "Immediately", "After", "AfterHealthy", "OnState", "AtStep", "OnWorldSize", "OnFile",
    "ScheduledFault",
]
__all__ = [*PUBLIC, "ORDERS_ENV", "from_spec", "to_spec", "SPEC_KEYS", "fault_class", "register", "unregister",
           "BUILT_IN", "JobShape", "check_targets", "exit_order"]



# -- what ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fault:
    """What to break: the fields of its kind's row (``harness.sim.schema.FAULT_KINDS``),
    which says everything else about it (the part that applies it, whether it lasts...)."""

    kind: ClassVar[str] = "fault"

    def __post_init__(self) -> None:
        """Bad field values fail here, at construction, not when the fault fires (checks:
        the class's row in ``harness.sim.schema``; a class with no row checks nothing)."""
        row = schema.FAULT_KINDS.get(self.kind)
        if row is not None and row.cls == type(self).__name__:
            schema.check_fields(row.cls, ((p.name, p, getattr(self, p.name)) for p in row.params))

    def apply(self, job: ScheduledJob) -> None:
        """Hand the fault to the part of the job its row names, as the method of its kind's
        name with the row's parameters: ``WorkerKill(node=1)`` calls
        ``job.processes.kill_worker(node=1, local_rank=0, sig=9, exit_code=None)``. One
        apply for every kind, so that a new kind is its row and its part's method; the
        scheduler and chaos act through the part, never through ``Job``'s hand-offs. A kind
        whose row names no part (``heal``) has a class that applies itself."""
        row = schema.FAULT_KINDS[self.kind]
        if row.part is None:
            raise TypeError(f"{type(self).__name__}: the row of {self.kind!r} names no part, and the class "
                            "has no apply of its own")
        act = getattr(getattr(job, row.part), row.kind)
        act(**{p.name: getattr(self, p.name) for p in row.params})

    def describe(self) -> str:
        args = ", ".join(f"{k}={v}" for k, v in asdict(self).items())
        return f"{type(self).__name__}({args})"


@dataclass(frozen=True)
class WorkerKill(Fault):
    """A worker dies of ``sig`` (default SIGKILL), or exits with ``exit_code`` at its next
    ``report_step`` (exit codes need the worker to report steps)."""

    kind: ClassVar[str] = "kill_worker"
    node: int = 0
    local_rank: int = 0
    sig: int = int(signal.SIGKILL)
    exit_code: int | None = None


@dataclass(frozen=True)
class WorkerHang(Fault):
    kind: ClassVar[str] = "hang_worker"
    node: int = 0
    local_rank: int = 0


@dataclass(frozen=True)
class AgentKill(Fault):
    kind: ClassVar[str] = "kill_agent"
    node: int = 0


@dataclass(frozen=True)
class NodeKill(Fault):
    """The node's agent and workers are SIGKILLed at once; ``lose_unsynced``: what it wrote
    and never fsynced is gone too (``torn``: but a prefix of its last write)."""

    kind: ClassVar[str] = "kill_node"
    node: int = 0
    lose_unsynced: bool = False
    torn: bool = False


@dataclass(frozen=True)
class NodeRemove(Fault):
    kind: ClassVar[str] = "remove_node"
    node: int = 0


@dataclass(frozen=True)
class NodeAdd(Fault):
    kind: ClassVar[str] = "add_node"


@dataclass(frozen=True)
class NodeFreeze(Fault):
    kind: ClassVar[str] = "freeze_node"
    node: int = 0


@dataclass(frozen=True)
class StoreHostKill(Fault):
    kind: ClassVar[str] = "kill_store_host"


# network faults: need Cluster(network="netns"); each lasts until a Heal (or the job's end)


@dataclass(frozen=True)
class Partition(Fault):
    """Node ``node``'s packets to and from ``peers`` ("all", "store" or a list of nodes)
    are silently dropped; ``direction`` "in"/"out" cuts one way only."""

    kind: ClassVar[str] = "partition"
    node: int = 0
    peers: Any = "all"  # "all" | "store" | [node, ...]
    direction: str = "both"


@dataclass(frozen=True)
class Heal(Fault):
    """End node ``node``'s lasting faults, network and resource (``node=None``: every node's)."""

    kind: ClassVar[str] = "heal"
    node: int | None = None

    def apply(self, job: ScheduledJob) -> None:
        """Not a part's: ``job.heal`` asks every part whose faults last (``job.lasting``)."""
        job.heal(self.node)


@dataclass(frozen=True)
class PacketLoss(Fault):
    """Each of node ``node``'s packets is dropped with ``probability``, both ways."""

    kind: ClassVar[str] = "packet_loss"
    node: int = 0
    probability: float = 0.05


@dataclass(frozen=True)
class Bandwidth(Fault):
    """Node ``node``'s link is limited to ``rate`` ("1mbit", or bits per second)."""

    kind: ClassVar[str] = "bandwidth"
    node: int = 0
    rate: Any = "1mbit"


@dataclass(frozen=True)
class LinkDown(Fault):
    """Node ``node``'s cable is pulled (its interface loses carrier)."""

    kind: ClassVar[str] = "link_down"
    node: int = 0


# resource faults: need cgroups (harness.sim.resources); each lasts until a Heal (or the job's end)


@dataclass(frozen=True)
class SlowNode(Fault):
    """Node ``node``'s processes get ``cpu`` CPUs' worth of time (a CPU quota): a straggler."""

    kind: ClassVar[str] = "slow_node"
    node: int = 0
    cpu: float = 0.2


@dataclass(frozen=True)
class MemoryLimit(Fault):
    """Node ``node``'s processes share ``limit`` bytes of memory; past it the kernel's OOM
    killer ends one (a worker it takes is recorded with ``reason="oom"``)."""

    kind: ClassVar[str] = "memory_limit"
    node: int = 0
    limit: Any = "300M"


# storage faults: need the harness's FUSE filesystem; each lasts until a Heal (or the job's end)


@dataclass(frozen=True)
class DiskFull(Fault):
    """Writes and fsyncs on node ``node``'s disk (None: the shared filesystem) fail with ENOSPC."""

    kind: ClassVar[str] = "disk_full"
    node: int | None = None


@dataclass(frozen=True)
class SlowIO(Fault):
    """Every write and fsync on node ``node``'s disk (None: shared) takes ``delay`` s longer."""

    kind: ClassVar[str] = "slow_io"
    node: int | None = None
    delay: float = 0.2


@dataclass(frozen=True)
class IoError(Fault):
    """I/O on files matching ``path`` on node ``node``'s disk (None: shared) fails with ``errno``."""

    kind: ClassVar[str] = "io_error"
    node: int | None = None
    errno: int = 5
    path: str = "*"
    probability: float = 1.0


# -- when ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Trigger:
    """When a fault fires. The scheduler evaluates ``ready`` whenever events arrive, and at
    ``deadline`` for triggers that come due with time alone (no polling tick)."""

    def __post_init__(self) -> None:
        """Bad field values fail at construction (checks: the class's ``TriggerForm`` in
        ``harness.sim.schema``; ``_TRIGGER_FIELDS``)."""
        name = type(self).__name__
        fields = _TRIGGER_FIELDS.get(name, ())
        schema.check_fields(name, ((attr, key, getattr(self, attr)) for key, attr in fields))

    def ready(self, job: ScheduledJob, armed_at: float, now: float) -> bool:
        raise NotImplementedError

    def deadline(self, job: ScheduledJob, armed_at: float) -> float | None:
        """The monotonic time at which ``ready`` turns true if no event arrives before
        (None: only an event can make it ready)."""
        return None

    def never_met(self, job: ScheduledJob, armed_at: float) -> str:
        """Why this trigger, armed at ``armed_at``, was not met by the end of the job (one
        clause, for ``Job.wait``'s "never fired" error)."""
        return "its trigger was never met"


@dataclass(frozen=True)
class Immediately(Trigger):
    def ready(self, job: ScheduledJob, armed_at: float, now: float) -> bool:
        return True

    def never_met(self, job: ScheduledJob, armed_at: float) -> str:
        return "it was due at once"


@dataclass(frozen=True)
class After(Trigger):
    seconds: float = 0.0

    def ready(self, job: ScheduledJob, armed_at: float, now: float) -> bool:
        return now - armed_at >= self.seconds

    def deadline(self, job: ScheduledJob, armed_at: float) -> float | None:
        return armed_at + self.seconds

    def never_met(self, job: ScheduledJob, armed_at: float) -> str:
        return f"the job ended before {self.seconds:g}s had passed since it was scheduled"


@dataclass(frozen=True)
class OnState(Trigger):
    """When ``node`` (default: every running node) is in ``state`` with live workers."""

    state: WorkerState = WorkerState.HEALTHY
    node: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.state, WorkerState):  # "HEALTHY": the state of that name
            object.__setattr__(self, "state", WorkerState(self.state))

    def ready(self, job: ScheduledJob, armed_at: float, now: float) -> bool:
        return job.in_state(self.state, self.node)

    def never_met(self, job: ScheduledJob, armed_at: float) -> str:
        who = "every running node" if self.node is None else f"node {self.node}"
        live = " with live workers" if self.state == WorkerState.HEALTHY else ""
        return f"{who} was never {self.state.value}{live} while it was armed"


@dataclass(frozen=True)
class AtStep(Trigger):
    """When global ``rank`` has reported training ``step`` (``harness.report_step``)."""

    step: int = 0
    rank: int = 0

    def ready(self, job: ScheduledJob, armed_at: float, now: float) -> bool:
        for event in reversed(job.timeline.steps(self.rank)):  # newest first: stop at arming
            if event.get("mono", 0) < armed_at:
                return False
            if event.get("step", -1) >= self.step:
                return True
        return False

    def never_met(self, job: ScheduledJob, armed_at: float) -> str:
        every = job.timeline.steps(self.rank)
        steps = [e.get("step", -1) for e in every if e.get("mono", 0) >= armed_at]
        if steps:
            return f"rank {self.rank} reported steps up to {max(steps)} only, none >= {self.step}"
        before = [e.get("step", -1) for e in every if e.get("mono", 0) < armed_at]
        if before and max(before) >= self.step:  # armed late: the fault before it fired after the step
            return (f"rank {self.rank} reached step {self.step} before this trigger was armed (the fault "
                    f"before it fired late, after step {max(before)}), and reported no step after")
        if before:  # it trains, so it reports: the job ended (or stalled) before the step came
            return (f"rank {self.rank} reported no step after this trigger was armed (its last, step "
                    f"{max(before)}, came before)")
        return (f"rank {self.rank} reported no step >= {self.step} — does the script call "
                "harness.report_step?")


@dataclass(frozen=True)
class AfterHealthy(After):
    """``seconds`` after the job was first seen HEALTHY (so the fault meets live workers)."""

    def ready(self, job: ScheduledJob, armed_at: float, now: float) -> bool:
        first = job.first_healthy_time()
        return first is not None and now - max(first, armed_at) >= self.seconds

    def deadline(self, job: ScheduledJob, armed_at: float) -> float | None:
        first = job.first_healthy_time()
        return None if first is None else max(first, armed_at) + self.seconds

    def never_met(self, job: ScheduledJob, armed_at: float) -> str:
        if job.first_healthy_time() is None:
            return "the job was never HEALTHY"
        return f"the job ended less than {self.seconds:g}s after it was first HEALTHY"


@dataclass(frozen=True)
class OnWorldSize(Trigger):
    """When a rendezvous round forms with WORLD_SIZE ``size`` (after the trigger is armed)."""

    size: int = 1

    def ready(self, job: ScheduledJob, armed_at: float, now: float) -> bool:
        return any(e["world_size"] == self.size and e.get("mono", 0) >= armed_at
                   for e in job.timeline.events("rendezvous"))

    def never_met(self, job: ScheduledJob, armed_at: float) -> str:
        return (f"no rendezvous round of WORLD_SIZE {self.size} formed while it was armed "
                f"(rounds: {job.timeline.world_sizes()})")


@dataclass(frozen=True)
class OnFile(Trigger):
    """The moment a file matching ``path_glob`` (on its path below the disk's root, or on
    its name) is created or renamed, by a process of ``node`` (None: any). The operation is
    held inside the harness's filesystem until the fault has been applied: a node killed
    here dies with the file created but not written, or before the rename happened."""

    path_glob: str = "*"
    node: int | None = None

    def ready(self, job: ScheduledJob, armed_at: float, now: float) -> bool:
        return bool(job.storage.file_seen(self, self.path_glob, self.node))

    def never_met(self, job: ScheduledJob, armed_at: float) -> str:
        who = "" if self.node is None else f" by node {self.node}"
        return f"no file matching {self.path_glob!r} was created or renamed{who} while it was armed"


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


@dataclass(frozen=True)
class JobShape:
    """What a fault may target in a job: node indices ``0..nodes-1`` (the job's maximum,
    plus one per node join scheduled), ``nproc_per_node`` local ranks, ``world`` ranks."""

    nodes: int
    nproc_per_node: int
    world: int
    nnodes: str  # as the user wrote it, for the message


def check_targets(entry: ScheduledFault, shape: JobShape) -> None:
    """Raise ``ConfigError`` if ``entry`` names a node, local rank or rank the job can never
    have: such a fault would never fire (and wait() would only say so at the end)."""
    where = entry.describe()
    nodes = f"its nodes are 0..{shape.nodes - 1} (nnodes={shape.nnodes})"

    def node_ok(name: str, value: Any) -> None:
        if isinstance(value, int) and not 0 <= value < shape.nodes:
            raise ConfigError(name, value, f"names no node of this job: {nodes}", where)

    fault, trigger = entry.fault, entry.trigger
    node_ok("node", getattr(fault, "node", None))
    local_rank = getattr(fault, "local_rank", None)
    if isinstance(local_rank, int) and not 0 <= local_rank < shape.nproc_per_node:
        raise ConfigError("local_rank", local_rank, "names no worker of a node: local ranks are "
                          f"0..{shape.nproc_per_node - 1} (nproc_per_node={shape.nproc_per_node})", where)
    peers = getattr(fault, "peers", None)
    if isinstance(peers, (list, tuple)):
        for peer in peers:
            node_ok("peers", peer)
    if isinstance(trigger, AtStep) and not 0 <= trigger.rank < shape.world:
        raise ConfigError("rank", trigger.rank, f"names no rank of this job: ranks are 0..{shape.world - 1} "
                          f"(at most {shape.world} workers)", where)
    if isinstance(trigger, OnState):
        node_ok("state_node", trigger.node)
    if isinstance(trigger, OnFile):
        node_ok("file_node", trigger.node)
    if isinstance(trigger, OnWorldSize) and not 1 <= trigger.size <= shape.world:
        raise ConfigError("on_world_size", trigger.size, f"can never form: WORLD_SIZE is 1..{shape.world} "
                          "in this job", where)


def exit_order(rank: int, exit_code: int, step: int | None = None) -> tuple[str, str]:
    """An order ``report_step`` obeys, as (its file's name in the orders dir, its text):
    rank ``rank`` exits with ``exit_code`` at ``step`` (None: its next)."""
    return f"{rank}.{'any' if step is None else step}", str(int(exit_code))


# -- the registry: kind -> (row, class) -------------------------------------------------
# A kind is its row in harness.sim.schema and its Fault class here, paired by ``register``
# (the built-in kinds at the bottom of this module; any other module's with the same call).


#: kind -> its Fault class (``register``); the row is ``schema.FAULT_KINDS[kind]``
_CLASSES: dict[str, type[Fault]] = {}


def register(row: schema.FaultKind, cls: type[Fault] | None = None) -> type[Fault]:
    """Make ``row`` a fault kind, applied as its ``Fault`` class ``cls`` (None: a frozen
    dataclass made from the row: its ``cls`` name, its ``params`` as fields); the class.
    From now on specs, scenario files, ``--elastic-schedule``, chaos (with a ``chaos``
    name), the scenario skips, the report and the invariants know the kind: each reads
    the row. ``ConfigError`` if the class and the row disagree (kind, name, fields and
    defaults), if the row names no ``part`` and the class has no apply of its own, or if
    the kind is registered already with another row or class. Registering the same pair
    again does nothing. A plugin registers its kinds from its own module at import."""
    if cls is None:
        known = _CLASSES.get(row.kind)
        cls = known if known is not None and schema.FAULT_KINDS.get(row.kind) == row else _made_from(row)
    _check_pair(row, cls)
    known = _CLASSES.get(row.kind)
    if known is not None and known is not cls:
        raise ConfigError("kind", row.kind, f"is registered already, as {known.__name__}; unregister it first "
                          "or choose another name")
    schema.add_kind(row)
    _CLASSES[row.kind] = cls
    return cls


def unregister(kind: str) -> None:
    """Forget a kind ``register`` added (a test's fake kind; a plugin unloaded)."""
    _CLASSES.pop(kind, None)
    schema.remove_kind(kind)


def fault_class(kind: str) -> type[Fault]:
    """The ``Fault`` class of a spec kind (``"kill_node"`` -> ``NodeKill``); a row added to
    the schema alone (``schema.add_kind``) gets its class made from the row here."""
    cls = _CLASSES.get(kind)
    return cls if cls is not None else register(schema.FAULT_KINDS[kind])


def _made_from(row: schema.FaultKind) -> type[Fault]:
    """The ``Fault`` class of a row that has none written out: a frozen dataclass named
    ``row.cls`` whose fields are the row's params, with their defaults."""
    fields = [(p.name, Any, field(default=p.default)) for p in row.params]
    made = make_dataclass(row.cls, fields, bases=(Fault,), frozen=True,
                          namespace={"kind": row.kind, "__doc__": row.doc, "__module__": __name__})
    return cast("type[Fault]", made)


def _check_pair(row: schema.FaultKind, cls: type[Fault]) -> None:
    """``ConfigError`` naming the first thing on which ``cls`` and ``row`` disagree."""
    if not (isinstance(cls, type) and issubclass(cls, Fault)):
        raise ConfigError("cls", cls, f"must be a Fault subclass (the class of kind {row.kind!r})")
    if cls.kind != row.kind or cls.__name__ != row.cls:
        raise ConfigError("cls", cls.__name__, f"must be the row's class {row.cls!r} whose kind is {row.kind!r} "
                          f"(its kind: {cls.kind!r})")
    fields = [(f.name, f.default) for f in dataclass_fields(cls)]
    params = [(p.name, p.default) for p in row.params]
    if fields != params:
        raise ConfigError(row.cls, fields, f"must have the row's params, same order and defaults: {params}")
    if row.part is None and cls.apply is Fault.apply:
        raise ConfigError("part", None, f"needs an apply of {row.cls}'s own (the row names no part of the job)")


# -- the scenario vocabulary (``[[fault]]`` tables, ``--elastic-schedule`` JSON) -----------
# Written against harness.sim.schema only: a new fault kind or trigger form is a row there
# (plus, for a trigger form, its class above); nothing here names a kind, a key or a default.


def _class_of(name: str, base: type) -> Any:
    """The trigger class a schema row names, checked at import: a row without its class
    fails loudly here, not on first use."""
    cls = globals().get(name)
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise ImportError(f"harness.sim.schema names {name!r}, which is no {base.__name__} "
                          "subclass in harness.sim.faults")
    return cls


_TRIGGER_CLASSES: dict[str, type[Trigger]] = {form.key: _class_of(form.cls, Trigger) for form in schema.TRIGGERS}
#: trigger class name -> (key, field) of each field it checks at construction
_TRIGGER_FIELDS: dict[str, tuple[tuple[schema.Key, str], ...]] = {
    **{form.cls: form.fields for form in schema.TRIGGERS},
    "After": ((schema.Key("seconds", 0.0, "delay", number(0)), "seconds"),)}
_TRIGGER_FORMS: dict[type[Trigger], schema.TriggerForm] = {
    _TRIGGER_CLASSES[form.key]: form for form in schema.TRIGGERS}
SPEC_KEYS = schema.SPEC_KEYS


def from_spec(spec: dict[str, Any]) -> ScheduledFault:
    """``{"kind": "kill_node", "node": 1, "at_step": 8, "rank": 0}`` -> a ScheduledFault.
    Keys, triggers and defaults: ``harness.sim.schema`` (``python -m harness.sim.schema``
    prints them all). Raises ``ConfigError`` naming the bad key or kind; old spellings
    pass with a DeprecationWarning."""
    spec = schema.modern_spec(spec)
    schema.check_fault_spec(spec)
    row = schema.FAULT_KINDS[spec["kind"]]
    fault = fault_class(row.kind)(**{p.name: spec[p.name] for p in row.params if p.name in spec})
    form = schema.trigger_form(spec)
    if form is None:  # no trigger key: the default trigger
        spec = {**spec, **schema.DEFAULT_TRIGGER}
        form = schema.trigger_form(spec)
        assert form is not None
    trigger = _TRIGGER_CLASSES[form.key](
        **{attr: key.to_python(spec.get(key.name, key.default)) for key, attr in form.fields})
    return ScheduledFault(fault, trigger, after_previous=spec.get(schema.AFTER_PREVIOUS.name, False))


def to_spec(entry: ScheduledFault) -> dict[str, Any] | None:
    """The inverse of ``from_spec`` (optional keys equal to their defaults left out); None
    when the trigger has no spelling in the vocabulary (``Immediately``, a plain ``After``)."""
    form = _TRIGGER_FORMS.get(type(entry.trigger))
    if form is None:
        return None
    fault = entry.fault
    data: dict[str, Any] = {"kind": fault.kind}
    for param in schema.FAULT_KINDS[fault.kind].params:
        value = getattr(fault, param.name)
        if value != param.default:
            data[param.name] = value
    for i, (key, attr) in enumerate(form.fields):
        value = getattr(entry.trigger, attr)
        value = getattr(value, "value", value)  # enums are spelled by value
        if i == 0 or value != key.default:
            data[key.name] = value
    if entry.after_previous:
        data[schema.AFTER_PREVIOUS.name] = True
    return data


#: the classes written out above, each registered with its row (other modules: ``register``)
_WRITTEN_OUT: tuple[type[Fault], ...] = (
    WorkerKill, WorkerHang, AgentKill, NodeKill, NodeRemove, NodeAdd, NodeFreeze, StoreHostKill,
    Partition, Heal, PacketLoss, Bandwidth, LinkDown, SlowNode, MemoryLimit, DiskFull, SlowIO, IoError)
for _cls in _WRITTEN_OUT:
    register(schema.FAULT_KINDS[_cls.kind], _cls)
for _row in list(schema.FAULT_KINDS.values()):  # a row written without its class: one made from it
    register(_row)
#: the built-in kinds' classes: every row of the schema's table, written out or made from it
BUILT_IN: tuple[type[Fault], ...] = tuple(_CLASSES[kind] for kind in schema.FAULT_KINDS)


def __getattr__(name: str) -> Any:
    """The class of a kind registered without one written out (``register(row)``), by its
    name; old class names (``WorkerCrash``...), with a DeprecationWarning."""
    made = next((cls for cls in _CLASSES.values() if cls.__name__ == name), None)
    if made is not None:
        return made
    new = schema.RENAMED_CLASSES.get(name)
    if new is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    schema.deprecated(name, new, "fault class")
    return globals()[new]

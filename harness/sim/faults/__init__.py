"""Faults: what to break and when (as data), the door a fault goes through, and what fires it.

* ``data``: every ``Fault`` class and ``Trigger``, the scenario vocabulary (``from_spec``,
  ``to_spec``) and ``register``: each kind paired with its row in ``harness.sim.schema``;
* ``target``: the ``FaultTarget`` protocol, the job as a part sees it (the parts themselves
  live in the rooms of what they break: ``nodes.faults``, ``net.faults``, ``storage.faults``,
  ``resources.faults``);
* ``methods``: ``hand_off``, how ``Job`` offers a part's method as its own (the public API);
* ``scheduler``: ``FaultScheduler``, which fires a job's scheduled faults on the event bus;
* ``chaos``: seeded, replayable random schedules.

``harness.sim.faults`` is ``data``'s face: it exports what that module exports (the names the
harness, plugins and ``harness.faults`` import from here), and any other name of it too.
"""

from typing import Any

from harness.sim.faults import data as _data
from harness.sim.faults.data import (
    BUILT_IN,
    ORDERS_ENV,
    SPEC_KEYS,
    After,
    AfterHealthy,
    AgentKill,
    AtStep,
    Bandwidth,
    DiskFull,
    Fault,
    Heal,
    Immediately,
    IoError,
    JobShape,
    LinkDown,
    MemoryLimit,
    NodeAdd,
    NodeFreeze,
    NodeKill,
    NodeRemove,
    OnFile,
    OnState,
    OnWorldSize,
    PacketLoss,
    Partition,
    ScheduledFault,
    SlowIO,
    SlowNode,
    StoreHostKill,
    Trigger,
    WorkerHang,
    WorkerKill,
    check_targets,
    exit_order,
    fault_class,
    from_spec,
    register,
    to_spec,
    unregister,
)

__all__ = [  # = data.__all__ (tests/unit/test_exports.py)
    "Fault", "WorkerKill", "WorkerHang", "AgentKill", "NodeKill", "NodeRemove", "NodeAdd",
    "NodeFreeze", "StoreHostKill", "Partition", "Heal", "PacketLoss", "Bandwidth", "LinkDown",
    "SlowNode", "MemoryLimit", "DiskFull", "SlowIO", "IoError",
    "Trigger", "Immediately", "After", "AfterHealthy", "OnState", "AtStep", "OnWorldSize", "OnFile",
    "ScheduledFault",
    "ORDERS_ENV", "from_spec", "to_spec", "SPEC_KEYS", "fault_class", "register", "unregister",
    "BUILT_IN", "JobShape", "check_targets", "exit_order",
]


def __getattr__(name: str) -> Any:
    """Every other name of ``data`` (a class made from a row by ``register``; an old class
    name, with its DeprecationWarning), as before ``harness.sim.faults`` was a package."""
    return getattr(_data, name)

"""Faults as data (public face of ``harness.sim.faults``): what to break, and when.

``from harness.faults import NodeKill, AtStep`` is the import path users and scenario
authors rely on; the implementation lives in the simulation layer. Each fault
has one name: its class here, its ``Job`` method, its scenario kind and its chaos kind
(docs/reference/faults.md; ``harness.sim.schema.FAULT_KINDS``). The errors a fault can end in
come from here too: ``FaultError`` (a scheduled fault could not be applied; ``Job.wait``
raises it), ``FaultNotFired`` (the job ended with it still pending), ``TargetNotReady``
(its target is not running now) and ``FaultRefused`` (its node's host cannot carry it out:
a ``ConfigError`` raised when it is scheduled). The spec helpers (``from_spec``, ``to_spec``...) serve
the harness itself: ``harness.sim.faults``.
"""

from typing import Any

from harness.sim import faults as _faults
from harness.sim.errors import FaultError, FaultNotFired, FaultRefused, TargetNotReady
from harness.sim.faults import (
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
)

__all__ = [  # = harness.sim.faults.PUBLIC + the errors (tests/unit/test_exports.py)
    "Fault", "WorkerKill", "WorkerHang", "AgentKill", "NodeKill", "NodeRemove", "NodeAdd",
    "NodeFreeze", "StoreHostKill", "Partition", "Heal", "PacketLoss", "Bandwidth", "LinkDown",
    "SlowNode", "MemoryLimit", "DiskFull", "SlowIO", "IoError",
    "Trigger", "Immediately", "After", "AfterHealthy", "OnState", "AtStep", "OnWorldSize", "OnFile",
    "ScheduledFault", "FaultError", "FaultNotFired", "TargetNotReady", "FaultRefused",
]
#: internal names this module used to export: still reachable, with a DeprecationWarning
_MOVED = ("ORDERS_ENV", "SPEC_KEYS", "to_spec", "from_spec", "fault_class")


def __getattr__(name: str) -> Any:
    """Old class names (``WorkerCrash``...) and the internals once exported here still
    work, each with a DeprecationWarning naming what to use."""
    from harness.sim import schema

    if name in _MOVED:
        schema.deprecated(f"harness.faults.{name}", f"harness.sim.faults.{name}", "internal name")
        return getattr(_faults, name)
    new = schema.RENAMED_CLASSES.get(name)
    if new is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    schema.deprecated(name, new, "fault class")
    return getattr(_faults, new)

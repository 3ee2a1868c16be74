"""Faults as data (public face of ``harness.sim.faults``): what to break, and when.

``from harness.faults import NodeKill, AtStep`` is the import path users and scenario
authors rely on (DESIGN.md); the implementation lives in the simulation layer. The two
errors a fault can end in come from here too: ``FaultError`` (a scheduled fault could not
be applied; ``Job.wait`` raises it) and ``TargetNotReady`` (its target is not running).
"""

from harness.sim.faults import *  # noqa: F403
from harness.sim.faults import __all__ as _fault_names
from harness.sim.scheduler import FaultError, FaultNotFired, TargetNotReady

__all__ = [*_fault_names, "FaultError", "FaultNotFired", "TargetNotReady"]

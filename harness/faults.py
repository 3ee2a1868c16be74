"""Faults as data (public face of ``harness.sim.faults``): what to break, and when.

``from harness.faults import NodeKill, AtStep`` is the import path users and scenario
authors rely on (DESIGN.md); the implementation lives in the simulation layer.
"""

from harness.sim.faults import *  # noqa: F403
from harness.sim.faults import __all__  # noqa: F401

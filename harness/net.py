"""Deprecated alias of ``harness.endpoints`` (ports and endpoints), kept because the
README and ``harness``'s docstring named it: importing it warns once and hands back the
same objects. Renamed because it sat beside ``harness.sim.net`` (the simulated network),
which it has nothing to do with."""

from __future__ import annotations

import warnings

from harness.endpoints import PortReservation, fqdn, split_endpoint

__all__ = ["PortReservation", "fqdn", "split_endpoint"]

warnings.warn("harness.net is deprecated: import harness.endpoints (the same names)",
              DeprecationWarning, stacklevel=2)

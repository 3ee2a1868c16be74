"""The simulation's errors, in one leaf: what a cluster, a job, a fault or a verdict can end in.

Each derives from the runtime's root (``harness.errors.ElasticError``: one ``except`` catches
every error we raise on purpose), but ``JobHung``, a ``TimeoutError`` as a wait's timeout is.
This module imports nothing of the harness but ``harness.errors`` (``tests/unit/test_layers.py``
pins it), so any module may raise or catch these without importing the module that raises
them. Each is also importable where it was first defined (``harness.sim.cluster.ClusterLeakError``,
``harness.sim.faults.scheduler.FaultError``...); users import them from ``harness`` and
``harness.faults``.
"""

from __future__ import annotations

from typing import Protocol

from harness.errors import ConfigError, ElasticError

__all__ = ["ClusterLeakError", "FaultError", "FaultNotFired", "FaultRefused", "InvariantViolation", "JobHung",
           "NetworkError", "NetworkUnavailable", "TargetNotReady", "TwinError"]


class ClusterLeakError(ElasticError):
    """Something the cluster started was still alive after ``close()`` tried to end it."""


class _Printable(Protocol):
    """What a violation prints the job with: its timeline (``Timeline.format``)."""

    def format(self) -> str: ...


class InvariantViolation(ElasticError):
    """An elastic invariant was broken; the message carries the timeline."""

    def __init__(self, violations: list[str], timeline: _Printable):
        self.violations = violations
        text = "\n".join(f"  - {v}" for v in violations)
        super().__init__(f"{len(violations)} invariant(s) violated:\n{text}\n"
                         f"timeline:\n{timeline.format()}")


class JobHung(TimeoutError):
    """A node outlived its peers' finished training by more than the exit barrier; the
    message says which, what its workers last did, and their stacks."""


class FaultError(ElasticError):
    """A scheduled fault could not be applied; the message names it and says why."""


class FaultNotFired(FaultError):
    """The job ended with scheduled faults that never fired (``Job.wait``); the message
    names each and says why; ``unfired`` holds their descriptions."""

    def __init__(self, reasons: list[tuple[str, str]]):
        self.unfired = [what for what, _ in reasons]
        lines = "; ".join(f"{what} never fired: {why}" for what, why in reasons)
        super().__init__(f"{len(reasons)} scheduled fault(s) never fired before the job ended: {lines} "
                         "(wait(allow_unfired=True), or [expect] allow_unfired = true in a scenario, "
                         "if that is expected)")


class TargetNotReady(FaultError):
    """The fault's target exists but cannot take it now (a worker between rounds, a node
    that already exited); a scheduled fault stays pending and is retried. Not bad input
    (no ``ConfigError``/``ValueError``): the same call may succeed a moment later."""

    def __init__(self, name: str, value: object, constraint: str):
        self.name, self.value, self.constraint = name, value, constraint
        super().__init__(f"{name}={value!r} {constraint}")


class FaultRefused(ConfigError):
    """A fault the host of its node cannot carry out, refused when it is scheduled
    (``inject()``): one line naming the fault, the host and what it lacks."""

    def __init__(self, fault: str, why: str):
        super().__init__("fault", fault, f"is refused: {why}")


class TwinError(ElasticError):
    """The fault-free twin did not succeed: nothing to compare against."""


class NetworkError(ElasticError):
    """A namespace, link or rule could not be created or changed (the tool's error attached)."""


class NetworkUnavailable(ConfigError):
    """A network fault asked of a cluster whose nodes are not network hosts (loopback mode);
    the message names what is missing. Under pytest such a test is skipped with it."""

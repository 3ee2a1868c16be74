"""The runtime's settings that more than one door takes: their defaults and their one rule.

``WorkerSpec``, ``LaunchConfig``, ``elastic-run``'s flags and (through ``harness.sim.schema``)
``Cluster``, the marker and scenario files take ``max_restarts`` and ``monitor_interval``. Each
door used to say the rule in its own words (``max_restarts`` was checked four times, three
ways; the CLI refused a ``monitor_interval`` the schema let through to every node agent, which
then died on it); now each applies the one ``SettingRule`` here, with the one default here.

A leaf: it imports nothing of the harness but ``harness.errors``, so the pytest plugin's
schema reads it without loading the agent (``pytest --help`` stays free of the engine).
``harness.agent`` re-exports every name (``harness.agent.MAX_RESTARTS_RULE``...).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from harness.errors import ConfigError

__all__ = ["SettingRule", "DEFAULT_MAX_RESTARTS", "DEFAULT_MONITOR_INTERVAL", "MAX_MONITOR_INTERVAL",
           "MAX_RESTARTS_RULE", "MONITOR_INTERVAL_RULE"]

T = TypeVar("T")

#: restarts of the worker group a job may use when nobody says: the one default of
#: ``WorkerSpec``, ``LaunchConfig``, ``Cluster`` and a scenario's ``[job]`` (``elastic-run``'s
#: ``--max-restarts`` keeps torchrun's 0)
DEFAULT_MAX_RESTARTS = 3
#: seconds between the agent's looks at its workers when nobody says (torchrun's too)
DEFAULT_MONITOR_INTERVAL = 0.1
#: the agent's wait between checks is at most this (1e28 or inf: OverflowError in poll())
MAX_MONITOR_INTERVAL = 3600.0


@dataclass(frozen=True)
class SettingRule:
    """What a setting must be, as a predicate and in words (``must be an int >= 0``).

    ``rule(value)`` answers yes or no (the schema's ``Check`` wraps that); ``rule.check(value,
    source)`` raises the one-line ``ConfigError``: ``max_restarts=-1 must be an int >= 0 (from
    --max-restarts)``."""

    name: str
    test: Callable[[Any], bool]
    says: str

    def __call__(self, value: Any) -> bool:
        return self.test(value)

    def check(self, value: T, source: str | None = None) -> T:
        """``value`` if it obeys the rule; else ``ConfigError`` naming ``source`` (a flag, ...)."""
        if not self.test(value):
            raise ConfigError(self.name, value, self.says, source)
        return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)  # nan fails every comparison


MAX_RESTARTS_RULE = SettingRule("max_restarts", lambda v: _is_int(v) and v >= 0, "must be an int >= 0")
MONITOR_INTERVAL_RULE = SettingRule(
    "monitor_interval", lambda v: _is_number(v) and 0 < v <= MAX_MONITOR_INTERVAL,
    f"must be a number > 0 and at most {MAX_MONITOR_INTERVAL:g} (s)")

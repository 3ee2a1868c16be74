"""How a run is replayed: the pytest command line that runs a test again as it ran, and
chaos schedules as the JSON ``--elastic-schedule`` takes (a scenario's ``[[fault]]`` keys).

A leaf of the plugin (it imports only ``_settings``, and the harness lazily): the session,
shrinking and the report index all print replay lines.
"""

from __future__ import annotations

import json
from typing import Any

from pytest_elastic._settings import Settings, parse_schedule

__all__ = ["Schedules", "rerun_line", "reproduction_line", "entry_to_json", "entry_from_json", "schedules_to_json",
           "schedules_from_json"]

Schedules = tuple[tuple[Any, ...], ...]  # per job, ScheduledFault entries


def reproduction_line(test_id: str, settings: Settings, schedule: str | None = None,
                      shrink_budget: int | None = None) -> str:
    """The command that replays this test's chaos run (``schedule``: exact JSON schedules)."""
    from harness.sim.schema import DEFAULT_CHAOS_KINDS

    line = f"{_pytest(test_id, settings)} --elastic-chaos --elastic-seed={settings.seed}"
    if settings.faults != ",".join(DEFAULT_CHAOS_KINDS):
        line += f" --elastic-faults={settings.faults}"
    if settings.overload:
        line += " --elastic-chaos-overload"
    schedule = schedule if schedule is not None else settings.schedule
    if schedule is not None:
        line += f" --elastic-schedule='{schedule}'"
    if shrink_budget is not None:
        line += f" --elastic-shrink-budget={shrink_budget}"
    return line


def rerun_line(test_id: str, settings: Settings, chaotic: bool) -> str:
    """The command that runs this test again as it ran (its chaos seed included)."""
    return reproduction_line(test_id, settings) if chaotic else _pytest(test_id, settings)


def _pytest(test_id: str, settings: Settings) -> str:
    """``pytest 'TEST'``, where it ran (``--elastic-hosts``, ``--elastic-slurm``): chaos draws
    from what the nodes there can do."""
    line = f"pytest '{test_id}'"
    if settings.place is not None:
        line += f" {settings.place.argument()}"
    return line


def entry_to_json(entry: Any) -> dict[str, Any] | None:
    """One fault in the vocabulary of a scenario's ``[[fault]]``; None when its trigger has
    no spelling there."""
    from harness.sim.faults import to_spec

    return to_spec(entry)


def schedules_to_json(schedules: Schedules) -> str | None:
    """Compact JSON for ``--elastic-schedule``; None when an entry cannot be spelled."""
    out = []
    for job in schedules:
        entries = [entry_to_json(e) for e in job]
        if any(e is None for e in entries):
            return None
        out.append(entries)
    return json.dumps(out, separators=(",", ":"))


def entry_from_json(data: dict[str, Any]) -> Any:
    from harness.sim.faults import from_spec

    return from_spec(data)


def schedules_from_json(text: str) -> Schedules:
    return tuple(tuple(entry_from_json(e) for e in job) for job in parse_schedule(text))

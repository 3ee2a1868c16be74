"""``pytest --lf`` replays a failed chaos test with the schedule it failed with.

pytest's ``--lf`` reruns what failed; for a chaos test that is only half the story: a new
random seed gives it other faults, and it may pass without anything having been fixed. So
the controller keeps, in pytest's cache (``elastic/lastfailed``), the session seed, fault
kinds and exact schedule (the minimal one when shrinking found it) of every chaos test
that failed, drops a test's entry when it passes, and a later ``--lf`` session runs each
such test with exactly that schedule, says so in its header and in the test's chaos
section (pytest-randomly keeps its seed for ``--lf`` the same way). A seed or schedule
given on the command line wins: then nothing is replayed.

The cache holds JSON only (what ``--elastic-schedule`` takes), read back through the same
validation as that option: an entry that does not parse is dropped, never trusted.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import pytest

from pytest_elastic._settings import Settings, parse_schedule

__all__ = ["CACHE_KEY", "Replay", "load_replays", "remember_outcomes", "replay_settings", "replaying",
           "replays_of"]

CACHE_KEY = "elastic/lastfailed"


@dataclass(frozen=True)
class Replay:
    """How a chaos test failed last: enough to run it again the same way."""

    seed: int
    faults: str
    overload: bool
    schedule: str

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> Replay | None:
        """None for anything that is not an entry we wrote (the cache is a plain directory)."""
        try:
            replay = cls(seed=int(data["seed"]), faults=str(data["faults"]),
                         overload=bool(data["overload"]), schedule=str(data["schedule"]))
            parse_schedule(replay.schedule)
        except (KeyError, TypeError, ValueError):
            return None
        return replay


_REPLAYS = pytest.StashKey[dict[str, Replay]]()


def _cache(config: pytest.Config) -> Any:
    return getattr(config, "cache", None)


def load_replays(config: pytest.Config, settings: Settings) -> dict[str, Replay]:
    """The failed chaos tests' schedules to replay in this session: only under ``--lf``,
    and not when the command line names a seed or a schedule."""
    replays: dict[str, Replay] = {}
    cache = _cache(config)
    if cache is not None and getattr(config.option, "lf", False) and not settings.seed_given \
            and settings.schedule is None:
        stored = cache.get(CACHE_KEY, {})
        if isinstance(stored, dict):
            for test_id, data in stored.items():
                replay = Replay.from_json(data)
                if replay is not None:
                    replays[str(test_id)] = replay
    config.stash[_REPLAYS] = replays
    return replays


def replays_of(config: pytest.Config) -> dict[str, Replay]:
    """Every schedule this session replays, by test id."""
    return config.stash.get(_REPLAYS, {})


def replaying(config: pytest.Config, test_id: str) -> Replay | None:
    """The schedule ``test_id`` replays in this session, if any."""
    return replays_of(config).get(test_id)


def replay_settings(settings: Settings, replay: Replay) -> Settings:
    """The settings a replayed test runs under: chaos on, its old seed, kinds and schedule,
    no shrinking (the schedule is already the one to look at)."""
    return dataclasses.replace(settings, chaos=True, seed=replay.seed, seed_given=True, faults=replay.faults,
                               overload=replay.overload, schedule=replay.schedule, shrink_budget=0)


def remember_outcomes(config: pytest.Config, stats: list[dict[str, Any]]) -> None:
    """Update the cache from this session's elastic tests: a failed chaos test's schedule
    is kept (the minimal one when shrinking found it), a test that passed is forgotten,
    tests that did not run keep their entries (``--lf`` may run a subset)."""
    cache = _cache(config)
    if cache is None or not stats:
        return
    stored = cache.get(CACHE_KEY, {})
    entries: dict[str, Any] = dict(stored) if isinstance(stored, dict) else {}
    for s in stats:
        test_id = s.get("elastic_test")
        if not test_id:
            continue
        schedule = s.get("elastic_minimal_schedule") or s.get("elastic_schedule")
        if s.get("elastic_outcome") == "failed" and s.get("elastic_seed") is not None and schedule:
            entries[str(test_id)] = Replay(seed=int(s["elastic_seed"]), faults=str(s.get("elastic_chaos_faults", "")),
                                           overload=bool(s.get("elastic_chaos_overload", False)),
                                           schedule=str(schedule)).to_json()
        else:
            entries.pop(str(test_id), None)
    cache.set(CACHE_KEY, entries)

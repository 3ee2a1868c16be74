"""Seeded, replayable random fault schedules (``pytest --elastic-chaos``).

A schedule depends only on (seed, the job's shape, the fault kinds), never on timing, so
the same seed gives the same fault history on any machine, under ``-n auto`` and in any
test order. Worker failures stay within ``max_restarts`` unless ``overload`` is set;
membership faults keep at least ``min_nodes`` nodes.

Chaos draws only what the job can survive by its own configuration (``survivable``): a
kind the job has no means to survive is left out of its schedule, and the job's
``chaos_schedule`` event says which and why (the plugin's report and summary show it).
The rule per kind is in docs/chaos.md.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from harness.sim import schema
from harness.sim.faults.data import AfterHealthy, Fault, Heal, ScheduledFault, fault_class

# (FAULT_KINDS: made at each use by the module's __getattr__)
__all__ = ["FAULT_KINDS", "ChaosConfig", "AfterHealthy", "JobFacts", "derive_seed",  # noqa: F822
           "generate_schedule", "parse_fault_kinds", "survivable"]

DEFAULT_KINDS = schema.DEFAULT_CHAOS_KINDS
#: ``"kill_worker,scale"`` -> ``("kill_worker", "remove_node", "add_node")`` (ConfigError naming unknown kinds)
parse_fault_kinds = schema.parse_chaos_kinds


def derive_seed(base_seed: int, test_id: str) -> int:
    """Per-test seed: stable across processes and runs (no PYTHONHASHSEED dependence)."""
    digest = hashlib.sha256(f"{base_seed}:{test_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") & 0x7FFF_FFFF


@dataclass(frozen=True)
class ChaosConfig:
    seed: int
    kinds: tuple[str, ...] = DEFAULT_KINDS
    overload: bool = False
    max_faults: int | None = None
    #: latest delay (s) after the first HEALTHY state at which a fault may fire
    horizon: float = 1.0
    on_job: list[Any] = field(default_factory=list, compare=False)  # observers (the plugin's report)
    #: explicit schedules, one per job in launch order, used instead of generating one
    #: (replay of a printed schedule, the plugin's shrinking); jobs past the end generate
    schedules: tuple[tuple[ScheduledFault, ...], ...] | None = None
    #: nodes the test's own faults take out (a scenario's node kill or partition): chaos
    #: keeps them spare, or its own node faults on top would drop the job below min_nodes
    #: and fail it for a reason the test never meant to test
    reserved_nodes: int = 0
    #: kinds taken out of ``kinds`` before the job was seen (a scenario's own faults leave
    #: them no room) -> why; the job's ``chaos_schedule`` event lists them with its own
    left_out: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class JobFacts:
    """What chaos must know of a job to draw only the faults it can survive."""

    min_nodes: int
    max_nodes: int
    #: nodes the job starts with
    nodes: int
    #: nodes the test's own faults take out (``ChaosConfig.reserved_nodes``)
    reserved_nodes: int = 0
    #: the job's agents run the file-timer watchdog (``TORCHELASTIC_ENABLE_FILE_TIMER=1``)
    watchdog: bool = False
    #: a need of ``harness.sim.schema.NEEDS`` the job's machine or settings lack -> why
    missing: Mapping[str, str] = field(default_factory=dict)


#: why a job without the watchdog cannot survive ``hang_worker``
NO_WATCHDOG = ("nothing reaps a hung worker: the job's agents run no watchdog (set "
               "TORCHELASTIC_ENABLE_FILE_TIMER=1 in the job's env) for its steps' timers "
               "(torch.distributed.elastic.timer.expires around each step)")


def survivable(kinds: tuple[str, ...], facts: JobFacts) -> tuple[tuple[str, ...], dict[str, str]]:
    """The kinds of ``kinds`` the job ``facts`` describes can survive by its own
    configuration, and those left out, each with why (one clause)."""
    left_out: dict[str, str] = {}
    spare = facts.nodes - facts.min_nodes - facts.reserved_nodes
    for kind in kinds:
        row = schema.CHAOS_KINDS[kind]
        lacking = [facts.missing[need] for need in row.needs if need in facts.missing]
        if lacking:
            left_out[kind] = lacking[0]
        elif kind == "hang_worker" and not facts.watchdog:
            left_out[kind] = NO_WATCHDOG
        elif row.membership < 0 and spare <= 0:
            taken = f", and the test's own faults take {facts.reserved_nodes}" if facts.reserved_nodes else ""
            left_out[kind] = (f"the job has no node to spare: it starts {facts.nodes} and needs "
                              f"min_nodes={facts.min_nodes}{taken}")
    takes = any(schema.CHAOS_KINDS[k].membership < 0 for k in kinds if k not in left_out)
    for kind in kinds:
        if schema.CHAOS_KINDS[kind].membership > 0 and kind not in left_out and facts.nodes >= facts.max_nodes \
                and not takes:
            left_out[kind] = f"the job starts at its max_nodes ({facts.max_nodes}) and chaos takes no node out"
    return tuple(kind for kind in kinds if kind not in left_out), left_out


#: faults in one generated schedule, at most (a job's restart budget may be any int)
MAX_FAULTS = 64


def generate_schedule(seed: int, kinds: tuple[str, ...], min_nodes: int, max_nodes: int,
                      nproc_per_node: int, max_restarts: int, overload: bool = False,
                      max_faults: int | None = None, horizon: float = 1.0,
                      initial_nodes: int | None = None, reserved_nodes: int = 0,
                      protected_nodes: tuple[int, ...] = ()) -> list[ScheduledFault]:
    """A random but reproducible schedule for one job; no fault that takes a node out
    (``membership`` -1) lands on ``protected_nodes`` (node 0 where it hosts the store)."""
    rng = random.Random(seed)
    nodes = initial_nodes if initial_nodes is not None else max_nodes
    failure_budget = max_restarts + (1 + rng.randrange(2) if overload else 0)
    budget = failure_budget if max_faults is None else min(failure_budget, max_faults)
    spare = nodes - min_nodes - reserved_nodes  # nodes we may lose and still run
    schedule: list[ScheduledFault] = []
    delay = 0.0
    count = rng.randint(1, max(1, budget)) if budget else 0
    count = min(count, MAX_FAULTS)  # max_restarts=10**18 drew that many faults (a hang)
    if max_faults is not None:
        count = min(count, max_faults)
    if not count:  # no restart to spare: only faults that cost none (network, membership)
        kinds = tuple(k for k in kinds if not schema.CHAOS_KINDS[k].failure)
        count = rng.randint(1, 2) if kinds else 0
    alive = list(range(nodes))
    for _ in range(count):
        takeable = [n for n in alive if n not in protected_nodes]
        choices = [k for k in kinds if _possible(schema.CHAOS_KINDS[k], alive, takeable, spare, nodes, max_nodes)]
        if not choices:
            break
        kind = rng.choice(choices)
        delay = round(delay + rng.uniform(0.05, horizon / max(1, count)), 3)
        node = rng.choice(takeable if schema.CHAOS_KINDS[kind].membership < 0 else alive)
        local_rank = rng.randrange(nproc_per_node)
        row = schema.CHAOS_KINDS[kind]
        fault = _make(row, node, local_rank, rng)
        if row.membership < 0:
            alive.remove(node)
            spare -= 1
        elif row.membership > 0:
            nodes += 1
            alive.append(nodes - 1)
        schedule.append(ScheduledFault(fault, _trigger(delay)))
        if row.heal_after is not None:  # a lasting fault: healed before the job can end
            low, high = row.heal_after
            lasts = round(low + rng.random() * (high - low), 3)
            schedule.append(ScheduledFault(Heal(node=node), AfterHealthy(seconds=lasts), after_previous=True))
            delay = round(delay + lasts, 3)
    return schedule


def _possible(row: schema.FaultKind, alive: list[int], takeable: list[int], spare: int, nodes: int,
              max_nodes: int) -> bool:
    if row.membership < 0:
        return spare > 0 and len(alive) > 1 and bool(takeable)
    if row.membership > 0:
        return nodes < max_nodes
    return bool(alive)


def _make(row: schema.FaultKind, node: int, local_rank: int, rng: random.Random) -> Fault:
    """The row's fault at ``node``/``local_rank``; each ``chaos_choices`` parameter drawn
    (one ``rng.random()`` each, in parameter order: the same seed, the same faults)."""
    values: dict[str, object] = {}
    for param in row.params:
        if param.name == "node":
            values["node"] = node
        elif param.name == "local_rank":
            values["local_rank"] = local_rank
        if param.name in row.chaos_choices:
            options = row.chaos_choices[param.name]
            values[param.name] = options[int(rng.random() * len(options))]
    return fault_class(row.kind)(**values)


def _trigger(delay: float) -> AfterHealthy:
    """Fire ``delay`` s after the job first became HEALTHY (so the fault meets workers)."""
    return AfterHealthy(seconds=delay)


def __getattr__(name: str) -> Any:
    """``FAULT_KINDS``: the kinds chaos generates (``--elastic-faults``), each a row of
    ``harness.sim.schema`` with a ``chaos`` name, as the schema has them now (kinds
    registered since this module was imported included)."""
    if name == "FAULT_KINDS":
        return tuple(schema.CHAOS_KINDS)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

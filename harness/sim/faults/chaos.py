"""Seeded, replayable random fault schedules (``pytest --elastic-chaos``).

A schedule depends only on (seed, the job's shape, the fault kinds), never on timing, so
the same seed gives the same fault history on any machine, under ``-n auto`` and in any
test order. Worker failures stay within ``max_restarts`` unless ``overload`` is set;
membership faults keep at least ``min_nodes`` nodes.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field
from typing import Any

from harness.sim import schema
from harness.sim.faults.data import AfterHealthy, Fault, Heal, ScheduledFault, fault_class

__all__ = ["FAULT_KINDS", "ChaosConfig", "AfterHealthy", "derive_seed", "generate_schedule",  # noqa: F822
           "parse_fault_kinds"]  # (FAULT_KINDS: made at each use by the module's __getattr__)

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


#: faults in one generated schedule, at most (a job's restart budget may be any int)
MAX_FAULTS = 64


def generate_schedule(seed: int, kinds: tuple[str, ...], min_nodes: int, max_nodes: int,
                      nproc_per_node: int, max_restarts: int, overload: bool = False,
                      max_faults: int | None = None, horizon: float = 1.0,
                      initial_nodes: int | None = None, reserved_nodes: int = 0) -> list[ScheduledFault]:
    """A random but reproducible schedule for one job."""
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
        choices = [k for k in kinds if _possible(schema.CHAOS_KINDS[k], alive, spare, nodes, max_nodes)]
        if not choices:
            break
        kind = rng.choice(choices)
        delay = round(delay + rng.uniform(0.05, horizon / max(1, count)), 3)
        node = rng.choice(alive)
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


def _possible(row: schema.FaultKind, alive: list[int], spare: int, nodes: int, max_nodes: int) -> bool:
    if row.membership < 0:
        return spare > 0 and len(alive) > 1
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

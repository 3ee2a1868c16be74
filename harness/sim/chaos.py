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

from harness.errors import ConfigError
from harness.sim.faults import (
    HealthyThenAfter,
    AgentKill,
    NodeFreeze,
    NodeJoin,
    NodeKill,
    NodeLeave,
    ScheduledFault,
    WorkerCrash,
    WorkerHang,
)

__all__ = ["FAULT_KINDS", "ChaosConfig", "HealthyThenAfter", "derive_seed", "generate_schedule",
           "parse_fault_kinds"]

FAULT_KINDS = ("worker", "hang", "agent", "node", "leave", "join", "freeze")
DEFAULT_KINDS = ("worker",)


def parse_fault_kinds(text: str | None) -> tuple[str, ...]:
    if not text:
        return DEFAULT_KINDS
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    unknown = [k for k in kinds if k not in FAULT_KINDS + ("scale",)]
    if unknown:
        raise ConfigError("elastic_faults", text, f"names unknown kinds {unknown}; choose from "
                          f"{', '.join(FAULT_KINDS)}", "--elastic-faults")
    expanded: list[str] = []
    for kind in kinds:  # DESIGN.md's "scale" means both directions
        expanded.extend(("leave", "join") if kind == "scale" else (kind,))
    return tuple(dict.fromkeys(expanded))


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
    on_job: list = field(default_factory=list, compare=False)  # observers (the plugin's report)
    #: explicit schedules, one per job in launch order, used instead of generating one
    #: (replay of a printed schedule, the plugin's shrinking); jobs past the end generate
    schedules: tuple[tuple[ScheduledFault, ...], ...] | None = None


def generate_schedule(seed: int, kinds: tuple[str, ...], min_nodes: int, max_nodes: int,
                      nproc_per_node: int, max_restarts: int, overload: bool = False,
                      max_faults: int | None = None, horizon: float = 1.0,
                      initial_nodes: int | None = None) -> list[ScheduledFault]:
    """A random but reproducible schedule for one job."""
    rng = random.Random(seed)
    nodes = initial_nodes if initial_nodes is not None else max_nodes
    failure_budget = max_restarts + (1 + rng.randrange(2) if overload else 0)
    budget = failure_budget if max_faults is None else min(failure_budget, max_faults)
    spare = nodes - min_nodes  # nodes we may lose and still run
    schedule: list[ScheduledFault] = []
    delay = 0.0
    count = rng.randint(1, max(1, budget)) if budget else 0
    if max_faults is not None:
        count = min(count, max_faults)
    alive = list(range(nodes))
    for _ in range(count):
        choices = [k for k in kinds if _possible(k, alive, spare, nodes, max_nodes)]
        if not choices:
            break
        kind = rng.choice(choices)
        delay = round(delay + rng.uniform(0.05, horizon / max(1, count)), 3)
        node = rng.choice(alive)
        local_rank = rng.randrange(nproc_per_node)
        fault = _make(kind, node, local_rank, rng)
        if kind in ("agent", "node", "leave", "freeze"):
            alive.remove(node)
            spare -= 1
        elif kind == "join":
            nodes += 1
            alive.append(nodes - 1)
        schedule.append(ScheduledFault(fault, _trigger(delay)))
    return schedule


def _possible(kind: str, alive: list[int], spare: int, nodes: int, max_nodes: int) -> bool:
    if kind in ("agent", "node", "leave", "freeze"):
        return spare > 0 and len(alive) > 1
    if kind == "join":
        return nodes < max_nodes
    return bool(alive)


def _make(kind: str, node: int, local_rank: int, rng: random.Random):
    if kind == "worker":
        if rng.random() < 0.5:
            return WorkerCrash(node=node, local_rank=local_rank)
        return WorkerCrash(node=node, local_rank=local_rank, sig=15)
    if kind == "hang":
        return WorkerHang(node=node, local_rank=local_rank)
    if kind == "agent":
        return AgentKill(node=node)
    if kind == "node":
        return NodeKill(node=node)
    if kind == "leave":
        return NodeLeave(node=node)
    if kind == "join":
        return NodeJoin()
    if kind == "freeze":
        return NodeFreeze(node=node)
    raise ConfigError("fault kind", kind, f"must be one of {FAULT_KINDS}")


def _trigger(delay: float) -> "HealthyThenAfter":
    """Fire ``delay`` s after the job first became HEALTHY (so the fault meets workers)."""
    return HealthyThenAfter(seconds=delay)

"""Global and role ranks for the workers of one node.

Fast path (one role everywhere, ``TORCH_ELASTIC_WORKER_IDENTICAL=1``, or a single node):
arithmetic from the group rank. Slow path (several roles): every agent publishes
``(role, local_world_size)`` under its group rank; group rank 0 reads them all (one
``multi_get``), computes prefix sums per role and publishes each node's
``[base_global_rank, global_world_size, base_role_rank, role_world_size]`` (one
``multi_set``), as torch does.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from harness.agent._api import Worker, WorkerSpec

__all__ = ["assign_worker_ranks"]

ROLE_INFO_KEY = "torchelastic/role_info/"
ASSIGNED_RANKS_KEY = "torchelastic/assigned_ranks/"


def _identical(spec: WorkerSpec, group_rank: int, group_world_size: int) -> list[Worker]:
    lws = spec.local_world_size
    world = group_world_size * lws
    return [
        Worker(local_rank=i, global_rank=group_rank * lws + i, role_rank=group_rank * lws + i,
               world_size=world, role_world_size=world)
        for i in range(lws)
    ]


def _get(store: Any, key: str, timeout: float) -> bytes:
    return _get_many(store, [key], timeout)[0]


def _get_many(store: Any, keys: list[str], timeout: float) -> list[bytes]:
    """Each key's value, waiting for it (up to ``timeout``). One ``multi_get``, as torch's
    agent does: group rank 0 reads every node's role, and one request for each was
    three round trips each (a wait, then ``get``'s own wait and read): 192 at 64 nodes."""
    if hasattr(store, "set_timeout"):
        store.set_timeout(timedelta(seconds=timeout))
    multi_get = getattr(store, "multi_get", None)
    if multi_get is None:  # a store without it (a foreign handler's)
        return [store.get(key) for key in keys]
    values: list[bytes] = multi_get(keys)
    return values


def _set_many(store: Any, keys: list[str], values: list[bytes]) -> None:
    """One ``multi_set`` where the store has it (torch's agent: one request, not N)."""
    multi_set = getattr(store, "multi_set", None)
    if multi_set is None:
        for key, value in zip(keys, values, strict=True):
            store.set(key, value)
    else:
        multi_set(keys, values)


def assign_worker_ranks(store: Any, group_rank: int, group_world_size: int, spec: WorkerSpec,
                        identical: bool, timeout: float = 300.0) -> list[Worker]:
    if identical or group_world_size == 1 or store is None:
        return _identical(spec, group_rank, group_world_size)
    store.set(f"{ROLE_INFO_KEY}{group_rank}",
              json.dumps([spec.role, spec.local_world_size]).encode())
    if group_rank == 0:
        infos = [json.loads(raw) for raw in _get_many(
            store, [f"{ROLE_INFO_KEY}{i}" for i in range(group_world_size)], timeout)]
        global_world = sum(lws for _, lws in infos)
        role_totals: dict[str, int] = {}
        for role, lws in infos:
            role_totals[role] = role_totals.get(role, 0) + lws
        base_global, role_base = 0, {role: 0 for role in role_totals}
        assigned = []
        for role, lws in infos:
            assigned.append(json.dumps([base_global, global_world, role_base[role], role_totals[role]]).encode())
            base_global += lws
            role_base[role] += lws
        _set_many(store, [f"{ASSIGNED_RANKS_KEY}{i}" for i in range(group_world_size)], assigned)
    base_global, global_world, base_role, role_world = json.loads(
        _get(store, f"{ASSIGNED_RANKS_KEY}{group_rank}", timeout))
    return [
        Worker(local_rank=i, global_rank=base_global + i, role_rank=base_role + i,
               world_size=global_world, role_world_size=role_world)
        for i in range(spec.local_world_size)
    ]

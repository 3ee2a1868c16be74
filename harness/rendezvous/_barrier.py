"""A counting barrier on a key-value store (torch TCPStore API: add/set/wait)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

__all__ = ["store_barrier"]


def store_barrier(store: Any, world_size: int, prefix: str, timeout: float) -> None:
    """Block until ``world_size`` callers arrived; raises the store's timeout error."""
    arrived = store.add(f"{prefix}/num_members", 1)
    last_key = f"{prefix}/last_member"
    if arrived >= world_size:
        store.set(last_key, b"1")
    store.wait([last_key], timedelta(seconds=timeout))

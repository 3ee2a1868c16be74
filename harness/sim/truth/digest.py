"""A training state's fingerprint: sha256 over every tensor's bytes, in key order.

The fault-free twin is judged by comparing each rank's final state with the twin's. Comparing
the state itself would mean shipping gigabytes through the event stream; a digest is 64 hex
characters and differs as soon as one bit of one parameter, optimizer moment or RNG state does.

What is hashed, for each leaf in a deterministic walk (mapping keys sorted by their ``repr``,
so an optimizer state dict's int keys and a model's str keys both have one order; sequences
in order): the key path, then for a tensor its dtype, shape and raw bytes (read in place,
no copy for a contiguous CPU tensor); for anything else its ``repr``. A sharded tensor
(``DTensor``, FSDP2) is hashed by its local shard: digests then compare only at the same
world size, which is what the twin comparison does with them.

torch is imported only when a tensor is met: the worker already has it then.
"""

from __future__ import annotations

import ctypes
import hashlib
from collections.abc import Mapping
from typing import Any

__all__ = ["state_digest"]


def state_digest(state: Any) -> str:
    """The sha256 hex digest of ``state`` (a tensor, a state dict, any nesting of them)."""
    h = hashlib.sha256()
    _feed(h, "", state)
    return h.hexdigest()


def _feed(h: Any, path: str, value: Any) -> None:
    if isinstance(value, Mapping):
        for key in sorted(value, key=repr):
            _feed(h, f"{path}/{key!r}", value[key])
        return
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _feed(h, f"{path}[{i}]", item)
        return
    h.update(path.encode())
    if _is_tensor(value):
        _feed_tensor(h, value)
    else:
        h.update(b"=" + repr(value).encode())


def _is_tensor(value: Any) -> bool:
    # by class name first: a worker that never made a tensor never imports torch here
    return type(value).__module__.startswith("torch") and hasattr(value, "dtype") and hasattr(value, "shape")


def _feed_tensor(h: Any, tensor: Any) -> None:
    local = getattr(tensor, "to_local", None)
    if callable(local):  # a DTensor: its shard on this rank
        tensor = local()
    tensor = tensor.detach()
    h.update(f":{tensor.dtype}:{tuple(tensor.shape)}:".encode())
    if tensor.numel() == 0:
        return
    flat = tensor.cpu().contiguous()
    # the bytes in place (numpy may be absent: torch's CPU wheel does not need it); ``flat``
    # keeps the memory alive while it is hashed
    nbytes = flat.numel() * flat.element_size()
    h.update(memoryview((ctypes.c_char * nbytes).from_address(flat.data_ptr())))

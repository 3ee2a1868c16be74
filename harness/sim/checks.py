"""Checks of user-written values, each with what it demands in words: the vocabulary
``harness.sim.schema`` states its keys' types in (``integer(1)`` -> "must be an int >= 1").

Standard library only (the pytest plugin loads the schema at configure time).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard

__all__ = ["Check", "integer", "number", "one_of", "optional", "list_of", "BOOL", "TEXT",
           "STR_TABLE", "TABLE", "NNODES", "GPUS", "ARGS", "PEERS", "PROBABILITY", "RATE", "MEMORY_LIMIT", "HOSTS",
           "PLACEMENT", "REQUIREMENT"]


@dataclass(frozen=True)
class Check:
    """A predicate on a value and what it demands, in words (``must be an int >= 1``)."""

    test: Callable[[Any], bool]
    says: str

    def __call__(self, value: Any) -> bool:
        return self.test(value)


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def integer(low: int | None = None) -> Check:
    if low is None:
        return Check(_is_int, "must be an int")
    return Check(lambda v: _is_int(v) and v >= low, f"must be an int >= {low}")


def number(low: float, strict: bool = False) -> Check:
    if strict:
        return Check(lambda v: _is_number(v) and v > low, f"must be a number > {low:g}")
    return Check(lambda v: _is_number(v) and v >= low, f"must be a number >= {low:g}")


def one_of(*choices: Any) -> Check:
    return Check(lambda v: isinstance(v, type(choices[0])) and v in choices,
                 f"must be one of {', '.join(map(str, choices))}")


def optional(check: Check) -> Check:
    return Check(lambda v: v is None or check(v), f"{check.says} (or None)")


def list_of(check: Check, what: str) -> Check:
    return Check(lambda v: isinstance(v, (list, tuple)) and all(check(x) for x in v),
                 f"must be a list of {what}")


def _nnodes_ok(value: Any) -> bool:
    if _is_int(value):
        return value >= 1
    if not isinstance(value, str):
        return False
    parts = value.split(":")
    # isdecimal(), not isdigit(): "²" is a digit that int() refuses
    if len(parts) not in (1, 2) or not all(p.strip().isdecimal() for p in parts):
        return False
    return 1 <= int(parts[0]) <= int(parts[-1])


BOOL = Check(lambda v: isinstance(v, bool), "must be true or false")
TEXT = Check(lambda v: isinstance(v, str) and v != "", "must be a non-empty string")


def _requirement_ok(value: Any) -> bool:
    from packaging.requirements import InvalidRequirement, Requirement  # pytest's own dependency

    if not isinstance(value, str):
        return False
    try:
        Requirement(value)
    except InvalidRequirement:
        return False
    return True


#: a requirement as pip spells it ("transformers>=5", "lightning")
REQUIREMENT = Check(_requirement_ok, 'must be a requirement as pip spells it ("transformers>=5")')
# any Mapping: a frozen ClusterConfig holds its tables read-only (types.MappingProxyType)
STR_TABLE = Check(lambda v: isinstance(v, Mapping) and all(isinstance(k, str) and isinstance(x, str)
                                                        for k, x in v.items()),
                  "must be a table of strings (name = value)")
TABLE = Check(lambda v: isinstance(v, Mapping) and all(isinstance(k, str) for k in v),
              "must be a table (name = value)")
NNODES = Check(_nnodes_ok, "must be N or 'MIN:MAX' with 1 <= MIN <= MAX")
GPUS = Check(lambda v: v is None or (_is_int(v) and v >= 0)
             or (isinstance(v, (list, tuple)) and all(isinstance(x, (str, int)) for x in v)),
             "must be a GPU count (int >= 0), a list of device ids, or None (detect)")
ARGS = list_of(Check(lambda v: isinstance(v, (str, int, float)) and not isinstance(v, bool), ""),
               "strings (or numbers)")
PEERS = Check(lambda v: v in ("all", "store") or (isinstance(v, (list, tuple)) and bool(v)
                                                 and all(_is_int(x) and x >= 0 for x in v)),
              'must be "all", "store" or a non-empty list of node indices')
PROBABILITY = Check(lambda v: _is_number(v) and 0 <= v <= 1, "must be a number in [0, 1]")
RATE = Check(lambda v: (_is_int(v) and v > 0) or (isinstance(v, str) and v[:1].isdigit()),
             'must be a rate like "1mbit", "500kbit" or bits per second (an int > 0)')
MEMORY_LIMIT = Check(lambda v: (_is_int(v) and v > 0) or (isinstance(v, str) and v.lstrip("+")[:1].isdigit()),
                     'must be a size like "300M", "1G" or a number of bytes, or "+300M": that much above '
                     'what the node holds when it fires')


def _is_host(value: Any) -> bool:
    """A host as written: its URL, or a ``harness.hosts.HostSpec`` (known by its fields:
    this module imports no harness package)."""
    if isinstance(value, str):
        return value.startswith("ssh://")
    return all(hasattr(value, name) for name in ("address", "user", "port", "label"))


HOSTS = Check(lambda v: isinstance(v, (list, tuple)) and bool(v) and all(_is_host(x) for x in v),
              'must be a non-empty list of hosts: "ssh://user@address[:port]" or harness.hosts.HostSpec')
SLURM = Check(lambda v: isinstance(v, dict) or hasattr(v, "controller_address"),
              "must be a harness.hosts.SlurmSpec or a dict of its fields (controller_address, partition, ...)")
PLACEMENT = Check(lambda v: isinstance(v, (list, tuple)) and all(_is_int(x) and x >= 0 for x in v),
                  "must be a list of host indexes (ints >= 0), one per node")

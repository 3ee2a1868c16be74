"""``Std``: which of a worker's streams go to files (redirect) or files + console (tee)."""

from __future__ import annotations

import enum

from harness.errors import ConfigError

__all__ = ["Std", "parse_std"]


class Std(enum.IntFlag):
    NONE = 0
    OUT = 1
    ERR = 2
    ALL = 3

    @classmethod
    def from_str(cls, text: str) -> Std | dict[int, Std]:
        """``"3"`` -> Std.ALL; ``"0:3,1:0"`` -> {0: Std.ALL, 1: Std.NONE} (as torchrun)."""
        return parse_std(text, "redirects")


def _one(value: str, name: str) -> Std:
    # isdecimal(), not isdigit(): "①" and "²" are digits that int() refuses
    if not value.strip().isdecimal() or int(value) not in (0, 1, 2, 3):
        raise ConfigError(name, value, "must be 0 (none), 1 (stdout), 2 (stderr) or 3 (both)",
                          f"--{name}")
    return Std(int(value))


def parse_std(text: str | int | Std, name: str) -> Std | dict[int, Std]:
    if isinstance(text, int):
        return _one(str(int(text)), name)
    text = str(text).strip()
    if ":" not in text:
        return _one(text, name)
    result: dict[int, Std] = {}
    for item in text.split(","):
        rank, sep, value = item.partition(":")
        if not sep or not rank.strip().isdecimal():  # isdigit() passes "²"; int() refuses it
            raise ConfigError(name, text, "must be N or a list like 0:3,1:0", f"--{name}")
        result[int(rank)] = _one(value, name)
    return result


def std_for_rank(value: Std | dict[int, Std], local_rank: int) -> Std:
    if isinstance(value, dict):
        return value.get(local_rank, Std.NONE)
    return value

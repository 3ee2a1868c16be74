"""Importable worker functions for callable-entrypoint tests (spawn needs importable code)."""

from __future__ import annotations

import os
import time


def rank_times(factor: int) -> int:
    return int(os.environ["RANK"]) * factor


def fail_on_rank_one() -> None:
    if os.environ["RANK"] == "1":
        raise ValueError("rank one is broken")
    time.sleep(30)


def crash_first_attempt() -> str:
    if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0" and os.environ["LOCAL_RANK"] == "0":
        os._exit(7)
    return f"attempt {os.environ['TORCHELASTIC_RESTART_COUNT']}"


def print_and_return() -> int:
    print(f"hello from {os.environ['LOCAL_RANK']}", flush=True)
    return 1

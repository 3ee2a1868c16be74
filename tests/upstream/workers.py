"""Worker entrypoints of upstream's local_elastic_agent_test, re-expressed (see README.md).

They live in an importable module so ``spawn``ed workers can unpickle them."""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist


def happy() -> None:
    return None


def sad() -> None:
    raise RuntimeError("sad because i throw")


def dummy_compute() -> torch.Tensor:
    return torch.rand(100, 100)


def fail_rank_one_once() -> torch.Tensor:
    if os.environ["RANK"] == "1" and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
        os.kill(os.getpid(), 9)
    return torch.rand(100, 100)


def echo(msg: str) -> str:
    return msg


def bipolar() -> None:
    if int(os.environ["RANK"]) % 2:
        sad()


def dist_sum(wait: float = 0) -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group(backend="gloo")
    t = torch.tensor(rank)
    time.sleep(wait)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    if t.item() != sum(range(world)):
        raise RuntimeError(f"expected rank sum {sum(range(world))}, got {t.item()}")


def check_master(addr: str, port: int) -> None:
    # upstream's condition, kept as written there: fail only if both differ
    if os.environ["MASTER_ADDR"] != addr and int(os.environ["MASTER_PORT"]) != port:
        raise RuntimeError(f"expected {addr}:{port}, got {os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}")


ENV_VARS = ["RANK", "LOCAL_RANK", "ROLE_RANK", "ROLE_NAME", "GROUP_RANK", "LOCAL_WORLD_SIZE",
            "ROLE_WORLD_SIZE", "WORLD_SIZE", "GROUP_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
            "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
            "TORCHELASTIC_USE_AGENT_STORE", "TORCH_NCCL_ASYNC_ERROR_HANDLING"]


def check_env() -> None:
    missing = [v for v in ENV_VARS if v not in os.environ]
    if missing:
        raise RuntimeError(f"missing {missing}")


def check_env_value(key: str, expected: str) -> None:
    if os.environ.get(key) != expected:
        raise RuntimeError(f"os.environ[{key!r}]={os.environ.get(key)!r}, expected {expected!r}")


def check_env_present(key: str, present: bool) -> None:
    if (key in os.environ) != present:
        raise RuntimeError(f"{key} {'missing' if present else 'present'}")

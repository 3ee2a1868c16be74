"""Trains until killed: one gloo all_reduce a step, each step reported with a timestamp.

Line per step: ``BENCH step node=<BENCH_NODE> rank=<r> world=<w> step=<s> pid=<p> ts=<time.time()>``,
written with one ``os.write`` (workers share their agent's stdout; lines of two ranks must
not interleave). A step is only reported once the all_reduce over the whole world returned,
so a line at world w proves a live world of w workers. bench/network.py tells "the
survivors train again" and "the node is back" from ``world``. A failed collective ends the
worker with status 1 (its agent decides what follows).
"""
import os
import sys
import time

import torch
import torch.distributed as dist

STEP_S = float(os.environ.get("BENCH_STEP_S", "0.05"))


def say(line: str) -> None:
    os.write(1, (line + "\n").encode())


node = os.environ.get("BENCH_NODE", "?")
try:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.ones(1)
    step = 0
    while True:
        dist.all_reduce(t)
        say(f"BENCH step node={node} rank={rank} world={world} step={step} pid={os.getpid()} "
            f"ts={time.time():.6f}")
        step += 1
        time.sleep(STEP_S)
except Exception as e:  # a peer vanished: say so in one line, let the agent restart us
    say(f"BENCH error node={node} pid={os.getpid()} {type(e).__name__} ts={time.time():.6f}")
    sys.exit(1)

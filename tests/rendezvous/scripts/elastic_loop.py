"""gloo all_reduce in a loop. Prints START/DONE lines with rank, world and restart count.

Runs until WORLD_SIZE equals ``--finish-world`` (then a few steps and exit 0); in any
other world it keeps stepping (bounded by ``--max-seconds``) so a test can change the
membership while it runs. ``--crash-rank R``: rank R exits 1 on restart 0 after START.
``--until FILE``: finishing also waits until FILE exists (the test says when).
"""
import argparse
import os
import sys
import time

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--finish-world", type=int, required=True)
p.add_argument("--crash-rank", type=int, default=-1)
p.add_argument("--max-seconds", type=float, default=60)
p.add_argument("--until", default=None)
a = p.parse_args()
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
restart = os.environ["TORCHELASTIC_RESTART_COUNT"]
# one write(2) per line: under ``python -u`` print() writes the text and the newline
# separately, and the ranks of a node share its agent's stdout (their lines would interleave)
os.write(1, f"START rank={rank} world={world} restart={restart} group={os.environ['GROUP_RANK']} "
            f"pid={os.getpid()}\n".encode())
if rank == a.crash_rank and restart == "0":
    time.sleep(0.3)
    sys.exit(1)
t = torch.ones(1)
deadline = time.monotonic() + a.max_seconds
steps = 0
while time.monotonic() < deadline:
    dist.all_reduce(t)
    steps += 1
    # the ranks finish together: each looks at FILE at its own moment, and a rank that saw
    # it and left would break the all_reduce of one that looked just before it appeared
    ready = torch.tensor([world == a.finish_world and steps >= 5 and (a.until is None or os.path.exists(a.until))],
                         dtype=torch.float32)
    dist.all_reduce(ready, op=dist.ReduceOp.MIN)
    if ready.item() == 1.0:
        break
    time.sleep(0.1)
os.write(1, f"DONE rank={rank} world={world} restart={restart}\n".encode())
dist.destroy_process_group()

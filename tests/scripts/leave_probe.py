"""Trains in lockstep (a gloo all_reduce per step, steps reported) for argv[1] steps; the
last rank of a 4-worker world answers SIGTERM by sleeping (no collective error can end it
either), so its agent takes the whole shutdown grace to stop it: with 2 nodes of 2, node
1's first worker is gone long before its agent finishes stopping the rest."""
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

from harness import report_step

if os.environ.get("RANK") == "3" and os.environ.get("WORLD_SIZE") == "4":
    signal.signal(signal.SIGTERM, lambda *_: time.sleep(3600))
dist.init_process_group("gloo")
steps = int(sys.argv[1])
for step in range(steps):
    report_step(step)
    t = torch.ones(1)
    dist.all_reduce(t)
    time.sleep(0.05)
dist.barrier()
os._exit(0)  # no teardown: nothing of this probe's needs it (see scenarios/scripts/train.py)

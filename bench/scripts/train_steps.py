"""Bus bench worker: gloo init, then ``STEPS`` training steps (one all_reduce each, then
``harness.report_step``), ``DELAY`` s apart: a job that trains and reports, for the
harness's CPU and its trigger latency. Args: STEPS DELAY."""
import sys
import time

import torch
import torch.distributed as dist

from harness import report_step

steps = int(sys.argv[1])
delay = float(sys.argv[2])
dist.init_process_group("gloo")
t = torch.ones(1)
for step in range(steps):
    dist.all_reduce(t)
    report_step(step)
    time.sleep(delay)
dist.destroy_process_group()

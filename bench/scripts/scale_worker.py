"""Scale bench worker: gloo init, then ``--steps`` steps of one all_reduce each, reported to
the harness (``harness.report_step``), ``--step-time`` s apart; destroy, exit 0."""
import argparse
import time

import torch
import torch.distributed as dist

import harness

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=4)
parser.add_argument("--step-time", type=float, default=0.0)
opts = parser.parse_args()
dist.init_process_group("gloo")
value = torch.ones(1)
for step in range(1, opts.steps + 1):
    dist.all_reduce(value)
    harness.report_step(step)
    time.sleep(opts.step_time)
dist.destroy_process_group()

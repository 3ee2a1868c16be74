"""A stepper that computes on its GPU: each step a matmul on ``cuda:LOCAL_RANK`` and an
``all_reduce`` of its result over the job's process group (``argv[3]``: ``nccl`` on the
device itself, ``gloo`` over a CPU copy, for workers that share a device). Prints one
``CUDA`` line at the end: rank, world, device, ``CUDA_VISIBLE_DEVICES`` and the last sum."""
import os
import sys
import time

import torch
import torch.distributed as dist

from harness import report_step

steps = int(sys.argv[1])
delay = float(sys.argv[2])
backend = sys.argv[3]
device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
torch.cuda.set_device(device)
if backend == "nccl":
    dist.init_process_group("nccl", device_id=device)
else:
    dist.init_process_group(backend)
weights = torch.eye(64, device=device)
total = 0.0
for step in range(steps):
    value = (weights @ torch.ones(64, device=device)).sum()  # 64 on every rank
    shared = value if backend == "nccl" else value.cpu()
    dist.all_reduce(shared)
    total = shared.item()
    report_step(step)
    time.sleep(delay)
line = (f"CUDA rank={dist.get_rank()} world={dist.get_world_size()} device={torch.cuda.get_device_name(device)!r} "
        f"visible={os.environ.get('CUDA_VISIBLE_DEVICES')} sum={total:g} "
        f"attempt={os.environ['TORCHELASTIC_RESTART_COUNT']}\n")
dist.destroy_process_group()
os.write(1, line.encode())  # one write: lines never interleave

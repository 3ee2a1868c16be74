"""gloo init, one all_reduce, destroy; prints a timestamp as its very last action."""
import os
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
dist.destroy_process_group()
# one write(2) per line: workers share the launcher's stdout and run with python -u
os.write(1, f"BENCH last rank={os.environ['RANK']} ts={time.time():.6f}\n".encode())

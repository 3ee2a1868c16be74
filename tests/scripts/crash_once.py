"""gloo init; rank 1 exits 3 on the first attempt; then one all_reduce."""
import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, attempt = os.environ["RANK"], os.environ["TORCHELASTIC_RESTART_COUNT"]
os.write(1, (f"START rank={rank} attempt={attempt}" + "\n").encode())  # one write: lines never interleave
if rank == "1" and attempt == "0":
    raise SystemExit(3)
t = torch.ones(1)
dist.all_reduce(t)
# one write: lines never interleave
os.write(1, (f"SUM rank={rank} attempt={attempt} value={t.item():g}" + "\n").encode())
dist.destroy_process_group()

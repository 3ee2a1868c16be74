"""gloo all_reduce of (rank + 1); prints the sum."""
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.ones(1) * (dist.get_rank() + 1)
dist.all_reduce(t)
print(f"SUM rank={dist.get_rank()} world={dist.get_world_size()} value={t.item():g}", flush=True)
dist.destroy_process_group()

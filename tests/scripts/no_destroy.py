"""gloo all_reduce, then exit *without* destroy_process_group (as many training scripts end).

Shaped like PyTorch's ``test/distributed/launcher/bin/test_script_init_method.py``:
``--init-method`` (default ``env://``) goes to ``init_process_group``. The process group is
torn down by interpreter exit, while every rank's store client is still connected: whoever
hosts the store must outlive the workers, or the last ones abort at exit.
"""
import argparse
import os

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--init-method", "--init_method", default="env://")
args = parser.parse_args()
dist.init_process_group("gloo", init_method=args.init_method,
                        world_size=int(os.environ["WORLD_SIZE"]), rank=int(os.environ["RANK"]))
t = torch.nn.functional.one_hot(torch.tensor(dist.get_rank()), num_classes=dist.get_world_size())
dist.all_reduce(t)
assert int(t.sum()) == dist.get_world_size(), t
os.write(1, f"DONE rank={dist.get_rank()}\n".encode())

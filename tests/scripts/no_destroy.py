"""gloo all_reduce, then exit *without* destroy_process_group (as many training scripts end).

Shaped like PyTorch's ``test/distributed/launcher/bin/test_script_init_method.py``:
``--init-method`` (default ``env://``) goes to ``init_process_group``. The process group is
torn down by interpreter exit, while every rank's store client is still connected: whoever
hosts the store must outlive the workers, or the last ones abort at exit.

Even then a rank may still die with SIGABRT ("terminate called without an active
exception") now and then, under torchrun as under elastic-run: a race inside torch 2.13
(gloo's ``runLoop`` thread drops the last reference to the finished ``AllreduceWork``
after ``Py_FinalizeEx`` began; freeing its output tensor takes the GIL, the finalizing
interpreter ends that thread with ``pthread_exit``, and the forced unwind through a
``noexcept`` destructor calls ``std::terminate``). No launcher can prevent it; tests must
not require every run of this script to exit 0.
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

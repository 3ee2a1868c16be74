"""Who hosts the workers' store, and what a restarted attempt finds in it.

Every rank joins a gloo group (``env://``) and uses the group's store. Rank 0 then exits
*without* ``destroy_process_group``; the other ranks wait until it is gone and use the
store again: that works only if the store is not hosted by rank 0 (torch's agents host
it: ``TORCHELASTIC_USE_AGENT_STORE=True``). With ``--crash-first-attempt`` attempt 0
leaves a key behind and fails; attempt 1 prints whether it can still see that key.
Prints ``PROBE rank=R attempt=A agent_store=... stale=...`` per rank.
"""
import argparse
import os
import sys
import time

import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--crash-first-attempt", action="store_true")
args = parser.parse_args()
dist.init_process_group("gloo")
store = dist.distributed_c10d._get_default_store()
rank = dist.get_rank()
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
stale = store.check([f"attempt0_was_here_{rank}"])
if args.crash_first_attempt and attempt == 0:
    store.set(f"attempt0_was_here_{rank}", "1")
    dist.barrier()
    if rank == 0:
        sys.exit(3)
    time.sleep(120)  # the agent stops us
    sys.exit(4)
dist.barrier()
line = f"PROBE rank={rank} attempt={attempt} agent_store={os.environ['TORCHELASTIC_USE_AGENT_STORE']} stale={stale}"
if rank == 0:
    store.set("rank0_pid", str(os.getpid()))
    os.write(1, (line + "\n").encode())
    sys.exit(0)  # no destroy_process_group: the store must outlive this process
pid = int(store.get("rank0_pid"))
deadline = time.monotonic() + 60
while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
    time.sleep(0.05)
store.set(f"after_rank0_{rank}", "1")  # fails if rank 0 took the store with it
assert store.get(f"after_rank0_{rank}") == b"1"
os.write(1, (line + " after_rank0=ok\n").encode())

"""Differential-test worker: records what its launcher gave it, then does what argv says.

Every worker writes ``$DIFF_PROBE_DIR/attempt<N>_rank<R>.json`` (its whole environment,
argv, cwd and executable) and prints one line to stdout and one to stderr. Then:

  --fail-rank=R       rank R fails: after every peer of this attempt has written its record,
                      so both launchers see the same set of started ranks
  --fail-attempts=K   ... only in attempts < K (default: every attempt)
  --fail-code=C       ... with ``sys.exit(C)`` (default 3)
  --raise             ... by raising under torch's own ``@record`` (an error file is written)
  --allreduce         gloo ``all_reduce`` of (rank + 1); the sum goes into a second record
  --nccl              ... over NCCL instead, on GPU ``LOCAL_RANK`` (the record adds the device's
                      name and ``CUDA_VISIBLE_DEVICES``)

Peers of a failing rank sleep in that attempt until the launcher stops them. No torch import
unless ``--raise`` or ``--allreduce``. Standard library only otherwise, so it starts fast.
"""

import argparse
import json
import os
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("--fail-rank", type=int, default=None)
parser.add_argument("--fail-attempts", type=int, default=None)
parser.add_argument("--fail-code", type=int, default=3)
parser.add_argument("--raise", dest="raise_", action="store_true")
parser.add_argument("--allreduce", action="store_true")
parser.add_argument("--nccl", action="store_true")
opts, _extra = parser.parse_known_args()

out_dir = os.environ["DIFF_PROBE_DIR"]
rank = int(os.environ["RANK"])
world = int(os.environ["WORLD_SIZE"])
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])


def write_record(name: str, payload: dict) -> None:
    tmp = os.path.join(out_dir, f".{name}.tmp")
    with open(tmp, "w") as f:
        json.dump(payload, f, sort_keys=True)
    os.replace(tmp, os.path.join(out_dir, name))  # readers never see half a record


write_record(f"attempt{attempt}_rank{rank}.json", {
    "env": dict(os.environ),
    "argv": sys.argv,
    "cwd": os.getcwd(),
    "executable": os.path.realpath(sys.executable),
})
# one write(2) per line: under ``python -u`` print() writes the text and the newline
# separately, and ranks sharing the launcher's stdout would interleave between the two
os.write(1, f"PROBE out rank={rank} attempt={attempt} argv={sys.argv[1:]}\n".encode())
os.write(2, f"PROBE err rank={rank} attempt={attempt}\n".encode())

failing_attempt = opts.fail_rank is not None and (
    opts.fail_attempts is None or attempt < opts.fail_attempts)


def wait_for_peers(deadline_s: float = 30.0) -> None:
    names = [f"attempt{attempt}_rank{r}.json" for r in range(world)]
    deadline = time.monotonic() + deadline_s
    while not all(os.path.exists(os.path.join(out_dir, n)) for n in names):
        if time.monotonic() > deadline:
            sys.exit(f"diff_probe: peers of attempt {attempt} did not start in {deadline_s}s")
        time.sleep(0.01)


def fail() -> None:
    wait_for_peers()
    if opts.raise_:
        from torch.distributed.elastic.multiprocessing.errors import record

        @record
        def broken() -> None:
            raise RuntimeError(f"probe failure rank={rank} attempt={attempt}")

        broken()
    sys.exit(opts.fail_code)


if failing_attempt:
    if rank == opts.fail_rank:
        fail()
    time.sleep(60)  # stopped by the launcher
    sys.exit("diff_probe: the launcher did not stop this peer")

if opts.allreduce:
    import torch
    import torch.distributed as dist

    record: dict = {}
    if opts.nccl:
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
        record.update(gpu=torch.cuda.get_device_name(device),
                      visible=os.environ.get("CUDA_VISIBLE_DEVICES"))
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    t = torch.ones(1, device=device) * (dist.get_rank() + 1)
    dist.all_reduce(t)
    record.update(rank=dist.get_rank(), world=dist.get_world_size(), sum=t.item())
    write_record(f"sum_attempt{attempt}_rank{rank}.json", record)
    dist.destroy_process_group()

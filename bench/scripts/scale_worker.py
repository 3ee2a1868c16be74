"""Scale bench worker: gloo init, then ``--steps`` steps of one all_reduce each, reported to
the harness (``harness.report_step``), ``--step-time`` s apart; destroy, exit 0.

``--stamps DIR`` writes one JSON line per worker to ``DIR/<rank>-<pid>.json``: when the script
began, when ``init_process_group`` returned and when the first ``all_reduce`` did
(``time.monotonic()``, one clock for every process of the machine), so the bench can say how
long gloo's connection mesh took apart from the rest of the start; and ``end-<rank>-<pid>.json``
once ``destroy_process_group`` returned (when the steps ended and when the group was gone, and
the CPU the worker had used). ``--idle S``: every rank sleeps S s after its first step, and
its end stamp says when (``idle``): the bench measures what the job costs doing nothing."""
import argparse
import json
import os
import time

began = time.monotonic()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import harness  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=4)
parser.add_argument("--step-time", type=float, default=0.0)
parser.add_argument("--stamps", default="")
parser.add_argument("--idle", type=float, default=0.0)
opts = parser.parse_args()
imported = time.monotonic()
dist.init_process_group("gloo")
initialised = time.monotonic()
value = torch.ones(1)
first_reduce = None
for step in range(1, opts.steps + 1):
    dist.all_reduce(value)
    if first_reduce is None:
        first_reduce = time.monotonic()
        if opts.stamps:
            rank = dist.get_rank()
            with open(os.path.join(opts.stamps, f"{rank}-{os.getpid()}.json"), "w") as fp:
                json.dump({"rank": rank, "world": dist.get_world_size(), "began": began, "imported": imported,
                           "initialised": initialised, "first_reduce": first_reduce,
                           "restart": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))}, fp)
    harness.report_step(step)
    if step == 1 and opts.idle > 0:  # every rank sleeps here: the job has nothing to do but its overhead
        idle_began = time.monotonic()
        time.sleep(opts.idle)
        idle = (idle_began, time.monotonic())  # when it slept, as it woke (not as planned)
    time.sleep(opts.step_time)
stepped = time.monotonic()
rank = dist.get_rank()
dist.destroy_process_group()
if opts.stamps:
    with open(os.path.join(opts.stamps, f"end-{rank}-{os.getpid()}.json"), "w") as fp:
        json.dump({"rank": rank, "stepped": stepped, "destroyed": time.monotonic(),
                   "cpu": sum(os.times()[:2]),  # this worker's CPU so far: the bench sums them
                   **({"idle": idle} if opts.idle > 0 else {})}, fp)

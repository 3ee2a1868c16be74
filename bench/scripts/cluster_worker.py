"""Cluster bench worker: gloo init and one all_reduce, then ``BENCH ready`` (and
``harness.report_step(0)`` when run under the harness). A worker started before the bench
killed one (no file at ``$BENCH_KILLED``) then waits, 60 s at most, to be killed or stopped
by its agent; a worker started after it (the restarted group) exits 0 at once.

The same script runs under ``harness.Cluster`` and under torchrun: the bench kills one
worker once every rank reported ready, and the job is done when the restarted group exits.
(``TORCHELASTIC_RESTART_COUNT`` cannot tell the groups apart: a node whose workers are
restarted only because another node's failed keeps its count, under either launcher.)
"""
import os
import time


def emit(text: str) -> None:
    # one write(2) per line: workers share their launcher's stdout
    os.write(1, f"BENCH {text}\n".encode())


rank, attempt = os.environ["RANK"], os.environ["TORCHELASTIC_RESTART_COUNT"]
restarted = os.path.exists(os.environ["BENCH_KILLED"])

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

dist.init_process_group("gloo")
t = torch.ones(1) * (int(rank) + 1)
dist.all_reduce(t)
emit(f"ready rank={rank} attempt={attempt} restarted={int(restarted)} pid={os.getpid()} "
     f"value={t.item():g} ts={time.time():.6f}")
if os.environ.get("HARNESS_EVENTS"):
    from harness import report_step

    report_step(0)
if not restarted:
    time.sleep(60)  # until the bench kills one worker and the agents stop the others
dist.destroy_process_group()

"""Rank 1 exits 1 after gloo init on the first attempt; the restarted group all-reduces.

Prints ``BENCH first`` before importing torch (as soon as the worker runs), ``BENCH crash``
just before the crash and ``BENCH sum`` at the end, with time.time(). The crash is
``sys.exit(1)`` (the interpreter tears torch down first, as after an uncaught exception),
or with ``--hard`` ``os._exit(1)`` (gone at once, as after a segfault or SIGKILL).
"""
import os
import sys
import time


def emit(text: str) -> None:
    # one write(2) per line: workers share the launcher's stdout and run with python -u
    os.write(1, f"BENCH {text}\n".encode())


rank, attempt = os.environ["RANK"], os.environ["TORCHELASTIC_RESTART_COUNT"]
emit(f"first rank={rank} attempt={attempt} ts={time.time():.6f}")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

dist.init_process_group("gloo")
if rank == "1" and attempt == "0":
    emit(f"crash rank={rank} attempt={attempt} ts={time.time():.6f}")
    if "--hard" in sys.argv[1:]:
        os._exit(1)
    sys.exit(1)
t = torch.ones(1) * (int(rank) + 1)
dist.all_reduce(t)
emit(f"sum rank={rank} attempt={attempt} value={t.item():g}")
dist.destroy_process_group()

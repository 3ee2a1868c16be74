"""A tiny elastic training job: gloo DDP on CPU that checkpoints every step and resumes.

Used by the README's main job and the bundled scenarios. ``--crash-at-step N`` makes
rank ``--crash-rank`` exit 1 at step N on the first attempt only, so a restart resumes
from the checkpoint; the final line says how many steps ran and whether any was lost.
``--work N`` adds N small matrix products per step (CPU-bound work, one thread: what a CPU
quota slows down); ``--hog-mb M`` makes rank ``--crash-rank`` keep M more MiB every step on
the first attempt (what a memory limit's OOM killer stops).

``--step-timeout T`` keeps the worker under the agent's watchdog timer from its start to its
end, with no gap: a worker stuck anywhere (a ``hang_worker`` fault, a collective whose peer
is cut off) is reaped. The bound holds on a loaded CI runner too: the start-up (the process
group, the model, a checkpoint load), the first ``WARMUP_STEPS`` steps of each attempt (their
collectives wait for the slowest peer's start-up: imports, DDP's first buckets) and the end
get ``WARMUP_BOUND`` seconds; every later step ``T`` or ``LOAD_FACTOR`` times the slowest
timed step of this attempt so far, whichever is longer. A step that *hangs* still exceeds
it; a step that is merely slow on a busy machine does not. Each timer is acquired before the
one before it is released, so no moment of the run is unguarded.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

try:  # progress reports let the harness key faults by (rank, step); a no-op elsewhere
    from harness import report_step
except ImportError:  # pragma: no cover
    def report_step(step: int) -> None:
        pass


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--ckpt-dir", default=os.environ.get("TRAIN_CKPT_DIR", ""))
    p.add_argument("--crash-at-step", type=int, default=-1)
    p.add_argument("--crash-rank", type=int, default=1)
    p.add_argument("--step-time", type=float, default=0.0, help="extra seconds per step")
    p.add_argument("--work", type=int, default=0, help="matrix products per step (CPU work)")
    p.add_argument("--hog-mb", type=int, default=0,
                   help="rank --crash-rank keeps this many more MiB every step on the first attempt")
    p.add_argument("--hang-at-step", type=int, default=-1,
                   help="rank --crash-rank hangs at this step on the first attempt")
    p.add_argument("--step-timeout", type=float, default=0.0,
                   help="run each step under a watchdog timer of this many seconds "
                        "(needs TORCHELASTIC_ENABLE_FILE_TIMER=1 in the agent)")
    return p.parse_args()


WARMUP_STEPS = 2
#: the bound of the start-up, the warm-up steps and the end (s): longer than any of them takes
#: on a loaded runner, shorter than the harness takes to call a job stalled (60 s with a watchdog)
WARMUP_BOUND = 15.0
LOAD_FACTOR = 10.0


def step_bound(timeout: float, index: int, slowest: float) -> float:
    """The watchdog bound of this attempt's step ``index`` (0: none), given the slowest
    step of this attempt so far (see the module docstring)."""
    if not timeout:
        return 0.0
    if index < WARMUP_STEPS:
        return WARMUP_BOUND
    return max(timeout, LOAD_FACTOR * slowest)


class Guard:
    """The worker under one watchdog timer at a time, handed over without a gap: the next is
    acquired before the one before it is released. Nothing where the agent runs no watchdog
    (``TORCHELASTIC_TIMER_FILE`` unset) or without ``--step-timeout``."""

    def __init__(self, enabled: bool):
        path = os.environ.get("TORCHELASTIC_TIMER_FILE")
        self.enabled = bool(enabled and path)
        self.held: contextlib.AbstractContextManager | None = None
        self.count = 0
        if self.enabled:
            from torch.distributed.elastic.timer import FileTimerClient, configure

            configure(FileTimerClient(path))

    def arm(self, seconds: float) -> None:
        """From now on the worker is reaped unless it arms again or ends within ``seconds``."""
        if not self.enabled or not seconds:
            return
        from torch.distributed.elastic.timer import expires

        self.count += 1
        timer = expires(after=seconds, scope=f"train_{self.count % 2}")
        timer.__enter__()
        self.release()
        self.held = timer

    def release(self) -> None:
        held, self.held = self.held, None
        if held is not None:
            held.__exit__(None, None, None)


def main() -> int:
    args = parse()
    guard = Guard(args.step_timeout > 0)
    guard.arm(WARMUP_BOUND)  # the start-up: the process group, the model, a checkpoint load
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ckpt = os.path.join(args.ckpt_dir, "ckpt.pt") if args.ckpt_dir else ""
    start, done = 0, []
    held: list[bytearray] = []  # --hog-mb: memory kept, never freed
    if args.work:
        torch.set_num_threads(1)  # the work runs in the thread that reports steps
        work = torch.randn(64, 64)
    if ckpt and os.path.exists(ckpt):
        state = torch.load(ckpt)
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start, done = state["step"], state["done"]
    slowest = 0.0
    for step in range(start, args.steps):
        began = time.monotonic()
        guard.arm(step_bound(args.step_timeout, step - start, slowest))  # the whole step is under it
        report_step(step)
        if step == args.crash_at_step and rank == args.crash_rank and attempt == 0:
            print(f"rank {rank}: crashing at step {step}", flush=True)
            os._exit(1)
        if args.step_time:
            time.sleep(args.step_time)
        for _ in range(args.work):
            work = torch.tanh(work @ work)
        if args.hog_mb and rank == args.crash_rank and attempt == 0:
            held.append(bytearray(b"x") * (args.hog_mb << 20))  # written: charged to the cgroup
        if step == args.hang_at_step and rank == args.crash_rank and attempt == 0:
            time.sleep(300)  # stuck: only a watchdog timer can end this
        x = torch.randn(16, 8)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        done.append(step)
        if ckpt and rank == 0:
            tmp = ckpt + ".tmp"
            torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(),
                        "step": step + 1, "done": done}, tmp)
            os.replace(tmp, ckpt)
        dist.barrier()
        if step - start >= WARMUP_STEPS:  # start-up skew is not what a step costs
            slowest = max(slowest, time.monotonic() - began)
    guard.arm(WARMUP_BOUND)  # the end: the report, the process group's teardown
    if rank == 0:
        lost = sorted(set(range(args.steps)) - set(done))
        print(json.dumps({"steps": len(done), "unique": len(set(done)), "lost": lost,
                          "world_size": world, "attempt": attempt}), flush=True)
    # End without torch's teardown deadlock (pytorch#56297; seen in gdb: the main thread
    # in ~ProcessGroupGloo, reached from DDP's ~Reducer with the GIL held, joins gloo's run
    # loop, which waits for the GIL to destroy the last barrier's work): give the run loop
    # the GIL to retire that work, let the reducer go while the process group still has
    # another owner, and drop the group itself last, through its Python handle.
    group = dist.group.WORLD
    time.sleep(0.05)  # releases the GIL: the run loop destroys the finished barrier's work
    del model, opt
    dist.destroy_process_group()
    del group
    guard.release()
    return 0


if __name__ == "__main__":
    sys.exit(main())

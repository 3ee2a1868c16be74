"""``report_step``: the one line a worker adds so faults can be keyed by (rank, step), and
recovery judged on the training: each step carries its loss and, when the harness asks (the
fault-free twin comparison), a digest of the training state.

Digesting costs a pass over every byte of the state, so it happens only when the harness set
``HARNESS_STATE_DIGEST`` (``bench/digest.py`` measures it); otherwise ``state`` is ignored and
``report_step`` stays a line write.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator

from harness.events import EVENTS_ENV, NODE_ENV, WAKE_ENV, EventWriter, node_key
from harness.procs import share_imports
from harness.thread_cpu import ThreadCpu

#: dir where exit-code orders for report_step are left (defined here, the import-light end
#: a worker loads; ``harness.sim.faults`` re-exports it)
ORDERS_ENV = "HARNESS_ORDERS"
DIGEST_ENV = "HARNESS_STATE_DIGEST"  # set (to "1") by the harness when it wants state digests

__all__ = ["report_checkpoint", "report_step"]

_writer: EventWriter | None = None
_writer_pid: int | None = None
_taught_pid: int | None = None  # this process told its zygote what it imported (first step)
_reporting_thread = ThreadCpu()  # the CPU times of the thread that reports a step


def _obey_orders(writer: EventWriter, rank: int, step: int) -> None:
    """Exit now if the harness left an exit-code order for this rank at this step; the
    fault is recorded here, at the moment it happens (a ``kill_worker`` with its ``exit_code``)."""
    orders = os.environ.get(ORDERS_ENV)
    if not orders:
        return
    for name in (f"{rank}.{step}", f"{rank}.any"):
        path = os.path.join(orders, name)
        try:
            with open(path) as fp:
                code = int(fp.read().strip() or 1)
            os.unlink(path)
        except (FileNotFoundError, ValueError):
            continue
        import sys

        writer.emit("fault", fault="kill_worker", rank=rank, step=step, exit_code=code,
                    local_rank=int(os.environ.get("LOCAL_RANK", -1)),
                    target_node=writer.node)
        print(f"[harness] rank {rank}: exiting with code {code} at step {step} (injected)",
              file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(code)


def _events() -> EventWriter | None:
    """This process's writer (re-opened after a fork), or None outside the harness."""
    global _writer, _writer_pid
    path = os.environ.get(EVENTS_ENV)
    if not path:
        return None
    if _writer is None or _writer_pid != os.getpid():
        _writer = EventWriter(path, node_key(os.environ.get(NODE_ENV, "?")),
                              os.environ.get("TORCHELASTIC_RUN_ID", ""), os.environ.get(WAKE_ENV))
        _writer_pid = os.getpid()
    return _writer


def report_step(step: int, loss: object = None, state: object = None, **fields: object) -> None:
    """Record that this worker reached training ``step`` (a no-op outside the harness);
    obey an injected exit-code crash for this (rank, step).

    ``loss`` (a float or a 0-d tensor) goes on the timeline with the step, exactly (a float32
    loss is held exactly by the float the event carries). ``state`` (a tensor, a state dict,
    any nesting, or a function that returns one: called only then) is digested only when
    the harness asked for digests (``HARNESS_STATE_DIGEST``).
    """
    writer = _events()
    if writer is None:
        return
    rank = int(os.environ.get("RANK", -1))
    if loss is not None:
        fields["loss"] = _as_float(loss)
    if state is not None and os.environ.get(DIGEST_ENV):
        import inspect

        from harness.sim.truth.digest import state_digest

        fields["digest"] = state_digest(state() if inspect.isfunction(state) or inspect.ismethod(state) else state)
    times = _cpu_times()
    if times is not None:
        fields["cpu_run"], fields["cpu_wait"] = times
    writer.emit("step", step=int(step), rank=rank, local_rank=int(os.environ.get("LOCAL_RANK", -1)),
                restart_count=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)), **fields)
    _obey_orders(writer, rank, int(step))
    _teach_zygote()


def _teach_zygote() -> None:
    """Once per worker, at its first step: by then it has imported what it trains with; the
    zygote that forked it preloads that for the next worker (a restart: the resume is
    mostly imports otherwise; ``harness.procs._preload``)."""
    global _taught_pid
    if _taught_pid != os.getpid():
        _taught_pid = os.getpid()
        share_imports()


@contextlib.contextmanager
def report_checkpoint(step: int) -> Iterator[None]:
    """``with report_checkpoint(step): save(...)``: the save's time counts as checkpoint
    badput in the job's goodput, and its cost feeds ``project_goodput`` (a no-op outside
    the harness). The event is written when the save ends, and only if it ended normally:
    a save cut short by a crash never completed."""
    start = time.monotonic()
    yield
    writer = _events()
    if writer is not None:
        writer.emit("checkpoint", step=int(step), rank=int(os.environ.get("RANK", -1)),
                    seconds=time.monotonic() - start,
                    restart_count=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)))
    share_imports()  # a save may import what the steps did not (torch.distributed.checkpoint)


def _cpu_times() -> tuple[float, float] | None:
    """Seconds this worker's main thread has run, and has been runnable but not running
    (the kernel's run delay; a CPU quota's throttling counts): the wait names a straggler in
    step-rate terms, the run says whether a quota could slow it at all on a loaded machine
    (``harness.sim.truth.training.rank_rates``). None where /proc has no schedstat."""
    return _reporting_thread.times()


def _as_float(loss: object) -> float:
    item = getattr(loss, "item", None)  # a 0-d tensor (or a numpy scalar)
    return float(item() if callable(item) else loss)  # type: ignore[arg-type]

"""Expiration timers: a worker asks to be reaped if a block of code does not finish in time.

Usage (same API and wire formats as ``torch.distributed.elastic.timer``)::

    # in the agent's process
    server = FileTimerServer(None, run_id="job")   # private FIFO: server.file_path
    server.start()                                 # non-blocking
    server.set_workers(worker_pids)                # only these may ask to be reaped

    # in a worker
    timer.configure(FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"]))
    with timer.expires(after=60):                  # or @timer.expires(after=60)
        train_step()

Deadlines are kept on a monotonic clock and the server wakes at the nearest one, so a
timer fires at its deadline whatever ``max_interval`` is (torch: up to ``max_interval``
late, 60 s / 10 s by default). Torch's clients work with our servers and ours with
torch's servers.
"""

from harness.timer._api import (
    TimerClient,
    TimerExpiry,
    TimerRequest,
    TimerServer,
    TimerUnavailableError,
    configure,
    expires,
)
from harness.timer._clock import Clock, FakeClock, MonotonicClock
from harness.timer._debug import log_debug_info_for_expired_timers
from harness.timer._file import FileTimerClient, FileTimerRequest, FileTimerServer
from harness.timer._local import LocalTimerClient, LocalTimerServer
from harness.timer._watchdog import AgentWatchdog, WorkerTimerExpired

__all__ = [
    "AgentWatchdog",
    "Clock",
    "FakeClock",
    "FileTimerClient",
    "FileTimerRequest",
    "FileTimerServer",
    "LocalTimerClient",
    "LocalTimerServer",
    "MonotonicClock",
    "TimerClient",
    "TimerExpiry",
    "TimerRequest",
    "TimerServer",
    "TimerUnavailableError",
    "WorkerTimerExpired",
    "configure",
    "expires",
    "log_debug_info_for_expired_timers",
]

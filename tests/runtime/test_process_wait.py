"""``ProcessContext.wait``: what the agent's monitor loop blocks in, ten times a second. It
wakes for a worker's exit or for news on the caller's own fds, says which of those fds
are readable and whether a worker exited, and keeps the fds registered from one wait to
the next."""

from __future__ import annotations

import os
import signal
import sys
import time

from harness.procs import LogsSpecs, ProcessContext
from harness.selfpipe import close_pipe, drain_pipe, self_pipe, wake_pipe

#: generous: a wait that should wake at once must not be judged by this machine's load
WITHIN = 10.0


def _context(tmp_path) -> ProcessContext:
    logs = LogsSpecs(log_dir=str(tmp_path)).reify("wait", 0, "role", {0: 0}, None)
    return ProcessContext("role", sys.executable, {0: ("-c", "import time; time.sleep(60)")},
                          {0: dict(os.environ)}, logs, "spawn")


def test_wait_names_the_readable_fds_and_keeps_watching_them(tmp_path):
    pc = _context(tmp_path)
    first, second = self_pipe(), self_pipe()
    try:
        pc.start()
        woken = pc.wait(0.05, (first[0],))
        assert woken == (frozenset(), False) and woken.quiet  # nothing: the timeout
        wake_pipe(first[1])
        woken = pc.wait(WITHIN, (first[0],))
        assert woken == ({first[0]}, False) and not woken.quiet
        assert pc.wait(0.0, (first[0],)).fds == {first[0]}  # not drained: still readable
        drain_pipe(first[0])
        began = time.monotonic()
        assert pc.wait(0.2, (first[0],)).quiet
        assert time.monotonic() - began >= 0.15  # it waited: a drained pipe does not spin
        # another fd in its place: the first is no longer watched
        wake_pipe(first[1])
        assert pc.wait(0.05, (second[0],)).quiet
        wake_pipe(second[1])
        assert pc.wait(WITHIN, (first[0], second[0])).fds == {first[0], second[0]}
    finally:
        pc.close(signal.SIGKILL, grace=0)
        for pipe in (first, second):
            close_pipe(*pipe)


def test_a_worker_exit_wakes_the_wait_and_with_none_left_it_returns_at_once(tmp_path):
    pc = _context(tmp_path)
    news = self_pipe()
    try:
        pc.start()
        [proc] = pc.procs.values()
        os.kill(proc.pid, signal.SIGKILL)
        began = time.monotonic()
        woken = pc.wait(WITHIN, (news[0],))
        assert woken == (frozenset(), True)  # woken by the exit, not by news
        assert time.monotonic() - began < WITHIN
        result = pc.poll()
        assert result is not None and result.is_failed()
        # no worker left to watch: it returns at once, with every fd of the caller's to look at
        assert pc.wait(WITHIN, (news[0],)) == ({news[0]}, True)
    finally:
        pc.close(signal.SIGKILL, grace=0)
        close_pipe(*news)

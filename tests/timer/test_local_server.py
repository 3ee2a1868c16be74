"""``LocalTimerServer``/``LocalTimerClient`` over a real multiprocessing queue."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time

import pytest

from harness.timer import LocalTimerClient, LocalTimerServer

KILL = -int(signal.SIGKILL)
ctx = mp.get_context("fork")  # workers only put on the queue and sleep


def _worker(q, after, ready, mode):
    import harness.timer as timer

    timer.configure(LocalTimerClient(q))
    if mode == "release":
        with timer.expires(after=after, scope="quick"):
            pass
    elif mode == "exit-inside":  # dies holding the timer: its pid may be reused later
        with timer.expires(after=after, scope="dies"):
            q.close()
            q.join_thread()  # never die while the feeder holds the queue's shared write lock
            ready.set()
            os._exit(3)
    elif mode == "raise":
        try:
            with timer.expires(after=after, scope="raises"):
                raise ValueError("boom")
        except ValueError:
            pass
    else:
        with timer.expires(after=after, scope="hang"):
            ready.set()
            time.sleep(60)
    ready.set()
    time.sleep(60)


class Workers:
    def __init__(self, q):
        self.q, self.procs = q, []

    def start(self, after, mode="hang"):
        ready = ctx.Event()
        p = ctx.Process(target=_worker, args=(self.q, after, ready, mode), daemon=True)
        p.start()
        assert ready.wait(10), "worker did not start"
        self.procs.append(p)
        return p

    def close(self):
        for p in self.procs:
            if p.is_alive():
                p.kill()
            p.join(5)


@pytest.fixture
def mpq():
    q = ctx.Queue()
    yield q
    q.close()
    q.join_thread()


@pytest.fixture
def workers(mpq):
    w = Workers(mpq)
    yield w
    w.close()


@pytest.fixture
def local_server(mpq, expiries):
    server = LocalTimerServer(mpq, on_expired=expiries)  # default max_interval: 60 s
    server.start()
    yield server
    server.stop()


def test_hanging_worker_is_killed_long_before_max_interval(local_server, workers, expiries):
    p = workers.start(0.3)
    p.join(5)
    assert p.exitcode == KILL
    assert expiries.next().scope_ids == ("hang",)


@pytest.mark.parametrize("mode", ["release", "raise"])
def test_released_timer_does_not_fire(local_server, workers, expiries, mode):
    calm = workers.start(0.2, mode)
    hang = workers.start(0.6)  # its deadline is after the released one's
    hang.join(5)
    assert hang.exitcode == KILL
    assert calm.is_alive()
    assert expiries.next().worker_id == hang.pid and expiries.empty()


def test_timer_of_a_worker_that_exited_never_fires(local_server, workers, expiries):
    gone = workers.start(0.3, "exit-inside")
    gone.join(5)
    assert gone.exitcode == 3
    hang = workers.start(0.6)
    hang.join(5)
    assert hang.exitcode == KILL
    assert expiries.next().worker_id == hang.pid and expiries.empty()


def test_stop_is_prompt_with_a_real_queue(mpq):
    server = LocalTimerServer(mpq, max_interval=60)
    server.start()
    started = time.monotonic()
    server.stop()
    assert time.monotonic() - started < 5 and not server.is_alive()

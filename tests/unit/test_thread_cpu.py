"""``harness.thread_cpu``: a thread's wall time split into run, wait-for-a-CPU and sleep,
from the kernel's schedstat: what a fence (and a step) says about where time went."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from harness.thread_cpu import CpuSpan, ThreadCpu, cpu_span

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/thread-self/schedstat"), reason="no schedstat")


def _spin(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def _run_for(cpu_seconds: float) -> None:
    """Spin until this thread has run ``cpu_seconds`` on a CPU by its own clock (a busy
    machine stretches the wall time this takes, never the time run)."""
    end = time.thread_time() + cpu_seconds
    while time.thread_time() < end:
        pass


def test_a_spinning_thread_runs_and_a_sleeping_one_sleeps():
    cpu = ThreadCpu()
    ran0, _ = cpu.times()
    _run_for(0.1)
    ran1, _ = cpu.times()
    time.sleep(0.2)
    ran2, _ = cpu.times()
    assert ran1 - ran0 > 0.05  # ran 0.1 s by its own clock: schedstat saw it
    assert ran2 - ran1 < 0.05  # slept
    cpu.close()


def test_another_thread_is_read_by_its_id_from_any_thread():
    started, stop = threading.Event(), threading.Event()
    tid: list[int] = []

    def sleeper() -> None:
        tid.append(threading.get_native_id())
        started.set()
        stop.wait(5)

    thread = threading.Thread(target=sleeper)
    thread.start()
    started.wait(5)
    follower = ThreadCpu(tid[0])
    first = follower.times()
    _spin(0.1)  # this thread runs; the followed one does not
    second = follower.times()
    stop.set()
    thread.join()
    assert first is not None and second is not None
    assert second[0] - first[0] < 0.05
    follower.close()
    # join() returns once Python is done with the thread, a moment before the kernel is: a
    # busy machine showed the task still in /proc right after it
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/self/task/{tid[0]}") and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ThreadCpu(tid[0]).times() is None  # gone: None, not an error


def test_a_thread_that_shares_its_cpu_with_a_busy_process_waits_for_it():
    """Both pinned to one CPU: the measured spin is runnable about half the time and says
    so as wait; the sleeping half of a span is what is left of the wall time."""
    cpu0 = sorted(os.sched_getaffinity(0))[0]
    hog = subprocess.Popen([sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{cpu0}}})\nwhile True: pass"])
    try:
        time.sleep(0.2)  # the hog is pinned and spinning
        code = (f"import os, time; os.sched_setaffinity(0, {{{cpu0}}})\n"
                "from harness.thread_cpu import ThreadCpu, cpu_span\n"
                "c = ThreadCpu(); a = (time.monotonic(), *c.times())\n"
                "end = time.monotonic() + 0.6\n"
                "while time.monotonic() < end: pass\n"
                "s = cpu_span(a, (time.monotonic(), *c.times())); print(s.ran, s.waited, s.slept)")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    finally:
        hog.kill()
        hog.wait()
    ran, waited, slept = map(float, out.stdout.split())
    assert waited > 0.1, (ran, waited, slept)  # the CPU was the hog's about half the time
    assert slept < 0.1, (ran, waited, slept)  # it never slept: it spun or waited


def test_a_span_splits_wall_time_and_says_so_in_one_line():
    span = cpu_span((10.0, 1.0, 2.0), (11.3, 1.02, 2.91))
    assert span == CpuSpan(wall=pytest.approx(1.3), ran=pytest.approx(0.02), waited=pytest.approx(0.91))
    assert span.slept == pytest.approx(0.37)
    assert span.describe("its keep-alive thread") == (
        "its keep-alive thread waited 0.91s for a CPU, ran 0.02s and slept 0.37s (for an answer, the GIL, or stopped)")
    assert cpu_span(None, (1.0, 0.0, 0.0)) is None
    assert CpuSpan(wall=1.0, ran=0.6, waited=0.6).slept == 0.0  # clocks read apart: never negative

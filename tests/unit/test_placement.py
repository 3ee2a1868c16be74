"""Where an agent puts its workers (``harness.procs._placement``): the nice increment read
from the environment, and every thread of a real process niced."""

from __future__ import annotations

import os
import subprocess
import sys

from harness.procs._placement import WORKER_NICE_ENV, lower_priority, place_worker, worker_nice

_THREADS = "\n".join([
    "import threading, time",
    "for _ in range(3): threading.Thread(target=time.sleep, args=(60,), daemon=True).start()",
    "print('ready', flush=True)",
    "time.sleep(60)",
])


def test_the_increment_is_read_within_0_to_19_and_garbage_is_none():
    assert worker_nice({}) == 0
    assert worker_nice({WORKER_NICE_ENV: "10"}) == 10
    assert worker_nice({WORKER_NICE_ENV: "40"}) == 19
    assert worker_nice({WORKER_NICE_ENV: "-5"}) == 0  # never above the agent
    assert worker_nice({WORKER_NICE_ENV: "ten"}) == 0


def test_every_thread_of_the_worker_is_niced_relative_to_the_agent():
    child = subprocess.Popen([sys.executable, "-c", _THREADS], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        lower_priority(child.pid, 7)
        mine = os.getpriority(os.PRIO_PROCESS, 0)
        tids = [int(t) for t in os.listdir(f"/proc/{child.pid}/task")]
        assert len(tids) == 4
        assert {os.getpriority(os.PRIO_PROCESS, t) for t in tids} == {min(19, mine + 7)}
    finally:
        child.kill()
        child.communicate()


def test_a_worker_placed_twice_relative_to_its_agent_is_niced_once():
    """The worker places itself as it starts (``harness.procs._zygote``), its agent places it
    once it has its pid, in either order: relative to the agent's nice value both times,
    the second changes nothing. Relative to the worker's own, the second added the increment
    again (nice 19 where 10 was asked)."""
    child = subprocess.Popen([sys.executable, "-c", _THREADS], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        mine = os.getpriority(os.PRIO_PROCESS, 0)
        lower_priority(child.pid, 5, base=mine)
        lower_priority(child.pid, 5, base=mine)
        lower_priority(child.pid, 5)  # the agent's own call: relative to the caller
        tids = [int(t) for t in os.listdir(f"/proc/{child.pid}/task")]
        assert {os.getpriority(os.PRIO_PROCESS, t) for t in tids} == {min(19, mine + 5)}
    finally:
        child.kill()
        child.communicate()


def test_a_cgroup_that_cannot_be_joined_is_named_and_the_worker_runs_on(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        missing = str(tmp_path / "no-such-cgroup" / "cgroup.procs")
        [problem] = place_worker(child.pid, 0, [missing])
        assert f"cannot move worker {child.pid} into {tmp_path / 'no-such-cgroup'}" in problem
        assert child.poll() is None
    finally:
        child.kill()
        child.wait()


def test_the_zygote_leaves_a_worker_its_agent_places_where_it_forked_it():
    """A worker whose agent names its cgroups (``HARNESS_WORKER_CGROUP``) is moved there by
    the agent as soon as it has the pid; the zygote's own move into the agent's cgroups
    would be undone at once, and each move waits for the kernel, one worker after another."""
    from harness.procs._placement import WORKER_CGROUP_ENV
    from harness.procs._zygote import _placed_by_its_agent

    assert _placed_by_its_agent({WORKER_CGROUP_ENV: "/sys/fs/cgroup/cpu/n0/workers/cgroup.procs"})
    assert not _placed_by_its_agent({WORKER_CGROUP_ENV: ""})  # the agent's own cgroups: the zygote moves it
    assert not _placed_by_its_agent({})
    assert not _placed_by_its_agent(None)  # a request without an environment

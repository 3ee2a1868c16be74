"""The event bus (``harness.sim.bus``) and one node identity: writers wake the harness's one
reader, a lost wake-up loses nothing, agent exits wake waiters, every node API takes the
integer index, and the harness records what it did to a node on that node's timeline."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading

import pytest

from harness import Cluster, WorkerState
from harness.errors import ConfigError
from harness.events import EventWriter, event_writer_from_env
from harness.sim.bus import EventBus
from harness.sim.truth.timeline import Timeline
from tests.conftest import SCRIPTS

SLEEPER = str(SCRIPTS / "sleeper.py")
NEVER = 3600.0  # a safety re-read that never comes within a test: only a wake-up can help


@pytest.fixture
def bus(tmp_path):
    path = tmp_path / "events.jsonl"
    path.touch()
    made: list[EventBus] = []

    def make(safety: float = NEVER) -> EventBus:
        made.append(EventBus(Timeline(str(path)), str(tmp_path), safety=safety))
        return made[-1]

    yield make
    for b in made:
        b.close()


def _read_by_the_reader(bus: EventBus, count: int) -> bool:
    """Did the reader thread (not a query: ``_events`` is looked at without refreshing)
    bring the timeline to ``count`` events?"""
    return bus.wait_until(lambda: len(bus.timeline._events) >= count, timeout=30)


def test_a_writer_wakes_the_reader(bus):
    b = bus()
    writer = EventWriter(b.timeline.path, 0, "r", wake=b.wake_path)
    writer.emit("state", state="INIT")
    writer.close()
    assert _read_by_the_reader(b, 1)
    assert b.timeline.states(0) == [WorkerState.INIT]


def test_a_lost_wake_up_loses_no_event(bus):
    """No datagram at all (a writer without the socket): the periodic re-read finds it."""
    b = bus(safety=0.05)
    writer = EventWriter(b.timeline.path, 0, "r")  # no wake
    writer.emit("state", state="INIT")
    writer.close()
    assert _read_by_the_reader(b, 1)


def test_an_agent_exit_wakes_the_waiters(bus):
    b = bus()
    exited = threading.Event()
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        b.watch(proc.pid, exited.set)
        proc.kill()
        assert b.wait_until(exited.is_set, timeout=30)
    finally:
        proc.kill()
        proc.wait()


def test_a_writer_never_depends_on_a_reader(tmp_path):
    """A wake path nobody listens on (or that does not exist) is silently ignored."""
    path = str(tmp_path / "events.jsonl")
    env = {"HARNESS_EVENTS": path, "HARNESS_NODE": "3",
           "HARNESS_EVENTS_WAKE": str(tmp_path / "nobody.sock")}
    writer = event_writer_from_env(env, "r", "host")
    writer.emit("state", state="INIT")
    writer.close()
    with open(path) as lines:
        [event] = [json.loads(line) for line in lines]
    assert event["node"] == 3 and event["state"] == "INIT"  # the index, as an integer


def test_concurrent_queries_see_every_event_once(tmp_path):
    """Queries from several threads while lines arrive (the fault thread and the test did
    this): each sees a growing prefix, none an empty or torn view, and none is lost or
    doubled. (A timeline refreshed by two threads at once used to skip or repeat lines,
    and its in-place sort showed the other threads an empty list.)"""
    path = tmp_path / "events.jsonl"
    timeline = Timeline(str(path))
    writer = EventWriter(str(path), 0, "r")
    total = 3000
    problems: list[str] = []
    done = threading.Event()

    def query() -> None:
        seen = 0
        while not done.is_set() or seen < total:
            count = len(timeline.events("step"))
            if count < seen:
                problems.append(f"saw {count} steps after {seen}")
                return
            if count > total:
                problems.append(f"saw {count} steps of {total}")
                return
            seen = count

    threads = [threading.Thread(target=query) for _ in range(4)]
    for t in threads:
        t.start()
    for step in range(total):
        writer.emit("step", step=step, rank=step % 2)
    done.set()
    for t in threads:
        t.join(60)
    writer.close()
    assert problems == []
    assert [e["step"] for e in timeline.steps()] == list(range(total))


# -- one node identity, the harness's own records ----------------------------------------------


def test_kill_node_leaves_a_terminal_entry_under_the_integer_index(warm_pool):
    with Cluster(pool=warm_pool, nnodes="1:2", nproc_per_node=1, max_restarts=0) as cluster:
        job = cluster.launch(SLEEPER)
        job.wait_for_state(WorkerState.HEALTHY, timeout=30)
        job.kill_node(node=1)
        states = job.timeline.states(1)  # right away: kill_node returns once it is recorded
        assert states and states[-1] == WorkerState.FAILED, job.timeline.format()
        [entry] = [e for e in job.timeline.events("state", 1) if e.get("source") == "harness"]
        assert entry["cause"] == "kill_node" and entry["signal"] == signal.SIGKILL
        [start] = [e for e in job.timeline.events("node_start") if e["target_node"] == 1]
        assert start["node"] == "harness" and start["pid"] == job.nodes[1].pid
        assert start["label"] == job.node_name(1) == job.timeline.label(1)
        exits = [e for e in job.timeline.events("node_exit") if e["target_node"] == 1]
        assert [(e["cause"], e["signal"]) for e in exits] == [("kill_node", signal.SIGKILL)]
        # the survivor is untouched by the harness: no entry of its own, never FAILED (its agent
        # may already be re-forming the world without node 1: STOPPED is its own reaction)
        assert [e for e in job.timeline.events("state", 0) if e.get("source") == "harness"] == []
        assert WorkerState.FAILED not in job.timeline.states(0)


def test_an_unknown_node_raises_naming_the_valid_ones(warm_pool):
    with Cluster(pool=warm_pool, nnodes=2, nproc_per_node=1, max_restarts=0) as cluster:
        job = cluster.launch(SLEEPER)
        label = job.node_name(0)
        for query in (lambda: job.timeline.states(2), lambda: job.timeline.states(label),
                      lambda: job.timeline.events("state", node=7), lambda: job.kill_node(5),
                      lambda: job.hang_worker(node=3, local_rank=0)):
            with pytest.raises(ConfigError, match=r"is not .*nodes.*\[0, 1\]"):
                query()
        assert sorted(job.timeline.labels()) == [0, 1]


def test_a_frozen_node_ends_its_timeline_and_wait_skips_it(warm_pool):
    with Cluster(pool=warm_pool, nnodes="1:2", nproc_per_node=1, max_restarts=0) as cluster:
        job = cluster.launch(str(SCRIPTS / "stepper.py"), "30", "0.03")
        job.wait_for_state(WorkerState.HEALTHY, timeout=30)
        job.freeze_node(node=1)
        assert job.timeline.states(1)[-1] == WorkerState.FAILED
        [entry] = [e for e in job.timeline.events("state", 1) if e.get("source") == "harness"]
        assert entry["cause"] == "freeze_node" and entry["signal"] == signal.SIGSTOP
        job.wait(timeout=90)  # the frozen node never finishes; wait does not wait for it
        assert not job.nodes[0].alive() and job.nodes[1].alive()
    exits = {e["target_node"]: e for e in job.timeline.events("node_exit")}
    assert exits[1]["cause"] == "freeze_node" and exits[1]["signal"] == signal.SIGKILL  # at close
    assert exits[0]["cause"] is None and exits[0]["exitcode"] == 0
    assert not os.path.exists(job.bus.wake_path)


def test_a_deep_directory_binds_in_a_short_one_removed_at_close(tmp_path):
    """Unix socket paths are limited to 107 bytes: a deep TMPDIR binds under /tmp, in a dir
    named by the harness pid, removed by ``close`` (or by the next bus, once that pid died)."""
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    (deep / "events.jsonl").touch()
    stale = tempfile.mkdtemp(prefix=f"elastic_wake_{_dead_pid()}_", dir="/tmp")
    bus = EventBus(Timeline(str(deep / "events.jsonl")), str(deep))
    try:
        assert bus.wake_path.startswith(f"/tmp/elastic_wake_{os.getpid()}_")
        assert not os.path.exists(stale)
        writer = EventWriter(bus.timeline.path, 0, "r", wake=bus.wake_path)
        writer.emit("state", state="INIT")
        writer.close()
        assert _read_by_the_reader(bus, 1)
    finally:
        bus.close()
        shutil.rmtree(stale, ignore_errors=True)
    assert not os.path.exists(os.path.dirname(bus.wake_path))


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid

"""``AgentWatchdog``: the agent's FileTimerServer bound to its worker group."""

from __future__ import annotations

import os
import queue
import signal
import stat
import threading

from harness.timer import AgentWatchdog, WorkerTimerExpired
from harness.timer._watchdog import ENABLE_FILE_TIMER_ENV, TIMER_FILE_ENV

from .conftest import alive, read_line

KILL = -int(signal.SIGKILL)


def test_disabled_watchdog_is_a_no_op():
    dog = AgentWatchdog("run", enabled=False)
    dog.start()
    assert dog.worker_env() == {} and dog.file_path is None and dog.healthy
    dog.set_workers({0: os.getpid()})
    dog.stop()


def test_from_env_reads_torchs_variables(tmp_path):
    path = str(tmp_path / "t.fifo")
    dog = AgentWatchdog.from_env("run", {ENABLE_FILE_TIMER_ENV: "1", TIMER_FILE_ENV: path})
    assert dog.enabled
    with dog:
        assert dog.worker_env() == {TIMER_FILE_ENV: path}
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert not os.path.exists(path)
    assert not AgentWatchdog.from_env("run", {}).enabled


def test_expired_worker_is_reported_with_rank_and_scope(children):
    reports: queue.Queue[WorkerTimerExpired] = queue.Queue()
    dog = AgentWatchdog("run", enabled=True, on_expired=reports.put)
    dog.start()
    try:
        env = dog.worker_env()
        path = env[TIMER_FILE_ENV]
        assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
        other = children.worker("env", "-", 30, env=env)  # not in the group: ignored
        worker = children.worker("env", "-", 0.3, env=env)
        assert read_line(worker) == "acquired" and read_line(other) == "acquired"
        dog.set_workers({1: worker.pid})  # after its request arrived: held, then applied
        assert worker.wait(5) == KILL
        report = reports.get(timeout=5)
        assert (report.local_rank, report.pid, report.scopes, report.reaped) == (
            1, worker.pid, ("from-env",), True)
        event = report.as_event()
        assert event["kind"] == "timer_expired" and event["scope"] == "from-env"
        assert event["signal"] == "SIGKILL" and event["local_rank"] == 1
        assert alive(other) and dog.healthy
    finally:
        dog.stop()
    assert not os.path.exists(path) and not os.path.exists(os.path.dirname(path))


def test_workers_of_a_stopped_group_are_dropped(children):
    reports: queue.Queue[WorkerTimerExpired] = queue.Queue()
    with AgentWatchdog("run", enabled=True, on_expired=reports.put) as dog:
        old = children.worker("env", "-", 0.3, env=dog.worker_env())
        assert read_line(old) == "acquired"
        dog.set_workers({0: old.pid})
        dog.set_workers({})  # the group stopped (the agent kills it itself)
        new = children.worker("env", "-", 0.8, env=dog.worker_env())
        dog.set_workers({0: new.pid})
        assert new.wait(5) == KILL
        assert alive(old)
        assert reports.get(timeout=5).pid == new.pid and reports.empty()


def test_a_reaped_worker_is_known_before_on_expired_returns(children):
    """The agent can see the killed worker exit before the callback ran (the callback
    is called after the signal, outside the server's lock): ``expiry_of`` must already
    name the scope then, or the error summary loses the cause."""
    entered, release = threading.Event(), threading.Event()
    seen_in_callback: list[WorkerTimerExpired | None] = []

    def slow_callback(expired: WorkerTimerExpired) -> None:
        seen_in_callback.append(dog.expiry_of(expired.pid))
        entered.set()
        release.wait(10)

    dog = AgentWatchdog("run", enabled=True, on_expired=slow_callback)
    dog.start()
    try:
        worker = children.worker("env", "-", 0.3, env=dog.worker_env())
        assert read_line(worker) == "acquired"
        assert dog.expiry_of(worker.pid) is None
        dog.set_workers({2: worker.pid})
        assert worker.wait(5) == KILL
        known = dog.expiry_of(worker.pid)  # the callback may not have started yet
        assert known is not None and (known.local_rank, known.scopes) == (2, ("from-env",))
        assert entered.wait(5)
        assert seen_in_callback == [known]
    finally:
        release.set()
        dog.stop()

"""Expiry logic with a fake clock: no sleeps, no timing assertions.

The servers run on ``FakeClock``; most tests drive the watchdog pass by hand
(``tick``), a few let the real thread run and order on events. Timers are registered
for real (harmless) child processes, because identity is checked through /proc; the
recording server below never signals them.
"""

from __future__ import annotations

import os
import queue
import signal
import threading
import time

import psutil
import pytest

from harness.errors import ConfigError
from harness.timer import (
    FakeClock,
    FileTimerRequest,
    LocalTimerServer,
    MonotonicClock,
    TimerExpiry,
    TimerRequest,
    _engine,
    _proc,
)

KILL, TERM = int(signal.SIGKILL), int(signal.SIGTERM)


class Recording(LocalTimerServer):
    """Records reaps instead of signalling; ``fail`` makes the next N reaps fail."""

    def __init__(self, clock, **kwargs):
        self.reaped: list[tuple[int, int]] = []
        self.reap_event = threading.Event()
        self.fail = 0
        super().__init__(queue.Queue(), max_interval=60, clock=clock, **kwargs)

    def _reap_worker(self, worker_id, sig=KILL):
        if self.fail:
            self.fail -= 1
            return False
        self.reaped.append((worker_id, sig))
        self.reap_event.set()
        return True


def tick(server) -> None:
    """One watchdog pass without waiting: expire what is due, housekeeping."""
    server._expire_due()
    server._housekeeping()


def acquire(clock, pid, scope, after, sig=None):
    exp = clock.wall() + after
    return TimerRequest(pid, scope, exp) if sig is None else FileTimerRequest(pid, scope, exp, sig)


def release(pid, scope):
    return TimerRequest(pid, scope, -1)


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def events():
    return []


@pytest.fixture
def server(clock, events):
    s = Recording(clock, on_expired=events.append, log_event=lambda n, r: events.append(n))
    yield s
    s.stop()


@pytest.fixture
def w1(children):
    return children.sleeper()


@pytest.fixture
def w2(children):
    return children.sleeper()


def test_timer_fires_at_its_deadline_and_only_once(server, clock, w1):
    server.register_timers([acquire(clock, w1.pid, "s", 5)])
    clock.advance(4.9)
    tick(server)
    assert server.reaped == []
    clock.advance(0.2)
    tick(server)
    assert server.reaped == [(w1.pid, KILL)]
    assert server.timer_count == 0
    clock.advance(100)
    tick(server)
    assert server.reaped == [(w1.pid, KILL)]


def test_release_cancels_the_timer(server, clock, w1):
    server.register_timers([acquire(clock, w1.pid, "s", 5), release(w1.pid, "s")])
    clock.advance(10)
    tick(server)
    assert server.reaped == [] and server.timer_count == 0


def test_reacquire_moves_the_deadline(server, clock, w1):
    server.register_timers([acquire(clock, w1.pid, "s", 5)])
    clock.advance(4)
    server.register_timers([acquire(clock, w1.pid, "s", 5)])
    clock.advance(4)
    tick(server)
    assert server.reaped == []
    clock.advance(1.1)
    tick(server)
    assert server.reaped == [(w1.pid, KILL)]


class SlowReader(Recording):
    """Runs ``meanwhile`` right after its ``after``-th read: what happens while the
    watchdog thread, holding requests it has not registered yet, is off the CPU."""

    def __init__(self, clock, meanwhile, after=1):
        super().__init__(clock)
        self._meanwhile = meanwhile
        self._reads_left = after

    def _receive(self, timeout):
        got = super()._receive(timeout)
        self._reads_left -= 1
        meanwhile, self._meanwhile = (self._meanwhile, None) if self._reads_left == 0 else (None, self._meanwhile)
        if meanwhile is not None:
            meanwhile()
        return got


@pytest.mark.parametrize("after", [1, 2], ids=["after its first read", "after it read what came meanwhile"])
def test_a_release_sent_in_time_beats_a_slow_read(clock, w1, after):
    """The release comes while the thread holds the acquire unregistered, after its first
    read or after the read of what came meanwhile (seen once under the full suite: a
    worker killed for a scope it had released); the thread resumes past the deadline."""
    def meanwhile():
        server._mp_queue.put(release(w1.pid, "s"))
        clock.advance(10)

    server = SlowReader(clock, meanwhile, after)
    try:
        server._mp_queue.put(acquire(clock, w1.pid, "s", 5))
        server._run_watchdog()
        assert server.reaped == [] and server.timer_count == 0
    finally:
        server.stop()


def test_nearest_deadline_drives_the_wakeup_not_max_interval(server, clock, w1, w2):
    server.register_timers([acquire(clock, w1.pid, "late", 30), acquire(clock, w2.pid, "soon", 5)])
    assert server._next_wakeup() == pytest.approx(clock.now() + 5, abs=1e-3)
    real = Recording(MonotonicClock())  # max_interval=60, one timer due in 2 s
    try:
        real.register_timers([TimerRequest(w1.pid, "s", time.time() + 2)])
        assert real._wait_timeout() <= 2.0
    finally:
        real.stop()


def test_workers_expire_in_deadline_order(server, clock, w1, w2, events):
    server.register_timers([acquire(clock, w1.pid, "a", 10), acquire(clock, w2.pid, "b", 5)])
    clock.advance(7)
    tick(server)
    clock.advance(7)
    tick(server)
    assert server.reaped == [(w2.pid, KILL), (w1.pid, KILL)]
    reports = [e for e in events if isinstance(e, TimerExpiry)]
    assert [(r.worker_id, r.scope_ids, r.reaped) for r in reports] == [
        (w2.pid, ("b",), True), (w1.pid, ("a",), True)]
    assert reports[0].lateness == pytest.approx(2, abs=1e-3)


def test_concurrent_scopes_of_one_worker(server, clock, w1, events):
    server.register_timers([acquire(clock, w1.pid, "outer", 30), acquire(clock, w1.pid, "a", 5),
                            acquire(clock, w1.pid, "b", 3), release(w1.pid, "b")])
    clock.advance(6)
    tick(server)
    assert server.reaped == [(w1.pid, KILL)]
    assert [e.scope_ids for e in events if isinstance(e, TimerExpiry)] == [("a",)]
    assert server.timer_count == 0  # the reaped worker's other timers go with it


def test_wall_clock_steps_do_not_move_deadlines(server, clock, w1):
    server.register_timers([acquire(clock, w1.pid, "s", 5)])
    clock.step_wall(+7200)  # torch (time.time()) would fire now
    tick(server)
    assert server.reaped == []
    clock.step_wall(-3 * 3600)
    clock.advance(4.9)
    tick(server)
    assert server.reaped == []
    clock.advance(0.2)
    tick(server)
    assert server.reaped == [(w1.pid, KILL)]


def test_deadline_already_past_on_receipt_fires_at_once(server, clock, w1):
    server.register_timers([TimerRequest(w1.pid, "old", 1.0)])  # 1 s after the epoch
    tick(server)
    assert server.reaped == [(w1.pid, KILL)]


def test_get_expired_timers_uses_the_wire_timeline(server, clock, w1, w2):
    a, b = acquire(clock, w1.pid, "a", 5), acquire(clock, w2.pid, "b", 8)
    server.register_timers([a, b])
    assert server.get_expired_timers(clock.wall() + 4.9) == {}
    assert server.get_expired_timers(clock.wall() + 6) == {w1.pid: [a]}
    assert server.get_expired_timers(clock.wall() + 9) == {w1.pid: [a], w2.pid: [b]}
    server.clear_timers({w1.pid})
    assert server.get_expired_timers(clock.wall() + 9) == {w2.pid: [b]}


def test_exited_worker_timers_are_dropped_without_a_signal(server, clock, w1):
    server.register_timers([acquire(clock, w1.pid, "s", 5)])
    w1.kill()
    w1.wait()
    clock.advance(6)
    tick(server)
    assert server.reaped == [] and server.timer_count == 0


def test_reused_pid_is_never_signalled(server, clock, w1, monkeypatch):
    server.register_timers([acquire(clock, w1.pid, "s", 5)])
    real = _engine.start_time  # from now on the pid belongs to a process started later
    monkeypatch.setattr(_engine, "start_time", lambda pid: real(pid) + 1 if pid == w1.pid else real(pid))
    clock.advance(6)
    tick(server)
    assert server.reaped == [] and server.timer_count == 0


def test_signal_if_same_checks_the_start_time(children):
    proc = children.sleeper()
    start = _proc.start_time(proc.pid)
    assert _proc.signal_if_same(proc.pid, start + 1, KILL) is False
    assert proc.poll() is None
    assert _proc.signal_if_same(proc.pid, start, KILL) is True
    assert proc.wait(5) == -KILL
    assert _proc.signal_if_same(proc.pid, start, KILL) is False  # reaped: gone


PROTECTED = {"self": os.getpid, "parent": os.getppid, "init": lambda: 1, "zero": lambda: 0,
             "group": lambda: -1}  # ids by name: xdist workers must collect the same tests


@pytest.mark.parametrize("who", sorted(PROTECTED))
def test_signal_if_same_refuses_protected_pids(who):
    with pytest.raises(PermissionError):
        _proc.signal_if_same(PROTECTED[who](), 0, KILL)


def test_allow_list_ignores_other_pids(server, clock, w1, w2):
    server.set_workers({w1.pid: None})
    server.register_timers([acquire(clock, w2.pid, "forged", 1), acquire(clock, w1.pid, "ok", 2)])
    clock.advance(3)
    tick(server)
    assert server.reaped == [(w1.pid, KILL)]
    clock.advance(_engine.PENDING_TTL + 60)  # the held request expires unregistered
    tick(server)
    assert server.reaped == [(w1.pid, KILL)]
    assert server.rejected == 1
    server.add_worker(w2.pid)  # too late: the forged request is gone
    tick(server)
    assert server.reaped == [(w1.pid, KILL)]


def test_request_before_registration_is_applied_once_registered(server, clock, w1):
    server.set_workers({})
    server.register_timers([acquire(clock, w1.pid, "early", 2)])
    assert server.timer_count == 0
    clock.advance(3)
    server.set_workers({w1.pid: None})  # the agent learns its new worker's pid
    assert server.timer_count == 1
    tick(server)
    assert server.reaped == [(w1.pid, KILL)]


def test_release_of_a_held_request_cancels_it(server, clock, w1):
    server.set_workers({})
    server.register_timers([acquire(clock, w1.pid, "s", 2), release(w1.pid, "s")])
    server.set_workers({w1.pid: None})
    clock.advance(3)
    tick(server)
    assert server.reaped == [] and server.timer_count == 0


def test_wrong_start_time_in_allow_list_is_rejected(server, clock, w1):
    server.set_workers({w1.pid: _proc.start_time(w1.pid) + 1})  # a previous owner of the pid
    server.register_timers([acquire(clock, w1.pid, "s", 1)])
    clock.advance(2)
    tick(server)
    assert server.reaped == [] and server.rejected == 1


def test_set_workers_drops_timers_of_former_workers(server, clock, w1, w2):
    server.set_workers([w1.pid, w2.pid])
    server.register_timers([acquire(clock, w1.pid, "a", 5), acquire(clock, w2.pid, "b", 5)])
    server.set_workers([w2.pid])
    clock.advance(6)
    tick(server)
    assert server.reaped == [(w2.pid, KILL)]
    assert server.workers == {w2.pid: _proc.start_time(w2.pid)}


def test_set_workers_checks_its_input(server):
    with pytest.raises(ConfigError, match="pid="):
        server.set_workers({0: None})


def test_default_mode_accepts_only_descendants(server, clock):
    mine = {p.pid for p in psutil.Process().children(recursive=True)}
    stranger = next((p for p in psutil.pids() if p not in mine and not _proc.is_protected(p)
                     and _proc.start_time(p) is not None), None)
    if stranger is None:
        pytest.skip("no non-descendant process visible")
    server.register_timers([acquire(clock, stranger, "s", 0)])
    clock.advance(1)
    tick(server)
    assert server.reaped == [] and server.rejected == 1 and server.timer_count == 0


@pytest.mark.parametrize("who", [*sorted(PROTECTED), "str", "bool", "huge"])
def test_never_accepts_itself_its_parent_or_non_pids(server, clock, who):
    pid = {"str": lambda: "12", "bool": lambda: True, "huge": lambda: 2**40, **PROTECTED}[who]()
    server.register_timers([TimerRequest(pid, "s", clock.wall())])
    clock.advance(1)
    tick(server)
    assert server.reaped == [] and server.rejected == 1


@pytest.mark.parametrize("bad", [
    TimerRequest(123, 5, 10.0),                      # scope not a string
    TimerRequest(123, "s", float("nan")),            # deadline not finite
    TimerRequest(123, "s", "soon"),
    FileTimerRequest(123, "s", 10.0, signal.SIGSTOP),  # signal not on the allow-list
    FileTimerRequest(123, "s", 10.0, 64),
    object(),
])
def test_malformed_requests_are_skipped_alone(server, clock, w1, bad):
    server.register_timers([bad, acquire(clock, w1.pid, "ok", 1)])
    clock.advance(2)
    tick(server)
    assert server.reaped == [(w1.pid, KILL)] and server.rejected == 1


def test_signal_choice_and_no_kill_timers(server, clock, w1, w2, events):
    server.register_timers([
        acquire(clock, w1.pid, "watch-only", 1, sig=0),   # expires without a signal
        acquire(clock, w2.pid, "quiet", 1, sig=0),
        acquire(clock, w2.pid, "term", 2, sig=TERM),
    ])
    clock.advance(1.5)
    tick(server)
    assert server.reaped == []
    clock.advance(1)
    tick(server)
    assert server.reaped == [(w2.pid, TERM)]
    reports = [(e.worker_id, e.scope_ids, e.signal, e.reaped) for e in events
               if isinstance(e, TimerExpiry)]
    assert sorted(reports[:2]) == sorted([(w1.pid, ("watch-only",), 0, False),
                                          (w2.pid, ("quiet",), 0, False)])
    assert reports[2] == (w2.pid, ("term",), TERM, True)
    assert events.count("timer expired") == 3 and events.count("kill worker process") == 1


def test_failed_reap_is_retried_later(server, clock, w1):
    server.fail = 1
    server.register_timers([acquire(clock, w1.pid, "s", 1)])
    clock.advance(2)
    tick(server)
    assert server.reaped == [] and server.timer_count == 1
    clock.advance(_engine.RETRY_DELAY + 0.1)
    tick(server)
    assert server.reaped == [(w1.pid, KILL)]


def test_released_timers_do_not_grow_the_heap(server, clock, w1):
    for _ in range(5000):
        server.register_timers([acquire(clock, w1.pid, "s", 100), release(w1.pid, "s")])
    assert server.timer_count == 0
    assert len(server._heap) <= 64 + 2


def test_housekeeping_forgets_exited_workers(server, clock, w1):
    server.register_timers([acquire(clock, w1.pid, "s", 1000)])
    w1.kill()
    w1.wait()
    clock.advance(61)  # one max_interval
    tick(server)
    assert server.timer_count == 0 and server.reaped == []


def test_fake_clock_drives_the_real_thread(clock, w1, w2):
    server = Recording(clock)
    server.start()
    try:
        server._mp_queue.put(acquire(clock, w1.pid, "a", 5))
        server._mp_queue.put(acquire(clock, w2.pid, "b", 10))
        deadline = time.monotonic() + 5
        while server.timer_count < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert server.timer_count == 2
        clock.advance(7)
        assert server.reap_event.wait(5)
        assert server.reaped == [(w1.pid, KILL)]  # the clock is short of b's deadline
        server.reap_event.clear()
        clock.advance(5)
        assert server.reap_event.wait(5)
        assert server.reaped == [(w1.pid, KILL), (w2.pid, KILL)]
    finally:
        server.stop()
    assert not server.is_alive() and server.error is None


def test_fake_clock_real_kill(clock, w1):
    server = LocalTimerServer(queue.Queue(), clock=clock)
    server.start()
    try:
        server._mp_queue.put(acquire(clock, w1.pid, "s", 30))
        clock.advance(20)
        assert w1.poll() is None
        clock.advance(20)
        assert w1.wait(5) == -KILL
    finally:
        server.stop()


def test_stop_is_prompt_whatever_max_interval(clock):
    server = LocalTimerServer(queue.Queue(), max_interval=60)
    server.start()
    started = time.monotonic()
    server.stop()
    assert time.monotonic() - started < 5  # torch: joins for max_interval (60 s)
    assert not server.is_alive()


def test_a_dead_watchdog_thread_is_visible(caplog):
    seen = []

    class Broken(LocalTimerServer):
        def _receive(self, timeout):
            raise RuntimeError("transport broke")

    server = Broken(queue.Queue(), log_event=lambda name, req: seen.append(name))
    server.start()
    server._thread.join(5)
    try:
        assert not server.is_alive()
        assert isinstance(server.error, RuntimeError)
        assert "watchdog failed" in seen
        assert "watchdog thread died" in caplog.text
        assert "failed" in repr(server)
    finally:
        server.stop()


def test_a_failing_callback_does_not_stop_the_server(clock, w1, w2):
    def explode(expiry):
        raise ValueError("callback bug")

    server = Recording(clock, on_expired=explode)
    server.start()
    try:
        server._mp_queue.put(acquire(clock, w1.pid, "a", 1))
        server._mp_queue.put(acquire(clock, w2.pid, "b", 3))
        deadline = time.monotonic() + 5
        while server.timer_count < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        clock.advance(5)
        deadline = time.monotonic() + 5
        while len(server.reaped) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert {p for p, _ in server.reaped} == {w1.pid, w2.pid}
        assert server.is_alive()
    finally:
        server.stop()


@pytest.mark.parametrize("value", [0, -1, float("inf"), "10", None])
def test_max_interval_is_checked(value):
    with pytest.raises(ConfigError, match="max_interval="):
        LocalTimerServer(queue.Queue(), max_interval=value)


def test_start_twice_runs_one_watchdog_and_a_file_server_cannot_restart(tmp_path):
    """As torch's: a second start() is accepted (we keep one thread); the FIFO server's
    stop() removes its file, so starting it again is a one-line RuntimeError."""
    from harness.timer import FileTimerServer

    server = LocalTimerServer(queue.Queue())
    server.start()
    try:
        thread = server._thread
        server.start()
        assert server._thread is thread and server.is_alive()
    finally:
        server.stop()
    server.stop()  # idempotent
    fifo = FileTimerServer(str(tmp_path / "t.fifo"), "run", max_interval=0.01)
    fifo.start()
    fifo.stop()
    with pytest.raises(RuntimeError, match="stop\\(\\) released its resources"):
        fifo.start()


def test_custom_server_on_the_abstract_base(w1):
    """A torch-style subclass (request queue with size/get) runs on the base loop."""
    from harness.timer import TimerServer

    class ListQueue:
        def __init__(self):
            self.items = queue.Queue()

        def size(self):
            return self.items.qsize()

        def get(self, size, timeout):
            out = []
            try:
                out.append(self.items.get(timeout=timeout))
                while len(out) < size:
                    out.append(self.items.get_nowait())
            except queue.Empty:
                pass
            return out

    class Mine(TimerServer):
        def __init__(self, q):
            super().__init__(q, max_interval=0.05)
            self.timers, self.reaped = {}, threading.Event()

        def register_timers(self, timer_requests):
            for r in timer_requests:
                self.timers[(r.worker_id, r.scope_id)] = r

        def clear_timers(self, worker_ids):
            self.timers = {k: v for k, v in self.timers.items() if k[0] not in worker_ids}

        def get_expired_timers(self, deadline):
            out = {}
            for (pid, _), r in self.timers.items():
                if r.expiration_time <= deadline:
                    out.setdefault(pid, []).append(r)
            return out

        def _reap_worker(self, worker_id):
            self.reaped.set()
            return True

    q = ListQueue()
    server = Mine(q)
    server.start()
    try:
        q.items.put(TimerRequest(w1.pid, "s", time.time()))
        assert server.reaped.wait(5)
    finally:
        server.stop()
    assert server.timers == {} and server.error is None


def test_register_from_another_thread_wakes_the_loop(w1):
    server = LocalTimerServer(queue.Queue(), max_interval=60)  # waits up to 60 s otherwise
    server.start()
    try:
        time.sleep(0.05)  # let the loop block with nothing to do
        server.register_timers([TimerRequest(w1.pid, "direct", time.time() + 0.1)])
        assert w1.wait(5) == -KILL
    finally:
        server.stop()

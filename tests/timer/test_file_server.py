"""``FileTimerServer`` with real worker processes and a real FIFO.

Generous bounds only ("killed within 5 s"); precision is measured in bench/timers.py.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import time

import pytest

from harness.errors import ConfigError
from harness.timer import FileTimerServer, _proc

from .conftest import alive, read_line

KILL = -int(signal.SIGKILL)


def _write(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def _line(pid: int, scope: str = "forged", after: float = 0.0, sig: int = 9) -> bytes:
    return (json.dumps({"version": 1, "pid": pid, "scope_id": scope,
                        "expiration_time": time.time() + after, "signal": sig}) + "\n").encode()


def test_hanging_worker_is_killed(file_server, children, expiries):
    worker = children.worker("hang", file_server.file_path, 0.5)
    assert read_line(worker) == "acquired"
    assert worker.wait(5) == KILL
    expiry = expiries.next()
    # "released" (0.2 s) was released in time: only the hanging scope expired
    assert (expiry.worker_id, expiry.scope_ids, expiry.reaped) == (worker.pid, ("hang",), True)
    assert file_server.is_alive()  # and the server never signals its own process


def test_release_prevents_the_kill(file_server, children, expiries):
    released = children.worker("release", file_server.file_path, 0.3)
    assert read_line(released) == "released"
    hanging = children.worker("hang", file_server.file_path, 0.8)  # expires after 0.3 s did
    assert read_line(hanging) == "acquired"
    assert hanging.wait(5) == KILL
    assert alive(released)
    assert expiries.next().worker_id == hanging.pid


def test_exception_releases_the_timer(file_server, children, expiries):
    raised = children.worker("raise", file_server.file_path, 0.3)
    assert read_line(raised) == "released"
    hanging = children.worker("hang", file_server.file_path, 0.8)
    assert hanging.wait(5) == KILL
    assert alive(raised)
    assert expiries.next().worker_id == hanging.pid


def test_nested_scopes(file_server, children, expiries):
    worker = children.worker("nested", file_server.file_path, 0.5)
    assert read_line(worker) == "acquired"
    assert worker.wait(5) == KILL  # the inner timer, not the 30 s outer one
    assert expiries.next().scope_ids == ("inner-hang",)


def test_decorated_function(file_server, children, expiries):
    worker = children.worker("decorated", file_server.file_path, 0.3)
    assert read_line(worker) == "acquired"
    assert worker.wait(5) == KILL
    assert expiries.next().scope_ids == ("decorated",)


def test_forged_request_for_a_non_worker_is_ignored(make_file_server, children, expiries):
    victim = children.sleeper()
    server = make_file_server(workers={})
    worker = children.worker("hang", server.file_path, 0.6)
    server.set_workers({worker.pid: None})
    # anyone who can open the FIFO names the victim, the server and its parent
    for pid in (victim.pid, os.getpid(), os.getppid()):
        _write(server.file_path, _line(pid))
    assert worker.wait(5) == KILL  # its deadline is later than the forged ones
    assert alive(victim)
    assert expiries.next().worker_id == worker.pid and expiries.empty()
    assert server.rejected >= 2  # server and parent at once; the victim is held, then dropped


def test_malformed_line_does_not_drop_the_next_request(file_server, children, expiries):
    _write(file_server.file_path, b"this is not json\n")
    _write(file_server.file_path, b'{"version": 1, "pid": "x"}\n')
    _write(file_server.file_path, b"{" + b"x" * 6000 + b"}\n")  # oversized
    worker = children.worker("hang", file_server.file_path, 0.3)
    assert worker.wait(5) == KILL
    assert expiries.next().worker_id == worker.pid
    assert file_server.rejected >= 3 and file_server.is_alive()


def test_silent_writer_holding_the_fifo_does_not_stall_expiry(file_server, children, expiries):
    fd = os.open(file_server.file_path, os.O_WRONLY | os.O_NONBLOCK)
    try:
        os.write(fd, b'{"version": 1, "pid": 4')  # half a line, never finished
        worker = children.worker("hang", file_server.file_path, 0.3)
        assert read_line(worker) == "acquired"
        assert worker.wait(5) == KILL  # its line was merged behind the half line: recovered
        assert expiries.next().scope_ids == ("hang",)
    finally:
        os.close(fd)


def test_fifo_is_private(file_server):
    path = file_server.file_path
    st = os.stat(path)
    assert stat.S_ISFIFO(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
    assert os.path.basename(os.path.dirname(path)).startswith("elastic_timer_")


def test_stop_removes_fifo_and_directory_and_is_prompt():
    server = FileTimerServer(None, "r", max_interval=60)
    server.start()
    path = server.file_path
    started = time.monotonic()
    server.stop()
    assert time.monotonic() - started < 5
    assert not os.path.exists(path) and not os.path.exists(os.path.dirname(path))


def test_explicit_path_is_0600_and_replaces_only_a_stale_fifo(tmp_path):
    old = os.umask(0)
    try:
        path = str(tmp_path / "timer.fifo")
        os.mkfifo(path, 0o666)  # a stale FIFO, world-writable
        server = FileTimerServer(path, "r")
    finally:
        os.umask(old)
    try:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    finally:
        server.stop()
    assert not os.path.exists(path)


@pytest.mark.parametrize("kind", ["file", "dir", "symlink"])
def test_explicit_path_refuses_non_fifos(tmp_path, kind):
    path = tmp_path / "timer.fifo"
    if kind == "file":
        path.write_text("precious")
    elif kind == "dir":
        path.mkdir()
    else:
        path.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ConfigError, match="not a FIFO"):
        FileTimerServer(str(path), "r")
    assert os.path.lexists(path)
    if kind == "file":
        assert path.read_text() == "precious"


def test_requests_sent_before_start_are_honoured(make_file_server, children, expiries):
    server = make_file_server(start=False)
    worker = children.worker("hang", server.file_path, 0.2)
    assert read_line(worker) == "acquired"
    server.start()
    assert worker.wait(5) == KILL


def test_log_event_names(make_file_server, children):
    names = []
    server = make_file_server(None, "r", log_event=lambda name, req: names.append(name))
    worker = children.worker("hang", server.file_path, 0.2)
    assert worker.wait(5) == KILL
    server.stop()
    assert names[0] == "watchdog started" and names[-1] == "watchdog stopped"
    assert "timer expired" in names and "kill worker process" in names


def test_identity_helpers_on_real_processes(children):
    proc = children.sleeper()
    assert _proc.is_descendant(proc.pid, os.getpid())
    assert not _proc.is_descendant(os.getpid(), proc.pid)
    assert _proc.start_time(proc.pid) >= _proc.start_time(os.getpid())


def test_fake_clock_drives_the_fifo_server(make_file_server, children, expiries):
    from harness.timer import FakeClock

    clock = FakeClock(start=0.0, wall_offset=time.time())  # wire times line up with ours
    server = make_file_server(clock=clock)
    worker = children.worker("hang", server.file_path, 1000)  # 1000 s: only fake time gets there
    assert read_line(worker) == "acquired"
    clock.advance(500)
    assert alive(worker)
    clock.advance(600)
    assert worker.wait(5) == KILL
    assert expiries.next().scope_ids == ("hang",)

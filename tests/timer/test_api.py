"""``configure``/``expires``, the request objects and the clients' input checks (no server)."""

from __future__ import annotations

import json
import pickle
import signal
import threading

import pytest

import harness.timer as timer
from harness.errors import ConfigError, ElasticError
from harness.timer import FileTimerClient, FileTimerRequest, TimerClient, TimerRequest, _api


class Recorder(TimerClient):
    def __init__(self, fail_release: bool = False):
        self.calls: list[tuple] = []
        self.fail_release = fail_release

    def acquire(self, scope_id, expiration_time):
        self.calls.append(("acquire", scope_id, expiration_time))

    def release(self, scope_id):
        self.calls.append(("release", scope_id))
        if self.fail_release:
            raise BrokenPipeError("server gone")


@pytest.fixture(autouse=True)
def unconfigured(monkeypatch):
    monkeypatch.setattr(_api, "_timer_client", None)


def test_expires_without_configure_raises_runtime_error():
    with pytest.raises(RuntimeError, match="configure"):
        with timer.expires(after=1):
            pass


def test_expires_default_scope_is_caller_file_and_line():
    client = Recorder()
    timer.configure(client)
    line = None
    with timer.expires(after=5):
        line = __import__("sys")._getframe().f_lineno - 1
    kind, scope, _ = client.calls[0]
    assert kind == "acquire" and scope == f"{__file__}#{line}"
    assert client.calls[1] == ("release", scope)


def test_expires_sends_wall_clock_deadline_and_releases():
    import time

    client = Recorder()
    before = time.time()
    with timer.expires(after=10, scope="s", client=client):
        pass
    (_, scope, exp), release = client.calls
    assert before + 10 <= exp <= time.time() + 10
    assert release == ("release", "s")


def test_expires_releases_on_exception_and_keeps_it():
    client = Recorder(fail_release=True)
    with pytest.raises(ValueError, match="boom"):  # the body's error, not the release's
        with timer.expires(after=1, scope="s", client=client):
            raise ValueError("boom")
    assert [c[0] for c in client.calls] == ["acquire", "release"]


def test_release_error_surfaces_when_the_body_succeeded():
    client = Recorder(fail_release=True)
    with pytest.raises(BrokenPipeError):
        with timer.expires(after=1, scope="s", client=client):
            pass


def test_nested_same_scope_gets_distinct_ids():
    client = Recorder()
    with timer.expires(after=1, scope="s", client=client):
        with timer.expires(after=1, scope="s", client=client):
            pass
    assert [(c[0], c[1]) for c in client.calls] == [
        ("acquire", "s"), ("acquire", "s~2"), ("release", "s~2"), ("release", "s")]


def test_concurrent_threads_on_one_line_do_not_share_a_timer():
    client = Recorder()
    entered, go = threading.Barrier(2), threading.Event()

    def body():
        with timer.expires(after=1, scope="line", client=client):
            entered.wait(5)
            go.wait(5)

    threads = [threading.Thread(target=body) for _ in range(2)]
    for t in threads:
        t.start()
    go.set()
    for t in threads:
        t.join(5)
    acquired = sorted(c[1] for c in client.calls if c[0] == "acquire")
    released = sorted(c[1] for c in client.calls if c[0] == "release")
    assert acquired == released == ["line", "line~2"]


def test_expires_as_decorator_takes_a_timer_per_call_and_resolves_client_late():
    @timer.expires(after=3)
    def step(x):
        return x * 2

    client = Recorder()
    timer.configure(client)  # after decoration
    assert step(2) == 4 and step(3) == 6
    kinds = [c[0] for c in client.calls]
    assert kinds == ["acquire", "release", "acquire", "release"]
    assert client.calls[0][1].endswith(f"#{step.__wrapped__.__code__.co_firstlineno}")  # the decorator line


@pytest.mark.parametrize("after", [-1, float("nan"), float("inf"), "5", True])
def test_expires_rejects_bad_after(after):
    with pytest.raises(ConfigError, match="after="):
        timer.expires(after=after)


def test_configure_rejects_non_clients():
    with pytest.raises(ConfigError, match="timer_client="):
        timer.configure(object())


def test_timer_request_equality_and_pickle():
    r = TimerRequest(12, "s", 3.5)
    assert r == TimerRequest(12, "s", 3.5) and r != TimerRequest(12, "s", -1)
    assert pickle.loads(pickle.dumps(r)) == r
    assert "scope_id='s'" in repr(r)


def test_file_request_json_matches_torchs_line():
    from torch.distributed.elastic.timer import FileTimerRequest as TorchRequest

    ours = FileTimerRequest(12, "scope", 1.5, signal=9)
    theirs = TorchRequest(12, "scope", 1.5, signal=9)
    assert json.loads(ours.to_json()) == json.loads(theirs.to_json())
    assert ours.to_json() == theirs.to_json()
    assert ours.worker_pid == 12


@pytest.mark.parametrize("sig", [signal.SIGSTOP, signal.SIGCONT, 64, True])
def test_file_client_rejects_signals_outside_the_allow_list(tmp_path, sig):
    with pytest.raises(ConfigError, match="signal="):
        FileTimerClient(str(tmp_path / "fifo"), signal=sig)


def test_file_client_accepts_no_kill_and_allowed_signals(tmp_path):
    assert FileTimerClient(str(tmp_path / "f"), signal=0).signal == 0
    assert FileTimerClient(str(tmp_path / "f"), signal=signal.SIGTERM).signal == signal.SIGTERM


def test_file_client_without_server_raises_broken_pipe(tmp_path):
    client = FileTimerClient(str(tmp_path / "missing.fifo"))
    with pytest.raises(BrokenPipeError) as info:
        client.acquire("s", 1.0)
    assert isinstance(info.value, ElasticError)
    assert "no timer server" in str(info.value)


def test_file_client_refuses_a_regular_file(tmp_path):
    path = tmp_path / "not-a-fifo"
    path.write_text("")
    with pytest.raises(ConfigError, match="not a FIFO"):
        FileTimerClient(str(path)).acquire("s", 1.0)
    assert path.read_text() == ""


def test_file_client_refuses_oversized_requests(tmp_path):
    with pytest.raises(ConfigError, match="4096"):
        FileTimerClient(str(tmp_path / "f")).acquire("x" * 5000, 1.0)


def test_log_debug_info_for_expired_timers(caplog):
    caplog.set_level("INFO", logger="harness.timer")
    timer.log_debug_info_for_expired_timers("run1", {})
    assert not caplog.records
    timer.log_debug_info_for_expired_timers("run1", {12: ['{"pid": 12}']})
    assert "Timers expired for run:[run1]" in caplog.text and '{"pid": 12}' in caplog.text

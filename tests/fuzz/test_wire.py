"""Garbage on the wire, by the thousand, into live servers.

* The timer FIFO: a real ``FileTimerServer`` reading a real FIFO gets Faker-made lines
  (random bytes, broken JSON, requests with odd fields, lines past PIPE_BUF). Each bad
  line must be dropped with a log line; the server must stay alive and afterwards still
  reap a real worker whose timer expires (and nobody else: its allow-list is empty
  during the flood, so no pid a fuzz line names is ever signalled).
* The store: a real ``StoreServer`` on loopback gets garbage over a socket per case:
  random bytes, then the handshake followed by random bytes, then well-framed commands
  with odd sizes, counts and values. Each case may cost that connection only: a client
  connected before the flood keeps working throughout, and our client and torch's
  ``TCPStore`` client work afterwards.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import select
import signal
import socket
import struct
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from harness.rendezvous._store import (
    ADD,
    APPEND,
    CANCEL_WAIT,
    CHECK,
    COMPARE_SET,
    DELETE_KEY,
    GET,
    GETNUMKEYS,
    MAGIC,
    MULTI_GET,
    MULTI_SET,
    PING,
    SET,
    VALIDATE,
    WAIT,
    StoreClient,
    StoreConnectionError,
    StoreServer,
)
from harness.timer import FileTimerServer
from tests.fuzz._bad import Bad, run_target
from tests.fuzz.test_scenarios import bad_value
from tests.timer.conftest import Children, Expiries, read_line

# -- the timer FIFO -------------------------------------------------------------------


def timer_line(b: Bad) -> bytes:
    """One line for the FIFO (newline included): garbage, or a request with odd fields."""
    kind = b.rng.randrange(6)
    if kind == 0:
        return b.blob().replace(b"\n", b" ") + b"\n"
    if kind == 1:  # past PIPE_BUF: the server keeps only the tail
        return b"{" + b.rng.randbytes(b.rng.choice([4100, 9000])).replace(b"\n", b" ") + b"}\n"
    request: dict[str, Any] = {"version": 1, "pid": 4_000_000, "scope_id": "fuzz",
                               "expiration_time": time.time() + 0.2, "signal": 9}
    for name in b.rng.sample([*request, b.clean(b.any())], b.rng.randint(1, 3)):
        request[name] = b.rng.choice([bad_value(b), int("1" + "0" * b.rng.choice([20, 400])),
                                      -(2**70), 2**31, -1, 0, 1, os.getpid(), os.getppid()])
    text = json.dumps(request, default=str)
    if kind == 2:
        text = text.replace("0.2", b.rng.choice(["NaN", "Infinity", "1e999", "-1e999"]), 1)
    if kind == 3:  # half a line, then the rest glued to garbage
        text = text[: b.rng.randrange(len(text))]
    return text.encode("utf-8", "surrogatepass") + b"\n"


def _write_all(path: str, data: bytes) -> None:
    """Write in PIPE_BUF pieces, waiting while the FIFO is full (the server drains it)."""
    fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    try:
        for at in range(0, len(data), select.PIPE_BUF):
            piece = data[at:at + select.PIPE_BUF]
            deadline = time.monotonic() + 10
            while True:
                try:
                    os.write(fd, piece)
                    break
                except BlockingIOError:
                    assert time.monotonic() < deadline, "the timer server stopped reading its FIFO"
                    select.select([], [fd], [], 0.1)
    finally:
        os.close(fd)


@pytest.fixture
def timer_server() -> Iterator[tuple[FileTimerServer, Expiries]]:
    expiries = Expiries()
    server = FileTimerServer(None, "fuzz", workers={}, on_expired=expiries, max_interval=0.5)
    server.start()
    try:
        yield server, expiries
    finally:
        server.stop()


def test_timer_fifo_garbage(timer_server: tuple[FileTimerServer, Expiries],
                            caplog: pytest.LogCaptureFixture) -> None:
    server, expiries = timer_server
    caplog.set_level(logging.WARNING, logger="harness.timer")
    sent = {"n": 0}

    def check(line: bytes) -> str:
        _write_all(server.file_path, line)
        sent["n"] += 1
        assert server.is_alive(), "the timer server died"
        return "sent"

    run_target("timer FIFO lines", 3000, timer_line, check)
    _write_all(server.file_path, b"\n")  # ends whatever half line the flood left
    children = Children()
    try:
        victim = children.sleeper()
        worker = children.worker("hang", server.file_path, 0.3)
        server.set_workers({worker.pid: None})
        assert read_line(worker) == "acquired"
        assert worker.wait(10) == -signal.SIGKILL, "the server no longer reaps expired workers"
        assert expiries.next().worker_id == worker.pid
        assert victim.poll() is None and server.is_alive()
    finally:
        children.close()
    assert server.rejected > 0
    assert any("ignored a timer request" in r.getMessage() for r in caplog.records)


# -- the store wire ---------------------------------------------------------------------

_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")
HANDSHAKE = bytes([VALIDATE]) + struct.pack("<I", MAGIC)


def _blob(b: Bad) -> bytes:
    data = b.rng.choice([b"", b"1", b"9223372036854775807", b"-9223372036854775808", b"x" * 100,
                         b.any().encode("utf-8", "surrogatepass")[:200], b.rng.randbytes(16)])
    size = len(data) if b.rng.random() < 0.8 else b.rng.choice([2**64 - 1, 2**30, 2**30 + 1, len(data) + 5])
    return _U64.pack(size) + data


def _count(b: Bad) -> bytes:
    return _U64.pack(b.rng.choice([0, 1, 2, 3, 2**63, 2**64 - 1]))


def store_command(b: Bad) -> bytes:
    """A well-framed command with odd sizes, counts and values (or an unknown one)."""
    cmd = b.rng.choice([SET, COMPARE_SET, GET, ADD, CHECK, WAIT, GETNUMKEYS, DELETE_KEY, APPEND,
                        MULTI_GET, MULTI_SET, CANCEL_WAIT, PING, VALIDATE, 14, 200, 255])
    out = bytes([cmd])
    if cmd in (SET, APPEND):
        out += _blob(b) + _blob(b)
    elif cmd == COMPARE_SET:
        out += _blob(b) + _blob(b) + _blob(b)
    elif cmd in (GET, DELETE_KEY):
        out += _blob(b)
    elif cmd == ADD:
        out += _blob(b) + _I64.pack(b.rng.choice([1, -1, 2**63 - 1, -(2**63), 0]))
    elif cmd in (CHECK, WAIT, MULTI_GET):
        out += _count(b) + b"".join(_blob(b) for _ in range(b.rng.randint(0, 3)))
    elif cmd == MULTI_SET:
        out += _I64.pack(b.rng.choice([-1, 0, 1, 2, 2**62])) + b"".join(
            _blob(b) + _blob(b) for _ in range(b.rng.randint(0, 2)))
    elif cmd in (PING, VALIDATE):
        out += struct.pack("<I", b.rng.choice([0, MAGIC, 2**32 - 1]))
    return out


def store_bytes(b: Bad) -> bytes:
    kind = b.rng.randrange(4)
    if kind == 0:
        return b.blob(600)
    if kind == 1:
        return HANDSHAKE + b.blob(600)
    # a shared key the well-framed commands keep hitting: ADD past i64, APPEND onto it, ...
    prefix = HANDSHAKE + bytes([SET]) + _U64.pack(2) + b"/n" + _U64.pack(19) + b"9223372036854775807"
    return prefix + b"".join(store_command(b) for _ in range(b.rng.randint(1, 6)))


def _send_and_hang_up(port: int, data: bytes) -> None:
    """Send ``data``, half-close, and read until the server closes this connection: by
    then it has handled every byte (or dropped us for them), or it is stuck."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
            while sock.recv(65536):
                pass
        except ConnectionResetError:
            pass  # the server dropped us mid-send: allowed
        except TimeoutError:
            raise AssertionError("the store server neither answered nor closed within 10s") from None
        except OSError as e:
            if e.errno != errno.EPIPE:
                raise


@pytest.fixture
def store() -> Iterator[StoreServer]:
    server = StoreServer("127.0.0.1", 0).start()
    try:
        yield server
    finally:
        server.stop()


def test_store_wire_garbage(store: StoreServer) -> None:
    bystander = StoreClient("127.0.0.1", store.port, timeout=10)  # connected before the flood
    try:
        bystander.set("before", b"1")

        def check(data: bytes) -> str:
            _send_and_hang_up(store.port, data)
            try:  # a dead server closed every connection, this one's too
                bystander.ping()
            except StoreConnectionError as e:
                raise AssertionError(f"the store server died: {e}") from None
            return "closed"

        run_target("store wire bytes", 2000, store_bytes, check, shown=lambda d: d[:300])
        bystander.ping()
        assert bystander.get("before") == b"1"  # the flood cost other connections nothing
        fresh = StoreClient("127.0.0.1", store.port, timeout=10)
        try:
            fresh.set("after", b"2")
            assert fresh.add("counter", 5) == 5 and bystander.get("after") == b"2"
        finally:
            fresh.close()
    finally:
        bystander.close()
    import torch.distributed as dist

    theirs = dist.TCPStore("127.0.0.1", store.port, is_master=False, timeout=timedelta(seconds=10))
    theirs.set("torch", b"3")
    assert theirs.get("torch") == b"3" and theirs.add("counter", 1) == 6

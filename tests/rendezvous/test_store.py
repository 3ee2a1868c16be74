"""Our pure-Python TCPStore client and server against torch's, over real sockets."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from datetime import timedelta

import pytest

from harness.rendezvous._store import (
    StoreClient,
    StoreConnectionError,
    StoreProtocolError,
    StoreServer,
    StoreTimeoutError,
)

dist = pytest.importorskip("torch.distributed")


def exercise(client: StoreClient) -> None:
    client.set("k", b"v1")
    assert client.get("k") == b"v1"
    assert client.add("n", 5) == 5 and client.add("n", -2) == 3
    assert client.compare_set("k", b"v1", b"v2") == b"v2"
    assert client.compare_set("k", b"nope", b"v3") == b"v2"
    assert client.compare_set("fresh", b"", b"x") == b"x"
    assert client.check(["k", "n"]) and not client.check(["k", "missing"])
    client.wait(["k"], 1)
    with pytest.raises(StoreTimeoutError, match=r"wait\(\['missing'\]\) timed out after 0.2s"):
        client.wait(["missing"], timedelta(seconds=0.2))
    client.set("k", "str value")  # the connection is still in step after a cancelled wait
    assert client.get("k") == b"str value"
    client.multi_set(["a", "b"], [b"1", b"2"])
    assert client.multi_get(["a", "b"]) == [b"1", b"2"]
    # an answer of many values, some empty, one larger than a chunk the client receives
    many = {f"m{i}": (b"" if i % 7 == 0 else bytes([65 + i % 26]) * (i * 37)) for i in range(300)}
    many["m150"] = b"x" * 200_000
    client.multi_set(list(many), list(many.values()))
    assert client.multi_get(list(many)) == list(many.values())
    client.set("k", b"after")  # the connection is in step after the long answer
    assert client.get("k") == b"after"
    assert client.peek_many(["k"]) == [b"after"] and client.peek_many(["k", "b"]) == [b"after", b"2"]
    assert client.add_and_peek("n", 2, ["k", "n", "m150"]) == (5, [b"after", b"5", many["m150"]])
    assert client.add_and_peek("n", 1, []) == (6, [])
    # a list of keys asked for again is sent as encoded last time; changed in place, afresh
    keys = ["k", "b"]
    assert client.peek_many(keys) == [b"after", b"2"] and client.peek_many(keys) == [b"after", b"2"]
    keys[1] = "n"
    assert client.peek_many(keys) == [b"after", b"6"]
    assert client.multi_get(keys) == [b"after", b"6"]  # another command on the same keys
    assert client.get("k") == b"after"  # in step after the two answers of one send
    client.append("a", b"+")
    assert client.get("a") == b"1+"
    assert client.delete_key("a") and not client.delete_key("a")
    assert client.num_keys() >= 4  # k, n, fresh, b (torch may count internal keys too)
    client.ping()


@pytest.mark.parametrize("libuv", [True, False], ids=["libuv", "classic"])
def test_our_client_against_torch_server(libuv):
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, use_libuv=libuv, wait_for_workers=False)
    client = StoreClient("127.0.0.1", server.port, timeout=5)
    try:
        exercise(client)
        server.set("from_torch", b"t")  # same key space ("/" prefix) as torch's own client
        assert client.get("from_torch") == b"t"
        client.set("from_us", b"u")
        assert server.get("from_us") == b"u"
    finally:
        client.close()
        del server


def test_a_list_of_keys_asked_for_at_each_beat_is_encoded_once(monkeypatch):
    """A keep-alive reads the same keys every beat and waits for the state's next change
    between two beats: the wait must not make the next beat encode its keys again."""
    server = StoreServer("", 0).start()
    client = StoreClient("127.0.0.1", server.port, timeout=5)
    try:
        keys = [f"hb/{i}" for i in range(20)]
        client.multi_set(keys, [b"1"] * len(keys))
        encoded: list[str] = []
        key = StoreClient._key
        monkeypatch.setattr(StoreClient, "_key", staticmethod(lambda k: encoded.append(k) or key(k)))
        for _ in range(3):
            client.add_and_peek("me", 1, keys)
            with pytest.raises(StoreTimeoutError):
                client.wait(["seq/next"], 0.01)
        assert encoded.count("hb/0") == 1 and encoded.count("seq/next") == 1
    finally:
        client.close()
        server.stop()


def test_torch_client_against_our_server():
    server = StoreServer("", 0).start()
    try:
        ours = StoreClient("127.0.0.1", server.port, timeout=5)
        exercise(ours)
        theirs = dist.TCPStore("127.0.0.1", server.port, is_master=False,
                               timeout=timedelta(seconds=5))
        theirs.set("t", b"1")
        assert ours.get("t") == b"1"
        assert theirs.add("n", 1) == ours.add("n", 0)
        assert theirs.compare_set("t", b"1", b"2") == b"2"
        assert theirs.multi_get(["t"]) == [b"2"]
        with pytest.raises(Exception, match="(?i)timeout"):  # "Socket Timeout" in torch 2.4
            theirs.wait(["never"], timedelta(seconds=0.2))
        theirs.set("late", b"x")
        assert ours.get("late") == b"x"
        del theirs
        ours.close()
    finally:
        server.stop()


@pytest.mark.parametrize("server_kind", ["ours", "torch-libuv", "torch-classic"])
def test_a_peek_at_a_missing_key(server_kind):
    """Why a reader peeks only at keys it has read a value of: our store and torch's libuv
    store answer a missing key with b"", torch's classic store closes the connection."""
    if server_kind == "ours":
        ours = StoreServer("", 0).start()
        port, stop = ours.port, ours.stop
    else:
        theirs = dist.TCPStore("127.0.0.1", 0, is_master=True, use_libuv=server_kind == "torch-libuv",
                               wait_for_workers=False)
        port, stop = theirs.port, (lambda: None)
    client = StoreClient("127.0.0.1", port, timeout=5)
    try:
        client.set("there", b"1")
        if server_kind == "torch-classic":
            with pytest.raises(StoreConnectionError, match="closed the connection"):
                client.peek_many(["missing"])
        else:
            assert client.peek_many(["missing"]) == [b""]
            assert client.peek_many(["there", "missing"]) == [b"1", b""]
            assert client.get("there") == b"1"  # still in step
    finally:
        client.close()
        stop()


def test_wait_wakes_on_set_from_another_client():
    server = StoreServer("", 0).start()
    try:
        a = StoreClient("127.0.0.1", server.port, timeout=5)
        b = a.clone()
        threading.Timer(0.1, lambda: b.set("go", b"1")).start()
        a.wait(["go"], 10)
        assert a.get("go") == b"1"
        a.close(), b.close()
    finally:
        server.stop()


def test_unreachable_store_is_a_clear_bounded_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(StoreConnectionError,
                       match=rf"could not reach the rendezvous store at 127.0.0.1:{port} within 0.3s"):
        StoreClient("127.0.0.1", port, timeout=0.3)


def _open_sockets() -> int:
    return sum(os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
               for fd in os.listdir("/proc/self/fd") if os.path.exists(f"/proc/self/fd/{fd}"))


def test_a_store_that_does_not_answer_the_handshake_is_a_timeout_and_leaves_no_socket_open():
    """A store frozen mid-connect (its kernel completes the TCP handshake, nothing reads):
    the client's handshake times out, and the socket it made is closed before it says so
    (a keeper retrying every keep-alive would otherwise pile them up)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()  # never accepts, never answers
    try:
        before = _open_sockets()
        with pytest.raises(StoreTimeoutError, match="no answer to the handshake"):
            StoreClient("127.0.0.1", listener.getsockname()[1], timeout=0.2, connect_timeout=0.2)
        assert _open_sockets() == before
    finally:
        listener.close()


def test_not_a_store_is_rejected():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()

    def garbage():
        conn, _ = listener.accept()
        conn.recv(64)
        conn.sendall(b"HTTP/1.1 400 Bad\r\n\r\n")
        conn.close()

    threading.Thread(target=garbage, daemon=True).start()
    with pytest.raises(StoreProtocolError, match="not a TCPStore server"):
        StoreClient("127.0.0.1", listener.getsockname()[1], timeout=1)
    listener.close()


def test_a_byte_past_a_multi_get_answer_drops_the_connection_instead_of_reading_on():
    """The client receives a ``multi_get``'s answer in chunks; a store that sent more than
    the answer is out of step, and what follows would be read as the next answer."""
    from harness.rendezvous._store import STOP_WAITING

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()

    def out_of_step():
        conn, _ = listener.accept()
        hello = b""
        while len(hello) < 10:  # VALIDATE, its magic, PING and its nonce
            hello += conn.recv(64)
        conn.sendall(hello[-4:])  # the nonce echoed: a store
        conn.recv(256)  # multi_get's WAIT
        conn.sendall(bytes([STOP_WAITING]))
        conn.recv(256)  # the MULTI_GET
        conn.sendall(b"".join(len(v).to_bytes(8, "little") + v for v in (b"1", b"22")) + b"!")
        conn.recv(64)  # until the client hangs up
        conn.close()

    threading.Thread(target=out_of_step, daemon=True).start()
    client = StoreClient("127.0.0.1", listener.getsockname()[1], timeout=5)
    with pytest.raises(StoreProtocolError, match=r"1 byte\(s\) past the answer to multi_get"):
        client.multi_get(["a", "b"])
    assert not client.connected
    client.close()
    listener.close()


def test_server_drops_garbage_client_and_keeps_serving():
    server = StoreServer("", 0).start()
    try:
        with socket.create_connection(("127.0.0.1", server.port)) as raw:
            raw.sendall(b"GET / HTTP/1.1\r\n\r\n")
            raw.settimeout(2)
            assert raw.recv(16) == b""  # dropped
        client = StoreClient("127.0.0.1", server.port, timeout=2)
        client.set("ok", b"1")
        assert client.get("ok") == b"1"
        client.close()
    finally:
        server.stop()


def test_lost_server_is_a_connection_error_naming_the_store():
    server = StoreServer("", 0).start()
    client = StoreClient("127.0.0.1", server.port, timeout=2)
    server.stop()
    with pytest.raises(StoreConnectionError, match=f"127.0.0.1:{server.port}"):
        client.get("anything")


def test_renewing_a_connection_to_a_store_that_is_gone_says_so_instead_of_retrying_the_connect():
    """A finished agent whose exit barrier lost the store (its host died) closes the
    rendezvous on a fresh connection: a refused connect there means the store is gone, not
    still starting, and must not be retried for the whole bound (30 s held the agent's exit)."""
    from harness.rendezvous._store_host import StoreHost

    server = StoreServer("127.0.0.1", 0).start()
    host = StoreHost("127.0.0.1", server.port, read_timeout=60.0, is_host=False)
    host.open()
    try:
        server.stop()
        with pytest.raises(StoreConnectionError, match=f"127.0.0.1:{server.port} refused the connection"):
            host.renew(connect_within=60.0)
    finally:
        host.close()

def test_port_in_use_fails_at_once():
    server = StoreServer("", 0).start()
    try:
        with pytest.raises(OSError):
            StoreServer("", server.port)
    finally:
        server.stop()


def test_standalone_store_process_prints_port_and_dies_with_parent(tmp_path):
    """... and, with HARNESS_STORE_STATS, writes there what it served when it stops."""
    import json

    stats = tmp_path / "served.json"
    proc = subprocess.Popen([sys.executable, "-m", "harness.rendezvous.store_server", "--port", "0"],
                            stdout=subprocess.PIPE, text=True, env={**os.environ, "HARNESS_STORE_STATS": str(stats)})
    try:
        line = proc.stdout.readline()
        assert line.startswith("PORT ")
        client = StoreClient("127.0.0.1", int(line.split()[1]), timeout=5)
        client.set("x", b"1")
        assert client.get("x") == b"1"
        client.close()
    finally:
        proc.terminate()
        proc.stdout.close()
        assert proc.wait(10) == 0
    # the handshake's PING, the SET, and the GET with the WAIT before it
    assert json.loads(stats.read_text()) == {"served": {"SET": 1, "GET": 1, "WAIT": 1, "PING": 1}}


def test_a_request_cut_by_a_signal_drops_the_connection_instead_of_reading_its_reply_later():
    """SIGTERM reached an agent mid-request (its handler raises ``SignalException`` out of the
    read): the reply stayed in the stream, and the leave the agent announced next read it as
    its own, then waited the whole read timeout (a node removed as it joined a round held the
    job 20 s, until the harness called it stalled). The stream is dropped instead."""
    import signal as signals

    from harness.errors import SignalException

    server = StoreServer("", 0).start()
    try:
        client = StoreClient("127.0.0.1", server.port, timeout=5)
        client.add("n", 1)
        real = client._recv_on

        def interrupted(sock, n, what):
            client._recv_on = real  # once
            raise SignalException("got signal 15", signals.SIGTERM)

        client._recv_on = interrupted  # type: ignore[method-assign]
        with pytest.raises(SignalException):
            client.add("n", 1)  # the server added and answered; the answer is never read
        assert not client.connected
        with pytest.raises(StoreConnectionError, match="is closed"):
            client.add("n", 1)  # at once, not a stale reply (2 read as this one's) or a wait
        again = client.clone()
        assert again.add("n", 0) == 2
        again.close()
    finally:
        server.stop()



@pytest.fixture
def sigterm_after():
    """Arm SIGALRM (``sigterm_after(seconds)``) to raise what the agent's SIGTERM handler
    raises (``harness.run``'s), wherever the main thread is then."""
    import signal as signals

    from harness.errors import SignalException

    def handler(signum, frame):
        raise SignalException("got signal 15", signals.SIGTERM)

    previous = signals.signal(signals.SIGALRM, handler)
    yield lambda after: signals.setitimer(signals.ITIMER_REAL, after)
    signals.setitimer(signals.ITIMER_REAL, 0)
    signals.signal(signals.SIGALRM, previous)


def test_a_wait_cut_by_a_signal_drops_the_connection_so_its_late_answer_is_never_read(sigterm_after):
    """SIGTERM reached an agent waiting in its rendezvous (``wait`` on the next state): the
    wait stayed open at the store, and once the key came its STOP_WAITING sat in the stream,
    where the leave the agent went on to write read it as the first byte of a reply's length
    and waited the whole read timeout (a node removed as it joined a round held its job
    until the harness called it stalled). The connection is dropped instead."""
    import time

    from harness.errors import SignalException

    server = StoreServer("", 0).start()
    try:
        client = StoreClient("127.0.0.1", server.port, timeout=5)
        client.set("state", b"x" * 300)
        sigterm_after(0.2)
        with pytest.raises(SignalException):
            client.wait(["next"], 10)
        assert not client.connected
        other = client.clone()
        other.set("next", b"1")  # the withdrawn wait's answer would now be on its way
        started = time.monotonic()
        with pytest.raises(StoreConnectionError, match="is closed"):
            client.get("state")
        assert time.monotonic() - started < 1
        again = client.clone()
        assert again.get("state") == b"x" * 300
        with pytest.raises(StoreTimeoutError):  # a wait withdrawn by its timeout stays in step
            again.wait(["never"], 0.1)
        assert again.connected and again.get("next") == b"1"
        again.close()
        other.close()
    finally:
        server.stop()


def test_a_leave_after_a_signal_cut_the_rendezvous_wait_short_still_lands(sigterm_after):
    """The agent's SIGTERM raised in its rendezvous wait (the connection is dropped, above):
    its leave makes a new connection within its own bound and withdraws the node, so the
    others do not wait out its heartbeat."""
    from harness.errors import SignalException
    from harness.rendezvous import RendezvousParameters, get_rendezvous_handler
    from harness.rendezvous._state import RendezvousState

    server = StoreServer("", 0).start()
    handler = get_rendezvous_handler(RendezvousParameters(
        "c10d", f"127.0.0.1:{server.port}", "cut", 2, 2, is_host=False, read_timeout=5,
        last_call_timeout=0.1))
    try:
        sigterm_after(0.5)
        with pytest.raises(SignalException):
            handler.next_rendezvous()  # the second node never comes: it waits
        handler.announce_leave(1.0)
        handler.leave()
        reader = StoreClient("127.0.0.1", server.port, timeout=5)
        key = "harness/rdzv/cut/state"
        state = RendezvousState.from_json(reader.get(key), "cut", key)
        assert state.participants == [] and not state.nodes, state
        reader.close()
    finally:
        handler.shutdown()
        server.stop()

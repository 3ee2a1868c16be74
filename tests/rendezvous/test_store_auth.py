"""The rendezvous store with a job secret, over real sockets: a stranger (a plain socket,
torch's own TCPStore client, our client without the secret or with a wrong one) gets no
key read or written. It is refused before its first request, the refusal is counted and
logged with its address, and our client says why in one line. The standalone store
process takes the secret from its environment and never from its command line."""

from __future__ import annotations

import logging
import os
import socket
import struct
import subprocess
import sys
from datetime import timedelta

import pytest

from harness.rendezvous import SECRET_ENV, SECRET_FILE_ENV
from harness.rendezvous._store import (
    MAGIC,
    SET,
    VALIDATE,
    StoreAuthError,
    StoreClient,
    StoreServer,
)
from harness.rendezvous._store_auth import REFUSED, JobSecret
from harness.rendezvous._store_host import elect_store_host

SECRET = JobSecret(b"the-job-secret-0123456789")
WRONG = JobSecret(b"not-the-job-secret-98765")
REFUSAL = "refused this agent: wrong or missing job secret (HARNESS_RDZV_SECRET"


@pytest.fixture
def guarded():
    """A store that demands ``SECRET``, its refusals listed as (peer, reason), and a
    client that knows the secret (to look at the keys)."""
    refusals: list[tuple[str, str]] = []
    server = StoreServer("127.0.0.1", 0, secret=SECRET,
                         on_refused=lambda peer, why: refusals.append((peer, why))).start()
    client = StoreClient("127.0.0.1", server.port, timeout=5, secret=SECRET)
    client.set("state", b"ours")
    try:
        yield server, client, refusals
    finally:
        client.close()
        server.stop()


def _wait(predicate, what: str, timeout: float = 10.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"{what}: not within {timeout:g}s"
        time.sleep(0.01)


def _frame(key: bytes, value: bytes) -> bytes:
    return (bytes([VALIDATE]) + struct.pack("<I", MAGIC) + bytes([SET])
            + struct.pack("<Q", len(key)) + key + struct.pack("<Q", len(value)) + value)


def test_a_plain_socket_stranger_is_refused_before_its_first_request(guarded, caplog):
    server, client, refusals = guarded
    with caplog.at_level(logging.WARNING, logger="harness.rendezvous._store_auth"), \
            socket.create_connection(("127.0.0.1", server.port), timeout=5) as stranger:
        stranger.sendall(_frame(b"/state", b"garbage"))
        answer = stranger.recv(64)
        assert answer == struct.pack("<I", REFUSED)
        assert stranger.recv(64) == b""  # and closed
        peer = f"127.0.0.1:{stranger.getsockname()[1]}"
    assert client.get("state") == b"ours"  # its SET was never served
    assert server.refused == 1 and refusals == [(peer, refusals[0][1])]
    assert "sent SET without proving it knows the job secret" in refusals[0][1]
    [line] = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert line.startswith(f"rendezvous store: refused {peer}: ") and "\n" not in line


def test_torch_s_client_without_the_secret_cannot_read_or_write(guarded):
    dist = pytest.importorskip("torch.distributed")
    server, client, refusals = guarded
    with pytest.raises(Exception) as info:  # noqa: PT011 - torch's error types vary by version
        # torch retries a refused ping, with backoff, until its timeout: keep that short
        store = dist.TCPStore("127.0.0.1", server.port, is_master=False,
                              timeout=timedelta(seconds=0.5))
        try:
            store.set("state", b"torch")
            store.get("state")
        finally:
            del store
    assert "timeout" not in str(info.value).lower()  # refused at once, not left waiting
    assert client.get("state") == b"ours"
    assert server.refused >= 1 and all("without proving" in why for _, why in refusals)


def test_our_client_without_the_secret_gets_one_line(guarded):
    server, client, refusals = guarded
    with pytest.raises(StoreAuthError) as info:
        StoreClient("127.0.0.1", server.port, timeout=5)
    message = str(info.value)
    assert message.startswith(f"the rendezvous store at 127.0.0.1:{server.port} {REFUSAL}")
    assert "\n" not in message
    assert server.refused == 1 and "sent PING without proving" in refusals[0][1]


def test_a_wrong_secret_is_refused_on_both_sides(guarded, caplog):
    server, client, refusals = guarded
    with caplog.at_level(logging.WARNING, logger="harness.rendezvous._store_auth"), \
            pytest.raises(StoreAuthError, match=REFUSAL.replace("(", r"\(")):
        StoreClient("127.0.0.1", server.port, timeout=5, secret=WRONG)
    [(peer, why)] = refusals
    assert why == "wrong job secret" and server.refused == 1
    assert f"rendezvous store: refused {peer}: wrong job secret" in caplog.text


def test_an_agent_with_a_secret_will_not_use_a_store_without_it():
    """A store that cannot prove the secret is not the job's (a stranger may hold the
    port): the client says so instead of handing it the job's state."""
    server = StoreServer("127.0.0.1", 0).start()
    try:
        with pytest.raises(StoreAuthError, match="does not take a job secret"):
            StoreClient("127.0.0.1", server.port, timeout=5, secret=SECRET)
    finally:
        server.stop()
    other = StoreServer("127.0.0.1", 0, secret=WRONG).start()
    try:
        with pytest.raises(StoreAuthError, match=REFUSAL.replace("(", r"\(")):
            StoreClient("127.0.0.1", other.port, timeout=5, secret=SECRET)
    finally:
        other.stop()


def test_a_silent_stranger_is_refused_after_the_auth_timeout(guarded, monkeypatch):
    server, client, refusals = guarded
    monkeypatch.setattr("harness.rendezvous._store.AUTH_TIMEOUT", 0.2)
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as stranger:
        _wait(lambda: server.refused == 1, "the silent connection refused")
        assert stranger.recv(64) == struct.pack("<I", REFUSED)
    assert "did not prove it knows the job secret within 0.2s" in refusals[0][1]
    client.ping()  # the store serves its own all along


def test_the_clients_that_know_the_secret_share_one_store(guarded):
    server, client, _ = guarded
    other = client.clone()
    try:
        assert other.compare_set("state", b"ours", b"next") == b"next"
        assert client.get("state") == b"next"
        assert server.refused == 0
    finally:
        other.close()


def test_a_hosted_store_listens_on_the_endpoint_address_only():
    server = elect_store_host("127.0.0.1", 0, secret=SECRET)
    assert server is not None
    try:
        StoreClient("127.0.0.1", server.port, timeout=5, secret=SECRET).close()
        with pytest.raises(ConnectionRefusedError):  # another address of this machine
            socket.create_connection(("127.0.0.2", server.port), timeout=5).close()
    finally:
        server.stop()


def _store_process(env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "harness.rendezvous.store_server", "--host",
                             "127.0.0.1", "--port", "0"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def test_the_store_process_takes_the_secret_from_a_file_in_its_environment(tmp_path):
    path = tmp_path / "secret"
    path.write_bytes(b"the-job-secret-0123456789\n")
    os.chmod(path, 0o600)
    env = {k: v for k, v in os.environ.items() if k not in (SECRET_ENV, SECRET_FILE_ENV)}
    proc = _store_process({**env, SECRET_FILE_ENV: str(path)})
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline().split()[1])
        with open(f"/proc/{proc.pid}/cmdline", "rb") as fp:
            assert b"the-job-secret" not in fp.read()
        StoreClient("127.0.0.1", port, timeout=5, secret=SECRET).close()
        with pytest.raises(StoreAuthError, match="refused this agent"):
            StoreClient("127.0.0.1", port, timeout=5, secret=WRONG)
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=10)
    [line] = [line for line in err.splitlines() if "refused" in line]
    assert line.startswith("store_server: rendezvous store: refused 127.0.0.1:")
    assert line.endswith(": wrong job secret") and "the-job-secret" not in err


def test_the_store_process_refuses_to_start_on_a_readable_secret_file(tmp_path):
    path = tmp_path / "secret"
    path.write_bytes(b"the-job-secret-0123456789")
    os.chmod(path, 0o644)
    proc = _store_process({**os.environ, SECRET_FILE_ENV: str(path)})
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 2 and out == ""
    assert err.strip() == (f"store_server: error: {SECRET_FILE_ENV}='{path}' may be read by "
                           f"others (mode 0644): chmod 600 it")

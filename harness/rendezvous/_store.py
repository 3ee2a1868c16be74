"""torch's TCPStore wire protocol, spoken without importing torch: a client and a server.

Why our own code instead of ``torch.distributed.TCPStore`` in the agent: importing torch
costs an agent ~1.1 s and ~210 MB, and a job of 32 agents on 2 cores pays that 32 times
before the first rendezvous. The protocol is small and stable, so the agent speaks it
directly. Both halves are checked against torch in ``tests/rendezvous/test_store.py``:
our client against torch's servers (libuv and classic), torch's client against ours.

The protocol (read off the wire of torch 2.13, little-endian): every command is one byte
of ``QueryType`` followed by its arguments; a string or byte vector is a u64 length plus
the bytes; integers are i64. A client opens with ``VALIDATE`` + u32 magic, then ``PING``
+ u32 nonce, which the server echoes. torch 2.4's servers know no ``PING`` and close the
connection; where one did, the client's next try probes with ``GETNUMKEYS`` instead.
torch's client puts ``/`` in front of every key, so we do too: a torch client on the same
server sees the same keys. ``GET`` and ``MULTI_GET`` are preceded by a ``WAIT`` on their
keys (a missing key blocks, as in torch); a ``WAIT`` that times out is withdrawn with
``CANCEL_WAIT``, answered by ``WAIT_CANCELED`` (possibly after a late ``STOP_WAITING``).

Every blocking call has a timeout; its error names the store, the operation and how long
it waited. A lost connection is a ``StoreConnectionError`` naming the store address.

With a job secret (``_store_auth``), both halves add a challenge and response after
``VALIDATE``. The server then serves nothing to a connection that has not proved the
secret: it refuses it, counts it and closes it. A refusal on the client side is a
``StoreAuthError``, which is never retried.
"""

from __future__ import annotations

import errno
import logging
import os
import selectors
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import timedelta

from harness.rendezvous._api import RendezvousConnectionError, RendezvousTimeoutError
from harness.rendezvous._store_auth import (
    ACCEPTED,
    AUTH,
    AUTH_TIMEOUT,
    NONCE_SIZE,
    PROOF_SIZE,
    REFUSED,
    SECRET_ENV,
    SECRET_FILE_ENV,
    JobSecret,
    Refusal,
    StoreGate,
    new_nonce,
)
from harness.selfpipe import drain_pipe, self_pipe, wake_pipe

__all__ = [
    "StoreClient",
    "StoreServer",
    "StoreAuthError",
    "StoreConnectionError",
    "StoreTimeoutError",
    "StoreProtocolError",
]

log = logging.getLogger(__name__)

#: the port a c10d rendezvous store listens on when the endpoint names none (torch's)
DEFAULT_PORT = 29400
MAGIC = 0x3C85F7CE
KEY_PREFIX = "/"

(VALIDATE, SET, COMPARE_SET, GET, ADD, CHECK, WAIT, GETNUMKEYS, DELETE_KEY, APPEND,
 MULTI_GET, MULTI_SET, CANCEL_WAIT, PING) = range(14)
READY, NOT_READY = 0, 1
STOP_WAITING, WAIT_CANCELED = 0, 1

_U8 = struct.Struct("<B")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")
_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1


class StoreConnectionError(RendezvousConnectionError):
    """The store cannot be reached, or the connection to it was lost."""


class StoreTimeoutError(RendezvousTimeoutError):
    """A store operation did not complete in time."""


class StoreProtocolError(StoreConnectionError):
    """The peer does not speak the TCPStore protocol (or sent garbage)."""


class StoreAuthError(StoreConnectionError):
    """The store and this client do not share the job secret: one of them refused the
    other. Retrying cannot help, so it is never retried."""


def refused_message(address: str) -> str:
    """The client's one line when the store refused it."""
    return (f"the rendezvous store at {address} refused this agent: wrong or missing job "
            f"secret ({SECRET_ENV} or {SECRET_FILE_ENV} must give every agent of the job, "
            f"and the store, the same secret)")


def _seconds(timeout: float | timedelta | None, default: float) -> float:
    if timeout is None:
        return default
    if isinstance(timeout, timedelta):
        return timeout.total_seconds()
    return float(timeout)


def _bytes(value: bytes | str) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


def _pack_str(data: bytes) -> bytes:
    return _U64.pack(len(data)) + data


# -- client ----------------------------------------------------------------------------


class StoreClient:
    """A TCPStore client with torch's method names (``set``, ``get``, ``add``, ...).

    One socket, one lock: safe to share between threads, but a blocking ``wait`` holds
    the connection, so threads that wait concurrently should ``clone()`` their own.
    """

    def __init__(self, host: str, port: int, timeout: float | timedelta = 60.0,
                 connect_timeout: float | None = None, secret: JobSecret | None = None,
                 connect_within: float | None = None):
        self.host = host
        self.port = port
        self.timeout = _seconds(timeout, 60.0)
        self._connect_timeout = self.timeout if connect_timeout is None else connect_timeout
        self._secret = secret
        self._lock = threading.Lock()
        self._midway = False  # a request went out and its whole answer has not come in
        self._sock: socket.socket | None = None
        self._pings = True  # the handshake's probe: PING (False: GETNUMKEYS, for torch 2.4's servers)
        self._encoded: dict[int, tuple[list[str], bytes]] = {}  # command -> its last request's keys, bytes
        # the first connect's bound may be tighter than the later ones' (a leave's renewal)
        self._sock = self._connect(self._connect_timeout if connect_within is None else connect_within)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def __repr__(self) -> str:
        state = "connected" if self._sock is not None else "closed"
        return f"StoreClient({self.address}, {state})"

    @property
    def connected(self) -> bool:
        """False once a request timed out or failed (the stream was dropped): reconnect."""
        return self._sock is not None

    def clone(self, connect_within: float | None = None) -> StoreClient:
        """A second connection to the same store (for another thread, or to replace this one
        once dropped), made within ``connect_within`` s (default: this one's connect timeout)."""
        return StoreClient(self.host, self.port, self.timeout, self._connect_timeout, self._secret,
                           connect_within=connect_within)

    # -- connection ---------------------------------------------------------------------

    def _connect(self, within: float) -> socket.socket:
        deadline = time.monotonic() + within
        delay, last_error = 0.02, None
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise StoreConnectionError(
                    f"could not reach the rendezvous store at {self.address} within "
                    f"{within:g}s ({last_error}); is its host running and the endpoint right?")
            try:
                sock = socket.create_connection((self.host, self.port), timeout=min(remaining, 5))
            except (TimeoutError, ConnectionRefusedError, OSError) as e:
                if isinstance(e, socket.gaierror):
                    raise StoreConnectionError(
                        f"cannot resolve the rendezvous store host {self.host!r}: {e}") from None
                last_error = e.strerror or type(e).__name__
                time.sleep(min(delay, max(0.0, remaining)))
                delay = min(delay * 2, 0.25)
                continue
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                nonce = os.getpid() & 0xFFFFFFFF
                sock.settimeout(max(0.05, deadline - time.monotonic()))
                opening = _U8.pack(VALIDATE) + _U32.pack(MAGIC)
                if self._secret is not None:
                    self._authenticate(sock, self._secret, opening)
                    opening = b""
                if self._pings:
                    sock.sendall(opening + _U8.pack(PING) + _U32.pack(nonce))
                    echo = _U32.unpack(self._recv_on(sock, 4, "the handshake"))[0]
                else:  # a server older than PING: any answer proves a TCPStore
                    sock.sendall(opening + _U8.pack(GETNUMKEYS))
                    self._recv_on(sock, 8, "the handshake")
                    echo = nonce
            except (StoreAuthError, StoreTimeoutError):  # not ours, or no answer in time
                sock.close()
                raise
            except (OSError, StoreConnectionError) as e:
                sock.close()
                last_error = f"handshake failed: {e}"
                if self._secret is None:
                    # torch 2.4's servers know no PING and drop a connection that sends
                    # one; the next try probes with GETNUMKEYS, the one after with PING again
                    self._pings = not self._pings
                if time.monotonic() >= deadline:
                    continue
                time.sleep(delay)
                continue
            if echo == REFUSED:  # it wants a secret and we have none
                sock.close()
                raise StoreAuthError(refused_message(self.address))
            if echo != nonce:
                sock.close()
                raise StoreProtocolError(
                    f"{self.address} answered the TCPStore handshake with {echo:#x}, not {nonce:#x}: "
                    f"not a TCPStore server")
            return sock

    def _authenticate(self, sock: socket.socket, secret: JobSecret, opening: bytes) -> None:
        """Send ``opening`` (the handshake's first bytes), then prove the job secret to the
        store and have it prove the secret to us (the exchange: ``_store_auth``)."""
        mine = new_nonce()
        sock.sendall(opening + _U8.pack(AUTH) + mine)
        try:
            theirs = self._recv_on(sock, NONCE_SIZE, "the authentication")
        except StoreConnectionError:
            raise StoreAuthError(
                f"the rendezvous store at {self.address} does not take a job secret: it closed "
                f"the connection when asked to authenticate (a store started without "
                f"{SECRET_ENV}, or torch's); give it the job's secret") from None
        sock.sendall(secret.client_proof(theirs, mine))
        try:
            verdict = _U32.unpack(self._recv_on(sock, 4, "the authentication"))[0]
        except StoreConnectionError:
            verdict = REFUSED  # closed before its verdict arrived: it did not accept us
        if verdict == REFUSED:
            raise StoreAuthError(refused_message(self.address))
        if verdict != ACCEPTED:
            raise StoreAuthError(f"{self.address} answered the authentication with {verdict:#x}: "
                                 f"not a rendezvous store of ours")
        if not secret.store_proved(self._recv_on(sock, PROOF_SIZE, "the authentication"), mine, theirs):
            raise StoreAuthError(
                f"the rendezvous store at {self.address} does not know this job's secret: it is "
                f"not this job's store (another job's, or a stranger's on this port)")

    def _recv_on(self, sock: socket.socket, n: int, what: str) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            buf += self._recv_some(sock, n - len(buf), what)
        return bytes(buf)

    def _recv_some(self, sock: socket.socket, most: int, what: str) -> bytes:
        """What one ``recv`` of at most ``most`` bytes gives (at least one byte)."""
        try:
            chunk = sock.recv(most)
        except TimeoutError:
            raise StoreTimeoutError(f"rendezvous store {self.address}: no answer to {what} "
                                    f"within {sock.gettimeout():g}s") from None
        except OSError as e:
            raise StoreConnectionError(f"lost the connection to the rendezvous store at "
                                       f"{self.address} during {what}: {e}") from None
        if not chunk:
            raise StoreConnectionError(f"the rendezvous store at {self.address} closed the "
                                       f"connection during {what} (is its host gone?)")
        return chunk

    def _sock_or_raise(self) -> socket.socket:
        if self._sock is None:
            raise StoreConnectionError(f"the connection to the rendezvous store at {self.address} "
                                       f"is closed")
        return self._sock

    @contextmanager
    def _exchange(self) -> Iterator[None]:
        """One request and its whole answer, under the lock. An exception that leaves it
        midway leaves the stream out of step, whatever raised it: a signal handler's (the
        agent's SIGTERM raises ``SignalException`` wherever its main thread is: in a read,
        between a request and its answer, or in a rendezvous's ``wait``, whose late
        ``STOP_WAITING`` the next request would read as the first byte of its own answer's
        length and then wait the whole read timeout for bytes that never come), or a read
        that timed out. The connection is dropped then: the next request fails at once
        (``StoreConnectionError``; ``connected`` is False) and the caller makes a new one.
        An exception before the request went out (a key that cannot be encoded) or after
        a wait was withdrawn in step keeps it."""
        with self._lock:
            self._midway = False
            try:
                yield
            except BaseException:
                if self._midway:
                    self._drop()
                raise
            finally:
                self._midway = False

    def _send(self, data: bytes, what: str) -> None:
        sock = self._sock_or_raise()
        self._midway = True
        try:
            sock.settimeout(self.timeout)
            sock.sendall(data)
        except OSError as e:
            self._drop()
            raise StoreConnectionError(f"lost the connection to the rendezvous store at "
                                       f"{self.address} during {what}: {e}") from None

    def _recv(self, n: int, what: str, timeout: float | None = None) -> bytes:
        sock = self._sock_or_raise()
        sock.settimeout(self.timeout if timeout is None else max(timeout, 1e-3))
        return self._recv_on(sock, n, what)

    def _recv_bytes(self, what: str) -> bytes:
        size = _U64.unpack(self._recv(8, what))[0]
        return self._recv(size, what) if size else b""

    def _drop(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock = None

    def close(self) -> None:
        with self._lock:
            self._drop()

    def interrupt(self) -> None:
        """Cut the connection short from another thread: a request blocked on it (a
        ``wait`` of many seconds) ends at once with ``StoreConnectionError``. Without the
        lock, which that request holds; ``close`` it afterwards."""
        sock = self._sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:  # not connected (any more)
                pass

    # -- torch's Store API --------------------------------------------------------------

    def set_timeout(self, timeout: float | timedelta) -> None:
        self.timeout = _seconds(timeout, self.timeout)

    @staticmethod
    def _key(key: str) -> bytes:
        return _pack_str((KEY_PREFIX + key).encode())

    def set(self, key: str, value: bytes | str) -> None:
        with self._exchange():
            self._send(_U8.pack(SET) + self._key(key) + _pack_str(_bytes(value)), f"set({key!r})")

    def multi_set(self, keys: list[str], values: list[bytes | str]) -> None:
        if len(keys) != len(values):
            raise ValueError(f"multi_set: {len(keys)} keys but {len(values)} values")
        body = b"".join(self._key(k) + _pack_str(_bytes(v)) for k, v in zip(keys, values, strict=True))
        with self._exchange():
            self._send(_U8.pack(MULTI_SET) + _I64.pack(len(keys)) + body, "multi_set")

    def compare_set(self, key: str, expected: bytes | str, desired: bytes | str) -> bytes:
        """torch's semantics: the value after the call (``desired`` iff it was swapped in;
        a missing key counts as ``b""``)."""
        with self._exchange():
            self._send(_U8.pack(COMPARE_SET) + self._key(key) + _pack_str(_bytes(expected))
                       + _pack_str(_bytes(desired)), f"compare_set({key!r})")
            return self._recv_bytes(f"compare_set({key!r})")

    def add(self, key: str, amount: int) -> int:
        with self._exchange():
            self._send(_U8.pack(ADD) + self._key(key) + _I64.pack(int(amount)), f"add({key!r})")
            return int(_I64.unpack(self._recv(8, f"add({key!r})"))[0])

    def get(self, key: str, timeout: float | timedelta | None = None) -> bytes:
        with self._exchange():
            self._wait_locked([key], _seconds(timeout, self.timeout), f"get({key!r})")
            self._send(_U8.pack(GET) + self._key(key), f"get({key!r})")
            return self._recv_bytes(f"get({key!r})")

    def multi_get(self, keys: list[str], timeout: float | timedelta | None = None) -> list[bytes]:
        if not keys:
            return []
        with self._exchange():
            self._wait_locked(keys, _seconds(timeout, self.timeout), "multi_get")
            self._send(self._with_keys(MULTI_GET, keys), "multi_get")
            return self._recv_values(len(keys), "multi_get")

    #: whether ``peek_many`` may be given a key that may be missing: not here (torch's
    #: classic store closes the connection on one); ``EtcdStore``'s may
    peeks_missing_keys = False

    def peek_many(self, keys: list[str]) -> list[bytes]:
        """``multi_get`` without its wait for the keys: one round trip, not two. Only for
        keys known to exist: our store and torch's libuv store answer ``b""`` for a
        missing one, but torch's classic store closes the connection."""
        if not keys:
            return []
        with self._exchange():
            self._send(self._with_keys(MULTI_GET, keys), "peek_many")
            return self._recv_values(len(keys), "peek_many")

    def add_and_peek(self, key: str, amount: int, keys: list[str]) -> tuple[int, list[bytes]]:
        """``add(key, amount)`` and ``peek_many(keys)`` sent together: the store reads both
        at once and answers both in one reply. A keep-alive bumps its heartbeat and reads
        the state and its peers' heartbeats; each request is a send whose TCP path (the
        receiver's included) is most of a keep-alive's CPU. The keys must exist (``peek_many``)."""
        with self._exchange():
            self._send(_U8.pack(ADD) + self._key(key) + _I64.pack(int(amount)) + self._with_keys(MULTI_GET, keys),
                       f"add_and_peek({key!r})")
            total = int(_I64.unpack(self._recv(8, f"add({key!r})"))[0])
            return total, self._recv_values(len(keys), "add_and_peek") if keys else []

    def _with_keys(self, command: int, keys: list[str]) -> bytes:
        """A request on a list of keys (``MULTI_GET``, ``CHECK``, ``WAIT``). The last one of
        each command is kept: a keep-alive reads the same 129 keys each beat at 128 nodes
        (and waits for the state's next change between two beats), and encoding them was a
        fifth of its Python. A list equal to the last one's (its strings are most often the
        same objects: a quick compare) reuses its bytes."""
        kept = self._encoded.get(command)
        if kept is not None and kept[0] == keys:
            return kept[1]
        request = _U8.pack(command) + _U64.pack(len(keys)) + b"".join(self._key(k) for k in keys)
        self._encoded[command] = (list(keys), request)
        return request

    def _recv_values(self, count: int, what: str) -> list[bytes]:
        """``count`` length-prefixed values (a ``multi_get``'s answer), received in chunks
        and cut out of them. Why: read value by value, each took two ``recv`` calls and
        four Python calls, and at 128 nodes every agent's keeper reads 127 heartbeats a
        beat: the largest part of its CPU. The store sends nothing the client did not ask
        for, so a chunk cannot hold more than this answer; a byte past it means the stream
        is out of step, and the connection is dropped rather than read on."""
        sock = self._sock_or_raise()
        sock.settimeout(self.timeout)
        buf = bytearray()
        values: list[bytes] = []
        at = 0
        while len(values) < count:
            if len(buf) - at >= 8:
                end = at + 8 + _U64.unpack_from(buf, at)[0]
                if len(buf) >= end:
                    values.append(bytes(buf[at + 8:end]))
                    at = end
                    continue
                need = end - len(buf)
            else:
                need = at + 8 - len(buf)
            buf += self._recv_some(sock, max(need, 65536), what)
        if at != len(buf):
            self._drop()
            raise StoreProtocolError(f"{self.address}: {len(buf) - at} byte(s) past the answer to {what}")
        return values

    def check(self, keys: list[str]) -> bool:
        with self._exchange():
            self._send(self._with_keys(CHECK, keys), "check")
            return int(_U8.unpack(self._recv(1, "check"))[0]) == READY

    def wait(self, keys: Iterable[str], timeout: float | timedelta | None = None) -> None:
        keys = list(keys)
        with self._exchange():
            self._wait_locked(keys, _seconds(timeout, self.timeout), f"wait({keys!r})")

    def _wait_locked(self, keys: list[str], timeout: float, what: str) -> None:
        self._send(self._with_keys(WAIT, keys), what)
        sock = self._sock_or_raise()
        sock.settimeout(max(timeout, 1e-3))
        try:
            first = sock.recv(1)
        except TimeoutError:
            first = None
        except OSError as e:
            self._drop()
            raise StoreConnectionError(f"lost the connection to the rendezvous store at "
                                       f"{self.address} during {what}: {e}") from None
        if first == b"":
            self._drop()
            raise StoreConnectionError(f"the rendezvous store at {self.address} closed the "
                                       f"connection during {what} (is its host gone?)")
        if first is not None:
            if first[0] != STOP_WAITING:
                self._drop()
                raise StoreProtocolError(f"{self.address}: unexpected answer {first[0]} to {what}")
            return
        self._send(_U8.pack(CANCEL_WAIT), what)
        answer = self._recv(1, f"cancel of {what}")[0]
        if answer == STOP_WAITING:  # the keys arrived just before the cancel
            answer = self._recv(1, f"cancel of {what}")[0]
        if answer != WAIT_CANCELED:
            self._drop()
            raise StoreProtocolError(f"{self.address}: unexpected answer {answer} to a cancel")
        self._midway = False  # withdrawn in step: the connection stays usable
        raise StoreTimeoutError(f"rendezvous store {self.address}: {what} timed out after "
                                f"{timeout:g}s")

    def delete_key(self, key: str) -> bool:
        with self._exchange():
            self._send(_U8.pack(DELETE_KEY) + self._key(key), f"delete_key({key!r})")
            return int(_I64.unpack(self._recv(8, f"delete_key({key!r})"))[0]) == 1

    def append(self, key: str, value: bytes | str) -> None:
        with self._exchange():
            self._send(_U8.pack(APPEND) + self._key(key) + _pack_str(_bytes(value)), f"append({key!r})")

    def num_keys(self) -> int:
        with self._exchange():
            self._send(_U8.pack(GETNUMKEYS), "num_keys")
            return int(_I64.unpack(self._recv(8, "num_keys"))[0])

    def ping(self) -> None:
        """One round trip (``PING``; ``GETNUMKEYS`` to a server that knows no ``PING``)."""
        if not self._pings:
            self.num_keys()
            return
        with self._exchange():
            self._send(_U8.pack(PING) + _U32.pack(7), "ping")
            self._recv(4, "ping")


# -- server ----------------------------------------------------------------------------


class _Incomplete(Exception):
    pass


class _Reader:
    """Parses one command from a buffer; raises _Incomplete if more bytes are needed."""

    def __init__(self, buf: bytearray):
        self.buf = buf
        self.pos = 0

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.buf):
            raise _Incomplete
        data = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return data

    def u8(self) -> int:
        return self.take(1)[0]

    def u32(self) -> int:
        return int(_U32.unpack(self.take(4))[0])

    def u64(self) -> int:
        return int(_U64.unpack(self.take(8))[0])

    def i64(self) -> int:
        return int(_I64.unpack(self.take(8))[0])

    def blob(self) -> bytes:
        size = self.u64()
        if size > 1 << 30:
            raise StoreProtocolError(f"a {size}-byte value is too large")
        return self.take(size)

    def key(self) -> str:
        return self.blob().decode("utf-8", "surrogateescape")


#: command names for the refusal log line
_COMMANDS = ("VALIDATE", "SET", "COMPARE_SET", "GET", "ADD", "CHECK", "WAIT", "GETNUMKEYS",
             "DELETE_KEY", "APPEND", "MULTI_GET", "MULTI_SET", "CANCEL_WAIT", "PING")


class _Conn:
    def __init__(self, sock: socket.socket, peer: str, trusted: bool):
        self.sock = sock
        self.peer = peer
        self.inbuf = bytearray()
        self.outbuf = bytearray()
        self.validated = False
        #: may it be served? (it proved the job secret, or the server has none)
        self.trusted = trusted
        self.accepted_at = time.monotonic()
        #: (client nonce, store nonce) while the client's proof is due
        self.challenge: tuple[bytes, bytes] | None = None
        self.waiting: list[str] | None = None


class StoreServer:
    """A TCPStore server in one Python thread (selectors), wire-compatible with torch's.

    ``StoreServer(host="", port=0).start()`` binds and listens *before* returning, so
    ``.port`` is the real port (no probe-then-bind race) and a second server on a port
    already in use fails at once with ``OSError(EADDRINUSE)`` (how agents on one machine
    elect the store host). Dual-stack (IPv6 + IPv4) where the host allows it.

    ``secret``: every connection must prove the job secret before it is served
    (``_store_auth``). A connection that does not is refused and closed. It is counted in
    ``refused``, logged with the peer's address, and reported to ``on_refused(peer, reason)``
    on the server's thread.
    """

    def __init__(self, host: str = "", port: int = 0, backlog: int = 1024, *,
                 secret: JobSecret | None = None,
                 on_refused: Callable[[str, str], None] | None = None):
        self._listener = self._bind(host, port, backlog)
        self.port: int = self._listener.getsockname()[1]
        self._gate = None if secret is None else StoreGate(secret, on_refused)
        self._next_sweep = 0.0
        self._data: dict[str, bytes] = {}
        self._conns: dict[int, _Conn] = {}
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = self_pipe()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._served = [0] * len(_COMMANDS)  # requests served, by command (``served()``)

    def served(self) -> dict[str, int]:
        """How many requests of each command the server has served (a rendezvous's cost)."""
        return {name: count for name, count in zip(_COMMANDS, self._served, strict=True) if count}

    @staticmethod
    def _bind(host: str, port: int, backlog: int) -> socket.socket:
        if host in ("", "0.0.0.0", "::") and socket.has_ipv6:
            try:
                sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            except OSError:
                sock = None
            if sock is not None:
                try:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    sock.bind(("::", port))
                    sock.listen(backlog)
                    return sock
                except OSError as e:
                    sock.close()
                    if e.errno == errno.EADDRINUSE:
                        raise
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host if host not in ("", "::") else "0.0.0.0", port))
            sock.listen(backlog)
        except OSError:
            sock.close()
            raise
        return sock

    def __repr__(self) -> str:
        state = "running" if self._thread and self._thread.is_alive() else "stopped"
        auth = "" if self._gate is None else f", job secret, refused={self.refused}"
        return f"StoreServer(port={self.port}, {state}, keys={len(self._data)}{auth})"

    @property
    def refused(self) -> int:
        """Connections refused for not proving the job secret."""
        return 0 if self._gate is None else self._gate.refused

    def start(self) -> StoreServer:
        self._listener.setblocking(False)
        self._sel.register(self._listener, selectors.EVENT_READ, "listen")
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._thread = threading.Thread(target=self._serve, name=f"store-server:{self.port}",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping = True
        wake_pipe(self._wake_w)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass

    def request_stop(self) -> None:
        """Ask the loop to end (safe from a signal handler)."""
        self._stopping = True
        wake_pipe(self._wake_w)

    def serve_forever(self) -> None:
        """Run in the calling thread (the standalone store process)."""
        self._listener.setblocking(False)
        self._sel.register(self._listener, selectors.EVENT_READ, "listen")
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._serve()

    # -- the loop ---------------------------------------------------------------------

    def _serve(self) -> None:
        try:
            while not self._stopping:
                if self._gate is not None and time.monotonic() >= self._next_sweep:
                    self._refuse_the_slow()
                for key, events in self._sel.select(timeout=1.0):
                    if key.data == "listen":
                        self._accept()
                    elif key.data == "wake":
                        drain_pipe(self._wake_r)
                    else:
                        conn = key.data
                        if events & selectors.EVENT_READ:
                            self._on_readable(conn)
                        if events & selectors.EVENT_WRITE and conn.sock.fileno() != -1:
                            self._flush(conn)
        finally:
            for conn in list(self._conns.values()):
                self._close(conn)
            try:
                self._sel.unregister(self._listener)
            except (KeyError, ValueError):
                pass
            self._listener.close()
            self._sel.close()

    def _accept(self) -> None:
        while True:
            try:
                sock, addr = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                log.warning("store server: accept failed: %s", e)
                return
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = _Conn(sock, f"{addr[0]}:{addr[1]}", trusted=self._gate is None)
            self._conns[sock.fileno()] = conn
            self._sel.register(sock, selectors.EVENT_READ, conn)

    def _close(self, conn: _Conn) -> None:
        if self._conns.pop(conn.sock.fileno(), None) is None:
            return
        try:
            self._sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()

    def _on_readable(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._close(conn)
            return
        conn.inbuf += data
        try:
            while conn.inbuf:
                reader = _Reader(conn.inbuf)
                try:
                    self._dispatch(conn, reader)
                except _Incomplete:
                    break
                del conn.inbuf[:reader.pos]
        except Refusal as e:
            self._refuse(conn, str(e))
            return
        except StoreProtocolError as e:
            if not conn.trusted:  # garbage from a stranger is a refusal like any other
                self._refuse(conn, str(e))
                return
            log.warning("store server: dropping client %s: %s", conn.peer, e)
            self._close(conn)
            return
        self._flush(conn)

    def _refuse(self, conn: _Conn, reason: str) -> None:
        """Count, log and report the refusal, then answer REFUSED (so our client can say
        why) and close."""
        assert self._gate is not None
        self._gate.refuse(conn.peer, reason)
        try:  # what was owed to it first (a nonce), so the client reads the verdict as one
            conn.sock.send(bytes(conn.outbuf) + _U32.pack(REFUSED))
        except OSError:
            pass  # it is gone already: the close says the rest
        self._close(conn)

    def _refuse_the_slow(self) -> None:
        """Refuse connections that have not proved the secret within ``AUTH_TIMEOUT``
        (looked at once a second: the loop wakes at least that often)."""
        now = time.monotonic()
        self._next_sweep = now + 1.0
        for conn in [c for c in self._conns.values() if not c.trusted]:
            if now - conn.accepted_at > AUTH_TIMEOUT:
                self._refuse(conn, f"did not prove it knows the job secret within {AUTH_TIMEOUT:g}s")

    def _reply(self, conn: _Conn, data: bytes) -> None:
        conn.outbuf += data

    def _flush(self, conn: _Conn) -> None:
        if conn.sock.fileno() == -1:
            return
        if conn.outbuf:
            try:
                sent = conn.sock.send(conn.outbuf)
                del conn.outbuf[:sent]
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:
                self._close(conn)
                return
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if conn.outbuf else 0)
        try:
            self._sel.modify(conn.sock, events, conn)
        except (KeyError, ValueError):
            pass

    # -- commands ---------------------------------------------------------------------

    def _dispatch(self, conn: _Conn, r: _Reader) -> None:
        if conn.challenge is not None:  # the exchange (_store_auth): the proof is due
            assert self._gate is not None
            self._reply(conn, self._gate.admit(r.take(PROOF_SIZE), conn.challenge))
            conn.challenge, conn.trusted = None, True
            return
        cmd = r.u8()
        if not conn.validated:
            if cmd != VALIDATE or r.u32() != MAGIC:
                raise StoreProtocolError("the client did not open with the TCPStore handshake")
            conn.validated = True
            return
        if not conn.trusted:  # only AUTH is served before the proof
            if cmd != AUTH:
                raise StoreGate.unproved(_COMMANDS[cmd] if cmd < len(_COMMANDS) else f"command {cmd}")
            conn.challenge = StoreGate.challenge(r.take(NONCE_SIZE))
            self._reply(conn, conn.challenge[1])
            return
        if cmd < len(self._served):
            self._served[cmd] += 1
        data = self._data
        if cmd == SET:
            key, value = r.key(), r.blob()
            data[key] = value
            self._wake_waiters()
        elif cmd == MULTI_SET:
            count = r.i64()
            pairs = [(r.key(), r.blob()) for _ in range(count)]
            data.update(pairs)
            self._wake_waiters()
        elif cmd == COMPARE_SET:
            key, expected, desired = r.key(), r.blob(), r.blob()
            current = data.get(key)
            if current is None:
                if expected:
                    self._reply(conn, _pack_str(expected))
                    return
                data[key] = desired
                self._wake_waiters()
                self._reply(conn, _pack_str(desired))
                return
            if current == expected:
                data[key] = current = desired
                self._wake_waiters()
            self._reply(conn, _pack_str(current))
        elif cmd == GET:
            self._reply(conn, _pack_str(data.get(r.key(), b"")))
        elif cmd == ADD:
            key, amount = r.key(), r.i64()
            try:
                total = int(data.get(key, b"0")) + amount
            except ValueError:
                raise StoreProtocolError(f"add on key {key!r} whose value is not an integer") from None
            if not _I64_MIN <= total <= _I64_MAX:  # the answer is an i64: struct.error killed the loop
                raise StoreProtocolError(f"add on key {key!r} overflows a 64-bit integer")
            data[key] = str(total).encode()
            self._wake_waiters()
            self._reply(conn, _I64.pack(total))
        elif cmd == CHECK:
            keys = [r.key() for _ in range(r.u64())]
            ready = all(k in data for k in keys)
            self._reply(conn, _U8.pack(READY if ready else NOT_READY))
        elif cmd == WAIT:
            keys = [r.key() for _ in range(r.u64())]
            if all(k in data for k in keys):
                self._reply(conn, _U8.pack(STOP_WAITING))
            else:
                conn.waiting = keys
        elif cmd == CANCEL_WAIT:
            conn.waiting = None
            self._reply(conn, _U8.pack(WAIT_CANCELED))
        elif cmd == GETNUMKEYS:
            self._reply(conn, _I64.pack(len(data)))
        elif cmd == DELETE_KEY:
            existed = data.pop(r.key(), None) is not None
            self._reply(conn, _I64.pack(1 if existed else 0))
        elif cmd == APPEND:
            key, value = r.key(), r.blob()
            data[key] = data.get(key, b"") + value
            self._wake_waiters()
        elif cmd == MULTI_GET:
            keys = [r.key() for _ in range(r.u64())]
            self._reply(conn, b"".join(_pack_str(data.get(k, b"")) for k in keys))
        elif cmd == PING:
            self._reply(conn, _U32.pack(r.u32()))
        elif cmd == VALIDATE:
            if r.u32() != MAGIC:
                raise StoreProtocolError("bad magic number")
        elif cmd == AUTH:
            raise StoreProtocolError(f"the client has a job secret but this store has none "
                                     f"(start it with {SECRET_ENV} or {SECRET_FILE_ENV})")
        else:
            raise StoreProtocolError(f"unsupported TCPStore command {cmd}")

    def _wake_waiters(self) -> None:
        for conn in list(self._conns.values()):
            if conn.waiting is not None and all(k in self._data for k in conn.waiting):
                conn.waiting = None
                self._reply(conn, _U8.pack(STOP_WAITING))
                self._flush(conn)

"""The ``etcd`` / ``etcd-v2`` rendezvous: the c10d algorithm on a real etcd server.

Client choice: etcd's v3 HTTP/JSON gateway (``/v3/kv/range``, ``/v3/kv/txn``,
``/v3/watch``, ``/v3/lease/*``), spoken with the standard library. The Python clients
are not an option we want to depend on: ``python-etcd`` (what torch's etcd backend
imports) speaks only the v2 API, which etcd 3.4 disables by default and 3.6 removed, and
has been unmaintained for years; ``etcd3`` pulls in grpcio + protobuf (tens of MB, slow
to import in every agent) and is itself unmaintained. The gateway is part of etcd since
3.3, stable, and needs nothing but ``http.client``. ``etcd-v2`` is accepted as a backend
name for compatibility with torchrun command lines; it uses the same v3 gateway.

``EtcdStore`` gives etcd the small store API the rendezvous uses (``set``, ``get``,
``add``, ``compare_set``, ``wait``, ``multi_get``, ...), so the round logic, JSON state,
fencing and liveness are exactly those of ``_c10d`` (one algorithm, two stores):
``compare_set`` is a transaction on the value (or on ``create_revision == 0`` for a new
key), ``add`` a compare-and-swap loop on ``mod_revision``, ``wait`` a watch that starts
at the revision of the read that found the key missing (no event can slip between).

Leases: each node grants one and attaches its heartbeat key to it, refreshing it as it
beats. When a node dies its lease expires and etcd deletes the key: observers treat a
vanished heartbeat key as a dead node. etcd lease TTLs are whole seconds (and at least
about 2 s), so the sub-second detection still comes from the heartbeat counters and the
liveness sockets of ``_c10d``; the lease is the store-side guarantee that a dead node's
key goes away even if nobody watches it. Its TTL therefore outlasts the longest lease a
node may publish (``default_lease_ttl``), and a node that finds its lease expired (it
was silent past the TTL) grants a new one and goes on (``EtcdStore._write``): the
rendezvous, not the store, says whether it is still a member.
"""

from __future__ import annotations

import base64
import http.client
import json
import math
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import timedelta
from typing import Any

from harness.errors import ConfigError
from harness.rendezvous._api import RendezvousParameters
from harness.rendezvous._c10d import C10dRendezvousHandler, C10dSettings
from harness.rendezvous._store import StoreConnectionError, StoreTimeoutError
from harness.rendezvous._store_auth import job_secret
from harness.rendezvous._store_host import NoAnswer, StoreHost

__all__ = ["EtcdStore", "EtcdRendezvousHandler", "DEFAULT_ETCD_PORT", "ETCD_USER", "enable_auth", "enable_job_auth"]

DEFAULT_ETCD_PORT = 2379
#: the etcd user a job's nodes authenticate as (etcd enables auth only once ``root`` exists)
ETCD_USER = "root"
#: what the job's password is derived for (``JobSecret.password``)
ETCD_SERVICE = "etcd"


def _b64(data: bytes | str) -> str:
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode()


def _said(data: bytes) -> str:
    """etcd's own words in an error reply (its ``error``), else the reply's start."""
    try:
        said = json.loads(data).get("error")
    except (ValueError, AttributeError):
        said = None
    return str(said) if said else repr(data[:120])


def _unb64(text: str | None) -> bytes:
    return base64.b64decode(text) if text else b""


def _seconds(timeout: float | timedelta | None, default: float) -> float:
    if timeout is None:
        return default
    return timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)


def _post(host: str, port: int, path: str, body: dict[str, Any], timeout: float) -> tuple[int, bytes]:
    """One gateway request, with no token, on a connection of its own: its HTTP status and body."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def enable_auth(host: str, port: int, password: str, timeout: float = 10.0) -> None:
    """Turn on authentication in the fresh etcd at ``host:port``: user ``ETCD_USER`` with
    ``password`` (the job's: ``JobSecret.password("etcd")``) and the root role. From then
    on a client that has not authenticated as that user can neither read nor write a key
    (etcd answers "user name is empty"); the harness's etcd is reached from hosts through
    ports any user there may connect to."""
    for path, body in (("/v3/auth/user/add", {"name": ETCD_USER, "password": password}),
                       ("/v3/auth/user/grant", {"user": ETCD_USER, "role": "root"}),
                       ("/v3/auth/enable", {})):
        try:
            status, data = _post(host, port, path, body, timeout)
        except (OSError, http.client.HTTPException) as e:
            raise StoreConnectionError(f"etcd {host}:{port}: turning on authentication ({path}): {e}") from None
        if status != 200:
            raise StoreConnectionError(f"etcd {host}:{port}: turning on authentication: {path} answered HTTP "
                                       f"{status}: {data[:200]!r}")


def enable_job_auth(host: str, port: int, env: Mapping[str, str]) -> None:
    """``enable_auth`` with the password of the job secret ``env`` names (the environment
    its nodes get: ``HARNESS_RDZV_SECRET_FILE`` or ``HARNESS_RDZV_SECRET``)."""
    secret = job_secret(env)
    if secret is None:
        raise ConfigError("secret", None, "is needed to turn on etcd's authentication: the job's "
                          "(HARNESS_RDZV_SECRET_FILE or HARNESS_RDZV_SECRET)", "etcd")
    enable_auth(host, port, secret.password(ETCD_SERVICE))


class _LeaseNotFound(StoreConnectionError):
    """etcd no longer has this node's lease: it expired while the node was silent past its
    TTL (a process starved of CPU, a machine under load). The store is fine; the node grants
    a new lease and writes again (``EtcdStore._write``)."""


class _Lease:
    """One node's etcd lease, shared by its store connections."""

    def __init__(self, ttl: int):
        self.ttl = ttl
        self.id: str | None = None
        self.refreshed = 0.0
        self.lock = threading.Lock()


class EtcdStore:
    """The store API of ``StoreClient`` on etcd's v3 JSON gateway."""

    #: ``peek_many`` reads a missing key as ``b""`` (``StoreClient``'s may not: torch's
    #: classic store closes the connection), so a reader may peek at keys it never saw
    peeks_missing_keys = True

    def __init__(self, host: str, port: int, prefix: str = "/harness", timeout: float = 60.0,
                 connect_timeout: float | None = None, lease_ttl: int = 2,
                 _lease: _Lease | None = None, password: str | None = None):
        self.host, self.port = host, port
        #: the job's etcd password (None: etcd without authentication, as torch's backend uses it)
        self._password = password
        self._token: str | None = None
        self.prefix = prefix.rstrip("/") + "/"
        self.timeout = float(timeout)
        self._connect_timeout = self.timeout if connect_timeout is None else connect_timeout
        self._lock = threading.Lock()
        self._conn: http.client.HTTPConnection | None = None
        self._owns_lease = _lease is None
        self._lease = _lease or _Lease(lease_ttl)
        self._leased: set[str] = set()
        self.leases_regranted = 0  # leases found expired and granted anew (``_write``)
        try:
            self._connect()
        except BaseException:  # refused (a wrong secret) or unreachable: no connection left open
            self._drop()
            raise

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def __repr__(self) -> str:
        return f"EtcdStore({self.address}, prefix={self.prefix!r})"

    def clone(self) -> EtcdStore:
        other = EtcdStore(self.host, self.port, self.prefix, self.timeout, self._connect_timeout,
                          self._lease.ttl, _lease=self._lease, password=self._password)
        other._leased = set(self._leased)
        return other

    # -- HTTP ---------------------------------------------------------------------------

    def _connect(self) -> None:
        deadline = time.monotonic() + self._connect_timeout
        delay, error = 0.05, "no attempt"
        while True:
            try:
                self._call("/v3/maintenance/status", {}, retry=False)
                break
            except StoreConnectionError as e:
                error = str(e)
            if time.monotonic() + delay > deadline:
                raise StoreConnectionError(
                    f"could not reach etcd at {self.address} within {self._connect_timeout:g}s "
                    f"({error}); is etcd running there?")
            time.sleep(delay)
            delay = min(delay * 2, 0.5)
        if self._password is not None:
            self._authenticate()

    def _authenticate(self) -> None:
        """A token for this client, as the job's etcd user (``enable_auth``). An etcd with
        authentication off (a user's own, as torch's backend uses one) is used without."""
        try:
            status, data = _post(self.host, self.port, "/v3/auth/authenticate",
                                 {"name": ETCD_USER, "password": self._password}, self._connect_timeout)
        except (OSError, http.client.HTTPException) as e:
            raise StoreConnectionError(f"lost the connection to etcd at {self.address} while authenticating: "
                                       f"{e}") from None
        if status == 412 and b"authentication is not enabled" in data:
            self._token = None
            return
        if status != 200:
            raise StoreConnectionError(f"etcd {self.address} refused this node's job secret (HTTP {status}: "
                                       f"{_said(data)}): not this job's etcd, or its secret is not this one")
        try:
            token = json.loads(data).get("token")
        except (ValueError, AttributeError):  # not etcd's JSON object
            token = None
        if not isinstance(token, str) or not token:
            raise StoreConnectionError(f"etcd {self.address} answered the authentication with no token: "
                                       f"{_said(data)}; is this an etcd v3 server?")
        self._token = token

    def _call(self, path: str, body: dict[str, Any], retry: bool = True,
              timeout: float | None = None) -> dict[str, Any]:
        payload = json.dumps(body).encode()
        reconnected = reauthenticated = False  # each done at most once per call
        while True:
            with self._lock:
                if self._conn is None:
                    self._conn = http.client.HTTPConnection(self.host, self.port,
                                                            timeout=timeout or self.timeout)
                conn = self._conn
                try:
                    conn.timeout = timeout or self.timeout
                    if conn.sock is not None:
                        conn.sock.settimeout(conn.timeout)
                    conn.request("POST", path, body=payload, headers=self._headers())
                    response = conn.getresponse()
                    data = response.read()
                    status = response.status
                except TimeoutError:
                    self._drop()
                    raise StoreTimeoutError(f"etcd {self.address}: {path} got no answer within "
                                            f"{conn.timeout:g}s") from None
                except (OSError, http.client.HTTPException) as e:
                    self._drop()
                    if retry and not reconnected:
                        reconnected = True
                        continue  # a kept-alive connection the server closed: reconnect once
                    raise StoreConnectionError(f"lost the connection to etcd at {self.address} "
                                               f"during {path}: {e}") from None
            if status == 401 and b"invalid auth token" in data and self._password is not None \
                    and not reauthenticated:  # its token expired (etcd's simple tokens live 5 min unused)
                reauthenticated = True
                self._authenticate()
                continue
            if status == 400 and b"user name is empty" in data:
                raise self._no_secret()
            if status == 404 and b"requested lease not found" in data:
                raise _LeaseNotFound(f"etcd {self.address}: this node's lease expired")
            if status != 200:
                raise StoreConnectionError(f"etcd {self.address}: {path} answered HTTP {status}: "
                                           f"{data[:200]!r}")
            try:
                reply: dict[str, Any] = json.loads(data or b"{}")
                return reply
            except ValueError:
                raise StoreConnectionError(f"etcd {self.address}: {path} answered non-JSON "
                                           f"{data[:80]!r}; is this an etcd v3 server?") from None

    def _no_secret(self) -> StoreConnectionError:
        """What etcd's "user name is empty" means here, for a request and for a watch."""
        return StoreConnectionError(f"etcd {self.address} wants the job's secret (authentication is on there), "
                                    "and this node has none: HARNESS_RDZV_SECRET_FILE or HARNESS_RDZV_SECRET")

    def _headers(self) -> dict[str, str]:
        token = self._token
        return {"Content-Type": "application/json", **({"Authorization": token} if token else {})}

    def _drop(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def close(self) -> None:
        if self._owns_lease:
            with self._lease.lock:
                lease, self._lease.id = self._lease.id, None
            if lease is not None:
                try:
                    self._call("/v3/lease/revoke", {"ID": lease}, timeout=2)
                except (StoreConnectionError, StoreTimeoutError):
                    pass
        with self._lock:
            self._drop()

    # -- helpers ------------------------------------------------------------------------

    def _k(self, key: str) -> str:
        return _b64(self.prefix + key)

    def _range_many(self, keys: list[str]) -> tuple[list[bytes | None], int]:
        body = {"success": [{"requestRange": {"key": self._k(k)}} for k in keys]}
        reply = self._call("/v3/kv/txn", body)
        values: list[bytes | None] = []
        for response in reply.get("responses", []):
            kvs = response.get("response_range", {}).get("kvs", [])
            values.append(_unb64(kvs[0].get("value")) if kvs else None)
        return values, int(reply.get("header", {}).get("revision", 0))

    def _lease_id(self) -> str:
        with self._lease.lock:
            if self._lease.id is None:
                reply = self._call("/v3/lease/grant", {"TTL": self._lease.ttl})
                self._lease.id = reply["ID"]
                self._lease.refreshed = time.monotonic()
            elif time.monotonic() - self._lease.refreshed > self._lease.ttl / 3:
                self._call("/v3/lease/keepalive", {"ID": self._lease.id})
                self._lease.refreshed = time.monotonic()
            return self._lease.id

    def attach_lease(self, key: str) -> None:
        """Writes of ``key`` from now on carry this node's lease (it vanishes if we die)."""
        self._leased.add(key)

    def _put(self, key: str, value: bytes | str) -> dict[str, Any]:
        put: dict[str, Any] = {"key": self._k(key), "value": _b64(value)}
        if key in self._leased:
            put["lease"] = self._lease_id()
        return put

    # -- the store API ------------------------------------------------------------------

    def set_timeout(self, timeout: float | timedelta) -> None:
        self.timeout = _seconds(timeout, self.timeout)

    def _write(self, path: str, body: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """``_call(path, body())``; where etcd says this node's lease is gone (it expired
        while the node was silent past its TTL), a new lease is granted and the write made
        again with it, once. Before, that answer read as the store lost, and ended an agent
        that had only been starved of CPU for longer than the TTL (seen in a full suite:
        seven agents on two busy cores, etcd's 2 s TTL). Whether the node is still a member
        of its round is the rendezvous's to say, from its state, as for any late node."""
        try:
            return self._call(path, body())
        except _LeaseNotFound:
            with self._lease.lock:
                self._lease.id = None
            self.leases_regranted += 1
            return self._call(path, body())

    def set(self, key: str, value: bytes | str) -> None:
        self._write("/v3/kv/put", lambda: self._put(key, value))

    def multi_set(self, keys: list[str], values: list[bytes | str]) -> None:
        self._write("/v3/kv/txn", lambda: {"success": [{"requestPut": self._put(k, v)}
                                                       for k, v in zip(keys, values, strict=False)]})

    def compare_set(self, key: str, expected: bytes | str, desired: bytes | str) -> bytes:
        expected_b = expected.encode() if isinstance(expected, str) else bytes(expected)
        desired_b = desired.encode() if isinstance(desired, str) else bytes(desired)
        if expected_b:
            compare = {"key": self._k(key), "target": "VALUE", "result": "EQUAL",
                       "value": _b64(expected_b)}
        else:
            compare = {"key": self._k(key), "target": "CREATE", "result": "EQUAL",
                       "create_revision": "0"}
        reply = self._write("/v3/kv/txn", lambda: {
            "compare": [compare], "success": [{"requestPut": self._put(key, desired_b)}],
            "failure": [{"requestRange": {"key": self._k(key)}}]})
        if reply.get("succeeded"):
            return desired_b
        kvs = reply["responses"][0].get("response_range", {}).get("kvs", [])
        return _unb64(kvs[0].get("value")) if kvs else expected_b

    def add(self, key: str, amount: int) -> int:
        while True:
            reply = self._call("/v3/kv/range", {"key": self._k(key)})
            kvs = reply.get("kvs", [])
            if kvs:
                try:
                    value = int(_unb64(kvs[0].get("value"))) + amount
                except ValueError:
                    raise StoreConnectionError(f"etcd key {key!r} does not hold an integer") from None
                compare = {"key": self._k(key), "target": "MOD", "result": "EQUAL",
                           "mod_revision": kvs[0]["mod_revision"]}
            else:
                value = amount
                compare = {"key": self._k(key), "target": "CREATE", "result": "EQUAL",
                           "create_revision": "0"}

            def txn(c: dict[str, Any] = compare, v: int = value) -> dict[str, Any]:
                return {"compare": [c], "success": [{"requestPut": self._put(key, str(v))}]}

            reply = self._write("/v3/kv/txn", txn)
            if reply.get("succeeded"):
                return value

    def check(self, keys: list[str]) -> bool:
        values, _ = self._range_many(keys)
        return all(v is not None for v in values)

    def peek_many(self, keys: list[str]) -> list[bytes]:
        """Current values without waiting; ``b""`` for a missing key."""
        values, _ = self._range_many(keys)
        return [v if v is not None else b"" for v in values]

    def get(self, key: str, timeout: float | timedelta | None = None) -> bytes:
        self.wait([key], timeout)
        values, _ = self._range_many([key])
        if values[0] is None:  # deleted between the wait and the read
            return self.get(key, timeout)
        return values[0]

    def multi_get(self, keys: list[str], timeout: float | timedelta | None = None) -> list[bytes]:
        if not keys:
            return []
        self.wait(keys, timeout)
        return self.peek_many(keys)

    def wait(self, keys: Iterable[str], timeout: float | timedelta | None = None) -> None:
        keys = list(keys)
        total = _seconds(timeout, self.timeout)
        deadline = time.monotonic() + total
        values, revision = self._range_many(keys)
        for key, value in zip(keys, values, strict=False):
            if value is None:
                self._watch_for(key, revision + 1, deadline, total)

    def _watch_for(self, key: str, start: int, deadline: float, total: float) -> None:
        """Until ``key`` is put (at revision ``start`` or later). A watch etcd cancels for an
        expired token is opened again once, re-authenticated; one it cancels for another
        reason is a one-line error now, not a wait to the deadline."""
        for renewed in (False, True):
            reason = self._watch_once(key, start, deadline, total)
            if not reason:
                return
            if "invalid auth token" in reason and self._password is not None and not renewed:
                self._authenticate()
                continue
            if "user name is empty" in reason:
                raise self._no_secret()
            raise StoreConnectionError(f"etcd {self.address} canceled the watch on {key!r}: {reason}")

    def _watch_once(self, key: str, start: int, deadline: float, total: float) -> str:
        """One watch: returns once ``key`` is put (""), or why etcd canceled it."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise StoreTimeoutError(f"etcd {self.address}: wait for {key!r} timed out after {total:g}s")
        conn = http.client.HTTPConnection(self.host, self.port, timeout=remaining)
        try:
            conn.request("POST", "/v3/watch", body=json.dumps({"create_request": {
                "key": self._k(key), "start_revision": str(start)}}), headers=self._headers())
            response = conn.getresponse()
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError
                conn.sock.settimeout(remaining)
                line = response.readline()
                if not line:
                    raise StoreConnectionError(f"etcd {self.address} ended a watch on {key!r}")
                result = json.loads(line).get("result", {})
                for event in result.get("events", []):
                    if event.get("type", "PUT") == "PUT":
                        return ""
                if result.get("canceled"):
                    return str(result.get("cancel_reason") or "no reason given")
        except TimeoutError:
            raise StoreTimeoutError(f"etcd {self.address}: wait for {key!r} timed out after "
                                    f"{total:g}s") from None
        except (OSError, http.client.HTTPException, ValueError) as e:
            raise StoreConnectionError(f"lost the connection to etcd at {self.address} while "
                                       f"waiting for {key!r}: {e}") from None
        finally:
            conn.close()

    def delete_key(self, key: str) -> bool:
        reply = self._call("/v3/kv/deleterange", {"key": self._k(key)})
        return int(reply.get("deleted", 0)) == 1

    def append(self, key: str, value: bytes | str) -> None:
        extra = value.encode() if isinstance(value, str) else bytes(value)
        while True:
            current, _ = self._range_many([key])
            old = current[0]
            if self.compare_set(key, old or b"", (old or b"") + extra) == (old or b"") + extra:
                return

    def num_keys(self) -> int:
        reply = self._call("/v3/kv/range", {"key": _b64(self.prefix),
                                            "range_end": _b64(self.prefix[:-1] + chr(ord(self.prefix[-1]) + 1)),
                                            "count_only": True})
        return int(reply.get("count", 0))


class EtcdStoreHost(StoreHost):
    """The store part of the etcd backend: etcd is never hosted by an agent, every
    connection is an ``EtcdStore``, and this node's heartbeat key rides on a lease (so it
    vanishes on the server when the node dies)."""

    def __init__(self, host: str, port: int, read_timeout: float, prefix: str, lease_ttl: int,
                 heartbeat_key: str, password: str | None = None):
        super().__init__(host, port, read_timeout=read_timeout, is_host=False)
        self._password = password
        self._prefix = prefix
        self._lease_ttl = lease_ttl
        self._heartbeat_key = heartbeat_key

    def _connect_main(self) -> Any:
        timeout = self._read_timeout
        store = EtcdStore(self.host, self.port, self._prefix, timeout=timeout,
                          connect_timeout=timeout, lease_ttl=self._lease_ttl, password=self._password)
        store.attach_lease(self._heartbeat_key)
        return store

    def open(self) -> None:
        self._client = self._connect_main()

    def connect(self, timeout: float) -> Any:
        try:
            client = self.client.clone()  # its own connect logic
        except (StoreTimeoutError, StoreConnectionError) as e:
            raise NoAnswer(e) from None
        client.set_timeout(timeout)
        return client

    def lost_message(self, error: BaseException) -> str:
        return (f"lost the etcd rendezvous store at {self.endpoint} ({error}); the job cannot "
                f"continue without it")


def default_lease_ttl(settings: C10dSettings) -> int:
    """The etcd lease's TTL unless ``lease_ttl`` is given: whole seconds past the longest
    lease a node may publish (``max_lease``) and one more beat. A vanished heartbeat key
    reads as a dead node at once, so a TTL shorter than that would declare dead a node
    that the adaptive detector (``_liveness``) still waits for: a fixed bound again, the
    one taken out (with the defaults: 5 s, against the old 2 s). A killed node is
    still seen in well under a second, by its peers' liveness sockets and counters."""
    return max(2, math.ceil(settings.max_lease + settings.keep_alive_interval))


class EtcdRendezvousHandler(C10dRendezvousHandler):
    """The c10d round logic with etcd as the store (see the module docstring)."""

    def __init__(self, params: RendezvousParameters, backend_name: str = "etcd"):
        protocol = str(params.get("protocol", "http")).lower()
        if protocol != "http":
            raise ConfigError("protocol", protocol, "must be http (https/TLS is not supported yet)",
                              "--rdzv-conf")
        self._etcd_prefix = str(params.get("etcd_prefix", "/harness"))
        settings = C10dSettings.from_params(params)
        ttl = params.get_as_int("lease_ttl", default_lease_ttl(settings))
        if ttl is None or ttl < 1:
            raise ConfigError("lease_ttl", params.get("lease_ttl"), "must be an int >= 1 (seconds)",
                              "--rdzv-conf")
        self._lease_ttl = ttl
        super().__init__(params, settings, backend_name, default_port=DEFAULT_ETCD_PORT)

    def _store_host(self, host: str, port: int) -> StoreHost:
        """As c10d's: the job secret, if the environment holds one, read here once: the
        node authenticates to etcd with the password derived from it (``enable_auth``)."""
        secret = job_secret(os.environ)
        return EtcdStoreHost(host, port, self._settings.read_timeout, self._etcd_prefix,
                             self._lease_ttl, self._keys.heartbeat(self._node),
                             password=secret.password(ETCD_SERVICE) if secret is not None else None)

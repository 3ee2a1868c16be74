"""Where a c10d rendezvous's store lives, and the handler's way to it.

``StoreHost`` is one of the three parts of the dynamic rendezvous (``_c10d`` wires them):
it opens the store (hosting it in this agent when the endpoint names this machine and
this agent wins the election by bind, as torch's agents do), holds the main connection,
opens fresh ones for the keeper (``_keeper``), and says what losing the store means.
The etcd backend swaps in its own (``_etcd.EtcdStoreHost``); nothing here decides rounds
or liveness.
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import socket
import time
from collections.abc import Callable
from typing import Any

from harness.endpoints import fqdn
from harness.rendezvous._store import (
    StoreAuthError,
    StoreClient,
    StoreConnectionError,
    StoreServer,
    StoreTimeoutError,
)
from harness.rendezvous._store_auth import JobSecret

__all__ = ["NoAnswer", "StoreHost", "elect_store_host", "is_local_host", "listen_address"]

#: what a store that refused a connection tells: (the peer's "host:port", why)
RefusalListener = Callable[[str, str], None]

log = logging.getLogger(__name__)


def is_local_host(host: str) -> bool:
    """Does ``host`` name this machine (loopback, hostname, FQDN or one of its addresses)?"""
    if host in ("localhost", "0.0.0.0", "::", "::1") or host.startswith("127."):
        return True
    names = {socket.gethostname(), fqdn()}
    if host in names:
        return True
    try:
        mine = {info[4][0] for name in names for info in socket.getaddrinfo(name, None)}
        theirs = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except OSError:
        return False
    return bool(mine & theirs) or any(str(a).startswith("127.") or a == "::1" for a in theirs)


def _someone_listens(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def listen_address(host: str) -> str:
    """The address a store hosted for endpoint ``host`` listens on: the endpoint's own.
    torch's TCPStore listens on every interface, so anyone on any network the node is on
    can reach it. Returns "" (every interface) when the endpoint says so (``0.0.0.0``,
    ``::``) or when ``host`` is a name that resolves only to loopback here. Debian maps the
    host name to 127.0.1.1, but the other nodes resolve the same name by DNS to an address
    this node cannot know, so the store must listen everywhere to reach both."""
    if host in ("", "0.0.0.0", "::"):
        return ""
    try:
        found = [str(info[4][0]) for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)]
    except OSError:
        return ""
    if not found:
        return ""
    ips = [ipaddress.ip_address(a) for a in found]
    if all(ip.is_loopback for ip in ips) and not (host == "localhost" or _is_ip(host)):
        return ""
    ipv4 = [a for a, ip in zip(found, ips, strict=True) if ip.version == 4]
    return (ipv4 or found)[0]  # clients try each address of the name: IPv4 is the one to hold


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def elect_store_host(host: str, port: int, attempts: int = 50, *, secret: JobSecret | None = None,
                     on_refused: RefusalListener | None = None) -> StoreServer | None:
    """Host the store on ``port`` at ``listen_address(host)`` unless another agent
    already does; None: join as client.

    Two agents binding at the same moment can *both* lose: with SO_REUSEADDR both binds
    succeed while neither listens, then each listen() sees the other's socket and fails
    with EADDRINUSE (2 of 40 simultaneous starts here). So a lost election counts only if
    someone really listens; otherwise retry after a short random backoff. An endpoint
    address that is not this machine's (``is_host=true`` behind a NAT) listens on every
    interface, as before."""
    import random

    bind = listen_address(host)
    for _ in range(attempts):
        try:
            return StoreServer(bind, port, secret=secret, on_refused=on_refused).start()
        except OSError as e:
            if e.errno == errno.EADDRNOTAVAIL and bind:
                log.info("the rendezvous endpoint %s is no address of this machine; the store "
                         "listens on every interface", host)
                bind = ""
                continue
            if e.errno != errno.EADDRINUSE or _someone_listens(host, port):
                return None
        time.sleep(random.uniform(0.002, 0.03))
    return None


class NoAnswer(Exception):
    """The store did not answer a connection in time (``cause`` says how): unreachable,
    maybe only for now; not gone (a refused connection is ``StoreConnectionError``)."""

    def __init__(self, cause: BaseException):
        super().__init__(str(cause))
        self.cause = cause


class StoreHost:
    """The c10d rendezvous's store as this agent reaches it: ``open()`` connects (and hosts
    the store here when elected), ``client`` is the main connection, ``connect()`` a fresh
    one for the keeper; ``close()`` ends both and the hosted server. Opens nothing until
    ``open()``: a handler binds no socket before it is used.

    ``secret``: the job secret. Every connection proves it, and a hosted store demands it
    from every connection. It refuses a stranger and tells ``on_refused`` (the agent
    puts that on its event stream)."""

    def __init__(self, host: str, port: int, read_timeout: float, is_host: bool | None,
                 secret: JobSecret | None = None):
        self.host = host
        self.port = port
        self.endpoint = f"{host}:{port}"
        self._read_timeout = read_timeout
        self._is_host = is_host
        self._secret = secret
        self.on_refused: RefusalListener | None = None
        self.server: StoreServer | None = None
        self._client: Any = None

    @property
    def hosting(self) -> bool:
        """Whether this agent hosts the store (then it can never be cut off from it)."""
        return self.server is not None

    @property
    def client(self) -> Any:
        """The main connection (``open()`` first)."""
        assert self._client is not None, "StoreHost.open() was not called"
        return self._client

    def open(self) -> None:
        """Host the store if this agent should and may, then connect to it."""
        is_host = self._is_host if self._is_host is not None else is_local_host(self.host)
        if is_host:
            self.server = elect_store_host(self.host, self.port, secret=self._secret,
                                           on_refused=self._refused)
            if self.server is not None:
                log.info("hosting the rendezvous store on port %d", self.port)
            elif self._is_host:
                log.info("is_host=true but port %d is taken; joining as a client", self.port)
        try:
            self._client = self._connect_main()
        except BaseException:
            self.close()
            raise

    def _refused(self, peer: str, reason: str) -> None:
        """The hosted store refused ``peer`` (on the store's thread)."""
        if self.on_refused is not None:
            self.on_refused(peer, reason)

    def _connect_main(self) -> Any:
        timeout = self._read_timeout
        return StoreClient(self.host, self.port, timeout=timeout, connect_timeout=timeout,
                           secret=self._secret)

    def renew(self, connect_within: float | None = None) -> None:
        """Replace the main connection (a request on it went unanswered or was cut short:
        the stream may be out of step, or it went stale during a fence), connecting within
        ``connect_within`` s (default: the read timeout). Raises ``StoreConnectionError`` at
        once if nothing listens there any more: the store this agent reached before is gone
        (its host died). Retrying a refused connect is for a store still starting up; here
        it would only hold, for ``connect_within``, a finished agent's exit."""
        try:
            self._probe(min(connect_within if connect_within is not None else self._read_timeout, 1.0))
        except NoAnswer:
            pass  # silent, not gone: the clone below waits for it
        old, self._client = self._client, self.client.clone(connect_within)
        old.close()

    def _probe(self, timeout: float) -> None:
        """Raise ``StoreConnectionError`` if the store's port refuses a connection (nothing
        listens: the store is gone), ``NoAnswer`` if nothing answers within ``timeout``."""
        try:
            socket.create_connection((self.host, self.port), timeout=timeout).close()
        except ConnectionRefusedError as e:
            raise StoreConnectionError(f"the rendezvous store at {self.endpoint} refused "
                                       f"the connection: {e.strerror}") from None
        except OSError as e:
            raise NoAnswer(e) from None

    def connect(self, timeout: float) -> Any:
        """A fresh connection for the keeper, its requests bounded by ``timeout``. Raises
        ``StoreConnectionError`` if nothing listens there any more (refused: the store is
        gone), ``NoAnswer`` if it does not answer (yet)."""
        self._probe(timeout)
        try:
            return StoreClient(self.host, self.port, timeout=timeout, connect_timeout=timeout,
                               secret=self._secret)
        except StoreAuthError:
            raise  # it answers, but not as our job's store: it is gone for us
        except (StoreTimeoutError, StoreConnectionError) as e:
            raise NoAnswer(e) from None

    def lost_message(self, error: BaseException) -> str:
        """What the agent says when the store is gone for good."""
        hosted = "this agent" if self.hosting else "the node hosting it"
        return (
            f"lost the rendezvous store at {self.endpoint} ({error}); {hosted} is gone, so "
            f"the job cannot continue. To survive the loss of any node, run the store outside "
            f"the nodes (python -m harness.rendezvous.store_server --port N) and start the "
            f"agents with --rdzv-conf is_host=false")

    def close(self) -> None:
        """Close the main connection and stop the hosted server; idempotent."""
        if self._client is not None:
            self._client.close()
        if self.server is not None:
            self.server.stop()
            self.server = None

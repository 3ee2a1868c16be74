"""Rendezvous for multi-node simulated jobs: where the store lives and how nodes reach it.

``rendezvous_for(cluster_config, job)`` returns the settings every node agent gets (backend,
endpoint, ``--rdzv-conf`` entries; ``host_configs`` are merged into node 0's only) and a
handle on the store with ``close()`` (end of job) and ``kill()`` (store-host loss):

* ``store_host="harness"`` (default, c10d): a standalone store process
  (``python -m harness.rendezvous.store_server``), a child of the harness that dies with
  it; every node joins with ``is_host=false``, so the job survives the loss of any node.
* ``store_host="node0"`` (c10d): node 0's agent hosts the store in-process, on a port the
  harness keeps reserved (bound, never listening) for the whole job, so nothing else can
  take it; the other nodes join with ``is_host=false``. Losing the store host means
  losing node 0 (agent and workers); the survivors fail fast with an error naming the store.
* ``rdzv_backend="etcd"`` (or ``"etcd-v2"``): a real etcd server on reserved loopback
  ports, a child of the harness that dies with it (its data dir lives in the job's temp
  dir), with authentication on: its one user's password is derived from the job's secret,
  so only the job's nodes read or write a key. A missing ``etcd`` binary is a
  ``ConfigError`` that says how to install it.

Store-host loss (``Job.kill_store_host()``) is ``kill()`` on the handle: SIGKILL of the
store process, or of node 0 (agent and workers) when node 0 hosts the store.

Where nodes are network hosts (``Cluster(network="netns")``) the store server and etcd run
in the network's store namespace at its own address, and node 0's store listens on node 0's
address; a fresh namespace has every port free, so fixed ports replace the reservations
loopback needs.

Where nodes run on hosts over SSH (``Cluster(hosts=...)``: ``harness.sim.places.hosts.nodes``)
the store server runs here, on loopback, and each host reaches it through a port forward
of its connection that ends at a ``StoreBridge``: a Unix socket here relayed to the store.
With ``store_host="node0"`` node 0's agent hosts it on its host's address, at a port a
keeper there holds for the job (``RemoteNodes.store_port``), and the other nodes reach
it there, across the hosts' network, as torchrun's nodes reach the store of the node
that hosts it (the job's secret keeps strangers out).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from harness.endpoints import PortReservation
from harness.errors import ConfigError, ElasticError
from harness.rendezvous import SECRET_ENV, enable_etcd_auth
from harness.sim.leftovers import owned_tempdir
from harness.sim.nodes.process import job_secret_env

__all__ = ["rendezvous_for", "StoreProcess", "NodeHostedStore", "StoreHandle", "StoreBridge", "StoreSite",
           "STORE_ADDR"]

#: the loopback address every store the harness runs listens on in loopback mode
STORE_ADDR = "127.0.0.1"
#: ports inside namespaces the harness made (nothing else can hold them there)
NETNS_STORE_PORT, NETNS_ETCD_PEER_PORT = 29400, 29401
_READY_TIMEOUT = 15.0
_STOP_GRACE = 5.0
_ETCD_BACKENDS = ("etcd", "etcd-v2")


def rendezvous_for(cluster_config: Any, job: Any) -> tuple[dict[str, Any], StoreHandle]:
    """(settings for every node agent, a store handle with ``close()``/``kill()``), for a
    job of a cluster of ``cluster_config`` (a ``ClusterConfig``)."""
    settings = cluster_config
    backend = settings.rdzv_backend
    if backend == "c10d":
        if settings.store_host == "node0":
            return _node0_store(job)
        return _harness_store(job)
    if backend in _ETCD_BACKENDS:
        if settings.store_host != "harness":
            raise ConfigError("store_host", settings.store_host,
                              f"must be 'harness' with rdzv_backend={backend!r} (the etcd server "
                              "is never hosted by a node)")
        return _etcd_store(job, backend)
    raise ConfigError("rdzv_backend", backend,
                      "must be 'c10d' or 'etcd'/'etcd-v2' for a multi-node cluster "
                      f"(nnodes={settings.min_nodes}:{settings.max_nodes})")


# -- store handles ------------------------------------------------------------------------


class StoreProcess:
    """A store running as a child process of the harness (our store server, or etcd)."""

    node: int | None = None  # hosted by no node

    def __init__(self, name: str, popen: subprocess.Popen[bytes], endpoint: str,
                 reservations: Sequence[PortReservation] = (), data_dir: str | None = None):
        self.name = name
        self.popen = popen
        self.endpoint = endpoint
        self._reservations = list(reservations)
        self._data_dir = data_dir

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def kill(self) -> None:
        """The store host is lost: SIGKILL (reaped at once)."""
        if self.alive():
            self.popen.kill()
        self.popen.wait()

    def close(self) -> None:
        """SIGTERM, a grace period, SIGKILL, reap; free its ports and data."""
        if self.alive():
            self.popen.terminate()
            try:
                self.popen.wait(_STOP_GRACE)
            except subprocess.TimeoutExpired:
                self.popen.kill()
        self.popen.wait()
        for reservation in self._reservations:
            reservation.release()
        if self._data_dir:
            shutil.rmtree(self._data_dir, ignore_errors=True)

    def describe(self) -> str:
        return f"{self.name} at {self.endpoint}"

    def __repr__(self) -> str:
        state = "running" if self.alive() else f"exited {self.popen.returncode}"
        return f"StoreProcess({self.name}, {self.endpoint}, pid={self.pid}, {state})"


class Reservation(Protocol):
    """A port kept for the store (``PortReservation`` here; a keeper on a host)."""

    def release(self) -> None: ...


class NodeHostedStore:
    """The store inside node ``node``'s agent; the harness only keeps its port reserved."""

    def __init__(self, job: Any, node: int, reservation: Reservation | None, endpoint: str):
        self._job = job
        self.node = node
        self.endpoint = endpoint
        self._reservation = reservation

    def kill(self) -> None:
        """The store host is lost: node ``node`` (agent and workers) dies at once."""
        if self.node in self._job.nodes:
            self._job.processes.signal_node_processes(self.node, signal.SIGKILL)

    def close(self) -> None:
        if self._reservation is not None:
            self._reservation.release()

    def describe(self) -> str:
        return f"the store in node {self.node}'s agent at {self.endpoint}"

    def __repr__(self) -> str:
        return f"NodeHostedStore(node={self.node}, {self.endpoint})"


#: what ``rendezvous_for`` hands the job (``job.store``): ``close()``, ``kill()``, ``describe()``
StoreHandle = StoreProcess | NodeHostedStore


# -- the three setups ---------------------------------------------------------------------


@dataclass(frozen=True)
class StoreSite:
    """Where the harness's own store listens (the job's place says: ``JobPlace.store_site``):
    its address, its port (0: the server picks one), and what puts its process in the network
    namespace it listens in (None: this process's)."""

    address: str
    port: int = 0
    enter: Callable[[], None] | None = None


def _spawn(job: Any, argv: list[str], log_path: str, stdout: Any,
           env: dict[str, str] | None = None, enter: Callable[[], None] | None = None) -> subprocess.Popen[bytes]:
    """A store process: a child of the harness that dies with it, in the namespace ``enter``
    puts it in (the store's when the nodes are network hosts)."""
    from harness.procs import die_with_parent

    parent = os.getpid()

    def preexec() -> None:
        die_with_parent(parent)
        if enter is not None:
            enter()

    with open(log_path, "wb") as log:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=stdout if stdout else log,
                                stderr=log, start_new_session=True, preexec_fn=preexec, env=env)


def _harness_store(job: Any) -> tuple[dict[str, Any], StoreProcess]:
    site: StoreSite = job.place.store_site()  # where the job's nodes reach it
    host, port = site.address, site.port
    log_path = os.path.join(job.directory, "store.log")
    env = {k: v for k, v in os.environ.items() if k != SECRET_ENV} | job_secret_env(job.directory)
    popen = _spawn(job, [sys.executable, "-m", "harness.rendezvous.store_server", "--host", host,
                         "--port", str(port)], log_path, subprocess.PIPE, env, site.enter)
    assert popen.stdout is not None  # started with stdout=PIPE
    try:
        port = _read_port(popen, log_path)
    except BaseException:
        popen.kill()
        popen.wait()
        raise
    finally:
        popen.stdout.close()
    endpoint = f"{host}:{port}"
    store = StoreProcess("store_server", popen, endpoint)
    return {"backend": "c10d", "endpoint": endpoint, "configs": {"is_host": False}}, store


def _read_port(popen: subprocess.Popen[bytes], log_path: str) -> int:
    """The ``PORT n`` line the store server prints once it listens (bounded wait)."""
    import selectors

    assert popen.stdout is not None  # started with stdout=PIPE
    with selectors.DefaultSelector() as sel:
        sel.register(popen.stdout, selectors.EVENT_READ)
        if not sel.select(_READY_TIMEOUT):
            raise ElasticError(f"the rendezvous store server printed no port within "
                               f"{_READY_TIMEOUT:g}s{_tail(log_path)}")
    line = popen.stdout.readline().decode(errors="replace").split()
    if len(line) != 2 or line[0] != "PORT" or not line[1].isdigit():
        popen.wait(_STOP_GRACE)
        raise ElasticError(f"the rendezvous store server did not start (exit code "
                           f"{popen.poll()}){_tail(log_path)}")
    return int(line[1])


def _node0_store(job: Any) -> tuple[dict[str, Any], NodeHostedStore]:
    kept, endpoint = job.place.store_port(0)  # where node 0 runs: a port held there until its agent binds it
    store = NodeHostedStore(job, 0, kept, endpoint)
    return {"backend": "c10d", "endpoint": store.endpoint, "configs": {"is_host": False},
            "host_configs": {"is_host": True}}, store


def _etcd_store(job: Any, backend: str) -> tuple[dict[str, Any], StoreProcess]:
    binary = shutil.which("etcd")
    if binary is None:
        raise ConfigError("rdzv_backend", backend,
                          "needs the etcd server binary on PATH (Debian: apt-get install "
                          "etcd-server), or use rdzv_backend='c10d'")
    host = job.net.store_address
    reservations: list[PortReservation] = []
    if job.net.mode == "netns":
        client_port, peer_port = NETNS_STORE_PORT, NETNS_ETCD_PEER_PORT
    else:
        reservations = [PortReservation(host), PortReservation(host)]
        client_port, peer_port = (r.port for r in reservations)
    data_dir = os.path.join(job.directory, "etcd")
    log_path = os.path.join(job.directory, "etcd.log")
    client_url, peer_url = f"http://{host}:{client_port}", f"http://{host}:{peer_port}"
    popen = _spawn(job, [binary, "--data-dir", data_dir, "--name", "harness",
                         "--listen-client-urls", client_url, "--advertise-client-urls", client_url,
                         "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
                         "--initial-cluster", f"harness={peer_url}",
                         "--auth-token-ttl", "86400"], log_path, None,  # a node's token outlives its job
                   enter=job.net.enter_store())
    endpoint = f"{host}:{client_port}"
    store = StoreProcess("etcd", popen, endpoint, reservations, data_dir)
    secret_env = job_secret_env(job.directory)
    try:
        job.net.call_in_store(lambda: _wait_listening(popen, host, client_port, log_path))
        # only the job's nodes (its secret's password) may read or write a key: on hosts
        # etcd is reached through ports every user of a host may connect to
        job.net.call_in_store(lambda: enable_etcd_auth(host, client_port, secret_env))
    except BaseException:
        store.close()
        raise
    return {"backend": backend, "endpoint": endpoint, "configs": {}}, store


def _wait_listening(popen: subprocess.Popen[bytes], host: str, port: int, log_path: str) -> None:
    import socket

    deadline = time.monotonic() + _READY_TIMEOUT
    while True:
        if popen.poll() is not None:
            raise ElasticError(f"etcd exited with code {popen.returncode} before it listened on "
                               f"{host}:{port}{_tail(log_path)}")
        try:
            socket.create_connection((host, port), timeout=0.5).close()
            return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise ElasticError(f"etcd did not listen on {host}:{port} within "
                               f"{_READY_TIMEOUT:g}s{_tail(log_path)}")
        time.sleep(0.01)


def _tail(path: str, lines: int = 10) -> str:
    try:
        with open(path, errors="replace") as fp:
            text = "".join(fp.readlines()[-lines:]).strip()
    except OSError:
        return ""
    return f"; its log ({path}) ends:\n{text}" if text else ""


# -- reached from hosts -----------------------------------------------------------------

_log = logging.getLogger(__name__)


class StoreBridge:
    """A Unix socket (0600) whose every connection is relayed to the TCP ``target`` (the
    store's ``host:port``): what each host's port forward ends at. It lives in a temp dir
    of its own, named for this process (a dead owner's is removed by the next), because a
    socket path may not pass 107 bytes and a job's directory can be deeper than that."""

    def __init__(self, target: str):
        host, _, port = target.rpartition(":")
        self._dir = owned_tempdir("elastic_bridge_")
        path = os.path.join(self._dir, "store.sock")
        self.path, self.target = path, (host, int(port))
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        old = os.umask(0o177)  # 0600 from the start: only this user's processes (ssh) connect
        try:
            self._listener.bind(path)
        finally:
            os.umask(old)
        self._listener.listen(64)
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._closed = False
        self._thread = threading.Thread(target=self._accept, name=f"store bridge {path}", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:  # closed: the job ends
                return
            try:
                upstream = socket.create_connection(self.target, timeout=10)
                upstream.settimeout(None)
                upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError as e:
                _log.warning("store bridge %s: cannot reach the store at %s:%d: %s", self.path, *self.target, e)
                conn.close()
                continue
            with self._lock:
                if self._closed:
                    conn.close()
                    upstream.close()
                    return
                self._open |= {conn, upstream}
            for a, b in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=self._pump, args=(a, b), name="store bridge pump", daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        """Bytes from ``source`` to ``sink`` until ``source`` ends; then half-close ``sink``."""
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        try:
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def close(self) -> None:
        with self._lock:
            self._closed = True
            conns, self._open = list(self._open), set()
        try:
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept
        except OSError:
            pass
        self._listener.close()
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            conn.close()
        self._thread.join(5)
        shutil.rmtree(self._dir, ignore_errors=True)

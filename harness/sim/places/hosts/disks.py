"""The disks of a job's nodes placed on hosts (what ``job.storage`` asks there; docs/hosts.md).

A node on a host whose ``capabilities`` list ``fuse`` gets its local disk *there*, served
by the harness's own filesystem server (``python -m harness.sim.storage.server``, the same
one a local job's disks get), under the connection's supervisor: ``{node dir}/fs`` backed
by ``{node dir}/backing``, the node's disk and its workers' TMPDIR inside. The server takes
its control link on a Unix socket in the node's dir there, which this machine reaches
through the connection (``SshHost.forward_local``): the same JSON-lines link
(``harness.sim.storage.link``) as a local server's socket pair, nothing unpickled. So
``disk_full``, ``slow_io``, ``io_error`` on a node's disk, ``kill_node(lose_unsynced=True)``
and the ``OnFile`` watches are the same requests to the same code, in the host's kernel.

The server knows which node a writer belongs to from the node's events file there (its
workers' ``worker_start``: pids of the host).

It serves the node's view of the job's shared filesystem too, ``{node dir}/fs/shared``,
backed by the job's ``{shared}`` there (the hosts' ``shared_dir``, or the one host's own
dir): what the node writes there goes through its server, so a fault on the shared
filesystem is one on every node's server (``HostDisks.call``), and a crash of the node
rolls back what it wrote there and never fsynced, as on this machine's one mount.

Ownership: closing a disk unmounts it (SIGTERM: libfuse unmounts on its way out) and ends
the server; its supervisor does the same when the connection ends in any way, and the
lease detaches any mount left below the work dir (a server killed outright leaves a dead
one) before it removes the dir.

What it takes from the host: ``/dev/fuse``, libfuse 3 and the mfusepy package, and the
right to mount (root, or ``fusermount3``). A host that lists ``fuse`` but cannot mount runs
the node on a plain dir; its storage faults then name the host and what is missing.
"""

from __future__ import annotations

import logging
import signal
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from harness.errors import ConfigError
from harness.hosts import HostError, SshHost
from harness.sim.faults.target import NodeHosts
from harness.sim.schema import FUSE
from harness.sim.storage.link import Link, LinkClosed
from harness.sim.storage.standby import LIBRARY_ENV

__all__ = ["HostDisk", "HostDisks"]

_log = logging.getLogger(__name__)

#: how long the server may take to listen (an interpreter, mfusepy and libfuse, under load)
_READY_S = 60.0
_MOUNT_S = 30.0
#: its grace after SIGTERM: libfuse unmounts, the server closes what the job left open
_GRACE_S = 10.0


class HostDisk:
    """Node ``node``'s disk on its host, served there; ``call`` is a request to its server
    (``StorageServer.control``), as ``StorageMount.call`` is to a local one's."""

    def __init__(self, host: SshHost, node: int, node_dir: str, name: str,
                 answer: Callable[[str, dict[str, Any]], Any], shared: str):
        self.host, self.node = host, node
        self.mountpoint, self.backing = f"{node_dir}/fs", f"{node_dir}/backing"
        self._answer = answer
        self._mounted = threading.Event()
        self._released = threading.Event()
        python = host.spec.python
        host.run(["mkdir", "-p", self.mountpoint, f"{self.backing}/node{node}/disk", f"{self.backing}/node{node}/tmp",
                  f"{self.backing}/shared", shared])  # the placeholder lists it at the root
        control = f"{node_dir}/storage.sock"
        self.proc = host.start(["env", *(f"{k}={v}" for k, v in LIBRARY_ENV.items()), python, "-m",
                                "harness.sim.storage.server", "--control-socket", control], grace=_GRACE_S)
        try:
            said = self.proc.first_line(_READY_S).strip()
            if said != "listening":
                raise HostError(f"host {host.spec.label}: its storage server did not start ({said or 'no word'}: "
                                f"see {node_dir}/storage.log there)")
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(host.forward_local(control))
            self.link = Link(sock, self._route, f"storage-{host.spec.label}", on_close=self._released.set)
            try:
                self.link.call("mount", timeout=_MOUNT_S, mountpoint=self.mountpoint, backing=self.backing,
                               fsname=f"harness-{name}-node{node}", events=f"{node_dir}/events.jsonl",
                               log=f"{node_dir}/storage.log", devices={"shared": shared})
            except LinkClosed:
                raise HostError(f"host {host.spec.label}: its storage server is not reachable over the connection "
                                "(a socket forward its sshd denied? it must allow AllowTcpForwarding yes or "
                                "local)") from None
            if not self._mounted.wait(_MOUNT_S):
                raise HostError(f"host {host.spec.label}: node {node}'s disk did not mount within {_MOUNT_S:g} s "
                                f"(see {node_dir}/storage.log there)")
        except BaseException:
            self.proc.close()
            raise

    def _route(self, op: str, args: dict[str, Any]) -> Any:
        if op == "mounted":
            self._mounted.set()
            return None
        if op == "released":
            self._released.set()
            return None
        return self._answer(op, args)

    def disk(self) -> str:
        """The node's disk there (its ``node_disk``)."""
        return f"{self.mountpoint}/node{self.node}/disk"

    def tmp(self) -> str:
        """Its workers' TMPDIR there, on the disk's filesystem."""
        return f"{self.mountpoint}/node{self.node}/tmp"

    def shared(self) -> str:
        """The node's view of the job's shared filesystem there (its ``{shared}``)."""
        return f"{self.mountpoint}/shared"

    def call(self, op: str, **args: Any) -> Any:
        return self.link.call(op, **args)

    def close(self) -> str | None:
        """Unmount (SIGTERM: libfuse unmounts), end the server; a problem, or None."""
        problem = None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            if not self._released.wait(_GRACE_S):
                problem = (f"host {self.host.spec.label}: node {self.node}'s disk server did not unmount within "
                           f"{_GRACE_S:g} s (the lease detaches it when the connection ends)")
        self.link.close()
        self.proc.close()
        return problem


class HostDisks:
    """The disks of a job's nodes on hosts, one server per node whose host lists ``fuse``
    (``harness.sim.storage.servers.DiskServers``: what the job's storage part asks). Each
    server serves its node's view of the shared filesystem too: a request for that filesystem
    goes to every node's server, and a fault or watch on it in place reaches a server started
    later (a node added after a ``disk_full``) before its node starts."""

    def __init__(self, nodes: NodeHosts, run_id: Callable[[], str], answer: Callable[[str, dict[str, Any]], Any]):
        self._nodes = nodes
        self._run_id = run_id
        self._answer = answer
        self._disks: dict[int, HostDisk] = {}
        self._paths: dict[int, tuple[str, str]] = {}  # node -> its disk and TMPDIR on its host
        self._why: dict[int, str] = {}
        #: node -> its server, once the shared filesystem's requests in place were replayed to
        #: it (each serves its node's view of that filesystem)
        self._views: dict[int, HostDisk] = {}
        self._kept: list[tuple[str, dict[str, Any]]] = []  # the shared filesystem's faults and watches in place
        self._lock = threading.Lock()

    def serve(self, node: int, node_dir: str, shared: str) -> tuple[str, str, str]:
        """Node ``node``'s disk, its workers' TMPDIR and its view of the job's shared dir
        ``shared`` on its host (``node_dir``: its dir there), served by the harness's
        filesystem where its capabilities list ``fuse``, else plain dirs (its storage faults
        then say why). Called as the node starts, once its connection is open."""
        disk = self._start(node, node_dir, shared)
        paths = (disk.disk(), disk.tmp()) if disk is not None else (f"{node_dir}/disk", f"{node_dir}/disk/tmp")
        with self._lock:
            self._paths[node] = paths
        return (*paths, disk.shared() if disk is not None else shared)

    def _start(self, node: int, node_dir: str, shared: str) -> HostDisk | None:
        spec = self._nodes.host_of(node)
        if FUSE not in spec.capabilities:
            return None
        with self._lock:
            old = self._disks.pop(node, None)
        if old is not None:  # the node's index again (an add after a remove): a fresh disk
            old.close()
        began = time.monotonic()
        try:
            disk = HostDisk(self._nodes.connection(node)[0], node, node_dir, self._run_id(), self._answer, shared)
            try:
                with self._lock:  # the shared filesystem's faults and watches in place, before its node starts
                    for op, args in self._kept:
                        disk.call(op, **args)
                    self._views[node] = disk
                    self._disks[node] = disk
            except BaseException:
                disk.close()
                raise
        except (HostError, LinkClosed, OSError, TimeoutError, RuntimeError) as e:
            self._why[node] = f"a disk served on host {spec.label} ({e})"
            _log.warning("node %d: %s", node, self._why[node])
            return None
        _log.debug("node %d: its disk on host %s served in %.2f s", node, spec.label, time.monotonic() - began)
        return disk

    def disk_of(self, node: int) -> str:
        with self._lock:
            return self._paths[node][0]

    def tmp_of(self, node: int) -> str:
        with self._lock:
            return self._paths[node][1]

    def check(self, device: int | None, what: str) -> None:
        with self._lock:
            if device is not None:
                served = device in self._disks
            else:
                missing = [node for node in self._paths if node not in self._disks]
                served = bool(self._paths) and not missing
        if device is not None and not served:
            raise ConfigError(what, "storage fault", f"needs node {device}'s disk served by the harness's "
                              f"filesystem on its host; missing: {self.unavailable(device)}")
        if device is None and not served:
            raise ConfigError(what, "storage fault", "needs the shared filesystem served on every node's host; "
                              "missing: " + (self.unavailable(missing[0]) if missing else "a node started on a host"))

    def check_watch(self, node: int | None, what: str) -> None:
        with self._lock:
            served = bool(self._serving(node))
        if not served:
            missing = (self.unavailable(node) if node is not None else
                       "any node's (no node's host lists fuse in its capabilities, or none has started)")
            raise ConfigError(what, "storage fault", "needs a node's disk served by the harness's filesystem "
                              f"on its host; missing: {missing}")

    def _serving(self, device: int | None) -> list[HostDisk]:
        """The servers of ``device`` now (the caller holds ``_lock``): the shared filesystem's
        are every node's view not gone with its host's connection."""
        if device is None:
            return [view for view in self._views.values() if not view.link.closed]
        disk = self._disks.get(device)
        return [disk] if disk is not None else []

    def call(self, device: int | None, op: str, /, **args: Any) -> list[Any]:
        with self._lock:  # one at a time with a server's start: it gets what is kept, or this call
            answers = [server.call(op, **args) for server in self._serving(device)]
            if device is None and op in ("fault", "watch"):
                self._kept.append((op, args))
            elif device is None and op == "heal":
                self._kept = [(kept, kept_args) for kept, kept_args in self._kept if kept != "fault"]
        return answers

    def mountpoint(self, device: int) -> str:
        with self._lock:
            return self._disks[device].mountpoint

    def unavailable(self, node: int) -> str:
        """Why node ``node`` has no disk served on its host (a clause)."""
        spec = self._nodes.host_of(node)
        if FUSE not in spec.capabilities:
            return (f"'fuse' in the capabilities of its host {spec.label} (its hosts or Slurm file's), where the "
                    "harness may mount its filesystem (/dev/fuse, libfuse 3, root or fusermount3)")
        return self._why.get(node, f"its host {spec.label}'s connection (node {node} has not started there)")

    def close(self) -> list[str]:
        """Unmount every node's disk and end its server; what went wrong (one line each)."""
        with self._lock:
            disks, self._disks, self._views = list(self._disks.values()), {}, {}
        problems = []
        for disk in disks:
            try:
                problem = disk.close()
            except (HostError, OSError) as e:
                problem = f"host {disk.host.spec.label}: node {disk.node}'s disk: {e}"
            if problem:
                problems.append(problem)
        return problems

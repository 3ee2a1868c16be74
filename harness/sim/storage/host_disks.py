"""The disks of a job's nodes placed on hosts (``job.storage`` there; docs/hosts.md).

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
filesystem is one on every node's server (``StorageFaults``), and a crash of the node
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
    """The disks of a job's nodes on hosts, one server per node whose host lists ``fuse``."""

    def __init__(self, nodes: NodeHosts, run_id: Callable[[], str], answer: Callable[[str, dict[str, Any]], Any],
                 started: Callable[[HostDisk], None]):
        self._nodes = nodes
        self._run_id = run_id
        self._answer = answer
        self._started = started
        self._disks: dict[int, HostDisk] = {}
        self._why: dict[int, str] = {}
        self._lock = threading.Lock()

    def start(self, node: int, node_dir: str, shared: str) -> HostDisk | None:
        """Node ``node``'s disk on its host, and its view of ``shared`` (the job's shared
        dir there), served (None: plain dirs; ``unavailable`` says why); ``started`` is
        told before it is returned (the shared filesystem's faults in place reach it).
        Called as the node starts, once its connection is open."""
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
                self._started(disk)
            except BaseException:
                disk.close()
                raise
        except (HostError, LinkClosed, OSError, TimeoutError, RuntimeError) as e:
            self._why[node] = f"a disk served on host {spec.label} ({e})"
            _log.warning("node %d: %s", node, self._why[node])
            return None
        _log.debug("node %d: its disk on host %s served in %.2f s", node, spec.label, time.monotonic() - began)
        with self._lock:
            self._disks[node] = disk
        return disk

    def disk(self, node: int) -> HostDisk | None:
        with self._lock:
            return self._disks.get(node)

    def disks(self) -> list[HostDisk]:
        with self._lock:
            return list(self._disks.values())

    def unavailable(self, node: int) -> str:
        """Why node ``node`` has no disk served on its host (a clause)."""
        spec = self._nodes.host_of(node)
        if FUSE not in spec.capabilities:
            return (f"'fuse' in the capabilities of its host {spec.label} (the hosts file's), where the harness "
                    "may mount its filesystem (/dev/fuse, libfuse 3, root or fusermount3)")
        return self._why.get(node, f"its host {spec.label}'s connection (node {node} has not started there)")

    def close(self) -> list[str]:
        """Unmount every node's disk and end its server; what went wrong (one line each)."""
        with self._lock:
            disks, self._disks = list(self._disks.values()), {}
        problems = []
        for disk in disks:
            try:
                problem = disk.close()
            except (HostError, OSError) as e:
                problem = f"host {disk.host.spec.label}: node {disk.node}'s disk: {e}"
            if problem:
                problems.append(problem)
        return problems

"""``WarmPool``: warm interpreters shared across clusters: a zygote that has imported torch
(workers are forked from it), a node fork server that has imported the runtime (node
agents are forked from it, ``nodes.forks``) and a filesystem server standing by for the next
job's mount (``harness.sim.storage.standby``).

Forking workers from an interpreter that has already imported torch is what makes a
simulated job start in a second; importing torch costs about a second per cluster. A
pool is an explicit object with one owner: the caller creates it, passes it to every
``Cluster(pool=...)`` that should share it, and closes it. A ``Cluster`` given no pool
starts a private one and closes it with itself, so ``with Cluster(...)`` leaves nothing
alive. The pytest plugin keeps one pool per session (per xdist worker).

    with WarmPool() as pool:
        for _ in range(10):
            with Cluster(nnodes=2, pool=pool) as cluster:
                ...

A pool may join a zygote another pool owns instead of starting its own: ``WarmPool(zygote=
path)``, or ``$HARNESS_POOL_ZYGOTE`` in its environment (``SHARED_ZYGOTE_ENV``). The pytest
sessions a test starts (``pytester``) join the test process's zygote that way: each would
otherwise import torch again for a job of a few seconds. The owner's zygote serves them as
it serves its own agents (one zygote serves many, ``harness.procs._zygote``); the joining
pool never starts, stops or restarts it.

The zygote runs ahead of the nodes it serves (``harness.procs._priority``, where the machine
lets it raise a priority): it forks for every node of a job, one node after another, work a
real cluster's nodes each do on their own cores.
"""

from __future__ import annotations

import os
import threading
import warnings
from typing import Any

from harness.errors import ElasticError
from harness.procs import ZygoteServerProcess
from harness.sim.nodes.forks import NodeForkServer
from harness.sim.storage.mount import fuse_missing
from harness.sim.storage.standby import StandbyServer

__all__ = ["SHARED_ZYGOTE_ENV", "WarmPool"]

#: the socket of a warm pool's zygote to join (a session's, shared by its clusters)
SHARED_ZYGOTE_ENV = "HARNESS_POOL_ZYGOTE"


class WarmPool:
    """One zygote, started on first use (``start()`` returns at once so its torch import
    overlaps other start-up work), stopped by ``close()``."""

    def __init__(self, zygote: str | None = None) -> None:
        #: the socket of a zygote another pool owns, joined instead of starting one
        self.joined: str | None = zygote if zygote is not None else (os.environ.get(SHARED_ZYGOTE_ENV) or None)
        self._server: ZygoteServerProcess | None = None
        self._nodes: NodeForkServer | None = None
        self._storage: StandbyServer | None = None
        self._storage_lock = threading.Lock()
        self._closed = False

    def start(self) -> None:
        """Start the zygote if it is not running; does not wait for it to be ready."""
        if self._closed:
            raise ElasticError("this WarmPool is closed")
        if self.joined is not None:
            return  # the owner's to start
        if self._server is None or self._server.process.poll() is not None:
            if self._server is not None:
                self._server.close()  # a dead one's socket dir and ready pipe
            self._server = ZygoteServerProcess(ahead=True)

    def node_server(self) -> NodeForkServer | None:
        """The node fork server, started on first use (returns at once); None where it
        cannot run (no pidfd to watch its nodes with: their exits come from the server)."""
        if self._closed:
            raise ElasticError("this WarmPool is closed")
        if not _has_pidfd():
            return None
        if self._nodes is None or self._nodes.process.poll() is not None:
            if self._nodes is not None:
                self._nodes.close()  # a dead one's socket and reader thread
            self._nodes = NodeForkServer()
        return self._nodes

    def stand_by_storage(self) -> None:
        """Start a filesystem server standing by for the next job, unless one is (returns
        at once; nothing where FUSE is missing). Clusters sharing the pool call it when they
        start and when they close, so a job's launch never waits for a server's start."""
        if self._closed or fuse_missing() is not None:
            return
        with self._storage_lock:
            if self._storage is not None and self._storage.usable():
                return
            if self._storage is not None:
                self._storage.close()  # one that died: reaped before its replacement starts
            self._storage = StandbyServer()

    def storage_server(self) -> StandbyServer | None:
        """The server standing by, handed over (the taker owns it until it gives it back
        with ``return_storage_server``); None if there is none."""
        with self._storage_lock:
            server, self._storage = self._storage, None
        return server

    def return_storage_server(self, server: StandbyServer) -> None:
        """A job's server, unmounted and standing by again: kept for the next job (one is
        kept; a closed pool, or one that has one already, ends it)."""
        ended: StandbyServer | None = server
        with self._storage_lock:
            if not self._closed and server.usable() and (self._storage is None or not self._storage.usable()):
                ended, self._storage = self._storage, server  # a dead one, or none
        if ended is not None:
            ended.close()

    def path(self) -> str:
        """The socket agents reach the zygote on (``HARNESS_ZYGOTE``); waits until ready."""
        self.start()
        if self.joined is not None:
            return self.joined
        assert self._server is not None
        self._server.wait_ready()
        return self._server.path

    def address(self) -> str:
        """The socket path as soon as the zygote listens, before its torch import is done:
        agents started now connect at once and are served once it is (their start and
        rendezvous overlap the import)."""
        self.start()
        if self.joined is not None:
            return self.joined
        assert self._server is not None
        self._server.wait_listening()
        return self._server.path

    @property
    def pid(self) -> int | None:
        """The zygote's pid while it runs (for leak checks and benchmarks), else None."""
        if self._server is None or self._server.process.poll() is not None:
            return None
        return self._server.process.pid

    def pids(self) -> set[int]:
        """The pool's own processes running now (the zygote, the node fork server, the
        filesystem server standing by), not what they forked: a leak check that lets a shared
        pool live between tests still sees a worker or a node agent left behind."""
        processes = [getattr(self._server, "process", None), getattr(self._nodes, "process", None),
                     getattr(self._storage, "process", None)]
        return {proc.pid for proc in processes if proc is not None and proc.poll() is None}

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Kill the zygote and reap it; idempotent. Workers it forked die with it."""
        self._closed = True
        storage = self.storage_server()
        if storage is not None:
            storage.close()
        nodes, self._nodes = self._nodes, None
        if nodes is not None:
            nodes.close()
        server, self._server = self._server, None
        if server is not None:
            server.close()
            server.process.wait()

    def __enter__(self) -> WarmPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True) and (self._server is not None or self._nodes is not None
                                                    or self._storage is not None):
            warnings.warn("WarmPool was never closed; its zygote is killed now (use "
                          "`with WarmPool() as pool:` or call pool.close())", ResourceWarning,
                          stacklevel=2)
            self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else (f"pid={self.pid}" if self.pid else "not started")
        return f"WarmPool({state})"


def _has_pidfd() -> bool:
    try:
        os.close(os.pidfd_open(os.getpid()))
        return True
    except (OSError, AttributeError):
        return False


def resolve_pool(pool: Any) -> tuple[WarmPool, bool]:
    """(the pool a cluster uses, whether the cluster owns it and must close it)."""
    if pool is None:
        return WarmPool(), True
    if not isinstance(pool, WarmPool):
        from harness.errors import ConfigError

        raise ConfigError("pool", pool, "must be a harness.WarmPool or None")
    if pool.closed:
        from harness.errors import ConfigError

        raise ConfigError("pool", pool, "is closed")
    return pool, False

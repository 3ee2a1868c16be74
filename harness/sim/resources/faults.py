"""A job's resource faults: a slow node (a CPU quota) and a memory limit (the kernel's OOM killer).

Every node of a job gets its own cgroup where the machine allows it (``cgroups``): its
agent joins it first thing (``harness.sim.nodes.main.settle``), so every worker it spawns inherits it,
and the zygote moves the workers it forks for that agent in too. A fault is then a write to
the node's cgroup: ``slow_node`` sets a CFS quota (the node gets ``cpu`` CPUs' worth of
time, a straggler: every collective waits for it), ``memory_limit`` caps the memory its
processes share (past it the kernel OOM-kills one; the agent records ``reason="oom"`` and
restarts the group as any failure). Each lasts until ``job.heal()`` (or the job's end), is
recorded as a ``fault`` event when it starts and a ``heal`` event (``healed=[...]``) when
it ends, and one still in place when the job ends is reported by ``Cluster.close``.

A job holds one ``ResourceFaults`` as ``job.resources``, which sees the job only as a
``FaultTarget`` (``harness.sim.faults.target``); ``job.slow_node`` and ``job.memory_limit``
are its methods, handed on, and ``job.heal()`` ends these too (``end_lasting``). The job's
place hands it the nodes' cgroups (``NodeCgroups``: this machine's, or on hosts each node's
host's, where the same writes are carried out); the faults, their events and their heal are
the same.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any, Protocol

from harness.errors import ConfigError
from harness.procs import WORKER_CGROUP_ENV
from harness.sim.errors import FaultError
from harness.sim.faults.target import Ended, record_fault
from harness.sim.nodes.main import CGROUP_ENV
from harness.sim.resources.cgroups import NFT_CGROUP_ROOT, parse_bytes

if TYPE_CHECKING:
    from harness.sim.faults.target import FaultTarget

__all__ = ["CgroupOfNode", "NodeCgroups", "ResourceFaults", "unhealed_message", "MIN_CPU", "MIN_MEMORY"]


class CgroupOfNode(Protocol):
    """A node's cgroup as the faults, tests and benches use it: ``NodeCgroup`` on this
    machine, ``HostNodeCgroup`` on a host."""

    def procs_files(self) -> list[str]: ...

    def worker_procs_files(self) -> list[str]: ...

    def distinct(self) -> list[str]: ...

    def socket_cgroup(self) -> tuple[str, int] | None: ...

    def pids(self) -> list[int]: ...

    def joined(self, pid: int) -> bool: ...

    def set_cpu(self, cpus: float) -> None: ...

    def clear_cpu(self) -> None: ...

    def set_memory(self, limit: int) -> None: ...

    def set_memory_above(self, headroom: int) -> tuple[int, int]: ...

    def clear_memory(self) -> None: ...

    def cpu_seconds(self) -> float: ...

    def throttled(self) -> int: ...

    def memory_bytes(self) -> int: ...

    def oom_kills(self) -> int: ...


class NodeCgroups(Protocol):
    """Where a job's nodes' cgroups are (the job's place's: ``MachineCgroups`` on this
    machine, ``HostCgroups`` on hosts): a node's, made on first use, or None and why not."""

    def node(self, index: int) -> CgroupOfNode | None: ...

    def unavailable(self, index: int) -> str: ...

    def close(self) -> list[str]: ...


MIN_CPU = 0.01  # the kernel's smallest CFS quota (1 ms) per 100 ms period
MIN_MEMORY = 1 << 20
SLOW_NODE, MEMORY_LIMIT = "slow_node", "memory_limit"


class ResourceFaults:
    """The resource faults of one job, and its nodes' cgroups."""

    def __init__(self, target: FaultTarget, cgroups: NodeCgroups):
        self._target = target
        #: where the nodes' cgroups are: the job's place's (this machine's, or their hosts')
        self._cgroups = cgroups
        self._closed = False
        self._open: dict[int, dict[str, Any]] = {}  # node -> {fault kind: its value}

    # -- the nodes' cgroups ---------------------------------------------------------------

    def node_env(self, node: int) -> dict[str, str]:
        """What node ``node``'s agent needs in its environment to join its cgroup (made
        now); nothing where cgroups are unavailable (its resource faults then say why)."""
        cgroup = self._node_cgroup(node)
        if cgroup is None:
            return {}
        return {CGROUP_ENV: os.pathsep.join(cgroup.procs_files()),
                WORKER_CGROUP_ENV: os.pathsep.join(cgroup.worker_procs_files())}

    def _node_cgroup(self, node: int) -> CgroupOfNode | None:
        return None if self._closed else self._cgroups.node(node)

    def _why_none(self, node: int) -> str:
        return "the job is closed" if self._closed else self._cgroups.unavailable(node)

    def cgroup(self, node: int) -> CgroupOfNode:
        """Node ``node``'s cgroup (what tests and benches measure: ``cpu_seconds()``...);
        ``ConfigError`` naming what is missing where there is none."""
        self._target.node(node)
        cgroup = self._node_cgroup(node) if node in self._target.nodes else None
        if cgroup is None:
            raise ConfigError("node", node, f"has no cgroup: resource faults need {self._why_none(node)}")
        return cgroup

    def socket_cgroup(self, node: int) -> tuple[str, int] | str:
        """Node ``node``'s cgroup v2 dir as nft matches its sockets on its host (``[path,
        level]``: a network fault on one of several nodes of a host falls on it alone), or
        why it has none (a clause: what is missing)."""
        cgroup = self._node_cgroup(node)
        if cgroup is None:
            return self._why_none(node)
        return cgroup.socket_cgroup() or (f"a cgroup v2 hierarchy under {NFT_CGROUP_ROOT} where its cgroup spans it "
                                          "(nft matches a socket by its cgroup v2 dir)")

    def _live_cgroup(self, node: int, what: str) -> CgroupOfNode:
        """Node ``node``'s cgroup, its live agent in it: a fault written to a cgroup the
        agent never joined would reach none of its processes."""
        cgroup = self.cgroup(node)
        agent = self._target.node(node)
        if agent.alive() and not cgroup.joined(agent.pid):
            raise FaultError(f"{what}: node {node}'s agent (pid {agent.pid}) is not in its cgroup "
                             f"{cgroup.distinct()[0]} (see its agent log: it could not join)")
        return cgroup

    # -- the faults --------------------------------------------------------------------

    def slow_node(self, node: int, cpu: float = 0.2) -> None:
        """Node ``node``'s workers get ``cpu`` CPUs' worth of time together (0.2: a fifth
        of one core), until ``heal``: a straggler. Its agent is outside the quota (its
        keep-alive goes on: a slow node is not a dead one; ``NodeCgroup``)."""
        if isinstance(cpu, bool) or not isinstance(cpu, (int, float)) or not MIN_CPU <= cpu <= (os.cpu_count() or 1):
            raise ConfigError("cpu", cpu, f"must be a number of CPUs in [{MIN_CPU}, {os.cpu_count()}]")
        cgroup = self._live_cgroup(node, SLOW_NODE)
        cgroup.set_cpu(cpu)
        # recorded once the quota is in place, not before: on a host the write is a round
        # trip (~0.1 s, seconds under load), and a straggler's window (its steps from this
        # event to the heal: the step rates, ``min_slowdown``) must hold throttled steps
        # only. Nothing a quota does is an event that could come before this one
        record_fault(self._target, SLOW_NODE, target_node=node, cpu=cpu)
        self._open.setdefault(node, {})[SLOW_NODE] = cpu

    def memory_limit(self, node: int, limit: str | int = "300M") -> None:
        """Node ``node``'s processes share ``limit`` bytes ("300M", "1G", or an int), until
        ``heal``: past it the kernel's OOM killer ends one of them. ``"+300M"``: that much
        above what they hold when it fires. Why: what a node holds depends on where it runs
        (a worker forked from this machine's warm pool is charged only what it touches
        after the fork, one on a host that imports torch itself ~300 MB more), and a
        scenario that means "a leak meets a ceiling" must mean it on both."""
        text = limit.strip() if isinstance(limit, str) else limit
        headroom = isinstance(text, str) and text.startswith("+")
        try:
            size = parse_bytes(text[1:] if headroom and isinstance(text, str) else limit)
        except ValueError:
            raise ConfigError("limit", limit, 'must be a size like "300M", "1G" or a number of bytes, or "+300M": '
                                              "that much above what the node holds when it fires") from None
        if size < MIN_MEMORY:
            raise ConfigError("limit", limit, f"must be at least {'+' if headroom else ''}1M"
                                              f"{'' if headroom else ' (the agent itself needs more)'}")
        cgroup = self._live_cgroup(node, MEMORY_LIMIT)
        if headroom:
            self._limit_above(node, cgroup, limit, size)
            return
        record_fault(self._target, MEMORY_LIMIT, target_node=node, limit=limit, bytes=size)
        try:
            cgroup.set_memory(size)
        except OSError as e:
            raise self._refused(node, limit, cgroup, e) from None
        self._open.setdefault(node, {})[MEMORY_LIMIT] = size

    def _limit_above(self, node: int, cgroup: CgroupOfNode, limit: str | int, headroom: int) -> None:
        """``memory_limit`` ``"+N"``: what the node held and the limit are known only once
        it is set (one step where the node is: ``set_memory_above``), so the event is
        written then, stamped with the time the harness began (as every fault's event
        precedes its effect: the timeline orders events by their stamps)."""
        began = {"ts": time.time(), "mono": time.monotonic()}
        try:
            held, size = cgroup.set_memory_above(headroom)
        except OSError as e:
            record_fault(self._target, MEMORY_LIMIT, target_node=node, limit=limit, **began)
            raise self._refused(node, limit, cgroup, e) from None
        record_fault(self._target, MEMORY_LIMIT, target_node=node, limit=limit, bytes=size, held=held, **began)
        self._open.setdefault(node, {})[MEMORY_LIMIT] = size

    @staticmethod
    def _refused(node: int, limit: str | int, cgroup: CgroupOfNode, error: OSError) -> FaultError:
        return FaultError(f"memory_limit: the kernel refused limit={limit!r} for node {node} "
                          f"({error.strerror}): its processes use {cgroup.memory_bytes()} bytes and "
                          "could not be reclaimed below it")

    def end_lasting(self, node: int | None = None) -> Ended:
        """End node ``node``'s resource faults (every node's with None); the kinds ended
        (``Job.heal`` records them in its one ``heal`` event)."""
        nodes = [node] if node is not None else sorted(self._open)
        healed: set[str] = set()
        for n in nodes:
            faults = self._open.pop(n, {})
            if not faults:
                continue
            cgroup = self.cgroup(n)
            if SLOW_NODE in faults:
                cgroup.clear_cpu()
            if MEMORY_LIMIT in faults:
                cgroup.clear_memory()
            healed.update(faults)
        return Ended(sorted(healed))

    def open_faults(self) -> dict[int, list[str]]:
        """node -> the resource faults it still has (what the test has not healed)."""
        return {n: sorted(faults) for n, faults in self._open.items() if faults}

    def close(self) -> list[str]:
        """Remove the job's cgroups (after its processes were killed); what had to be moved
        out of them first (one line each)."""
        self._open.clear()
        self._closed = True
        return self._cgroups.close()


def unhealed_message(open_faults: dict[int, list[str]]) -> str | None:
    """What ``Cluster.close`` warns when a test left resource faults in place."""
    if not open_faults:
        return None
    parts = [f"node {node}: {', '.join(kinds)}" for node, kinds in sorted(open_faults.items())]
    return ("resource faults still in place when the job ended (heal them in the test, or "
            "expect their effect): " + "; ".join(parts))

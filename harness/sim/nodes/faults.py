"""A job's process faults (``job.processes``): signal, kill, freeze, remove and add the
processes of a simulated job (workers, agents, whole nodes, the store's host).

Each method is named as its fault kind (``harness.sim.schema.FAULT_KINDS``), takes the
row's parameters (``Fault.apply`` calls it with them) and records its ``fault`` event under
that name. Each resolves its target first (an unknown node or rank raises ``ConfigError``, a
target not running yet ``TargetNotReady``), so a fault that cannot hit anything is never
recorded as fired; then records the ``fault`` event, then acts. What the harness does to a node is
told to the job's ledger first (``ledger.harm``) so that the node's exit, reaped by the
harness, gets a terminal entry on its own timeline naming the cause. Exit-code orders (a
worker exits with a code at a step of its own choosing) are left here too, as files the
worker's ``harness.report_step`` obeys.

A node on a host (``RemoteNodeProcess``) is hit there: its agent's group or tree through
its supervisor (``signal_agent``, ``signal_node``), one worker through the same supervisor, which
signals a pid only if it is a process below the agent (``signal_worker``), its freeze seen
by that supervisor (``await_stopped``). Its exit-code orders go where its workers look
there (``places.hosts.orders.HostOrders``, the job's ``OrdersPlace`` on hosts).
"""

from __future__ import annotations

import functools
import os
import signal
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from harness.errors import ConfigError
from harness.sim.errors import TargetNotReady
from harness.sim.faults import exit_order
from harness.sim.faults.target import record_fault

if TYPE_CHECKING:
    from harness.sim.faults.target import FaultTarget
    from harness.sim.nodes.process import NodeProcess

__all__ = ["LocalOrders", "OrdersPlace", "ProcessFaults"]


class OrdersPlace(Protocol):
    """Where a job's exit-code orders are left for its workers' ``report_step``."""

    def leave(self, name: str, text: str, node: int | None) -> Callable[[], bool]:
        """Leave order ``name`` (``harness.sim.faults.exit_order``) where the workers of
        ``node`` look (None: an exact (rank, step) order, where every node looks); whether
        it is still there (not obeyed yet)."""
        ...


class LocalOrders:
    """The orders dir of a job on this machine: one, every node's workers look there."""

    def __init__(self, orders_dir: str):
        self.orders_dir = orders_dir

    def leave(self, name: str, text: str, node: int | None) -> Callable[[], bool]:
        path = os.path.join(self.orders_dir, name)
        with open(path + ".tmp", "w") as fp:  # whole or not at all: a worker may look any time
            fp.write(text)
        os.replace(path + ".tmp", path)
        return functools.partial(os.path.exists, path)


class ProcessFaults:
    """The process faults of one job (``job.processes``); none of them lasts (no heal)."""

    def __init__(self, target: FaultTarget, orders: OrdersPlace):
        self._target = target
        self._place = orders
        #: exit-code orders left for ``report_step``: (what was ordered, why it may not fire,
        #: whether it is still there: not obeyed yet)
        self._orders: list[tuple[str, str, Callable[[], bool]]] = []

    # -- exit-code orders ---------------------------------------------------------------

    def order_exit(self, node: int, local_rank: int, exit_code: int) -> None:
        """The worker exits with ``exit_code`` at its next ``report_step``."""
        self._check_local_rank(node, local_rank)
        starts = self._target.worker_starts(node)
        if local_rank not in starts:
            raise TargetNotReady("local_rank", local_rank, f"has not started on node {node} yet")
        rank = starts[local_rank]["rank"]
        self._target.harness_events.emit("fault_armed", fault="kill_worker", target_node=node,
                                         local_rank=local_rank, rank=rank, exit_code=exit_code)
        left = self._place.leave(*exit_order(rank, exit_code), node)
        self._orders.append((f"exit {exit_code} ordered for node {node} local rank {local_rank}",
                             f"rank {rank} reported no step after the order — does the script call "
                             "harness.report_step?", left))

    def order_exit_at(self, rank: int, step: int, exit_code: int, what: str) -> None:
        """Rank ``rank`` exits with ``exit_code`` when it reports step ``step`` (an exact
        (rank, step) crash, obeyed by the worker itself); ``what`` names it in ``unobeyed``."""
        self._target.harness_events.emit("fault_armed", fault="kill_worker", rank=rank,
                                         step=step, exit_code=exit_code)
        left = self._place.leave(*exit_order(rank, exit_code, step), None)
        self._orders.append((what, f"rank {rank} reported no step {step} — does the script call "
                             "harness.report_step?", left))

    def unobeyed(self) -> list[tuple[str, str]]:
        """(order, why) of every exit-code order no worker obeyed yet (its file is still there)."""
        return [(what, why) for what, why, left in self._orders if left()]

    # -- kills and stops ----------------------------------------------------------------

    def kill_store_host(self) -> None:
        """The process hosting the rendezvous store dies."""
        target = self._target
        store = target.store
        if store is None:
            raise ConfigError("store_host", target.cluster.config.store_host,
                              "has no separate store process to lose in this job")
        host = store.node
        where = {"target_node": host} if host is not None else {}
        if host is not None:
            target.ledger.harm(host, "kill_store_host")
        record_fault(target, "kill_store_host", store=store.describe(), **where)
        store.kill()
        if host is not None:
            target.ledger.await_exit(host)

    def kill_worker(self, node: int, local_rank: int, sig: int = signal.SIGKILL,
                    exit_code: int | None = None) -> None:
        """The worker dies of ``sig``; its agent must notice and restart the group. With
        ``exit_code`` it exits with that code at its next ``report_step`` instead (an
        order it obeys, recording the fault itself when it does: ``order_exit``)."""
        if exit_code is not None:
            self.order_exit(node, local_rank, exit_code)
            return
        pid = self._worker_pid(node, local_rank)
        record_fault(self._target, "kill_worker", target_node=node, local_rank=local_rank, sig=int(sig))
        self._target.node(node).signal_worker(pid, sig)

    def hang_worker(self, node: int, local_rank: int) -> None:
        """SIGSTOP: the worker is stuck, not dead."""
        pid = self._worker_pid(node, local_rank)
        record_fault(self._target, "hang_worker", target_node=node, local_rank=local_rank, worker_pid=pid)
        self._target.node(node).signal_worker(pid, signal.SIGSTOP)

    def kill_agent(self, node: int) -> None:
        """The agent dies (SIGKILL); its workers must follow on their own. Returns once the
        harness reaped the agent (its terminal entry is on the timeline); ``FaultError`` if
        it was not reaped within ``job.ledger.reap_timeout``."""
        agent = self._live_node(node)
        self._target.ledger.harm(node, "kill_agent")
        record_fault(self._target, "kill_agent", target_node=node)
        agent.signal_agent(signal.SIGKILL)  # on a host: the agent's group there
        self._target.ledger.await_exit(node)

    def kill_node(self, node: int, lose_unsynced: bool = False, torn: bool = False) -> None:
        """Agent and workers SIGKILLed at once (a machine lost). Returns once the harness
        reaped the agent (its terminal entry is on the timeline); ``FaultError`` if it was
        not reaped within ``job.ledger.reap_timeout``. ``lose_unsynced``: what the node wrote
        and never fsynced is gone too (``torn``: but a prefix of its last write; the storage
        semantics: ``harness.sim.storage.record``)."""
        crash = lose_unsynced or torn
        if crash:
            self._target.storage.require("lose_unsynced")
        self._signal_node(node, "kill_node", signal.SIGKILL,
                          **({"lose_unsynced": True, "torn": torn} if crash else {}))
        self._target.ledger.await_exit(node)
        if crash:
            self._target.storage.crash(node, torn)

    def remove_node(self, node: int) -> None:
        """Graceful leave: SIGTERM to the agent (its terminal entry follows its exit)."""
        agent = self._live_node(node)
        self._target.ledger.harm(node, "remove_node")
        record_fault(self._target, "remove_node", target_node=node)
        agent.signal_agent(signal.SIGTERM)

    def freeze_node(self, node: int) -> None:
        """SIGSTOP the whole node: alive to TCP, silent to heartbeats. Its terminal entry
        is written once the agent is stopped (it never writes again)."""
        self._signal_node(node, "freeze_node", signal.SIGSTOP)
        self._target.ledger.await_frozen(node)

    def add_node(self) -> int:
        """A new node joins (scale up); recorded as a fault, returns its index."""
        record_fault(self._target, "add_node", target_node=len(self._target.nodes))
        return self._target.start_node()

    def signal_node_processes(self, node: int, sig: int) -> None:
        """``sig`` to node ``node``'s agent and each of its workers, each with its process
        group (no fault recorded: the caller records what it stands for)."""
        self._target.node(node).signal_node(sig, self._target.worker_pids(node).values())

    # -- resolving targets ----------------------------------------------------------------

    def _signal_node(self, node: int, fault: str, sig: int, **fields: Any) -> None:
        """``sig`` to the agent and every worker of ``node`` at once (a recorded fault)."""
        self._live_node(node)
        self._target.ledger.harm(node, fault)
        record_fault(self._target, fault, target_node=node, **fields)
        self.signal_node_processes(node, sig)

    def _live_node(self, node: int) -> NodeProcess:
        agent = self._target.node(node)
        if not agent.alive():
            raise TargetNotReady("node", node, f"has no running agent (it exited with {agent.popen.poll()})")
        return agent

    def _check_local_rank(self, node: int, local_rank: int) -> None:
        self._target.node(node)
        n = self._target.cluster.config.nproc_per_node
        if not isinstance(local_rank, int) or not 0 <= local_rank < n:
            raise ConfigError("local_rank", local_rank, f"is not a worker of node {node} "
                              f"(local ranks: 0..{n - 1}, nproc_per_node={n})")

    def _worker_pid(self, node: int, local_rank: int) -> int:
        """The pid of a live worker (resolved before the fault is recorded, so a fault that
        cannot hit its target is never recorded as fired)."""
        self._check_local_rank(node, local_rank)
        pids = self._target.worker_pids(node)
        if local_rank not in pids:
            raise TargetNotReady("local_rank", local_rank, f"has no running worker on node {node} "
                                 f"now (running: {sorted(pids)})")
        return pids[local_rank]

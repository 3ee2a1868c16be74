"""A job's process faults: the ``Job`` methods that signal, kill, freeze, remove and add
the processes of a simulated job (workers, agents, whole nodes, the store's host).

Each resolves its target first (an unknown node or rank raises ``ConfigError``, a target
not running yet ``TargetNotReady``), so a fault that cannot hit anything is never recorded
as fired; then records the ``fault`` event, then acts. What the harness does to a node is
remembered (``_harm``) so that the node's exit, reaped by the harness, gets a terminal
entry on its own timeline naming the cause.
"""

from __future__ import annotations

import os
import signal
from typing import TYPE_CHECKING, Any

from harness.errors import ConfigError
from harness.procs import signal_process_group
from harness.sim.faults import write_exit_order
from harness.sim.scheduler import TargetNotReady

if TYPE_CHECKING:
    from harness.sim.bus import EventBus

__all__ = ["ProcessFaults"]


class ProcessFaults:
    """Mixed into ``Job``: needs the job's nodes, events, store and the helpers below."""

    cluster: Any
    nodes: dict[int, Any]
    bus: EventBus
    orders_dir: str
    frozen_nodes: set[int]
    storage: Any
    _store: Any
    _harness_events: Any
    _exit_lock: Any
    _exits: dict[int, int]
    _terminal: set[int]

    # provided by Job
    def _node(self, node: int) -> Any:
        raise NotImplementedError

    def _live_node(self, node: int) -> Any:
        raise NotImplementedError

    def _check_local_rank(self, node: int, local_rank: int) -> None:
        raise NotImplementedError

    def _latest_starts(self, node: int) -> dict[int, dict[str, Any]]:
        raise NotImplementedError

    def _worker_pid(self, node: int, local_rank: int) -> int:
        raise NotImplementedError

    def worker_pids(self, node: int) -> dict[int, int]:
        raise NotImplementedError

    def _fault(self, kind: str, **fields: Any) -> None:
        raise NotImplementedError

    def _harm(self, node: int, cause: str) -> None:
        raise NotImplementedError

    def _await_exit(self, node: int) -> None:
        raise NotImplementedError

    def _await_stop(self, node: int) -> None:
        raise NotImplementedError

    def _record_terminal(self, node: int, cause: str, **how: Any) -> None:
        raise NotImplementedError

    def _start_node(self) -> int:
        raise NotImplementedError

    def _order_left(self, path: str, what: str, why: str) -> None:
        raise NotImplementedError

    def order_exit(self, node: int, local_rank: int, exit_code: int) -> None:
        """The worker exits with ``exit_code`` at its next ``report_step``."""
        self._check_local_rank(node, local_rank)
        starts = self._latest_starts(node)
        if local_rank not in starts:
            raise TargetNotReady("local_rank", local_rank, f"has not started on node {node} yet")
        rank = starts[local_rank]["rank"]
        self._harness_events.emit("fault_armed", fault="worker_exit_order", target_node=node,
                                  local_rank=local_rank, rank=rank, exit_code=exit_code)
        path = write_exit_order(self.orders_dir, rank, exit_code)
        self._order_left(path, f"exit {exit_code} ordered for node {node} local rank {local_rank}",
                         f"rank {rank} reported no step after the order — does the script call "
                         "harness.report_step?")

    def kill_store_host(self) -> None:
        """The process hosting the rendezvous store dies."""
        if self._store is None:
            raise ConfigError("store_host", self.cluster.store_host,
                              "has no separate store process to lose in this job")
        host = self._store.node
        where = {"target_node": host} if host is not None else {}
        if host is not None:
            self._harm(host, "store_host_loss")
        self._fault("store_host_loss", store=self._store.describe(), **where)
        self._store.kill()
        if host is not None:
            self._await_exit(host)

    def kill_worker(self, node: int, local_rank: int, sig: int = signal.SIGKILL) -> None:
        """The worker dies of ``sig``; its agent must notice and restart the group."""
        pid = self._worker_pid(node, local_rank)
        self._fault("worker_kill", target_node=node, local_rank=local_rank, sig=int(sig))
        _kill(pid, sig)

    def hang_worker(self, node: int, local_rank: int) -> None:
        """SIGSTOP: the worker is stuck, not dead."""
        pid = self._worker_pid(node, local_rank)
        self._fault("worker_hang", target_node=node, local_rank=local_rank)
        _kill(pid, signal.SIGSTOP)

    def kill_agent(self, node: int) -> None:
        """The agent dies (SIGKILL); its workers must follow on their own. Returns once the
        harness reaped the agent (its terminal entry is on the timeline); ``FaultError`` if
        it was not reaped within ``Job.reap_timeout``."""
        target = self._live_node(node)
        self._harm(node, "agent_kill")
        self._fault("agent_kill", target_node=node)
        _kill(target.pid, signal.SIGKILL)
        self._await_exit(node)

    def _signal_node(self, node: int, fault: str, sig: int, **fields: Any) -> None:
        """``sig`` to the agent and every worker of ``node`` at once (a recorded fault)."""
        self._live_node(node)
        self._harm(node, fault)
        self._fault(fault, target_node=node, **fields)
        self._signal_node_processes(node, sig)

    def _signal_node_processes(self, node: int, sig: int) -> None:
        target = self._node(node)
        pids = self.worker_pids(node)
        signal_process_group(target.pid, sig)
        for pid in pids.values():
            signal_process_group(pid, sig)

    def kill_node(self, node: int, lose_unsynced: bool = False, torn: bool = False) -> None:
        """Agent and workers SIGKILLed at once (a machine lost). Returns once the harness
        reaped the agent (its terminal entry is on the timeline); ``FaultError`` if it was
        not reaped within ``Job.reap_timeout``. ``lose_unsynced``: what the node wrote and
        never fsynced is gone too (``torn``: but a prefix of its last write; the storage
        semantics: ``harness.sim.storage.record``)."""
        crash = lose_unsynced or torn
        if crash:
            self.storage.require("lose_unsynced")
        self._signal_node(node, "node_kill", signal.SIGKILL,
                          **({"lose_unsynced": True, "torn": torn} if crash else {}))
        self._await_exit(node)
        if crash:
            self.storage.crash(node, torn)

    def remove_node(self, node: int) -> None:
        """Graceful leave: SIGTERM to the agent (its terminal entry follows its exit)."""
        target = self._live_node(node)
        self._harm(node, "node_leave")
        self._fault("node_leave", target_node=node)
        _kill(target.pid, signal.SIGTERM)

    def freeze_node(self, node: int) -> None:
        """SIGSTOP the whole node: alive to TCP, silent to heartbeats. Its terminal entry
        is written once the agent is stopped (it never writes again)."""
        self._signal_node(node, "node_freeze", signal.SIGSTOP)
        self.frozen_nodes.add(node)
        self._await_stop(node)
        with self._exit_lock:
            if node not in self._exits and node not in self._terminal:
                self._record_terminal(node, "node_freeze", exitcode=None, signal=int(signal.SIGSTOP))
        self.bus.notify(lifecycle=True)  # Job.wait no longer waits for it

    def add_node(self) -> int:
        """A new node joins (scale up); recorded as a fault, returns its index."""
        self._fault("node_join", target_node=len(self.nodes))
        return self._start_node()

    def join_node(self) -> int:
        """Deprecated spelling of ``add_node``."""
        from harness.sim.schema import deprecated

        deprecated("Job.join_node", "Job.add_node", "method")
        return self.add_node()


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass

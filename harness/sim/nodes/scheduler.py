"""A job's scheduler faults: what the scheduler that owns the nodes does to them (Slurm's).

Where a job's nodes are job steps of a Slurm allocation (``Cluster(slurm=...)``), the
scheduler can fail a node in ways no process signal imitates, and an elastic job must
survive each:

- ``down_node``: the node marked DOWN (``scontrol update State=DOWN``), as Slurm does when it
  loses a node: every step there ends at once (the allocation is ``--no-kill``: the job's
  other steps go on);
- ``drain_node``: the node drained (``State=DRAIN``), as an operator takes a node out for
  maintenance: its steps go on, and no node the job adds lands there until it is healed
  (``State=RESUME``);
- ``kill_slurmd``: the node's ``slurmd`` killed: the steps there run on, unseen, until Slurm
  misses the daemon for its ``SlurmdTimeout`` and marks the node DOWN; the step's ``srun``
  then ends ("Node failure") and the node's supervisor with it. Healed by starting the
  daemon again (the node comes back once it registers).

Each needs an operator's rights on the cluster (``slurm_admin`` in the Slurm file's
capabilities; ``kill_slurmd`` also the Slurm file's ``slurmd_kill``/``slurmd_start``
commands): a place whose nodes no scheduler owns (this machine, SSH hosts) refuses them in
one line (``NoScheduler``). A job holds one ``SchedulerFaults`` as ``job.slurm``; its
lasting faults are healed by ``job.heal()`` and at the job's end, and the allocation puts
back every node it changed when it is released, healed or not.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from harness.errors import ConfigError
from harness.sim.faults.target import Ended, record_fault

if TYPE_CHECKING:
    from harness.sim.faults.target import FaultTarget

__all__ = ["NoScheduler", "NodeScheduler", "SchedulerFaults"]


class NodeScheduler(Protocol):
    """The scheduler that owns a job's nodes, as its faults reach it (the job's place's)."""

    def node_name(self, node: int) -> str:
        """What the scheduler calls node ``node``'s machine; ``ConfigError`` (one line)
        where no scheduler owns it."""
        ...

    def set_state(self, node: int, state: str, reason: str) -> None:
        """Node ``node``'s machine set to ``state`` (``DOWN``, ``DRAIN``, ``RESUME``)."""
        ...

    def kill_daemon(self, node: int) -> None:
        """Node ``node``'s machine's scheduler daemon killed (SIGKILL)."""
        ...

    def start_daemon(self, node: int) -> None:
        """Node ``node``'s machine's scheduler daemon started again."""
        ...


class NoScheduler:
    """The nodes of a place no scheduler owns: every scheduler fault is refused, saying ``why``."""

    def __init__(self, why: str):
        self.why = why

    def node_name(self, node: int) -> str:
        raise ConfigError("node", node, self.why)

    def set_state(self, node: int, state: str, reason: str) -> None:
        raise ConfigError("node", node, self.why)

    def kill_daemon(self, node: int) -> None:
        raise ConfigError("node", node, self.why)

    def start_daemon(self, node: int) -> None:
        raise ConfigError("node", node, self.why)


class SchedulerFaults:
    """The scheduler's own faults on a job's nodes (module doc)."""

    def __init__(self, target: FaultTarget, scheduler: NodeScheduler):
        self._target = target
        self._scheduler = scheduler
        self._drained: set[int] = set()  # nodes whose machine is drained, until healed
        self._daemon_lost: set[int] = set()  # nodes whose machine's slurmd is killed, until healed

    def down_node(self, node: int) -> None:
        """The node's machine marked DOWN: the scheduler ends every step there, the node's
        agent and workers among them. Returns once the harness reaped the agent."""
        name = self._live(node)
        self._target.ledger.harm(node, "down_node")
        record_fault(self._target, "down_node", target_node=node, slurm_node=name)
        self._scheduler.set_state(node, "DOWN", f"pytest-elastic down_node of node {node}")
        self._target.ledger.await_exit(node)

    def drain_node(self, node: int) -> None:
        """The node's machine drained: its steps go on, no new node lands there (healed:
        back in service)."""
        name = self._live(node)
        record_fault(self._target, "drain_node", target_node=node, slurm_node=name)
        self._scheduler.set_state(node, "DRAIN", f"pytest-elastic drain_node of node {node}")
        self._drained.add(node)

    def kill_slurmd(self, node: int) -> None:
        """The node's machine's slurmd killed: the node is lost once the scheduler sees it
        (its ``SlurmdTimeout`` and more); returns at once (healed: the daemon started)."""
        name = self._live(node)
        self._target.ledger.harm(node, "kill_slurmd")
        record_fault(self._target, "kill_slurmd", target_node=node, slurm_node=name)
        self._scheduler.kill_daemon(node)
        self._daemon_lost.add(node)

    def end_lasting(self, node: int | None) -> Ended:
        """Drained machines back in service, killed daemons started again (node ``node``'s;
        every node's with None)."""
        names: list[str] = []
        for index in sorted(self._drained):
            if node is None or index == node:
                self._scheduler.set_state(index, "RESUME", "pytest-elastic heal")
                self._drained.discard(index)
                names.append("drain_node")
        for index in sorted(self._daemon_lost):
            if node is None or index == node:
                self._scheduler.start_daemon(index)
                self._daemon_lost.discard(index)
                names.append("kill_slurmd")
        return Ended(sorted(set(names)))

    def open_faults(self) -> dict[Any, list[str]]:
        """node -> its scheduler faults still in place."""
        open_: dict[Any, list[str]] = {}
        for index in sorted(self._drained):
            open_.setdefault(index, []).append("drain_node")
        for index in sorted(self._daemon_lost):
            open_.setdefault(index, []).append("kill_slurmd")
        return open_

    def _live(self, node: int) -> str:
        """Node ``node``'s machine's name; the scheduler's refusal first, then ``TargetNotReady``
        where its agent is not running."""
        from harness.sim.errors import TargetNotReady

        agent = self._target.node(node)  # an unknown node raises, naming the valid ones
        name = self._scheduler.node_name(node)
        if not agent.alive():
            raise TargetNotReady("node", node, f"has no running agent (it exited with {agent.popen.poll()})")
        return name

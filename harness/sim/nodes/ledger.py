"""How each of a job's node agents ended, as the harness saw it (``job.ledger``).

The harness records what it does to nodes: ``node_exit`` (exit code, or the signal, from its
own ``waitpid``) when an agent ends, and for a node it killed, froze or removed a terminal
``state`` entry on the node's own timeline (``"source": "harness"``, with the ``cause``), so
``timeline.states(i)`` of a killed node ends in ``FAILED``. A fault says what it is about to
do to a node (``harm``) before it acts, then waits for the end it caused (``await_exit``,
``await_frozen``); the exit itself is recorded on the event bus's reader thread, once per
node, whoever reaped it.
"""

from __future__ import annotations

import functools
import signal
import subprocess
import threading
import weakref
from typing import TYPE_CHECKING, Any

from harness.sim.errors import FaultError
from harness.sim.truth.timeline import HARNESS
from harness.states import WorkerState

if TYPE_CHECKING:
    from harness.events import EventWriter
    from harness.sim.bus import EventBus
    from harness.sim.nodes.process import NodeProcess
    from harness.sim.truth.timeline import Timeline

__all__ = ["NodeLedger"]

#: agent states after which the harness adds no terminal entry of its own
_FINAL = (WorkerState.SUCCEEDED, WorkerState.FAILED, WorkerState.UNKNOWN)


class NodeLedger:
    """What the harness did to each node of one job and how each node's agent ended."""

    #: seconds a kill (``kill_node``, ``kill_agent``...) waits for the killed agent to be
    #: reaped before it raises ``FaultError``; also bounds the wait for a SIGSTOP to land
    reap_timeout: float = 10.0

    def __init__(self, nodes: dict[int, NodeProcess], timeline: Timeline, events: EventWriter, bus: EventBus):
        self._nodes = nodes  # the job's own dict: nodes started later are seen here too
        self._timeline = timeline
        self._events = events
        self._bus = bus
        self._lock = threading.Lock()
        self._exits: dict[int, int] = {}  # node -> its agent's return code, once recorded
        self._harmed: dict[int, str] = {}  # node -> what the harness did to it (a fault kind)
        self._terminal: set[int] = set()  # nodes whose terminal entry the harness wrote
        self.frozen: set[int] = set()  # nodes the harness SIGSTOPped (they never finish)

    def watch(self, node: int) -> None:
        """Record node ``node``'s exit the moment its agent ends (the bus sees its pidfd)."""
        self._bus.watch(self._nodes[node].pid, functools.partial(_record_exit_of, weakref.ref(self), node))

    def harm(self, node: int, cause: str) -> None:
        """The harness is about to end or stop ``node`` (``cause``: the fault kind): its
        exit, once reaped, gets a terminal entry naming the cause. Called before acting."""
        with self._lock:
            self._harmed.setdefault(node, cause)

    def record_exit(self, node: int) -> None:
        """Record the agent's exit (called on the bus's reader thread when its pidfd turns
        readable, and by ``Job.terminate``): a ``node_exit`` event, and the terminal entry
        of a node the harness harmed. Once per node."""
        agent = self._nodes[node]
        with self._lock:
            if node in self._exits:
                return
            code = agent.popen.poll()
            if code is None:
                try:  # exited (its pidfd said so) but reaped by a wait in another thread just now
                    code = agent.popen.wait(1.0)
                except subprocess.TimeoutExpired:
                    code = None
            if code is not None:
                self._note_exit(node, code)
                return
        # dead but not reaped yet: a forked node's parent (the node fork server) may be
        # stopped or slow; record the exit when it reaps, never drop it
        later = getattr(agent.popen, "when_exited", None)
        if later is not None:
            later(functools.partial(_record_exit_of, weakref.ref(self), node))

    def await_exit(self, node: int) -> None:
        """Until the agent of ``node`` (just SIGKILLed) was reaped and its exit recorded;
        ``FaultError`` if that does not happen within ``reap_timeout`` (the kill methods
        promise a reaped agent and its terminal entry: never return as if they had one)."""
        if not self._bus.wait_until(lambda: node in self._exits, self.reap_timeout, lifecycle=True):
            raise FaultError(f"node {node}'s agent (pid {self._nodes[node].pid}) was SIGKILLed but never "
                             f"reaped within {self.reap_timeout:g}s, so its exit and terminal entry are "
                             "not on the timeline (stuck in the kernel, or its parent, the node fork "
                             "server, is not reaping)")

    def await_frozen(self, node: int) -> None:
        """``node`` was just SIGSTOPped: until its agent is stopped, then its terminal entry
        (unless its exit already wrote one); ``Job.wait`` no longer waits for it."""
        self.frozen.add(node)
        self._await_stop(node)
        with self._lock:
            if node not in self._exits and node not in self._terminal:
                self._record_terminal(node, "freeze_node", exitcode=None, signal=int(signal.SIGSTOP))
        self._bus.notify(lifecycle=True)  # Job.wait no longer waits for it

    def _note_exit(self, node: int, code: int) -> None:
        """The ``node_exit`` event and terminal entry of a reaped agent (under ``_lock``)."""
        cause = self._harmed.get(node)
        how = {"exitcode": code, "signal": None} if code >= 0 else {"exitcode": None, "signal": -code}
        self._events.emit("node_exit", target_node=node, cause=cause, **how)
        if cause is not None and node not in self._terminal:
            self._record_terminal(node, cause, **how)
        self._exits[node] = code

    def _record_terminal(self, node: int, cause: str, **how: Any) -> None:
        """A terminal ``state`` entry on ``node``'s own timeline, written by the harness, unless
        the agent's own last state already was final."""
        states = self._timeline.states(node)
        if states and states[-1] in _FINAL:
            return
        code = how.get("exitcode")
        state = WorkerState.SUCCEEDED if cause == "remove_node" and code == 0 else WorkerState.FAILED
        self._terminal.add(node)
        self._events.emit("state", node=node, state=state.value, source=HARNESS, cause=cause, **how)

    def _await_stop(self, node: int) -> None:
        """Until the agent of ``node`` (just SIGSTOPped) is stopped (or gone), so nothing it
        writes can follow the terminal entry; at most ``reap_timeout`` (the node's own
        wait: here a poll of one process, on a host its supervisor's answer)."""
        self._nodes[node].await_stopped(self.reap_timeout)


def _record_exit_of(ledger_ref: weakref.ref[NodeLedger], node: int) -> None:
    """The bus's exit callback holds the ledger weakly: an abandoned Cluster (and its jobs)
    must stay collectable, so that the garbage collector can close it."""
    ledger = ledger_ref()
    if ledger is not None:
        ledger.record_exit(node)

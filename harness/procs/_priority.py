"""A server that works for many processes runs ahead of them: its CPU priority.

The simulation runs one zygote for every node of a job. Each fork it makes for a node is
work a real cluster's nodes do on their own cores, all at once; here one process does it,
one fork after another, on the path of every node's start. Scheduled as one process among
hundreds, it waited for a CPU as long as it ran: at 128 nodes its 128 forks took 1.6-1.8 s
of wall time for 0.75 s of CPU, 0.7-0.95 s of it runnable and waiting
(``/proc/self/schedstat``). Run ahead, the same forks took 0.7-0.8 s, 0.1 s of it waiting.

Two values decide a process's share of the CPU: its nice value among the processes of its
scheduling group, and, where the kernel groups each session's processes
(``CONFIG_SCHED_AUTOGROUP``, on in most distributions' kernels, for processes in the root
cgroup only), its session's group's nice value (``/proc/self/autogroup``). A server started
in a session of its own is its group's only process, so there only the group's value
counts; in a cgroup (a container), only its own does. ``run_ahead`` raises both. Raising a
priority needs root or ``CAP_SYS_NICE``: without it nothing changes, and the server runs as
any other process.

A child must not inherit the raise. The server forks at its own nice value
(``Ahead.before_fork``, ``after_fork``), and a child leaves the raised session's group by
leaving the root cgroup: a simulated node's workers move into their node's cgroup before
any of their code runs. A server whose child would stay in the group lowers the group
again (``Ahead.lower_group``).
Nor may the server's own work that no node waits for: the zygote steps back
(``Ahead.step_back``) while it imports between jobs what its workers imported, a second or
more of CPU that would otherwise run ahead of the next job's starting nodes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["AHEAD_STEPS", "Ahead", "run_ahead"]

#: how many nice steps a server shared by a simulation's nodes runs ahead of them: a weight
#: of 9548 against a node's 1024 (the kernel's table), so it waits for a CPU a tenth as long
AHEAD_STEPS = 10
_AUTOGROUP = "/proc/self/autogroup"


@dataclass
class Ahead:
    """What ``run_ahead`` raised, and what to put back."""

    #: how many nice steps it was raised by
    steps: int = 0
    #: the process's nice value before the raise (None: not raised)
    nice: int | None = None
    #: the session group's nice value before the raise (None: not raised)
    group_nice: int | None = None
    #: stepped back (``step_back``) and not up again yet
    back: bool = False

    def _raised(self, value: int) -> int:
        return max(-20, value - self.steps)

    def before_fork(self) -> None:
        """The server's own nice value back to what it was, so that the child it forks next
        is born with it: a child that set its own back after its birth could undo a value its
        agent set meanwhile (a worker the agent had put behind it, back at the agent's
        priority). ``after_fork`` raises it again."""
        if self.nice is not None:
            _set_nice(self.nice)

    def after_fork(self) -> None:
        """In the server, once it forked: ahead again."""
        if self.nice is not None:
            _set_nice(self._raised(self.nice))

    def lower_group(self) -> None:
        """The session's group back to its value, for good: a child that stays in it (one
        not moved into a cgroup of its own) would run ahead too."""
        if self.group_nice is not None and _write_group_nice(self.group_nice):
            self.group_nice = None

    def step_back(self) -> None:
        """Back to the values it had, until ``step_up``: for work of the server's own that
        no node waits for (the zygote's imports between jobs), which must not run ahead of
        the nodes. A thread started now starts at the value it had too."""
        self.before_fork()
        if self.group_nice is not None:
            _write_group_nice(self.group_nice)
        self.back = True

    def step_up(self) -> None:
        """Ahead again, after ``step_back`` (nothing to do otherwise: the zygote calls it
        before every fork)."""
        if not self.back:
            return
        self.after_fork()
        if self.group_nice is not None:
            _write_group_nice(self._raised(self.group_nice))
        self.back = False


def run_ahead(steps: int = AHEAD_STEPS) -> Ahead:
    """Raise this process (its calling thread) and its session's scheduling group by
    ``steps`` nice steps, each where the machine lets it; what was raised."""
    ahead = Ahead(steps)
    before = os.getpriority(os.PRIO_PROCESS, 0)
    if _set_nice(ahead._raised(before)):
        ahead.nice = before
    group = _read_group_nice()
    if group is not None and _write_group_nice(ahead._raised(group)):
        ahead.group_nice = group
    return ahead


def _set_nice(value: int) -> bool:
    try:
        os.setpriority(os.PRIO_PROCESS, 0, value)
        return True
    except OSError:  # no CAP_SYS_NICE (to lower it)
        return False


def _read_group_nice() -> int | None:
    """The session group's nice value (``/autogroup-N nice V``); None without autogroups."""
    try:
        with open(_AUTOGROUP) as fp:
            return int(fp.read().split()[-1])
    except (OSError, ValueError, IndexError):
        return None


def _write_group_nice(value: int) -> bool:
    try:
        with open(_AUTOGROUP, "w") as fp:
            fp.write(str(value))
        return True
    except OSError:  # no autogroups, or no CAP_SYS_NICE
        return False

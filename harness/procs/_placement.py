"""Where an agent's workers run beside it: a lower CPU priority (``HARNESS_WORKER_NICE``) and
a cgroup of their own (``HARNESS_WORKER_CGROUP``), both off unless the environment asks.

Why: an agent's keep-alive is a few milliseconds of CPU every ``keep_alive_interval``, and
its peers declare it dead when that keep-alive stays silent for ``heartbeat_timeout``. When
the agent and its workers share the CPU as equals, a node whose workers are busy (importing
torch, a CPU quota: ``slow_node``) can starve its own agent for seconds, and a live node is
taken for a dead one. Nicing the workers lets the agent run first whenever it has work,
without slowing the workers when it has none (it sleeps almost all the time).

What a real host does: the same, or more — the agent in a systemd slice with a higher
``CPUWeight`` than the training processes, or the workers started under ``nice``. torchrun
leaves its workers at its own priority and in its own cgroup; so does ``elastic-run`` unless
the variables are set (the simulation's nodes set both: ``harness.sim``). A cgroup of the
workers' own is what lets a CPU quota slow the training without silencing the agent.

Every thread the worker has when it is niced is niced (``setpriority`` acts on one thread);
threads it creates later inherit the value from the thread that creates them.
"""

from __future__ import annotations

import os

__all__ = ["WORKER_CGROUP_ENV", "WORKER_NICE_ENV", "place_worker", "worker_nice", "lower_priority"]

#: the nice increment the agent gives its workers (0 or unset: none, torchrun's behaviour)
WORKER_NICE_ENV = "HARNESS_WORKER_NICE"
#: ``os.pathsep``-joined ``cgroup.procs`` files the agent moves each worker into
WORKER_CGROUP_ENV = "HARNESS_WORKER_CGROUP"


def worker_nice(environ: dict[str, str] | os._Environ[str] | None = None) -> int:
    """The increment ``HARNESS_WORKER_NICE`` asks for, within 0..19 (garbage: 0)."""
    raw = (os.environ if environ is None else environ).get(WORKER_NICE_ENV, "").strip()
    try:
        value = int(raw) if raw else 0
    except ValueError:
        return 0
    return max(0, min(19, value))


def lower_priority(pid: int, increment: int, base: int | None = None) -> None:
    """Set the nice value of every thread of ``pid`` to ``base`` + ``increment``: relative to
    the agent's own (``base``; None: the caller's, the agent calling), so a user who niced
    the agent keeps their order, and the same value whoever sets it, however often. A
    process that is already gone is left alone."""
    if increment <= 0:
        return
    target = min(19, (os.getpriority(os.PRIO_PROCESS, 0) if base is None else base) + increment)
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        tids = [pid]
    for tid in tids:
        try:
            os.setpriority(os.PRIO_PROCESS, tid, target)
        except OSError:  # exited meanwhile, or not ours to change
            pass


def worker_cgroup_files(environ: dict[str, str] | os._Environ[str] | None = None) -> list[str]:
    """The ``cgroup.procs`` files ``HARNESS_WORKER_CGROUP`` names (none: the agent's own)."""
    raw = (os.environ if environ is None else environ).get(WORKER_CGROUP_ENV, "")
    return [path for path in raw.split(os.pathsep) if path]


def place_worker(pid: int, nice: int, cgroup_files: list[str], base: int | None = None) -> list[str]:
    """Put a just-started worker where the agent's environment says: its cgroups first
    (before it starts threads of its own), then its priority (``base``: the agent's nice
    value, where the caller is not the agent). The problems, one line each (a cgroup it
    could not join: the worker runs on in the agent's)."""
    problems = []
    for path in cgroup_files:
        try:
            with open(path, "w") as fp:
                fp.write(str(pid))
        except OSError as e:
            problems.append(f"cannot move worker {pid} into {os.path.dirname(path)}: {e.strerror}")
    lower_priority(pid, nice, base)
    return problems

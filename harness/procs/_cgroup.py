"""Which cgroups a process is in, and whether the kernel's OOM killer took a worker.

A worker the OOM killer ends dies of a plain SIGKILL: its exit status alone cannot tell it
from ``kill -9``, which is why torchrun reports only "Signal 9 (SIGKILL) received by PID".
The kernel does say it elsewhere: every OOM kill increments an ``oom_kill`` counter of the
victim's memory cgroup (``memory.oom_control`` in cgroup v1, ``memory.events`` in v2), and
the kernel raises that event *before* it sends the SIGKILL (``__oom_kill_process``: "task
reaper must see this"), so a reaper that reads the counter after the death always sees it.
The system-wide ``oom_kill`` of ``/proc/vmstat`` is the fallback where no memory cgroup is
mounted. ``OomLedger`` snapshots the counter of each worker's memory cgroup before the
workers start and, for each worker that dies of SIGKILL, claims one new OOM kill of its
cgroup if there is one unclaimed: two workers of one cgroup that both die of SIGKILL after a
single OOM kill are never both called OOM-killed. (It cannot tell *which* of several
SIGKILLed workers of one cgroup the kernel chose; the first reaped gets it. A node's workers
that die of SIGKILL together are rare outside an OOM.)

Also: ``cgroup_dirs`` (a process's cgroup directories, per hierarchy), and ``join_cgroups``
(the zygote puts a worker it forks into its agent's cgroups, where a child of the agent
would have been).
"""

from __future__ import annotations

import os
import select
import signal
import threading

__all__ = ["cgroup_dirs", "cgroup_mounts", "join_cgroups", "memory_cgroup", "memory_limit", "OomLedger", "OOM_REASON",
           "parse_cgroup", "parse_mountinfo"]

#: the ``reason`` a worker the OOM killer took gets (``worker_exit`` events)
OOM_REASON = "oom"
_UNIFIED = ""  # the controller key of the cgroup v2 (unified) hierarchy
#: super options of a v1 cgroup mount that name no controller
_OPTIONS = frozenset({"rw", "ro", "noprefix", "xattr", "clone_children", "cpuset_v2_mode", "none"})


class _MountTable:
    """This process's cgroup mounts, parsed again only when its mount table changed.

    Why: the zygote reads a worker's cgroups and its agent's on every fork, and the mount
    table grows with a simulated cluster (each node's network namespace is a bind mount under
    ``/run/netns``): parsed on every call, the forks of a round would cost O(N^2), 1.4 ms a
    call at 64 nodes. The kernel says when the table changed: an open ``mountinfo`` polls
    POLLPRI after any mount or unmount (proc(5)), so one ``poll`` of zero timeout stands for
    the parse. A forked child opens its own (``/proc/self`` was the parent's)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pid = -1
        self._fd = -1  # a raw descriptor, not a file object: it lives as long as the process
        self._poll: select.poll | None = None
        self._mounts: dict[str, tuple[str, str]] | None = None

    def get(self) -> dict[str, tuple[str, str]]:
        with self._lock:
            if self._pid != os.getpid():
                self._reopen()
            if self._mounts is None or self._changed():
                self._mounts = self._read()
            return dict(self._mounts)

    def close(self) -> None:
        with self._lock:
            self._close_fd()
            self._poll, self._mounts, self._pid = None, None, -1

    def _close_fd(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # in a forked child, its copy: the parent's stays open
        self._fd = -1

    def _reopen(self) -> None:
        self._close_fd()
        self._pid, self._mounts, self._poll = os.getpid(), None, None
        try:
            self._fd = os.open("/proc/self/mountinfo", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return
        self._poll = select.poll()
        self._poll.register(self._fd, select.POLLPRI)

    def _changed(self) -> bool:
        if self._poll is None:
            return True  # no descriptor to watch: read the table on every call
        try:
            return bool(self._poll.poll(0))
        except OSError:
            return True

    def _read(self) -> dict[str, tuple[str, str]]:
        try:
            if self._fd < 0:
                with open("/proc/self/mountinfo") as once:
                    return parse_mountinfo(once.read())
            os.lseek(self._fd, 0, os.SEEK_SET)
            chunks = []
            while chunk := os.read(self._fd, 65536):
                chunks.append(chunk)
            return parse_mountinfo(b"".join(chunks).decode(errors="surrogateescape"))
        except OSError:
            return {}


_mount_table = _MountTable()


def cgroup_mounts() -> dict[str, tuple[str, str]]:
    """controller -> (mount point, mount root) of every cgroup hierarchy mounted here
    (``""``: the cgroup v2 unified hierarchy)."""
    return _mount_table.get()


def parse_mountinfo(text: str) -> dict[str, tuple[str, str]]:
    """controller -> (mount point, mount root) of each cgroup hierarchy in a mountinfo text
    (v2's unified one under ``""``; v1 named ones as ``name=...``). A hierarchy mounted
    twice: its first mount."""
    found: dict[str, tuple[str, str]] = {}
    for line in text.splitlines():
        head, _, tail = line.partition(" - ")
        fields, rest = head.split(), tail.split()
        if len(fields) < 5 or len(rest) < 3:
            continue
        root, point = _unescape(fields[3]), _unescape(fields[4])
        if rest[0] == "cgroup2":
            found.setdefault(_UNIFIED, (point, root))
        elif rest[0] == "cgroup":
            for option in rest[2].split(","):  # the super options: rw, the controllers...
                if option.startswith("name=") or ("=" not in option and option not in _OPTIONS):
                    found.setdefault(option, (point, root))
    return found


def _unescape(path: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal."""
    return path.encode().decode("unicode_escape") if "\\" in path else path


def cgroup_dirs(pid: int | str = "self") -> dict[str, str]:
    """controller -> the directory of ``pid``'s cgroup in that hierarchy, for each hierarchy
    mounted here (``""``: the cgroup v2 unified hierarchy). Empty if ``pid`` is gone."""
    try:
        with open(f"/proc/{pid}/cgroup") as fp:
            text = fp.read()
    except OSError:
        return {}
    return parse_cgroup(text, cgroup_mounts())


def parse_cgroup(text: str, mounts: dict[str, tuple[str, str]]) -> dict[str, str]:
    """A ``/proc/<pid>/cgroup`` text and the mounts (``parse_mountinfo``) -> controller ->
    directory. A hierarchy mounted from a subtree (a container's) is resolved from there."""
    dirs: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        for controller in controllers.split(",") if controllers else [_UNIFIED]:
            if controller not in mounts:
                continue
            point, root = mounts[controller]
            if root != "/" and (path == root or path.startswith(root + "/")):
                path = path[len(root):] or "/"
            dirs[controller] = os.path.normpath(point + path)
    return dirs


def memory_cgroup(pid: int | str = "self") -> str | None:
    """The directory of ``pid``'s memory cgroup (v1 ``memory`` hierarchy, else v2 when its
    memory controller is on there); None without one."""
    dirs = cgroup_dirs(pid)
    if "memory" in dirs:
        return dirs["memory"]
    unified = dirs.get(_UNIFIED)
    if unified is not None and os.path.exists(os.path.join(unified, "memory.events")):
        return unified
    return None


def memory_limit(directory: str) -> int | None:
    """The memory limit of the cgroup at ``directory`` in bytes; None when unlimited or unknown."""
    for name in ("memory.max", "memory.limit_in_bytes"):
        try:
            with open(os.path.join(directory, name)) as fp:
                text = fp.read().strip()
        except OSError:
            continue
        if text == "max" or not text.isdigit() or int(text) >= 1 << 62:
            return None
        return int(text)
    return None


def oom_kills(directory: str | None) -> int | None:
    """The OOM kills the kernel counted in the memory cgroup at ``directory`` (None: the
    whole system's, from /proc/vmstat); None when unreadable."""
    if directory is None:
        return _counter("/proc/vmstat", "oom_kill")
    for name in ("memory.events", "memory.oom_control"):
        count = _counter(os.path.join(directory, name), "oom_kill")
        if count is not None:
            return count
    return None


def _counter(path: str, key: str) -> int | None:
    try:
        with open(path) as fp:
            for line in fp:
                name, _, value = line.partition(" ")
                if name == key:
                    return int(value)
    except (OSError, ValueError):
        return None
    return None


class OomLedger:
    """OOM kills per memory cgroup for one group of workers: snapshot before they start,
    each new kill claimed by at most one SIGKILLed worker (see the module doc)."""

    def __init__(self) -> None:
        self._seen: dict[str | None, int | None] = {}  # memory cgroup -> count at the snapshot
        self._claimed: dict[str | None, int] = {}
        self._where: dict[int, str | None] = {}  # worker pid -> its memory cgroup
        self._verdict: dict[int, bool] = {}
        self.snapshot(memory_cgroup())  # the workers start in ours (spawned, or zygote-moved)

    def snapshot(self, directory: str | None) -> None:
        if directory not in self._seen:
            self._seen[directory] = oom_kills(directory)
            self._claimed[directory] = 0

    def watch(self, pid: int) -> None:
        """Note a started worker's memory cgroup (a new one is snapshotted now)."""
        directory = memory_cgroup(pid)
        self._where[pid] = directory
        self.snapshot(directory)

    def killed_by_oom(self, pid: int, exitcode: int | None) -> bool:
        """Whether worker ``pid``, which ended with ``exitcode``, was taken by the OOM killer
        (the answer is given once and then remembered)."""
        if pid in self._verdict:
            return self._verdict[pid]
        verdict = False
        if exitcode == -int(signal.SIGKILL) and pid in self._where:
            directory = self._where[pid]
            before, now = self._seen.get(directory), oom_kills(directory)
            if before is not None and now is not None and now - before > self._claimed[directory]:
                self._claimed[directory] += 1
                verdict = True
        if exitcode is not None:
            self._verdict[pid] = verdict
        return verdict

    def describe(self, pid: int) -> str:
        """``killed by the OOM killer`` with the memory cgroup and its limit, when known."""
        directory = self._where.get(pid)
        if directory is None:
            return "killed by the OOM killer (SIGKILL; the system ran out of memory)"
        limit = memory_limit(directory)
        where = f"memory cgroup {directory}" + (f", limit {limit} bytes" if limit is not None else "")
        return f"killed by the OOM killer (SIGKILL; {where})"


def join_cgroups(pid: int, dirs: dict[str, str]) -> list[str]:
    """Move ``pid`` into the cgroups ``dirs`` (``cgroup_dirs`` of another process) where it
    is not in them already; the problems (one line each: a cgroup it could not join)."""
    problems = []
    mine = cgroup_dirs(pid)
    for controller, directory in dirs.items():
        if mine.get(controller) == directory:
            continue
        try:
            with open(os.path.join(directory, "cgroup.procs"), "w") as fp:
                fp.write(str(pid))
        except OSError as e:
            problems.append(f"cannot join cgroup {directory}: {e.strerror}")
    return problems

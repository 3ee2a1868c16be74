"""The cgroups of a job's nodes: one per node, under one per job, made and removed by the harness.

Where: under the cgroup the harness itself runs in (each hierarchy's own directory), so a
job's limits stay inside whatever limits the harness was given, and nothing is written
outside the subtree it was handed. cgroup v1 (the ``cpu``, ``cpuacct`` and ``memory``
hierarchies) and v2 (the unified hierarchy, detected by ``cgroup.controllers`` at
/sys/fs/cgroup) both work; in v2 the job's cgroup is made beside the harness's own (v2 lets
no cgroup both hold processes and hand controllers to children, and the harness's own holds
the harness), unless the harness runs in the root cgroup.

Names: ``elastic_<owner pid>_<run id>/node<i>``. A harness killed before it closed its job
(SIGKILL, a crashed run) leaves them; the next job made in any process removes those whose
owner is dead (``sweep_dead_owners``), never one whose owner still runs -- the rule the temp
dirs and namespaces follow (``harness.sim.leftovers``). A cgroup is removed with ``rmdir``
once no process is left in it; what is still there after a short wait (a process that
escaped the harness's kill) is moved to the parent first, and named.

Where cgroups cannot be made (nothing mounted, a controller missing, no write access),
``probe()`` says what is missing, and the resource faults raise ``ConfigError`` with it.

A node's v2 dir is also who its sockets are: nftables matches a packet's socket by the
cgroup v2 dir its process is in (``socket cgroupv2``), which is how a network fault on a
host falls on one of the nodes sharing it (``harness.sim.places.hosts.rules``). So on a hybrid
host (v1 controllers, the unified hierarchy mounted beside them, as systemd's "hybrid"
mode has it) a node's cgroup spans the unified hierarchy too, where it is writable: a dir
that holds the node's processes and nothing else (no controller is enabled there).
"""

from __future__ import annotations

import errno
import functools
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

from harness.procs import cgroup_dirs, cgroup_mounts
from harness.sim.leftovers import owner_alive

__all__ = ["CgroupSupport", "JobCgroup", "MachineCgroups", "NodeCgroup", "probe", "sweep_dead_owners", "parse_bytes",
           "socket_cgroup", "PREFIX", "PERIOD_US", "AGENT", "WORKERS", "NFT_CGROUP_ROOT"]

PREFIX = "elastic_"
_NAME = re.compile(r"elastic_(\d+)_[A-Za-z0-9]+")
PERIOD_US = 100_000  # the CFS period a CPU quota is a share of (the kernel's default)
_V1 = ("cpu", "cpuacct", "memory")  # the v1 hierarchies a node's cgroup spans
_V2 = ("cpu", "memory")  # the v2 controllers it needs
_UNIFIED = ""
_SETTLE_S = 5.0  # how long removal waits for the processes of a killed job to be gone
#: where nft looks up the cgroup v2 path of a ``socket cgroupv2`` match (it prepends it)
NFT_CGROUP_ROOT = "/sys/fs/cgroup"


@dataclass(frozen=True)
class CgroupSupport:
    """Where this process may make cgroups: v1 or v2, and the base directory per hierarchy
    (v1: ``cpu``/``cpuacct``/``memory`` -> dir; v2: ``""`` -> dir)."""

    version: int
    bases: dict[str, str]

    def distinct_bases(self) -> list[str]:
        return sorted(set(self.bases.values()))


@functools.lru_cache(maxsize=1)
def probe() -> CgroupSupport | str:
    """The cgroups this process may make, or why it may make none (a clause: what is missing)."""
    dirs = cgroup_dirs()
    if os.path.exists("/sys/fs/cgroup/cgroup.controllers") and _UNIFIED in dirs:
        return _probe_v2(dirs[_UNIFIED])
    missing = [c for c in _V1 if c not in dirs]
    if missing:
        if not dirs:
            return "cgroups (no cgroup filesystem is mounted at /sys/fs/cgroup)"
        return f"the cgroup v1 controller(s) {', '.join(missing)} (not mounted)"
    bases = {c: dirs[c] for c in _V1}
    for base in set(bases.values()):
        if not os.path.isdir(base):
            return f"cgroups (the hierarchy that holds {base} is not mounted here)"
        if not os.access(base, os.W_OK):
            return f"write access to the cgroup {base} (run as root, or in a cgroup delegated to this user)"
    unified = dirs.get(_UNIFIED)
    if unified is not None and os.path.isdir(unified) and os.access(unified, os.W_OK):
        bases[_UNIFIED] = unified  # hybrid: the node's sockets named by a v2 dir (the module's docstring)
    return CgroupSupport(1, bases)


def _probe_v2(own: str) -> CgroupSupport | str:
    root = "/sys/fs/cgroup"
    base = own if os.path.normpath(own) == root else os.path.dirname(own)
    try:
        with open(os.path.join(base, "cgroup.subtree_control")) as fp:
            enabled = fp.read().split()
    except OSError as e:
        return f"the cgroup v2 file {base}/cgroup.subtree_control ({e.strerror})"
    try:
        with open(os.path.join(base, "cgroup.controllers")) as fp:
            available = fp.read().split()
    except OSError:
        available = enabled
    absent = [c for c in _V2 if c not in available]
    if absent:  # no write can enable them: a hybrid host binds them to v1 hierarchies
        return (f"the cgroup v2 controller(s) {', '.join(absent)} (not available in {base}: its "
                f"cgroup.controllers lists {' '.join(available) or 'none'}; a v1 hierarchy may hold them)")
    missing = [c for c in _V2 if c not in enabled]
    if missing and base == root:
        try:
            _write(os.path.join(base, "cgroup.subtree_control"), " ".join(f"+{c}" for c in missing))
            missing = []
        except OSError:
            pass
    if missing:
        return (f"the cgroup v2 controller(s) {', '.join(missing)} enabled in {base}/cgroup.subtree_control "
                "(delegate them to the cgroup the tests run in)")
    if not os.access(base, os.W_OK):
        return f"write access to the cgroup {base} (run as root, or in a cgroup delegated to this user)"
    return CgroupSupport(2, {_UNIFIED: base})


def socket_cgroup(directory: str) -> tuple[str, int] | None:
    """A cgroup v2 dir of this machine as nft's ``socket cgroupv2 level LEVEL "PATH"`` names
    it: PATH relative to ``NFT_CGROUP_ROOT`` (nft resolves it there, to the dir's id), and
    LEVEL its depth below the v2 hierarchy's root (the kernel compares the id of a socket's
    cgroup's ancestor at that depth). None where nft cannot name it (not under
    ``NFT_CGROUP_ROOT``, or the hierarchy is mounted from a subtree: a container's)."""
    point, root = cgroup_mounts().get(_UNIFIED, ("", ""))
    directory = os.path.normpath(directory)
    if not point or root != "/" or not directory.startswith(point.rstrip(os.sep) + os.sep) or \
            not directory.startswith(NFT_CGROUP_ROOT + os.sep):
        return None
    depth = len(os.path.relpath(directory, point).split(os.sep))
    return os.path.relpath(directory, NFT_CGROUP_ROOT), depth


def parse_bytes(value: str | int) -> int:
    """``"300M"`` -> 314572800 (K, M, G, T: powers of 1024, as docker and the kernel spell
    them); an int is bytes. ValueError on anything else."""
    if isinstance(value, bool):
        raise ValueError(value)
    if isinstance(value, int):
        return value
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*", str(value), re.IGNORECASE)
    if match is None:
        raise ValueError(value)
    scale = 1024 ** " KMGT".index(match.group(2).upper() or " ")
    return int(float(match.group(1)) * scale)


def _write(path: str, text: str) -> None:
    with open(path, "w") as fp:
        fp.write(text)


def _read(path: str) -> str:
    with open(path) as fp:
        return fp.read()


def _pids(directory: str) -> list[int]:
    try:
        return [int(line) for line in _read(os.path.join(directory, "cgroup.procs")).split()]
    except (OSError, ValueError):
        return []


#: the children of a node's cgroup: its agent's, and its workers' (``NodeCgroup``)
AGENT, WORKERS = "agent", "workers"


def _splits(controller: str, version: int) -> bool:
    """Does a node's cgroup hold its agent and its workers apart in this hierarchy? In v2
    always (one tree; the node's own cgroup may then hold no process). In v1 only the CPU
    ones: v1 counts an OOM kill only in the victim's own memory cgroup, never its parents',
    so agent and workers share the node's memory cgroup, where its limit and counter are."""
    return version == 2 or controller in ("cpu", "cpuacct")


class NodeCgroup:
    """One node's cgroup: in each hierarchy a directory, with its agent and its workers in
    two children (``agent``, ``workers``) where the hierarchy is split (``_splits``).

    Why apart: a CPU quota (``slow_node``) is a straggler's *training*; the agent's
    keep-alive (a few ms of CPU a second) must not starve behind it, or a slow node is
    taken for a dead one by its peers and the job re-forms without it. A node
    whose agent is silent too is ``freeze_node``. A memory limit is the node's: its agent
    and workers share it, as on a real host.
    """

    def __init__(self, support: CgroupSupport, dirs: dict[str, str]):
        self.version = support.version
        self.dirs = dirs  # controller (v2: "") -> the node's directory
        self.agent_dirs = self._children(AGENT)
        self.workers_dirs = self._children(WORKERS)

    def _children(self, child: str) -> dict[str, str]:
        return {c: os.path.join(d, child) if _splits(c, self.version) else d
                for c, d in self.dirs.items()}

    def _key(self, controller: str) -> str:
        return _UNIFIED if self.version == 2 else controller

    def _dir(self, controller: str) -> str:
        return self.dirs[self._key(controller)]

    def _workers_dir(self, controller: str) -> str:
        return self.workers_dirs[self._key(controller)]

    def make(self) -> None:
        """Make the node's directories and its children (v2: hand the controllers down)."""
        for directory in sorted(set(self.dirs.values())):
            os.mkdir(directory)
            if self.version == 2:
                _write(os.path.join(directory, "cgroup.subtree_control"),
                       " ".join(f"+{c}" for c in _V2))
        for directory in sorted(set(self.agent_dirs.values()) | set(self.workers_dirs.values())):
            if not os.path.isdir(directory):
                os.mkdir(directory)

    def socket_cgroup(self) -> tuple[str, int] | None:
        """Its v2 dir as nft matches its processes' sockets (``socket_cgroup``); None
        where it has none, or nft cannot name it."""
        return socket_cgroup(self.dirs[_UNIFIED]) if _UNIFIED in self.dirs else None

    def distinct(self) -> list[str]:
        """Every directory of it, children before the node's (the order removal needs)."""
        children = set(self.agent_dirs.values()) | set(self.workers_dirs.values())
        nodes = set(self.dirs.values())
        return sorted(children - nodes) + sorted(nodes)

    def procs_files(self) -> list[str]:
        """The ``cgroup.procs`` files the agent writes its pid to, to join."""
        return [os.path.join(d, "cgroup.procs") for d in sorted(set(self.agent_dirs.values()))]

    def worker_procs_files(self) -> list[str]:
        """The ``cgroup.procs`` files its agent moves each worker into (``harness.procs``'
        ``HARNESS_WORKER_CGROUP``)."""
        return [os.path.join(d, "cgroup.procs") for d in sorted(set(self.workers_dirs.values()))]

    def add(self, pid: int) -> None:
        for path in self.procs_files():
            _write(path, str(pid))

    def pids(self) -> list[int]:
        """The processes in it (every hierarchy's, merged)."""
        return sorted({pid for d in self.distinct() for pid in _pids(d)})

    def agent_pids(self) -> list[int]:
        """The processes in its agent's own children (the agent alone joins them)."""
        return sorted({pid for d in set(self.agent_dirs.values()) for pid in _pids(d)})

    def joined(self, pid: int) -> bool:
        """Whether process ``pid`` (a node's agent) is in it."""
        return pid in self.pids()

    # -- CPU ---------------------------------------------------------------------------

    def set_cpu(self, cpus: float) -> None:
        """At most ``cpus`` CPUs' worth of time per CFS period, for all its workers together
        (the agent is outside the quota: see the class docstring)."""
        quota = max(1000, int(cpus * PERIOD_US))
        cpu = self._workers_dir("cpu")
        if self.version == 2:
            _write(os.path.join(cpu, "cpu.max"), f"{quota} {PERIOD_US}")
        else:
            _write(os.path.join(cpu, "cpu.cfs_period_us"), str(PERIOD_US))
            _write(os.path.join(cpu, "cpu.cfs_quota_us"), str(quota))

    def clear_cpu(self) -> None:
        cpu = self._workers_dir("cpu")
        if self.version == 2:
            _write(os.path.join(cpu, "cpu.max"), f"max {PERIOD_US}")
        else:
            _write(os.path.join(cpu, "cpu.cfs_quota_us"), "-1")

    def cpu_seconds(self) -> float:
        """CPU time its processes used (user + system), since it was made."""
        if self.version == 2:
            for line in _read(os.path.join(self._dir("cpu"), "cpu.stat")).splitlines():
                name, _, value = line.partition(" ")
                if name == "usage_usec":
                    return int(value) / 1e6
            return 0.0
        return int(_read(os.path.join(self._dir("cpuacct"), "cpuacct.usage"))) / 1e9

    def throttled(self) -> int:
        """CFS periods in which the quota stopped its workers (``nr_throttled``)."""
        for line in _read(os.path.join(self._workers_dir("cpu"), "cpu.stat")).splitlines():
            name, _, value = line.partition(" ")
            if name == "nr_throttled":
                return int(value)
        return 0

    # -- memory ------------------------------------------------------------------------

    def set_memory(self, limit: int) -> None:
        """Its processes share ``limit`` bytes (swap included, where swap is accounted):
        past it the kernel reclaims, then OOM-kills one of them."""
        memory = self._dir("memory")
        if self.version == 2:
            _write(os.path.join(memory, "memory.max"), str(limit))
            if os.path.exists(os.path.join(memory, "memory.swap.max")):
                _write(os.path.join(memory, "memory.swap.max"), "0")
            return
        memsw = os.path.join(memory, "memory.memsw.limit_in_bytes")
        if os.path.exists(memsw) and int(_read(memsw)) < limit:
            _write(memsw, str(limit))  # raising: memsw first (it must stay >= the limit)
            memsw_first = True
        else:
            memsw_first = False
        _write(os.path.join(memory, "memory.limit_in_bytes"), str(limit))
        if os.path.exists(memsw) and not memsw_first:
            _write(memsw, str(limit))

    def set_memory_above(self, headroom: int) -> tuple[int, int]:
        """A limit ``headroom`` bytes above what its processes hold now, read and written
        together (on a host, in one round trip: a process growing between a read here and a
        write there could pass the limit before it is set, and the kernel refuses a limit
        below what is in use); (what they held, the limit set)."""
        held = self.memory_bytes()
        self.set_memory(held + headroom)
        return held, held + headroom

    def clear_memory(self) -> None:
        memory = self._dir("memory")
        if self.version == 2:
            _write(os.path.join(memory, "memory.max"), "max")
            if os.path.exists(os.path.join(memory, "memory.swap.max")):
                _write(os.path.join(memory, "memory.swap.max"), "max")
            return
        memsw = os.path.join(memory, "memory.memsw.limit_in_bytes")
        if os.path.exists(memsw):
            _write(memsw, "-1")
        _write(os.path.join(memory, "memory.limit_in_bytes"), "-1")

    def memory_bytes(self) -> int:
        """Memory its processes use now (charged to it)."""
        memory = self._dir("memory")
        name = "memory.current" if self.version == 2 else "memory.usage_in_bytes"
        return int(_read(os.path.join(memory, name)))

    def oom_kills(self) -> int:
        """OOM kills the kernel made in it."""
        memory = self._dir("memory")
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        for line in _read(os.path.join(memory, name)).splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0


class JobCgroup:
    """A job's cgroup (``elastic_<owner pid>_<run id>`` in each hierarchy) and its nodes'."""

    def __init__(self, support: CgroupSupport, run_id: str):
        sweep_dead_owners(support)
        self.support = support
        self.name = f"{PREFIX}{os.getpid()}_{run_id}"
        self.dirs = {c: os.path.join(base, self.name) for c, base in support.bases.items()}
        for directory in sorted(set(self.dirs.values())):
            os.mkdir(directory)
        if support.version == 2:
            _write(os.path.join(self.dirs[_UNIFIED], "cgroup.subtree_control"),
                   " ".join(f"+{c}" for c in _V2))
        self.nodes: dict[int, NodeCgroup] = {}

    def node(self, index: int) -> NodeCgroup:
        """Node ``index``'s cgroup, made on first use."""
        if index not in self.nodes:
            node = NodeCgroup(self.support, {c: os.path.join(d, f"node{index}") for c, d in self.dirs.items()})
            node.make()
            self.nodes[index] = node
        return self.nodes[index]

    def remove(self) -> list[str]:
        """Remove every node's cgroup and the job's; what had to be moved out (one line each)."""
        problems: list[str] = []
        for node in self.nodes.values():
            problems += _remove(node.distinct(), self.support)
        problems += _remove(sorted(set(self.dirs.values())), self.support)
        return problems


def _remove(directories: list[str], support: CgroupSupport) -> list[str]:
    """rmdir each (children first: the caller's order), once its processes are gone: they
    were killed just before, and die within moments; survivors are moved to the base."""
    problems = []
    deadline = time.monotonic() + _SETTLE_S
    for directory in directories:
        if not os.path.isdir(directory):
            continue
        while _pids(directory) and time.monotonic() < deadline:
            time.sleep(0.01)
        left = _pids(directory)
        if left:
            base = _base_of(directory, support)
            for pid in left:
                try:
                    _write(os.path.join(base, "cgroup.procs"), str(pid))
                except OSError:
                    pass
            problems.append(f"pids {left} still in cgroup {directory} (moved to {base})")
        problem = _rmdir(directory, deadline)
        if problem:
            problems.append(problem)
    return problems


def _rmdir(directory: str, deadline: float) -> str | None:
    """rmdir, retried while the kernel says EBUSY: a task that just exited leaves
    ``cgroup.procs`` before the kernel lets go of the cgroup (seen in CI: an empty node
    cgroup refused right after its node was SIGKILLed)."""
    while True:
        try:
            os.rmdir(directory)
            return None
        except FileNotFoundError:
            return None
        except OSError as e:
            if e.errno == errno.EBUSY and time.monotonic() < deadline + _SETTLE_S:
                time.sleep(0.01)
                continue
            return f"cgroup {directory} could not be removed ({e.strerror})"


def _bottom_up(directory: str) -> list[str]:
    """``directory`` and every cgroup under it, each after its children (rmdir's order)."""
    found = []
    for parent, children, _files in os.walk(directory, topdown=False):
        found += [os.path.join(parent, c) for c in sorted(children)]
    return [*found, directory]


def _base_of(directory: str, support: CgroupSupport) -> str:
    for base in support.bases.values():
        if directory.startswith(base + os.sep):
            return base
    return os.path.dirname(directory)


def sweep_dead_owners(support: CgroupSupport | None = None) -> list[str]:
    """Remove the job cgroups (and their nodes') whose owner pid is dead; their paths."""
    found = support if support is not None else probe()
    if not isinstance(found, CgroupSupport):
        return []
    removed = []
    for base in found.distinct_bases():
        try:
            names = os.listdir(base)
        except OSError:
            continue
        for name in names:
            match = _NAME.fullmatch(name)
            if match is None or owner_alive(int(match.group(1))):
                continue
            job = os.path.join(base, name)
            _remove(_bottom_up(job), found)
            removed.append(job)
    return removed


class MachineCgroups:
    """The cgroups of a job's nodes on this machine (``JobCgroup``, made on first use), as
    ``harness.sim.resources.faults.NodeCgroups``: a node's, or None and why not."""

    def __init__(self, run_id: Callable[[], str]):
        self._run_id = run_id
        self._cgroup: JobCgroup | None = None
        self._unavailable: str | None = None

    def node(self, index: int) -> NodeCgroup | None:
        if self._cgroup is None and self._unavailable is None:
            support = probe()
            if isinstance(support, CgroupSupport):
                try:
                    self._cgroup = JobCgroup(support, self._run_id())
                except OSError as e:
                    self._unavailable = f"a cgroup of its own ({e.strerror} making one under {support.bases})"
            else:
                self._unavailable = support
        return self._cgroup.node(index) if self._cgroup is not None else None

    def unavailable(self, index: int) -> str:
        return self._unavailable or ""

    def close(self) -> list[str]:
        """Remove the job's cgroups (its processes killed first); what had to be moved out."""
        cgroup, self._cgroup = self._cgroup, None
        self._unavailable = "the job is closed"
        return cgroup.remove() if cgroup is not None else []

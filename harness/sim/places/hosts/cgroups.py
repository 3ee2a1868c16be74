"""The cgroups of a job's nodes placed on hosts (``job.resources`` there; docs/hosts.md).

A node on a host whose ``capabilities`` list ``cgroups`` gets its cgroup *there*, made by a
keeper (``harness.sim.places.hosts.cgroup_keeper keep``) that runs under the connection's supervisor
for as long as the node may: the agent joins it first thing (its spec's environment names
the host's ``cgroup.procs`` files, as a local node's names this machine's), its workers
follow, and ``slow_node`` / ``memory_limit`` are writes there, each one ``on_host apply``
over the node's connection. So a fault on a host is the same write as on this machine, by
the same code (``NodeCgroup``), in the host's kernel: a CPU quota throttles the host's
CPUs, a memory limit wakes the host's OOM killer.

Ownership: the keeper removes the cgroup when it is told to end, which its supervisor does
at ``close()`` and whenever the connection ends (this process killed, the link lost, the
lease expired). A keeper killed outright leaves it; the next keeper on that host sweeps
cgroups whose owner (a keeper's pid, in the name) is dead, as local jobs do.

What it takes from the host: cgroups it may write (root, or a delegated subtree) with the
cpu and memory controllers. A host that lists ``cgroups`` but cannot make one runs the
node without; its resource faults then name the host and what is missing.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from harness.hosts import HostError, SshHost, last_line
from harness.sim.faults.target import NodeHosts
from harness.sim.resources.cgroups import CgroupSupport, NodeCgroup
from harness.sim.schema import CGROUPS

if TYPE_CHECKING:
    from harness.hosts import RemoteProcess

__all__ = ["HostCgroups", "HostNodeCgroup"]

_log = logging.getLogger(__name__)

_MODULE = "harness.sim.places.hosts.cgroup_keeper"
#: how long a keeper may take to say where the cgroup is (an interpreter's start and the
#: harness's import, on a host as loaded as this machine can be)
_READY_S = 60.0
#: a keeper's grace after SIGTERM: removal waits up to 5 s for the node's processes to go,
#: and up to 5 s more while the kernel says EBUSY (``cgroups._remove``)
_KEEPER_GRACE_S = 15.0


class HostNodeCgroup:
    """One node's cgroup on its host, as ``NodeCgroup`` is one here: the same paths (of the
    host) and methods, each carried out there by ``on_host apply``. An ``OSError`` there
    comes back as one (``errno`` kept): the kernel's refusal reads the same."""

    def __init__(self, host: SshHost, version: int, dirs: dict[str, str], socket: tuple[str, int] | None = None):
        self.host = host
        self.version = version
        self.dirs = dirs
        self._socket = socket
        self._paths = NodeCgroup(CgroupSupport(version, {}), dirs)  # paths only: never touches this machine
        self.agent_dirs = self._paths.agent_dirs
        self.workers_dirs = self._paths.workers_dirs

    # -- where (no round trip) ----------------------------------------------------------

    def procs_files(self) -> list[str]:
        return self._paths.procs_files()

    def worker_procs_files(self) -> list[str]:
        return self._paths.worker_procs_files()

    def distinct(self) -> list[str]:
        return self._paths.distinct()

    def socket_cgroup(self) -> tuple[str, int] | None:
        """Its v2 dir as the host's nft matches its processes' sockets (the keeper said)."""
        return self._socket

    # -- on the host --------------------------------------------------------------------

    def _apply(self, op: str, *value: str) -> dict[str, Any]:
        result = self.host.run([self.host.spec.python, "-m", _MODULE, "apply", str(self.version),
                                json.dumps(self.dirs), op, *value], check=False)
        lines = result.stdout.strip().splitlines()
        try:
            answer = json.loads(lines[-1]) if lines else None
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            raise HostError(f"host {self.host.spec.label}: {_MODULE} {op} exited {result.returncode}: "
                            f"{last_line(result.stderr)}")
        if "error" in answer:
            code = answer.get("errno")
            if isinstance(code, int):
                raise OSError(code, f"{answer['error']} (on host {self.host.spec.label})")
            raise HostError(f"host {self.host.spec.label}: {op}: {answer['error']}")
        return answer

    def read(self) -> dict[str, Any]:
        """Its processes (``pids``, ``agent_pids``) and counters, in one round trip."""
        return self._apply("read")

    def pids(self) -> list[int]:
        return [int(p) for p in self.read()["pids"]]

    def joined(self, pid: int) -> bool:
        """Whether the node's agent is in it. ``pid`` is the agent's as this machine knows it
        (its ssh client's), which names no process of the host: the agent's own child cgroup
        holds a process of the host (only the agent joins it; its workers go to theirs)."""
        return bool(self.read()["agent_pids"])

    def set_cpu(self, cpus: float) -> None:
        self._apply("set_cpu", repr(float(cpus)))

    def clear_cpu(self) -> None:
        self._apply("clear_cpu")

    def set_memory(self, limit: int) -> None:
        self._apply("set_memory", str(int(limit)))

    def set_memory_above(self, headroom: int) -> tuple[int, int]:
        said = self._apply("set_memory_above", str(int(headroom)))
        return int(said["held"]), int(said["limit"])

    def clear_memory(self) -> None:
        self._apply("clear_memory")

    def cpu_seconds(self) -> float:
        return float(self.read()["cpu_seconds"])

    def throttled(self) -> int:
        return int(self.read()["throttled"])

    def memory_bytes(self) -> int:
        return int(self.read()["memory_bytes"])

    def oom_kills(self) -> int:
        return int(self.read()["oom_kills"])

    def __repr__(self) -> str:
        return f"<HostNodeCgroup {self.host.spec.label} {self.distinct()[-1]}>"


class _Keeper:
    """A node's keeper on its host, and what it said: the cgroup, or why there is none."""

    def __init__(self, proc: RemoteProcess | None, cgroup: HostNodeCgroup | None, why: str | None):
        self.proc, self.cgroup, self.why = proc, cgroup, why

    def ended(self) -> bool:
        """Whether it made a cgroup and has ended since, taking the cgroup with it."""
        return self.cgroup is not None and self.proc is not None and self.proc.poll() is not None


class HostCgroups:
    """The cgroups of a job's nodes on hosts, one keeper per node (``job.resources`` asks
    ``node``; ``ResourceFaults`` applies the faults through what it returns)."""

    def __init__(self, nodes: NodeHosts, run_id: Callable[[], str]):
        self._nodes = nodes
        self._run_id = run_id
        self._keepers: dict[int, _Keeper] = {}
        self._lock = threading.Lock()

    def node(self, index: int) -> HostNodeCgroup | None:
        """Node ``index``'s cgroup on its host (its keeper started on first use, once its
        connection is open); None where there is none (``unavailable`` says why)."""
        with self._lock:
            keeper = self._keepers.get(index)
            if keeper is None or keeper.ended():
                # a keeper that ended took its cgroup with it (its connection was lost and
                # made again: ``host_unreachable``): the node's next agent gets a new one
                keeper = self._keepers[index] = self._start(index)
            return keeper.cgroup

    def unavailable(self, index: int) -> str:
        """Why node ``index`` has no cgroup (a clause: what is missing, and where)."""
        spec = self._nodes.host_of(index)
        keeper = self._keepers.get(index)
        if CGROUPS not in spec.capabilities:
            return (f"'cgroups' in the capabilities of its host {spec.label} (its hosts or Slurm file's), where the "
                    "harness may write cgroups (root, or a delegated subtree)")
        if keeper is not None and keeper.why:
            return keeper.why
        return f"its host {spec.label}'s connection (node {index} has not started there)"

    def _start(self, index: int) -> _Keeper:
        spec = self._nodes.host_of(index)
        if CGROUPS not in spec.capabilities:
            return _Keeper(None, None, None)
        try:
            host, _port = self._nodes.connection(index)
            proc = host.start([spec.python, "-m", _MODULE, "keep", self._run_id(), str(index)],
                              grace=_KEEPER_GRACE_S)
        except (HostError, OSError) as e:
            return _Keeper(None, None, f"a cgroup on host {spec.label} ({e})")
        line = proc.first_line(_READY_S)
        try:
            said = json.loads(line) if line.strip() else None
        except ValueError:
            said = None
        if isinstance(said, dict) and isinstance(said.get("dirs"), dict) and said.get("version") in (1, 2):
            return _Keeper(proc, HostNodeCgroup(host, int(said["version"]), dict(said["dirs"]),
                                                _socket(said.get("socket"))), None)
        why = said.get("unavailable") if isinstance(said, dict) else None
        if not why:
            proc.terminate()  # its last words first, then its pipes closed
            err = proc.stderr.read() if proc.stderr is not None else ""
            proc.close()
            why = f"its keeper there said {line.strip()[:200]!r}" if line.strip() else \
                f"its keeper there said nothing within {_READY_S:g} s ({last_line(err)})"
        return _Keeper(proc, None, f"{why} on host {spec.label}")

    def close(self) -> list[str]:
        """End every keeper (each removes its cgroup once the node's processes are gone: they
        were ended just before, on the host); what they had to move out, or could not remove."""
        with self._lock:
            keepers, self._keepers = dict(self._keepers), {}
        for keeper in keepers.values():
            if keeper.proc is not None:
                keeper.proc.let_go()  # all told at once: their waits overlap
        problems = []
        for index, keeper in sorted(keepers.items()):
            if keeper.proc is None:
                continue
            label = self._nodes.host_of(index).label
            try:
                out, err = keeper.proc.communicate(_KEEPER_GRACE_S + 10)
            except HostError as e:
                problems.append(f"node {index}'s cgroup on host {label}: {e}")
                keeper.proc.close()
                continue
            keeper.proc.close()
            left = _said_left(out)
            if left is None:
                if keeper.cgroup is not None:
                    problems.append(f"node {index}'s cgroup on host {label} may be left (its keeper exited "
                                    f"{keeper.proc.returncode}: {last_line(err)}); "
                                    "the next job on that host removes it")
                continue
            problems += [f"host {label}: {line}" for line in left]
        return problems


def _socket(said: object) -> tuple[str, int] | None:
    """A keeper's ``socket`` (``[path, level]``) as ``socket_cgroup`` returns it; None for
    anything else (it goes into an nft rule: a path with a quote in it is refused)."""
    if isinstance(said, list) and len(said) == 2 and isinstance(said[0], str) and type(said[1]) is int \
            and 0 < said[1] < 64 and re.fullmatch(r"[\w./@:+-]+", said[0]) and ".." not in said[0].split("/"):
        return said[0], said[1]
    return None


def _said_left(out: str) -> list[str] | None:
    """The keeper's last words (``{"left": [...]}``), or None if it never said them."""
    for line in reversed(out.splitlines()):
        try:
            said = json.loads(line)
        except ValueError:
            continue
        if isinstance(said, dict) and isinstance(said.get("left"), list):
            return [str(item) for item in said["left"]]
    return None


"""A node's cgroup on a host: the host's half of ``harness.sim.places.hosts.cgroups``.

Run on the host over SSH, under the connection's supervisor, with the host's interpreter
and its installed pytest-elastic (the controller's version, checked when it connected):

* ``keep RUN_ID NODE``: makes the node's cgroup there (``JobCgroup``: under the cgroup this
  command runs in, named ``elastic_<this pid>_<run id>/node<i>``, the dead owners' of this
  host swept first), prints one JSON line (``{"version", "dirs", "socket"}``: ``socket`` is
  its v2 dir as nft names it, ``[path, level]``, or null; or ``{"unavailable":
  why}`` where the host cannot make one), then waits. When it is told to end (SIGTERM: the
  supervisor's, at the controller's ``close`` or when the connection is lost, the
  controller killed or its lease ended) it removes the cgroup, once the node's processes
  are gone, prints ``{"left": [...]}`` (what had to be moved out first) and exits. Why a
  process that waits: the cgroup's life is then the connection's, which the host's
  supervisor already ends whatever happens to the controller; a cgroup made by a command
  that returned would outlive a controller killed before it removed it.
* ``apply VERSION DIRS OP [VALUE]``: one write or read of a node's cgroup, as
  ``NodeCgroup`` does it here (``set_cpu``, ``clear_cpu``, ``set_memory``,
  ``set_memory_above``, ``clear_memory``, ``read``: its processes and counters); one JSON
  line, ``{"error", "errno"}`` on an ``OSError``. Only a directory of a cgroup this
  harness made (under ``/sys/fs/cgroup``, a component named ``elastic_...``) is touched,
  whatever argv says.

Nothing read here is unpickled; argv and the lines are JSON.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from harness.sim.resources.cgroups import PREFIX, CgroupSupport, JobCgroup, NodeCgroup, probe

__all__ = ["OPS", "main", "node_cgroup"]

CGROUP_ROOT = "/sys/fs/cgroup"
OPS = ("set_cpu", "clear_cpu", "set_memory", "set_memory_above", "clear_memory", "read")


def _say(data: Mapping[str, Any]) -> None:
    sys.stdout.write(json.dumps(data) + "\n")
    sys.stdout.flush()


def keep(run_id: str, node: int) -> int:
    """Make node ``node``'s cgroup, say where, wait to be told to end, remove it."""
    support = probe()
    if not isinstance(support, CgroupSupport):
        _say({"unavailable": support})
        return 0
    ends = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}
    signal.pthread_sigmask(signal.SIG_BLOCK, ends)  # one sent while the cgroup is made waits for sigwait
    try:
        job = JobCgroup(support, run_id)
        cgroup = job.node(node)
    except OSError as e:
        _say({"unavailable": f"a cgroup of its own ({e.strerror} making one under "
                             f"{' '.join(support.distinct_bases())})"})
        return 0
    _say({"version": support.version, "dirs": cgroup.dirs, "socket": cgroup.socket_cgroup()})
    signal.sigwait(ends)
    _say({"left": job.remove()})
    return 0


def node_cgroup(version: int, dirs: object) -> NodeCgroup:
    """The ``NodeCgroup`` of ``dirs`` (controller -> directory); ``ValueError`` unless every
    one is a directory of a cgroup this harness made (the paths come from a command line)."""
    if version not in (1, 2) or not isinstance(dirs, dict) or not dirs or \
            not all(isinstance(k, str) and isinstance(d, str) for k, d in dirs.items()):
        raise ValueError(f"not a node cgroup: version {version!r}, dirs {dirs!r}")
    for directory in dirs.values():
        norm = os.path.normpath(directory)
        if norm != directory or not norm.startswith(CGROUP_ROOT + os.sep) or \
                not any(part.startswith(PREFIX) for part in norm.split(os.sep)):
            raise ValueError(f"{directory!r} is not a cgroup this harness made (under {CGROUP_ROOT}, "
                             f"named {PREFIX}...)")
    return NodeCgroup(CgroupSupport(version, {}), dict(dirs))


def apply(cgroup: NodeCgroup, op: str, value: str | None) -> dict[str, Any]:
    """``op`` on ``cgroup``; what it read (``read``) or ``{}``."""
    if op == "set_cpu":
        cgroup.set_cpu(float(str(value)))
    elif op == "clear_cpu":
        cgroup.clear_cpu()
    elif op == "set_memory":
        cgroup.set_memory(int(str(value)))
    elif op == "set_memory_above":
        held, limit = cgroup.set_memory_above(int(str(value)))
        return {"held": held, "limit": limit}
    elif op == "clear_memory":
        cgroup.clear_memory()
    elif op == "read":
        return {"pids": cgroup.pids(), "agent_pids": cgroup.agent_pids(),
                "cpu_seconds": cgroup.cpu_seconds(), "throttled": cgroup.throttled(),
                "memory_bytes": cgroup.memory_bytes(), "oom_kills": cgroup.oom_kills()}
    else:
        raise ValueError(f"op {op!r} is not one of {', '.join(OPS)}")
    return {}


def main(argv: Sequence[str]) -> int:
    if len(argv) == 3 and argv[0] == "keep" and argv[2].isdigit():
        return keep(argv[1], int(argv[2]))
    if len(argv) in (4, 5) and argv[0] == "apply":
        try:
            cgroup = node_cgroup(int(argv[1]), json.loads(argv[2]))
            _say(apply(cgroup, argv[3], argv[4] if len(argv) == 5 else None))
        except OSError as e:
            _say({"error": e.strerror or str(e), "errno": e.errno})
            return 1
        except ValueError as e:
            _say({"error": str(e), "errno": None})
            return 2
        return 0
    sys.stderr.write("usage: python -m harness.sim.places.hosts.cgroup_keeper keep RUN_ID NODE | "
                     f"apply VERSION DIRS_JSON OP [VALUE] (OP: {', '.join(OPS)})\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

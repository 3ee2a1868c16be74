"""A job's shared filesystem on hosts that share one (the hosts file's ``shared_dir``).

Without it a job's ``{shared}`` on hosts is each host's own dir, and one node's checkpoint
is not another's (a resume on two hosts hung on the mismatch). Where every host of a job
names the same ``shared_dir`` (a path of a filesystem they all mount: NFS, a cluster
filesystem; the lab's hosts share this machine's), the job has one dir there,
``pe-shared-<this machine>-<pid>-<run id>``, holding its ``{shared}`` (``shared/``), its
``{tmp}`` (``scratch/``) and its exit-code orders (``orders/``: one file per order, which
every node's workers see, so the one that obeys it removes it for all: ``orders``).
Every node's agent makes them
(``mkdir -p``, with its other dirs) and ``close()`` removes the job's dir over a host's
connection. A controller
killed outright cannot; the next job of this machine on those hosts removes the dirs named
for this machine whose controller pid is dead (``sweep``), as dead owners' temp dirs,
namespaces and cgroups are removed here.

On a host whose capabilities list ``fuse`` each node's disk server serves the node its view
of that dir (``harness.sim.places.hosts.disks``), so the shared filesystem's faults
(``disk_full`` with no node, ``lose_unsynced``, ``torn``, ``on_file``) are carried out there
too, where one dir is every node's (``seen_by_all``) and every host serves it
(``shared_fs_refusal``).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence

from harness.hosts import HostError, HostSpec, SshHost, refusal
from harness.sim.leftovers import owner_alive
from harness.sim.schema import FUSE

__all__ = ["SharedDir", "seen_by_all", "shared_base", "shared_fs_refusal"]

PREFIX = "pe-shared-"


def shared_base(hosts: Sequence[HostSpec]) -> str | None:
    """The ``shared_dir`` every one of ``hosts`` names, or None (one names none, or another)."""
    bases = {spec.shared_dir for spec in hosts}
    return bases.pop() if len(bases) == 1 and None not in bases else None


def seen_by_all(hosts: Sequence[HostSpec], spread: Sequence[HostSpec]) -> bool:
    """Whether one dir of a job on ``hosts`` whose nodes may be on the hosts of ``spread``
    is seen by every node: the hosts share a filesystem, or the nodes are on one host."""
    return shared_base(hosts) is not None or len(set(spread)) <= 1


def shared_fs_refusal(hosts: Sequence[HostSpec], spread: Sequence[HostSpec]) -> str | None:
    """Why a fault on the shared filesystem of a job on ``hosts`` whose nodes may be on
    the hosts of ``spread`` cannot be carried out (one line), or None."""
    if not seen_by_all(hosts, spread):
        labels = ", ".join(sorted({spec.label for spec in spread}))
        return (f"the shared filesystem of a job whose nodes may be on hosts {labels} is each host's own dir: name "
                "one they share (shared_dir in the hosts or Slurm file)")
    for spec in dict.fromkeys(spread):
        why = refusal(spec, [FUSE])
        if why is not None:
            return f"the shared filesystem is served to each node by its host: {why}"
    return None


def _machine() -> str:
    return socket.gethostname() or "localhost"


class SharedDir:
    """A job's dir in the hosts' shared filesystem."""

    def __init__(self, base: str, run_id: str):
        self.base = base.rstrip("/") or "/"
        #: the job's dir there (what ``remove`` and a later job's ``sweep`` remove)
        self.root = f"{self.base}/{PREFIX}{_machine()}-{os.getpid()}-{run_id}"
        #: the job's ``{shared}``
        self.path = f"{self.root}/shared"
        #: the job's exit-code orders, seen by every node
        self.orders = f"{self.root}/orders"
        #: the job's ``{tmp}``: seen by every node, served by no node's disk server (no fault reaches it)
        self.scratch = f"{self.root}/scratch"
        self.swept = False

    def sweep(self, host: SshHost) -> list[str]:
        """Remove, over ``host``'s connection, the job dirs in the shared filesystem of
        controllers of this machine that are dead; their paths."""
        self.swept = True
        mine = f"{PREFIX}{_machine()}-"
        try:
            names = host.run(["ls", "-1", "--", self.base], check=False).stdout.split()
        except HostError:
            return []
        dead = []
        for name in names:
            pid, _, run_id = name[len(mine):].partition("-") if name.startswith(mine) else ("", "", "")
            if pid.isdigit() and run_id and not owner_alive(int(pid)):
                dead.append(f"{self.base}/{name}")
        if dead:
            try:
                host.run(["rm", "-rf", "--", *dead], check=False)
            except HostError:
                return []
        return dead

    def remove(self, host: SshHost) -> str | None:
        """Remove the job's dir over ``host``'s connection; a problem, or None."""
        try:
            done = host.run(["rm", "-rf", "--", self.root], check=False)
        except HostError as e:
            return f"the job's shared dir {self.root}: {e}"
        if done.returncode != 0:
            return f"the job's shared dir {self.root} on host {host.spec.label}: rm exited {done.returncode}"
        return None

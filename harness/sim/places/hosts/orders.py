"""Exit-code orders for a job's nodes on hosts: where ``job.processes`` leaves them.

An order is a file in the orders dir a worker's ``report_step`` looks in
(``harness.sim.faults.exit_order``); the worker obeys it by removing it, and the removal is
the claim: of two workers that find one file, one removes it and exits, the other reads
on. So an order must be *one* file that every worker it may concern sees:

* **The hosts share a filesystem** (``shared_dir``): the job's orders dir is there
  (``SharedDir.orders``), the same for every node. An exact (rank, step) order is obeyed
  once wherever the rank runs, by construction: there is no copy on another host for the
  rank to obey a second time after the restart the first one caused (copies on every
  host, removed once one was obeyed, were that race).
* **Otherwise** each host has its own (``<work dir>/orders``), shared by the job's nodes it
  carries: an order for a node's local rank goes to that node's host, and an exact order
  only where every node the job can have is on one host (it is refused otherwise,
  ``exact_order_refusal``, as a fault the hosts cannot do).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Protocol

from harness.hosts import HostError, HostSpec, SshHost
from harness.sim.errors import TargetNotReady
from harness.sim.places.hosts.shared import SharedDir, seen_by_all

__all__ = ["HostOrders", "exact_order_refusal"]

_log = logging.getLogger(__name__)


class OpenHosts(Protocol):
    """The job's hosts as its orders see them (``RemoteNodes``)."""

    def host_of(self, node: int) -> HostSpec: ...

    def opened(self, spec: HostSpec | None) -> SshHost | None:
        """``spec``'s open connection (None: any open one), or None: none is open."""
        ...


def exact_order_refusal(hosts: Sequence[HostSpec], spread: Sequence[HostSpec]) -> str | None:
    """Why an exact (rank, step) order cannot be left for a job on ``hosts`` whose nodes
    may be on the hosts of ``spread`` (one line), or None: they share a filesystem, or
    every node is on one host."""
    if seen_by_all(hosts, spread):
        return None
    labels = sorted({spec.label for spec in spread})
    return (f"an exact (rank, step) exit order (exit_code at AtStep) is one file that whichever node runs the rank "
            f"must see, and the job's nodes may be on hosts {', '.join(labels)}, which share no filesystem: name one "
            "they share (shared_dir in the hosts or Slurm file), or kill_worker at AtStep with a signal (no exit_code)")


class HostOrders:
    """A job's exit-code orders on its hosts (``RemoteNodes.orders``)."""

    def __init__(self, hosts: OpenHosts, shared: SharedDir | None):
        self._hosts = hosts
        self._shared = shared

    def dir_on(self, host: SshHost) -> str:
        """The orders dir the job's workers on ``host`` look in (``HARNESS_ORDERS``)."""
        return self._shared.orders if self._shared is not None else f"{host.work_dir}/orders"

    def leave(self, name: str, text: str, node: int | None) -> Callable[[], bool]:
        """Leave order ``name`` (``text``: its exit code) where the workers of ``node`` look
        (None: an exact order, where every node looks); whether it is still there (not
        obeyed yet). ``TargetNotReady`` where no connection to a host that would see it is
        open (none started yet, or one being reconnected)."""
        spec = None if self._shared is not None else self._hosts.host_of(0 if node is None else node)
        host = self._hosts.opened(spec)
        if host is None:
            raise TargetNotReady("node" if node is not None else "host", node if node is not None else "any",
                                 "has no open connection to leave an exit-code order through")
        path = host.write(f"{self.dir_on(host)}/{name}", text.encode())
        return lambda: self._left(spec, path)

    def _left(self, spec: HostSpec | None, path: str) -> bool:
        host = self._hosts.opened(spec)
        if host is None:  # the connection is gone, and a host's own orders dir with its work dir
            return False
        try:
            return host.run(["test", "-e", path], check=False).returncode == 0
        except HostError as e:
            _log.warning("the exit-code order %s: %s", path, e)
            return False

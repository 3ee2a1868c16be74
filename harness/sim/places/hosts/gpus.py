"""GPUs of nodes on hosts: each host's own devices (its spec's ``gpus``), split between
the job's nodes placed on it, and the backend that fits the whole job.

Here a cluster splits this machine's GPUs between node slots (``gpus.GpuPlan``). On hosts
the devices are the hosts': the hosts file lists them (``gpus = 8``, or the ids), as it
lists what else a host may do, so the split is known before anything connects and a
scenario's ``{backend}`` is the same for every node. Each host gets a ``GpuPlan`` over
the slots (nodes 0..max_nodes-1) placed on it, so two nodes on one 8-GPU host get 4
devices each and a node alone on one gets up to ``nproc_per_node``. NCCL only where every
worker of every host has a device of its own; a host that lists none makes the job gloo
(its workers see whatever the host shows: no ``CUDA_VISIBLE_DEVICES`` is set there).
"""

from __future__ import annotations

import functools
from collections.abc import Collection
from dataclasses import dataclass

from harness.hosts import HostSpec
from harness.sim.nodes.gpus import GpuPlan
from harness.sim.places.hosts.refusals import placed_hosts

__all__ = ["HostsGpuPlan"]


@dataclass(frozen=True)
class HostsGpuPlan:
    """The GPUs of a job's nodes on ``hosts`` (``Cluster.gpu_plan`` with hosts)."""

    hosts: tuple[HostSpec, ...]
    placement: tuple[int, ...] | None
    max_nodes: int
    nproc_per_node: int

    @functools.cached_property
    def _where(self) -> list[HostSpec]:
        """The host of each node slot (0..max_nodes-1)."""
        return placed_hosts(self.hosts, self.placement, self.max_nodes)

    def _slots_on(self, spec: HostSpec) -> list[int]:
        """The node slots placed on ``spec``, in order."""
        return [n for n, h in enumerate(self._where) if h == spec]

    def _plan(self, spec: HostSpec) -> GpuPlan:
        return GpuPlan(tuple(spec.gpus), max(1, len(self._slots_on(spec))), self.nproc_per_node)

    @property
    def backend(self) -> str:
        """``nccl`` when every worker on every host the job's slots use has a device of its
        own, else ``gloo``."""
        used = dict.fromkeys(self._where)
        return "nccl" if all(self._plan(spec).backend == "nccl" for spec in used) else "gloo"

    def slot(self, index: int) -> tuple[str, ...]:
        """The devices of node slot ``index`` (0 <= index < max_nodes) on its host."""
        if not 0 <= index < self.max_nodes:
            raise IndexError(f"slot {index} is not in 0..{self.max_nodes - 1}")
        spec = self._where[index]
        return self._plan(spec).slot(self._slots_on(spec).index(index))

    def for_node(self, index: int, spec: HostSpec, held: Collection[int]) -> tuple[int, tuple[str, ...]]:
        """Node ``index``'s slot and devices on ``spec``, its host: its own slot where it
        has one (index < max_nodes), else the lowest of that host's slots no live node
        holds (``held``), else none (no devices)."""
        slots = self._slots_on(spec)
        if index in slots:
            return index, self.slot(index)
        free = [s for s in slots if s not in held]
        return (free[0], self.slot(free[0])) if free else (index, ())

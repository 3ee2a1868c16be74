"""GPUs for simulated nodes: which devices exist, how they are split, which backend fits.

Detection never imports torch (an agent-sized cost the harness does not pay): the devices
are those named by ``CUDA_VISIBLE_DEVICES`` when it is set, else one per entry of
``/proc/driver/nvidia/gpus`` (the NVIDIA driver's own list), else one per ``GPU n:`` line
of ``nvidia-smi -L``, else none.

Slicing (``GpuPlan``): a cluster of ``max_nodes`` nodes x ``nproc_per_node`` workers has
``max_nodes`` slots. With at least one device per node the slots are disjoint, each of
``min(nproc_per_node, devices // max_nodes)`` devices; with fewer devices than nodes
(no disjoint split exists) slot ``i`` shares device ``i % devices``. The backend is NCCL
only when every worker has a device of its own (``devices >= max_nodes *
nproc_per_node``), else gloo (NCCL refuses two ranks on one device).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["GpuPlan", "detect_gpus", "VISIBLE_ENV"]

VISIBLE_ENV = "CUDA_VISIBLE_DEVICES"
_PROC_GPUS = "/proc/driver/nvidia/gpus"
_SMI_TIMEOUT = 10.0


def detect_gpus(env: Mapping[str, str] | None = None, proc_dir: str = _PROC_GPUS,
                smi: str | None = "nvidia-smi") -> tuple[str, ...]:
    """Device ids this process may hand out (strings, as ``CUDA_VISIBLE_DEVICES`` takes)."""
    env = os.environ if env is None else env
    visible = env.get(VISIBLE_ENV)
    if visible is not None:
        return _parse_visible(visible)
    try:
        count = len([e for e in os.listdir(proc_dir) if not e.startswith(".")])
    except OSError:
        count = _smi_count(smi) if smi else 0
    return tuple(str(i) for i in range(count))


def _parse_visible(text: str) -> tuple[str, ...]:
    """As CUDA reads it: comma-separated ids, cut at the first invalid one ("-1", empty)."""
    devices = []
    for item in text.split(","):
        item = item.strip()
        if not item or item.startswith("-"):
            break
        devices.append(item)
    return tuple(devices)


def _smi_count(smi: str) -> int:
    path = shutil.which(smi)
    if path is None:
        return 0
    try:
        out = subprocess.run([path, "-L"], capture_output=True, text=True, timeout=_SMI_TIMEOUT,
                             stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    if out.returncode != 0:
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


@dataclass(frozen=True)
class GpuPlan:
    """How ``devices`` are split between ``max_nodes`` node slots."""

    devices: tuple[str, ...]
    max_nodes: int
    nproc_per_node: int

    @classmethod
    def resolve(cls, gpus: int | Sequence[str | int] | None, max_nodes: int, nproc_per_node: int,
                env: Mapping[str, str] | None = None) -> GpuPlan:
        """``gpus``: None (detect), a count (ids 0..n-1, e.g. injected by a test) or ids."""
        if gpus is None:
            devices = detect_gpus(env)
        elif isinstance(gpus, bool) or not isinstance(gpus, (int, list, tuple)):
            from harness.errors import ConfigError

            raise ConfigError("gpus", gpus, "must be None (detect), a device count or a list of device ids")
        elif isinstance(gpus, int):
            if gpus < 0:
                from harness.errors import ConfigError

                raise ConfigError("gpus", gpus, "must be >= 0")
            devices = tuple(str(i) for i in range(gpus))
        else:
            devices = tuple(str(d) for d in gpus)
        return cls(devices, max_nodes, nproc_per_node)

    @property
    def per_node(self) -> int:
        """Devices in each slot (0: no GPUs)."""
        if not self.devices:
            return 0
        return max(1, min(self.nproc_per_node, len(self.devices) // self.max_nodes))

    @property
    def disjoint(self) -> bool:
        return len(self.devices) >= self.max_nodes

    @property
    def backend(self) -> str:
        """``nccl`` when every worker has its own device, else ``gloo``."""
        return "nccl" if self.devices and len(self.devices) >= self.max_nodes * self.nproc_per_node else "gloo"

    def slot(self, index: int) -> tuple[str, ...]:
        """The devices of slot ``index`` (0 <= index < max_nodes)."""
        if not 0 <= index < self.max_nodes:
            raise IndexError(f"slot {index} is not in 0..{self.max_nodes - 1}")
        if not self.devices:
            return ()
        if not self.disjoint:
            return (self.devices[index % len(self.devices)],)
        n = self.per_node
        return self.devices[index * n:(index + 1) * n]

    def __repr__(self) -> str:
        slots = [",".join(self.slot(i)) or "-" for i in range(self.max_nodes)]
        return f"GpuPlan({len(self.devices)} devices, slots={slots}, backend={self.backend})"

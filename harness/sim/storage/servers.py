"""Who serves a job's disks and its shared filesystem: the ``DiskServers`` a job's place
gives its storage part (``StorageFaults``), and this machine's, ``MountServers``.

On this machine one FUSE mount (``StorageMount``) serves every node's disk and the shared
filesystem. Elsewhere each node's disk may have a server of its own on the node's host
(``harness.sim.places.hosts.disks``), each also serving that node's view of the shared
filesystem: there a request for the shared filesystem goes to every node's server, and a
fault or watch on it reaches a server started later too. The storage part asks only
``DiskServers``; it never knows which.
"""

from __future__ import annotations

import os
from typing import Any, Protocol

from harness.errors import ConfigError
from harness.sim.storage.mount import StorageMount

__all__ = ["DiskServers", "MountServers"]


class DiskServers(Protocol):
    """Who serves each disk of a job (``device``: a node's index; None: the shared filesystem)."""

    def disk_of(self, node: int) -> str:
        """Node ``node``'s disk, as its workers see it (``{node_disk}``)."""
        ...

    def tmp_of(self, node: int) -> str:
        """Node ``node``'s workers' TMPDIR, on its disk's filesystem."""
        ...

    def check(self, device: int | None, what: str) -> None:
        """``ConfigError`` (naming ``what``: the fault kind, ``heal``...) where ``device`` is
        not served by the harness's filesystem, saying what is missing."""
        ...

    def check_watch(self, node: int | None, what: str) -> None:
        """``ConfigError`` where no server could see a file of ``node`` (None: anyone's) appear."""
        ...

    def call(self, device: int | None, op: str, /, **args: Any) -> list[Any]:
        """``op`` to every server of ``device`` now (the shared filesystem: each view of it);
        their answers, none where nothing serves it. A ``fault`` or ``watch`` on the shared
        filesystem reaches a server started later too; a ``heal`` of it ends that."""
        ...

    def mountpoint(self, device: int) -> str:
        """Where ``device``'s server mounts (the paths it names are below it)."""
        ...

    def close(self) -> list[str]:
        """End every server but the job's own mount (its part closes that last); what
        went wrong, one line each."""
        ...


class MountServers:
    """This machine's: the job's one mount serves every disk and the shared filesystem."""

    def __init__(self, mount: StorageMount):
        self._mount = mount

    def disk_of(self, node: int) -> str:
        return os.path.join(self._mount.mountpoint, f"node{node}", "disk")

    def tmp_of(self, node: int) -> str:
        return os.path.join(self._mount.mountpoint, f"node{node}", "tmp")

    def check(self, device: int | None, what: str) -> None:
        if not self._mount.available:
            raise ConfigError(what, "storage fault", f"needs the harness's FUSE filesystem; missing: "
                              f"{self._mount.missing or 'its server'}")

    def check_watch(self, node: int | None, what: str) -> None:
        self.check(node, what)

    def call(self, device: int | None, op: str, /, **args: Any) -> list[Any]:
        return [self._mount.call(op, **args)] if self._mount.available else []

    def mountpoint(self, device: int) -> str:
        return self._mount.mountpoint

    def close(self) -> list[str]:
        """Nothing: the mount is the storage part's own."""
        return []

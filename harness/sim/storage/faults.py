"""A job's storage: its filesystem (shared and per-node disks) and the faults you can inject.

``job.storage`` is made with the job, which it sees only as a ``FaultTarget``. Its
``shared_dir`` and ``node_disk(i)`` live on one FUSE mount the harness serves
(``harness.sim.storage.mount``): ``fs/shared`` is the shared filesystem every node sees
(checkpoints), ``fs/node<i>`` node i's local disk (``disk``: the job's ``node_disk(i)``,
``tmp``: its workers' TMPDIR; the agent keeps its own temp files, its timer FIFOs and logs,
off it: ``harness.sim.nodes.main``). The faults:

* ``disk_full(node=None)``: writes, fsyncs and mkdirs there fail with ENOSPC (None: the
  shared filesystem), until healed;
* ``slow_io(node=None, delay=0.2)``: every write and fsync request (up to 1 MiB each) there
  takes ``delay`` seconds longer, until healed;
* ``io_error(node=None, errno=EIO, path="*", probability=1.0)``: opens, reads, writes and
  fsyncs of files matching ``path`` there fail with ``errno`` (each with ``probability``),
  until healed;
* ``crash(node, torn)``: what node ``node`` wrote and never fsynced is rolled back (the
  process part's ``kill_node(node, lose_unsynced=True)`` calls it once the node is dead;
  the semantics are ``harness.sim.storage.record``'s);
* watches for ``OnFile``: a create or rename of a matching file is held inside the
  filesystem until the fault it triggers has been applied, so a kill lands between two
  steps of a save (DCP's write-then-rename of ``.metadata``): the held request sleeps on the
  scheduler's ``await_applied``, woken as the fault settles, never on a polling tick.

Each fault is a ``fault`` event on the timeline; ``heal`` ends the lasting ones (a ``heal``
event naming what ended). Faults still in place when the job ends are reported (a warning
and a ``storage_unhealed`` event). Without FUSE the directories are plain ones and every
fault raises ``ConfigError`` naming what is missing.
"""

from __future__ import annotations

import errno as errno_module
import itertools
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from harness.errors import ConfigError
from harness.sim.faults.target import Ended, record_fault
from harness.sim.storage.mount import StorageMount

if TYPE_CHECKING:
    from harness.sim.faults.target import FaultTarget
    from harness.sim.storage.servers import DiskServers

#: the job's place's servers of its disks, made with the job's mount and the part's answer
#: to a server's requests (``JobPlace.disk_servers``: ``MountServers`` on this machine)
ServersOfPlace = Callable[[StorageMount, Callable[[str, dict[str, Any]], Any]], "DiskServers"]

__all__ = ["StorageFaults", "HOLD_LIMIT"]

#: seconds a held file operation waits for its fault to be applied (then it goes on)
HOLD_LIMIT = 25.0


def _device_name(node: int | None) -> str:
    return "shared" if node is None else f"node{node}"


class StorageFaults:
    """The job's filesystem and its storage faults (``job.storage``)."""

    def __init__(self, target: FaultTarget, servers: ServersOfPlace):
        # weakly: the mount's request thread holds this part, and must not keep the job alive
        self._target_ref = weakref.ref(target)
        self.mount = StorageMount(target.directory, target.events_path, target.run_id,
                                  on_request=self._on_request, standby=target.cluster.pool.storage_server(),
                                  give_back=target.cluster.pool.return_storage_server)
        os.makedirs(os.path.join(self.mount.root, "shared"))
        #: ``{tmp}`` in the job's args: a fresh dir of this job's that every node here sees
        #: and no storage fault reaches (beside the mount, not in it). A twin is a new job:
        #: it never finds the faulted run's files there
        self.scratch_dir = os.path.join(target.directory, "scratch")
        os.makedirs(self.scratch_dir)
        self._open: dict[int | None, list[str]] = {}  # device -> lasting faults in place
        self._watch_ids = itertools.count(1)
        self._watches: dict[int, object] = {}  # watch id -> its trigger (held strongly)
        self._watch_of: dict[int, int] = {}  # id(trigger) -> watch id
        self._seen: dict[int, float] = {}  # watch id -> monotonic time its file was seen
        self._lock = threading.Lock()
        self.lost: list[dict[str, Any]] = []  # what crashes rolled back (tests, reports)
        #: who serves each disk: the job's place says (this machine: the mount above)
        self._servers: DiskServers = servers(self.mount, self._on_request)

    @property
    def _target(self) -> FaultTarget:
        target = self._target_ref()
        assert target is not None, "the job of this storage is gone"
        return target

    # -- where ------------------------------------------------------------------------------

    @property
    def shared_dir(self) -> str:
        return os.path.join(self.mount.mountpoint, "shared")

    def disk_of(self, node: int) -> str:
        """Node ``node``'s disk (a path of its host's, for a node started on one)."""
        return self._servers.disk_of(node)

    def tmp_of(self, node: int) -> str:
        """Node ``node``'s workers' TMPDIR: on its disk, beside ``disk_of(node)``."""
        return self._servers.tmp_of(node)

    def add_node(self, node: int) -> None:
        """Make node ``node``'s disk and temp dir (in the backing directory: no wait for the mount)."""
        for sub in ("disk", "tmp"):
            os.makedirs(os.path.join(self.mount.root, f"node{node}", sub), exist_ok=True)

    def ready(self) -> None:
        """Until the filesystem is served (before the first node starts)."""
        self.mount.wait_mounted()

    @property
    def available(self) -> bool:
        return self.mount.available

    def require(self, what: str) -> None:
        """``ConfigError`` naming what is missing, where the filesystem is a plain directory."""
        if not self.mount.available:
            raise ConfigError(what, "storage fault", f"needs the harness's FUSE filesystem; missing: "
                              f"{self.mount.missing or 'its server'}")

    # -- faults -----------------------------------------------------------------------------

    def _where(self, node: int | None) -> dict[str, Any]:
        if node is not None:
            self._target.node(node)  # an unknown node raises, naming the valid ones
        return {"target_node": node} if node is not None else {}

    def _lasting(self, kind: str, node: int | None, **params: Any) -> None:
        where = self._where(node)
        self._servers.check(node, kind)
        record_fault(self._target, kind, device=_device_name(node), **where, **params)
        with self._lock:
            self._servers.call(node, "fault", device=node, kind=kind, **params)
            self._open.setdefault(node, []).append(kind)

    def disk_full(self, node: int | None = None) -> None:
        """Writes, fsyncs and mkdirs on node ``node``'s disk (None: the shared filesystem)
        fail with ENOSPC until healed."""
        self._lasting("disk_full", node)

    def slow_io(self, node: int | None = None, delay: float = 0.2) -> None:
        """Every write and fsync request there takes ``delay`` seconds longer until healed."""
        if not isinstance(delay, (int, float)) or isinstance(delay, bool) or delay < 0:
            raise ConfigError("delay", delay, "must be a number of seconds >= 0")
        self._lasting("slow_io", node, delay=float(delay))

    def io_error(self, node: int | None = None, errno: int = errno_module.EIO, path: str = "*",
                 probability: float = 1.0) -> None:
        """Opens, reads, writes and fsyncs of files matching ``path`` (a glob on the path
        below the disk's root, or on the file name) fail with ``errno`` until healed."""
        if not isinstance(errno, int) or isinstance(errno, bool) or errno <= 0:
            raise ConfigError("errno", errno, "must be a positive errno number (e.g. errno.EIO)")
        if not isinstance(probability, (int, float)) or isinstance(probability, bool) or not 0 <= probability <= 1:
            raise ConfigError("probability", probability, "must be a number in [0, 1]")
        if not isinstance(path, str) or not path:
            raise ConfigError("path", path, 'must be a glob, e.g. "*.distcp"')
        seed = self._target.cluster.config.seed * 1_000_003 + sum(len(v) for v in self._open.values())
        self._lasting("io_error", node, errno=errno, path=path, probability=float(probability), seed=seed)

    def end_lasting(self, node: int | None = None) -> Ended:
        """End the lasting storage faults of node ``node``'s disk (None: of every disk and
        the shared filesystem); what ended, with the disks (``storage={disk: kinds}``, a
        field of the ``heal`` event ``Job.heal`` records)."""
        with self._lock:
            devices = list(self._open) if node is None else [node]
            if not any(self._open.get(d) for d in devices):
                return Ended()
            for d in devices:
                self._open.pop(d, None)
        per_disk: dict[str, list[str]] = {}
        for d in devices:
            for healed in self._servers.call(d, "heal", device=d):  # the shared filesystem: each view's
                for disk, kinds in healed.items():
                    per_disk[disk] = sorted({*per_disk[disk], *kinds}) if disk in per_disk else kinds
        names = sorted({kind for kinds in per_disk.values() for kind in kinds})
        return Ended(names, {"storage": per_disk} if per_disk else {})

    def open_faults(self) -> dict[str, list[str]]:
        """disk -> the lasting storage faults still in place there."""
        with self._lock:
            return {_device_name(d): list(kinds) for d, kinds in self._open.items() if kinds}

    def crash(self, node: int, torn: bool = False) -> list[dict[str, Any]]:
        """Roll back what node ``node`` wrote and never fsynced (it is dead by now); what
        was lost, per file, also on the timeline as a ``storage_lost`` event."""
        self._servers.check(node, "lose_unsynced")
        lost: list[dict[str, Any]] = [entry for answer in self._servers.call(node, "crash", node=node, torn=torn)
                                      for entry in answer]
        for entry in lost:  # paths in the mount -> the paths the job sees (on a host: there)
            entry["path"] = os.path.join(self._servers.mountpoint(node), entry["path"].lstrip("/"))
        self.lost.extend(lost)
        self._target.harness_events.emit("storage_lost", target_node=node, torn=torn, files=lost)
        return lost

    def unsynced(self, node: int | None = None) -> list[dict[str, Any]]:
        """Files with writes not fsynced yet (by ``node``, or anyone's)."""
        return [entry for answer in self._servers.call(node, "dirty", node=node) for entry in answer]

    # -- OnFile ---------------------------------------------------------------------------

    def file_seen(self, trigger: object, glob: str, node: int | None) -> bool:
        """Whether a file matching ``glob`` was created or renamed (by ``node``) since the
        trigger was armed; the first call arms the watch in the server (on hosts: in the
        server of ``node``'s disk, or of every node's with None)."""
        self._servers.check_watch(node, "on_file")
        with self._lock:
            ident = self._watch_of.get(id(trigger))
            if ident is None:
                ident = next(self._watch_ids)
                self._watch_of[id(trigger)] = ident
                self._watches[ident] = trigger
                arm = True
            else:
                arm = False
                if ident in self._seen:
                    return True
        if arm:
            with self._lock:  # of every node's (None): a server started later gets it too
                self._servers.call(node, "watch", ident=ident, glob=glob, node=node)
        return False

    def _on_request(self, op: str, args: dict[str, Any]) -> Any:
        """The server asks: a watched file appeared; answer once its fault was applied
        (or failed, or ``HOLD_LIMIT`` passed: the operation goes on either way)."""
        if op != "file_event":
            return None
        ident = int(args["watch"])
        with self._lock:
            trigger = self._watches.get(ident)
            self._seen[ident] = time.monotonic()
        target = self._target_ref()
        if target is None or trigger is None:
            return None
        target.harness_events.emit("file_event", op=args.get("action"), path=args.get("path"), to=args.get("to"),
                                   writer=args.get("node"))
        return "applied" if target.scheduler.await_applied(trigger, HOLD_LIMIT) else "timeout"

    # -- the end ----------------------------------------------------------------------------

    def close(self) -> list[Warning]:
        """End the servers (nothing stays mounted), recording faults still in place; the
        warnings to give once everything of the job is closed (``Cluster.close``: under
        ``-W error`` a warning given here was raised before the rest was closed)."""
        if self.mount.closed:
            return []
        still = self.open_faults()
        target = self._target_ref()
        found: list[Warning] = []
        if still and target is not None:
            text = ", ".join(f"{d}: {'+'.join(kinds)}" for d, kinds in sorted(still.items()))
            target.harness_events.emit("storage_unhealed", faults=still)
            found.append(UserWarning(f"job {target.run_id}: storage faults still in place when the job ended "
                                     f"({text}); heal them in the test (job.heal()), or expect them"))
        try:
            found += [RuntimeWarning(problem) for problem in self._servers.close()]
        finally:
            self.mount.close()
        return found

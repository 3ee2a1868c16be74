"""The harness's filesystem server: ``python -m harness.sim.storage.server`` (one job at a time).

A passthrough FUSE filesystem (``mfusepy``, over libfuse 3) on the job's ``fs`` directory,
backed by a plain directory. Its first path component is the *device* a path lives on:
``shared`` (the job's shared filesystem) or ``node<i>`` (node i's local disk); a rename
between two devices fails with EXDEV, as between two real filesystems. It keeps the
write-back record (``harness.sim.storage.record``), knows which node wrote what
(``harness.sim.storage.owners``) and applies the storage faults the harness sets over
the control link (``harness.sim.storage.link``): ENOSPC, delays, injected errnos, node
crashes that roll back unsynced data, and watches that hold a create or rename of a
matching file until the harness has applied the fault it triggers.

It starts standing by and mounts when the harness orders it (``harness.sim.storage.standby``:
a pool keeps one ready so a launch does not wait for this process's start). SIGTERM makes
libfuse leave its loop and unmount; the server then closes everything the job left open,
says ``released`` and stands by for the next job's order. It dies with its parent
(PDEATHSIG: SIGTERM, so a mounted one unmounts first). A SIGKILLed server leaves a dead
mount behind: the harness unmounts it (``harness.sim.storage.mount``), and the next harness
process sweeps mounts whose owner died.
"""

from __future__ import annotations

import argparse
import errno
import fnmatch
import os
import random
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from harness.sim.storage.link import Link, LinkClosed
from harness.sim.storage.owners import Owners
from harness.sim.storage.record import WriteBack

__all__ = ["main", "Device", "device_of"]

Device = int | None  # None: the shared filesystem; i: node i's disk
#: seconds a held operation waits for the harness to apply the fault its watch triggers
HOLD_TIMEOUT = 30.0


def device_of(path: str) -> Device:
    """``/shared/...`` -> None, ``/node3/...`` -> 3 (and anything else -> None)."""
    head = path.lstrip("/").split("/", 1)[0]
    if head.startswith("node") and head[4:].isdigit():
        return int(head[4:])
    return None


def _relative(path: str) -> str:
    """The path below its device's root: ``/shared/ckpt/x`` -> ``ckpt/x``."""
    parts = path.lstrip("/").split("/", 1)
    return parts[1] if len(parts) > 1 else ""


def _matches(path: str, glob: str) -> bool:
    rel = _relative(path)
    return fnmatch.fnmatchcase(rel, glob) or fnmatch.fnmatchcase(os.path.basename(rel), glob)


def _gone(pid: int) -> bool:
    """Whether the thread ``pid`` died (a zombie, or dying: a SIGKILL pending counts)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as fp:
            status = fp.read()
    except OSError:
        return True
    for line in status.splitlines():
        if line.startswith(b"State:") and line.split()[1] in (b"Z", b"X"):
            return True
        if line.startswith((b"SigPnd:", b"ShdPnd:")) and int(line.split()[1], 16) & (1 << (signal.SIGKILL - 1)):
            return True
    return False


@dataclass
class ErrorRule:
    errno: int
    glob: str
    probability: float
    rng: random.Random

    def hits(self, path: str) -> bool:
        return _matches(path, self.glob) and (self.probability >= 1.0 or self.rng.random() < self.probability)


@dataclass
class DeviceFaults:
    full: bool = False
    delay: float = 0.0
    errors: list[ErrorRule] = field(default_factory=list)

    def kinds(self) -> list[str]:
        return (["disk_full"] if self.full else []) + (["slow_io"] if self.delay else []) + \
            ["io_error"] * len(self.errors)


@dataclass(frozen=True)
class Watch:
    ident: int
    glob: str
    node: int | None


@dataclass
class Handle:
    fd: int
    path: str
    device: Device
    node: int | None
    key: tuple[int, int]


class StorageServer:
    """The filesystem operations (an ``mfusepy.Operations``) and the fault state."""

    use_ns = True

    def __init__(self, backing: str, events_path: str | None, devices: dict[str, str] | None = None):
        self.root = os.path.realpath(backing)
        #: a device (``shared``) backed elsewhere than below ``root``: on a host, the job's
        #: dir in the filesystem the hosts share, which each host's server serves to its
        #: node (so a write there is that node's, and its crash rolls it back)
        self.devices = {f"/{name}": os.path.realpath(path) for name, path in (devices or {}).items()}
        self.owners = Owners(events_path)
        self.writeback = WriteBack()
        self.faults: dict[Device, DeviceFaults] = {}
        self.watches: dict[int, Watch] = {}
        self.fenced: set[int] = set()  # crashed nodes: whatever of theirs still arrives fails
        self.handles: dict[int, Handle] = {}
        self.in_flight: dict[int | None, int] = {}  # node -> its writes and fsyncs being served
        self._flight_lock = threading.Lock()
        self.control_link: Link | None = None
        self.mounted = threading.Event()
        self.seen_errors: dict[str, int] = {}  # fault kind -> operations it failed (reports, bench)
        self.writes = 0  # write requests served, and the largest (the bench's max_write check)
        self.largest_write = 0

    # -- control (requests from the harness) ------------------------------------------------

    def control(self, op: str, args: dict[str, Any]) -> Any:
        if op == "fault":
            return self._set_fault(args)
        if op == "heal":
            return self._heal(args.get("device", "all"))
        if op == "crash":
            node = int(args["node"])
            self.fenced.add(node)  # nothing of its is let in any more; then what is in flight ends
            deadline = time.monotonic() + 2.0
            while self.in_flight.get(node) and time.monotonic() < deadline:
                time.sleep(0.001)
            return [vars(lost) for lost in self.writeback.crash(node, bool(args.get("torn")))]
        if op == "watch":
            watch = Watch(int(args["ident"]), str(args["glob"]), args.get("node"))
            self.watches[watch.ident] = watch
            return None
        if op == "unwatch":
            self.watches.pop(int(args["ident"]), None)
            return None
        if op == "dirty":
            return [{"path": r.path, "writers": sorted(w for w in r.writers if w is not None),
                     "unsynced_bytes": r.unsynced_bytes, "synced_size": r.synced_size}
                    for r in self.writeback.dirty(args.get("node"))]
        if op == "owner":
            self.owners.add(int(args["pid"]), int(args["node"]))
            return None
        if op == "stats":
            return {"errors": dict(self.seen_errors), "writes": self.writes, "largest_write": self.largest_write}
        raise ValueError(f"unknown storage control op {op!r}")

    def _set_fault(self, args: dict[str, Any]) -> list[str]:
        device: Device = args.get("device")
        faults = self.faults.setdefault(device, DeviceFaults())
        kind = args["kind"]
        if kind == "disk_full":
            faults.full = True
        elif kind == "slow_io":
            faults.delay = float(args["delay"])
        elif kind == "io_error":
            faults.errors.append(ErrorRule(int(args["errno"]), str(args["path"]), float(args["probability"]),
                                           random.Random(int(args.get("seed", 0)))))
        else:
            raise ValueError(f"unknown storage fault {kind!r}")
        return faults.kinds()

    def _heal(self, device: Any) -> dict[str, list[str]]:
        """End the lasting faults of ``device`` ("all": of every device); what ended, per device."""
        devices = list(self.faults) if device == "all" else [device]
        healed = {}
        for d in devices:
            faults = self.faults.pop(d, None)
            if faults is not None and faults.kinds():
                healed["shared" if d is None else f"node{d}"] = faults.kinds()
        return healed

    def forget_mount(self) -> None:
        """After the unmount: close every descriptor this mount held (open handles, and the
        write-back record's), so the process can serve the next job with nothing of this one."""
        for fd in list(self.handles):
            self.handles.pop(fd, None)
            try:
                os.close(fd)
            except OSError:
                pass
        self.writeback.forget()

    # -- helpers ------------------------------------------------------------------------------

    def _real(self, path: str) -> str:
        if self.devices:
            head, slash, rest = path.partition("/")[2].partition("/")
            elsewhere = self.devices.get(f"/{head}")
            if elsewhere is not None:
                return elsewhere + slash + rest
        return self.root + path

    def _caller(self) -> int | None:
        import mfusepy

        return self.owners.node_of(mfusepy.fuse_get_context()[2])

    def _check(self, op: str, path: str, node: int | None, device: Device, space: bool = False) -> None:
        """Raise the error an active fault gives ``op`` on ``path``, after its delay."""
        if node is not None and node in self.fenced:
            raise OSError(errno.EIO, "the node crashed")
        faults = self.faults.get(device)
        if faults is None:
            return
        if faults.delay and op in ("write", "fsync"):
            time.sleep(faults.delay)
        if space and faults.full:
            self._count("disk_full")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        for rule in faults.errors:
            if rule.hits(path):
                self._count("io_error")
                raise OSError(rule.errno, os.strerror(rule.errno))

    def _count(self, kind: str) -> None:
        self.seen_errors[kind] = self.seen_errors.get(kind, 0) + 1

    def _hold(self, op: str, path: str, node: int | None, to: str | None = None) -> None:
        """If a watch matches ``path`` (or a rename's new name ``to``), hold this operation
        until the harness answers (it applies the fault the watch triggers meanwhile); then
        fail it, never performed, if the caller did not survive."""
        if not self.watches:
            return
        for watch in list(self.watches.values()):
            if watch.node is not None and watch.node != node:
                continue
            if not (_matches(path, watch.glob) or (to is not None and _matches(to, watch.glob))):
                continue
            import mfusepy

            pid = mfusepy.fuse_get_context()[2]
            self.watches.pop(watch.ident, None)  # a watch fires once
            if self.control_link is not None:
                try:
                    self.control_link.call("file_event", timeout=HOLD_TIMEOUT, watch=watch.ident, action=op, path=path,
                                   to=to, node=node)
                except (LinkClosed, TimeoutError, RuntimeError):
                    pass
            if _gone(pid) or (node is not None and node in self.fenced):
                raise OSError(errno.EINTR, "the caller died while the harness held its operation")
            return

    # -- the filesystem -----------------------------------------------------------------------

    def init(self, path: str) -> None:
        self.mounted.set()
        if self.control_link is not None:
            try:
                self.control_link.call("mounted", timeout=5.0)
            except (LinkClosed, TimeoutError, RuntimeError):
                pass

    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        st = os.fstat(fh) if fh is not None and fh in self.handles else os.lstat(self._real(path))
        return {"st_mode": st.st_mode, "st_ino": st.st_ino, "st_nlink": st.st_nlink, "st_uid": st.st_uid,
                "st_gid": st.st_gid, "st_size": st.st_size, "st_blocks": st.st_blocks,
                "st_atime": st.st_atime_ns, "st_mtime": st.st_mtime_ns, "st_ctime": st.st_ctime_ns}

    def access(self, path: str, amode: int) -> int:
        if not os.access(self._real(path), amode):
            raise OSError(errno.EACCES, os.strerror(errno.EACCES))
        return 0

    def readdir(self, path: str, fh: int) -> list[str]:
        return [".", "..", *os.listdir(self._real(path))]

    def readlink(self, path: str) -> str:
        return os.readlink(self._real(path))

    def statfs(self, path: str) -> dict[str, Any]:
        sv = os.statvfs(self._real(path))
        values = {key: getattr(sv, key) for key in ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail",
                                                    "f_files", "f_ffree", "f_favail", "f_flag", "f_namemax")}
        if self.faults.get(device_of(path), DeviceFaults()).full:
            values["f_bfree"] = values["f_bavail"] = 0
        return values

    def mkdir(self, path: str, mode: int) -> int:
        node = self._caller()
        self._check("mkdir", path, node, device_of(path), space=True)
        os.mkdir(self._real(path), mode)
        return 0

    def rmdir(self, path: str) -> int:
        os.rmdir(self._real(path))
        return 0

    def unlink(self, path: str) -> int:
        real = self._real(path)
        st = os.lstat(real)
        os.unlink(real)
        self.writeback.unlinked((st.st_dev, st.st_ino), st.st_nlink - 1)
        return 0

    def symlink(self, target: str, source: str) -> int:
        os.symlink(source, self._real(target))
        return 0

    def link(self, target: str, source: str) -> int:
        os.link(self._real(source), self._real(target))
        return 0

    def rename(self, old: str, new: str) -> int:
        if device_of(old) != device_of(new) or old.lstrip("/").split("/")[0] != new.lstrip("/").split("/")[0]:
            raise OSError(errno.EXDEV, os.strerror(errno.EXDEV))
        node = self._caller()
        self._check("rename", new, node, device_of(new))
        self._hold("rename", old, node, to=new)
        real_new = self._real(new)
        try:
            st = os.lstat(real_new)
        except FileNotFoundError:
            st = None
        os.rename(self._real(old), real_new)
        if st is not None and not os.path.isdir(real_new):
            self.writeback.unlinked((st.st_dev, st.st_ino), st.st_nlink - 1)
        return 0

    def chmod(self, path: str, mode: int) -> int:
        os.chmod(self._real(path), mode)
        return 0

    def chown(self, path: str, uid: int, gid: int) -> int:
        os.chown(self._real(path), uid, gid)
        return 0

    def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
        os.utime(self._real(path), ns=times) if times is not None else os.utime(self._real(path))
        return 0

    def truncate(self, path: str, length: int, fh: int | None = None) -> int:
        handle = self.handles.get(fh) if fh is not None else None
        device = device_of(path) if handle is None else handle.device
        node = self._caller() if handle is None else handle.node
        faults = self.faults.get(device)
        if faults is not None and faults.full and length > 0:
            self._check("truncate", path, node, device, space=True)
        if handle is not None:
            os.ftruncate(handle.fd, length)
            self.writeback.truncated(handle.key, length)
        else:
            real = self._real(path)
            os.truncate(real, length)
            st = os.stat(real)
            self.writeback.truncated((st.st_dev, st.st_ino), length)
        return 0

    def _handle(self, path: str, fd: int, node: int | None) -> int:
        st = os.fstat(fd)
        self.handles[fd] = Handle(fd, path, device_of(path), node, (st.st_dev, st.st_ino))
        return fd

    def open(self, path: str, flags: int) -> int:
        node = self._caller() if flags & (os.O_WRONLY | os.O_RDWR) else None
        self._check("open", path, node, device_of(path))
        fd = os.open(self._real(path), flags & ~os.O_CREAT | os.O_CLOEXEC)
        if flags & os.O_TRUNC:
            st = os.fstat(fd)
            self.writeback.truncated((st.st_dev, st.st_ino), 0)
        return self._handle(path, fd, node)

    def create(self, path: str, mode: int, flags: int = os.O_WRONLY) -> int:
        node = self._caller()
        self._check("create", path, node, device_of(path))
        self._hold("create", path, node)
        fd = os.open(self._real(path), flags | os.O_CREAT | os.O_CLOEXEC, mode)
        if flags & os.O_TRUNC:
            st = os.fstat(fd)
            self.writeback.truncated((st.st_dev, st.st_ino), 0)
        return self._handle(path, fd, node)

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        handle = self.handles[fh]
        if self.faults:
            self._check("read", handle.path, None, handle.device)
        return os.pread(fh, size, offset)

    def _enter(self, node: int | None) -> None:
        with self._flight_lock:
            self.in_flight[node] = self.in_flight.get(node, 0) + 1

    def _leave(self, node: int | None) -> None:
        with self._flight_lock:
            self.in_flight[node] -= 1

    def write_buf(self, path: str, source: Any, offset: int, fh: int) -> int:
        """Every write (libfuse calls this instead of ``write``): its buffer goes to the backing
        file by libfuse's own copy, without a ``bytes`` copy (``harness.sim.storage.fast_path``)."""
        from harness.sim.storage.fast_path import buffer_size, copy_buffer_to_fd

        handle = self.handles[fh]
        size = buffer_size(source)
        self._enter(handle.node)
        try:
            if self.faults or self.fenced:
                self._check("write", handle.path, handle.node, handle.device, space=True)
            self.writeback.before_write(handle.key, fh, handle.path, handle.node, offset, size)
            self.writes += 1
            self.largest_write = max(self.largest_write, size)
            return copy_buffer_to_fd(source, size, fh, offset)
        finally:
            self._leave(handle.node)

    def fsync(self, path: str, datasync: int, fh: int) -> int:
        handle = self.handles[fh]
        self._enter(handle.node)
        try:
            if self.faults or self.fenced:
                self._check("fsync", handle.path, handle.node, handle.device, space=True)
            if datasync:
                os.fdatasync(fh)
            else:
                os.fsync(fh)
            self.writeback.synced(handle.key)
            return 0
        finally:
            self._leave(handle.node)

    def flush(self, path: str, fh: int) -> int:
        return 0  # close() makes nothing durable

    def release(self, path: str, fh: int) -> int:
        self.handles.pop(fh, None)
        os.close(fh)
        return 0

    def opendir(self, path: str) -> int:
        return 0

    def releasedir(self, path: str, fh: int) -> int:
        return 0

    def fsyncdir(self, path: str, datasync: int, fh: int) -> int:
        return 0  # namespace operations are durable on return (record.py)


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--control-fd", type=int, help="the control link (its orders come on it)")
    where.add_argument("--control-socket", help="a Unix socket path to take the control link on (one connection: "
                                                "a node's on a host, forwarded over its SSH connection)")
    p.add_argument("--parent", type=int, default=None, help="die when this pid (our parent) does")
    return p.parse_args(argv)


def _accept_one(path: str) -> socket.socket:
    """Listen at ``path`` (0600: only this user may connect), say so on stdout (the harness
    waits for that line before it connects through its forward), take one connection, and
    listen no more."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        listener.bind(path)
    finally:
        os.umask(old)
    listener.listen(1)
    print("listening", flush=True)
    try:
        conn, _ = listener.accept()
    finally:
        listener.close()
        os.unlink(path)
    return conn


class _Orders:
    """The handler of a server standing by: it takes one ``mount`` order and nothing else."""

    def __init__(self) -> None:
        self._given: dict[str, Any] | None = None
        self._event = threading.Event()

    def take(self, op: str, args: dict[str, Any]) -> None:
        if op != "mount" or self._event.is_set():
            raise ValueError(f"a storage server standing by takes one mount order, not {op!r}")
        self._given = args
        self._event.set()

    def wait(self, link: Link) -> dict[str, Any] | None:
        """The next order (then ready for another), or None once the link closed without
        one (the harness let this server go, or died)."""
        while not self._event.wait(0.5):
            if link.closed:
                return None
        given, self._given = self._given, None
        self._event.clear()
        return given


def _log_to(path: str) -> None:
    """From now on stdout and stderr go to the job's log (a standby's went to a pipe)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
    for target in (1, 2):
        os.dup2(fd, target)
    os.close(fd)


def _serve(order: dict[str, Any], link: Link, filesystem: type) -> bool:
    """Mount and serve one job's filesystem until SIGTERM (libfuse then unmounts); whether
    it mounted (a server whose mount failed is not used again)."""
    _log_to(str(order["log"]))
    server = StorageServer(str(order["backing"]), order.get("events"), order.get("devices"))
    server.control_link = link
    link.handler = server.control
    try:
        # no attribute caching in the kernel: a crash rolls files back behind its back
        filesystem(server, str(order["mountpoint"]), foreground=True, fsname=str(order["fsname"]),
                   subtype="harness", attr_timeout=0, entry_timeout=0, negative_timeout=0)
    except RuntimeError as e:  # libfuse's loop ended by our SIGTERM returns non-zero too
        if not server.mounted.is_set():
            print(f"harness storage server: mount failed ({e})", file=sys.stderr)
    server.forget_mount()
    return server.mounted.is_set()


def main(argv: list[str] | None = None) -> int:
    """Stand by (imports done) until the control link orders a mount, serve it until
    SIGTERM, say so (``released``) and stand by for the next job's order: one process
    serves job after job of a pool (``harness.sim.storage.standby``)."""
    args = _parse(sys.argv[1:] if argv is None else argv)
    if args.parent is not None:
        from harness.procs import die_with_parent

        die_with_parent(args.parent, signal.SIGTERM)  # SIGTERM: libfuse unmounts on its way out
    import resource

    from harness.sim.storage.fast_path import FastFUSE

    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)  # a descriptor per open file, and
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # one per file with unsynced writes
    orders = _Orders()
    control = socket.socket(fileno=args.control_fd) if args.control_fd is not None else _accept_one(args.control_socket)
    link = Link(control, orders.take, "storage-server")
    while (order := orders.wait(link)) is not None:
        mounted = _serve(order, link, FastFUSE)
        link.handler = orders.take  # before the harness hears of it: its next order lands here
        if not mounted:
            return 1
        try:
            link.call("released", timeout=5.0)
        except (LinkClosed, TimeoutError, RuntimeError):
            return 0
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # unmounted: nothing left to finalize, and the harness waits for this exit

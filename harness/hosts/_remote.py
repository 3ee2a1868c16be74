"""What runs on the host, sent as source with ``python -c``: this module is never imported
there, and must stay standard library only and free of the rest of the project (the host
may not have pytest-elastic yet: the lease is what tells us so).

Two modes, both tied to the SSH channel's stdin, the one thing that reliably ends when
the controller does (its process dies, its fds close, sshd sees EOF on the channel; a
connection that drops closes the channel too):

``lease LOST_AFTER [BASE]``
    The connection's own session. Makes a fresh work dir (under BASE or the host's temp
    dir) and holds an exclusive ``flock`` on its ``.lease`` file, prints one JSON line
    (interpreter, pytest-elastic's version, the work dir, its pid), then serves stdin:
    ``ping N`` is answered at once with ``{"pong": N, "wall": time.time(), "mono":
    time.monotonic()}`` (the clock offset, ``_clock``), any line counts as a heartbeat.
    It ends at EOF, or when the controller has been silent for LOST_AFTER seconds (or three
    times the longest gap it has shown, if longer; 0: never): a frozen controller, or a
    link that hangs without closing. Ending, it lets go of the lock (every command's
    supervisor then ends its group), waits for those supervisors to be gone (the
    ``.running`` lock), and only then removes the work dir, so that nothing a dying
    command writes there outlives it.
``run GRACE WORK_DIR ARGV...``
    Runs ARGV in a session of its own (its process group), its stdin /dev/null and its
    stdout/stderr the channel's. A stdin line ``signal N`` sends N to the group, ``tree N``
    to every descendant of ARGV's process (each one, whatever its group: an agent's
    workers lead groups of their own) and then to the group; EOF, or
    the lease of WORK_DIR ending, sends SIGTERM, waits GRACE seconds, then SIGKILL. Exits
    with ARGV's status (128+N when a signal N killed it, as a shell says). The group is
    swept with SIGKILL before ARGV is reaped, so nothing it started outlives it (an
    unreaped leader pins the group id, so the sweep cannot hit a stranger). It holds a
    shared lock on WORK_DIR's ``.running`` until then, and does not start ARGV at all
    when the lease has ended already.
``put PATH``
    Writes its stdin, to EOF, to the new file PATH (mode 0600, made with ``O_EXCL``: never
    over another file; its missing dirs made 0700). For what must reach the host without
    being on a command line (a secret) or in a form it would have to unpickle (a node's
    JSON spec). The controller puts files in the connection's work dir only, so they go
    with it.

Locks, not pids, tie the sessions of one connection together: the kernel drops a
``flock`` when its holder dies however it dies, and a lock names no process, so nothing
is mistaken for a stranger that reused a pid.

Why not a pty (sshd hangs up a pty session's foreground group on disconnect)? A pty mixes
stdout and stderr, and SIGHUP reaches neither a process that ignores it nor a background
child; a supervisor that owns the group reaches both.
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable

if sys.path and sys.path[0] == "":  # -c puts the remote cwd first: never import from there
    del sys.path[0]

DIST = "pytest-elastic"
_CODE_NOT_RUN = 127
#: in the work dir: held exclusively by the lease for its life / shared by each supervisor for its
LEASE_LOCK, RUNNING_LOCK = ".lease", ".running"
#: how long an ending lease waits for the supervisors to end their commands (each SIGKILLs
#: its group after its own grace) before it removes the work dir anyway
_SETTLE_S = 60.0
#: a lost controller: silent for this many times the longest gap it has shown (if longer than LOST_AFTER)
_GAPS = 3.0


def _exit_on_signal(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def lease(lost_after: float, base: str | None) -> None:
    import json
    import shutil
    import tempfile

    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):  # the work dir goes in any case
        signal.signal(sig, _exit_on_signal)
    report: dict[str, str | int | None] = {
        "python": ".".join(map(str, sys.version_info[:3])), "executable": sys.executable,
        "pytest_elastic": None, "problem": None, "work_dir": None, "pid": os.getpid()}
    work_dir = lock = None
    try:
        try:
            from importlib.metadata import PackageNotFoundError, version

            try:
                report["pytest_elastic"] = version(DIST)
            except PackageNotFoundError:
                pass
            if base is not None and not os.path.isdir(base):
                report["problem"] = f"work_dir={base!r} does not exist"
            else:
                work_dir = report["work_dir"] = tempfile.mkdtemp(prefix="pytest-elastic-", dir=base)
                lock = os.open(os.path.join(work_dir, LEASE_LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
                fcntl.flock(lock, fcntl.LOCK_EX)
                os.close(os.open(os.path.join(work_dir, RUNNING_LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600))
        except Exception as e:  # reported to the controller as one line, never a traceback
            report["problem"] = f"{type(e).__name__}: {e}"
        sys.stdout.write(json.dumps(report) + "\n")
        sys.stdout.flush()
        _serve(lost_after)
    finally:
        if lock is not None:
            os.close(lock)  # every supervisor of this connection ends its command now
        if work_dir is not None:
            _settle(work_dir)
            shutil.rmtree(work_dir, ignore_errors=True)


def _serve(lost_after: float) -> None:
    """Answer pings until EOF or until the controller is lost (silent for too long)."""
    import json
    import select
    import time

    pending, last, longest = b"", time.monotonic(), 0.0
    while True:
        limit = max(lost_after, _GAPS * longest) if lost_after > 0 else None
        wait = None if limit is None else max(0.0, last + limit - time.monotonic())
        if not select.select([0], [], [], wait)[0]:
            if limit is not None and time.monotonic() - last >= limit:
                sys.stderr.write(f"lease: the controller was silent for {time.monotonic() - last:.1f} s "
                                 f"(lost after {limit:g} s): ending this connection's commands\n")
                return
            continue
        chunk = os.read(0, 65536)
        if not chunk:
            return
        now = time.monotonic()
        longest, last = max(longest, now - last), now
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            words = line.split()
            if len(words) == 2 and words[0] == b"ping" and words[1].isdigit():
                wall, mono = time.time(), time.monotonic()
                _write_all(1, (json.dumps({"pong": int(words[1]), "wall": wall, "mono": mono}) + "\n").encode())


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data):]


def _settle(work_dir: str) -> None:
    """Wait (bounded) until no supervisor holds the work dir's running lock."""
    try:
        fd = os.open(os.path.join(work_dir, RUNNING_LOCK), os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return
    taken = threading.Event()

    def take() -> None:
        fcntl.flock(fd, fcntl.LOCK_EX)
        taken.set()

    threading.Thread(target=take, daemon=True).start()
    if not taken.wait(_SETTLE_S):
        sys.stderr.write(f"lease: commands still running {_SETTLE_S:g} s after the lease ended: "
                         "removing the work dir anyway\n")


def _die_with_parent() -> Callable[[], None] | None:
    """A preexec_fn that makes the child get SIGKILL when the supervisor dies
    (PR_SET_PDEATHSIG), so a supervisor killed outright still takes its command along.
    libc is loaded here, before the fork: the child only calls it."""
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (ImportError, OSError, AttributeError):  # not Linux: the stdin EOF alone
        return None
    return lambda: prctl(1, signal.SIGKILL, 0, 0, 0)


_reaped = threading.Event()  # set once the command is reaped: its group id may be reused
_ending = threading.Lock()  # the end (EOF or the lease's) is begun once


def _signal_group(pid: int, sig: int) -> None:
    if _reaped.is_set():
        return
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _end(pid: int, grace: float) -> None:
    """Terminate -> grace -> kill, begun once whoever asks first."""
    if _ending.acquire(blocking=False):
        _signal_group(pid, signal.SIGTERM)
        threading.Timer(grace, _signal_group, (pid, signal.SIGKILL)).start()


def _descendants(root: int) -> list[int]:
    """Every process below ``root`` now (one pass over /proc), parents before children."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        kids = children.get(todo.pop(0), [])
        found += kids
        todo += kids
    return found


def _signal_tree(pid: int, sig: int) -> None:
    """``sig`` to every descendant of the command, then to its group (before the reap:
    its pid, and so its descendants' parent links, cannot be reused meanwhile)."""
    if _reaped.is_set():
        return
    for child in _descendants(pid):
        try:
            os.kill(child, sig)
        except (ProcessLookupError, PermissionError):
            pass
    _signal_group(pid, sig)


def _watch_stdin(pid: int, grace: float) -> None:
    """Signals asked for on stdin; at EOF, the end."""
    pending = b""
    while True:
        try:
            chunk = os.read(0, 4096)
        except OSError:  # a stdin that cannot be read is as good as closed
            chunk = b""
        if not chunk:
            break
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            words = line.split()
            if len(words) == 2 and words[0] == b"signal" and words[1].isdigit():
                _signal_group(pid, int(words[1]))
            elif len(words) == 2 and words[0] == b"tree" and words[1].isdigit():
                _signal_tree(pid, int(words[1]))
    _end(pid, grace)


def _watch_lease(lease_fd: int, pid: int, grace: float) -> None:
    """The lease ends (its lock is let go, or it died): the end."""
    fcntl.flock(lease_fd, fcntl.LOCK_SH)
    _end(pid, grace)


def _join_lease(work_dir: str) -> tuple[int, int] | str:
    """(the lease lock's fd, the running lock's fd, now held shared) while the lease
    lives; else why not."""
    try:
        lease_fd = os.open(os.path.join(work_dir, LEASE_LOCK), os.O_RDWR | os.O_CLOEXEC)
        running = os.open(os.path.join(work_dir, RUNNING_LOCK), os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return f"the connection's lease of {work_dir} has ended"
    if _try_shared(lease_fd):  # nobody holds it exclusively: the lease is gone
        return f"the connection's lease of {work_dir} has ended"
    if not _try_shared(running):  # the lease holds it exclusively: it is ending
        return f"the connection's lease of {work_dir} is ending"
    return lease_fd, running


def _try_shared(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def run(grace: float, work_dir: str, argv: list[str]) -> int:
    joined = _join_lease(work_dir)
    if isinstance(joined, str):
        sys.stderr.write(f"not started on this host: {joined}\n")
        return _CODE_NOT_RUN
    lease_fd, _running = joined  # the running lock is held until this process exits
    try:
        child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, start_new_session=True,
                                 preexec_fn=_die_with_parent())
    except OSError as e:
        sys.stderr.write(f"cannot run {argv[0]!r} on this host: {e.strerror or e}\n")
        return _CODE_NOT_RUN
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):  # sshd or a user ending us
        signal.signal(sig, lambda signum, frame: _signal_group(child.pid, signum))
    threading.Thread(target=_watch_stdin, args=(child.pid, grace), daemon=True).start()
    threading.Thread(target=_watch_lease, args=(lease_fd, child.pid, grace), daemon=True).start()
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)
    _signal_group(child.pid, signal.SIGKILL)  # what it left in its group, before the reap
    _reaped.set()
    code = child.wait()
    return code if code >= 0 else 128 - code


def put(path: str) -> int:
    """Stdin to the new file ``path`` (0600, exclusive); its missing dirs made 0700."""
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except OSError as e:
        sys.stderr.write(f"cannot write {path}: {e.strerror or e}\n")
        return 1
    with os.fdopen(fd, "wb") as out:
        while True:
            chunk = os.read(0, 65536)
            if not chunk:
                break
            out.write(chunk)
    return 0


def main(args: list[str]) -> int:
    if args[:1] == ["lease"] and len(args) in (2, 3):
        lease(float(args[1]), args[2] if len(args) > 2 else None)
        return 0
    if args[:1] == ["run"] and len(args) >= 4:
        return run(float(args[1]), args[2], args[3:])
    if args[:1] == ["put"] and len(args) == 2:
        return put(args[1])
    sys.stderr.write("usage: lease LOST_AFTER [BASE] | run GRACE WORK_DIR ARGV... | put PATH\n")
    return 2


if __name__ == "__main__":
    status = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)  # not waiting for the SIGKILL timer of a group already gone

"""What runs on the host, sent as source with ``python -c``: this module is never imported
there, and must stay standard library only and free of the rest of the project (the host
may not have pytest-elastic yet: the lease is what tells us so).

Two modes, both tied to the SSH channel's stdin, the one thing that reliably ends when
the controller does (its process dies, its fds close, sshd sees EOF on the channel; a
connection that drops closes the channel too):

``lease [BASE]``
    The connection's own session. Prints one JSON line (interpreter, pytest-elastic's
    version, a fresh work dir made under BASE or the host's temp dir), then waits for EOF
    on stdin and removes the work dir. So the work dir goes with the connection, whoever
    ends it.
``run GRACE ARGV...``
    Runs ARGV in a session of its own (its process group), its stdin /dev/null and its
    stdout/stderr the channel's. A stdin line ``signal N`` sends N to the group; EOF sends
    SIGTERM, waits GRACE seconds, then SIGKILL. Exits with ARGV's status (128+N when a
    signal N killed it, as a shell says). The group is swept with SIGKILL before ARGV is
    reaped, so nothing it started outlives it (an unreaped leader pins the group id, so
    the sweep cannot hit a stranger).

Why not a pty (sshd hangs up a pty session's foreground group on disconnect)? A pty mixes
stdout and stderr, and SIGHUP reaches neither a process that ignores it nor a background
child; a supervisor that owns the group reaches both.
"""

from __future__ import annotations

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


def _exit_on_signal(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def lease(base: str | None) -> None:
    import json
    import shutil
    import tempfile

    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):  # the work dir goes in any case
        signal.signal(sig, _exit_on_signal)
    report: dict[str, str | None] = {
        "python": ".".join(map(str, sys.version_info[:3])), "executable": sys.executable,
        "pytest_elastic": None, "problem": None, "work_dir": None}
    try:
        from importlib.metadata import PackageNotFoundError, version

        try:
            report["pytest_elastic"] = version(DIST)
        except PackageNotFoundError:
            pass
        if base is not None and not os.path.isdir(base):
            report["problem"] = f"work_dir={base!r} does not exist"
        else:
            report["work_dir"] = tempfile.mkdtemp(prefix="pytest-elastic-", dir=base)
    except Exception as e:  # reported to the controller as one line, never a traceback
        report["problem"] = f"{type(e).__name__}: {e}"
    sys.stdout.write(json.dumps(report) + "\n")
    sys.stdout.flush()
    try:
        while os.read(0, 65536):
            pass
    finally:
        if report["work_dir"] is not None:
            shutil.rmtree(report["work_dir"], ignore_errors=True)


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


def _signal_group(pid: int, sig: int) -> None:
    if _reaped.is_set():
        return
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _watch_stdin(pid: int, grace: float) -> None:
    """Signals asked for on stdin; at EOF, terminate -> grace -> kill."""
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
    _signal_group(pid, signal.SIGTERM)
    threading.Timer(grace, _signal_group, (pid, signal.SIGKILL)).start()


def run(grace: float, argv: list[str]) -> int:
    try:
        child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, start_new_session=True,
                                 preexec_fn=_die_with_parent())
    except OSError as e:
        sys.stderr.write(f"cannot run {argv[0]!r} on this host: {e.strerror or e}\n")
        return _CODE_NOT_RUN
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):  # sshd or a user ending us
        signal.signal(sig, lambda signum, frame: _signal_group(child.pid, signum))
    threading.Thread(target=_watch_stdin, args=(child.pid, grace), daemon=True).start()
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)
    _signal_group(child.pid, signal.SIGKILL)  # what it left in its group, before the reap
    _reaped.set()
    code = child.wait()
    return code if code >= 0 else 128 - code


def main(args: list[str]) -> int:
    if args[:1] == ["lease"]:
        lease(args[1] if len(args) > 1 else None)
        return 0
    if args[:1] == ["run"] and len(args) >= 3:
        return run(float(args[1]), args[2:])
    sys.stderr.write("usage: lease [BASE] | run GRACE ARGV...\n")
    return 2


if __name__ == "__main__":
    status = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)  # not waiting for the SIGKILL timer of a group already gone

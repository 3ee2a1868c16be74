"""What runs on the host, sent as source with ``python -c``: this module is never imported
there, and must stay standard library only and free of the rest of the project (the host
may not have pytest-elastic yet: the lease is what tells us so).

Two modes, both tied to the SSH channel's stdin, the one thing that reliably ends when
the controller does (its process dies, its fds close, sshd sees EOF on the channel; a
connection that drops closes the channel too):

``lease LOST_AFTER KEEP [BASE]``
    The connection's own session. Makes a fresh work dir (under BASE or the host's temp
    dir) and holds an exclusive ``flock`` on its ``.lease`` file, prints one JSON line
    (interpreter, pytest-elastic's version, the work dir, its pid, what the host lacks of
    each capability a hosts file may list: ``host_lacks``), then serves stdin:
    ``ping N`` is answered at once with ``{"pong": N, "wall": time.time(), "mono":
    time.monotonic()}`` (the clock offset, ``_clock``), any line counts as a heartbeat.
    It ends at EOF, or when the controller has been silent for LOST_AFTER seconds (or three
    times the longest gap it has shown, if longer; 0: never): a frozen controller, or a
    link that hangs without closing. Ending, it lets go of the lock (every command's
    supervisor then ends its group), waits for those supervisors to be gone (the
    ``.running`` lock), and only then removes the work dir, so that nothing a dying
    command writes there outlives it. Unless the controller said ``bye`` first (its
    ``close()``): a lease that ended at EOF or silence may have lost a connection that the
    controller will open again (``host_unreachable``), so it removes everything but the
    nodes' events files, marks the dir ``.kept`` and keeps them for up to KEEP seconds,
    until the controller, having read what its relays never delivered, removes the mark
    (``kept`` below). The mark names the keeping lease (pid and start time): a lease that
    starts removes the kept dirs beside its own whose lease was killed outright meanwhile
    (``_sweep_kept``). It also binds the datagram socket ``.answers``
    in the work dir and writes each answer a supervisor sends there (one JSON object
    with an int ``answer``) on its stdout as a line: the way back for the questions
    below, whose supervisor's own stdout is its command's.
``run GRACE WORK_DIR ARGV...``
    Runs ARGV in a session of its own (its process group), its stdin /dev/null and its
    stdout/stderr pipes this supervisor copies to the channel's (``_relay``): the channel
    ends when ARGV does, not when the last process holding its output does (sshd closes a
    session once its command exited *and* its output pipes reached EOF, so an orphan
    of ARGV's stuck in the kernel, a worker in a FUSE request held until its node's kill
    is applied, held the channel open, and the kill waited on that channel). What the
    pipes hold once ARGV ended is copied for up to ``_DRAIN_S``. A stdin line ``signal
    N`` sends N to the group, ``tree N`` to every descendant of ARGV's process (each one, whatever its group: an agent's
    workers lead groups of their own) and then to the group. Two lines are questions,
    numbered Q and answered through the lease (``{"answer": Q, "result": ...}``):
    ``pid Q PID N`` sends N to PID only if PID is a process below ARGV's now
    (``signalled``; ``gone``: no such process below it; ``refused``, with ``why``: any
    other process of the host, the supervisor and ARGV's own included, is never
    signalled), and ``stopped Q MS`` answers once ARGV's process is stopped (``stopped``),
    has ended (``exited``), or MS milliseconds went by (``running``); every question taken
    is answered before the supervisor exits. EOF, or
    the lease of WORK_DIR ending, sends SIGTERM, waits GRACE seconds, then SIGKILL. Exits
    with ARGV's status (128+N when a signal N killed it, as a shell says). The group is
    swept with SIGKILL before ARGV is reaped, so nothing it started outlives it (an
    unreaped leader pins the group id, so the sweep cannot hit a stranger). It holds a
    shared lock on WORK_DIR's ``.running`` until then, and does not start ARGV at all
    when the lease has ended already.
``kept WORK_DIR WAIT`` and ``release WORK_DIR``
    ``kept`` prints ``kept`` once WORK_DIR's lease has ended and keeps its events (at most
    WAIT seconds), ``gone`` where the dir is gone, ``running`` where the lease still runs
    then. ``release`` removes the mark: the lease removes the dir now.
``put PATH``
    Writes its stdin, to EOF, to the new file PATH (mode 0600; it appears whole, linked
    into place once written, and never over another file; its missing dirs made 0700).
    For what must reach the host without
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
import functools
import os
import signal
import socket
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
#: in the work dir: the lease's datagram socket, where supervisors send their answers
ANSWERS = ".answers"
#: the longest answer the lease passes on (answers are a few dozen bytes)
_ANSWER_MAX = 4096
#: how long an ending lease waits for the supervisors to end their commands (each SIGKILLs
#: its group after its own grace) before it removes the work dir anyway
_SETTLE_S = 60.0
#: a lost controller: silent for this many times the longest gap it has shown (if longer than LOST_AFTER)
_GAPS = 3.0
#: in the work dir of a lease that ended without the controller's ``bye``: there while it
#: keeps the events files (``KEPT_FILES``) for the controller; the controller removes it
KEPT_MARK = ".kept"
#: what such a lease keeps: the nodes' events files (``harness.sim.places.hosts.nodes``'s name)
KEPT_FILES = ("events.jsonl",)
#: how often a lease keeping its events, and ``kept``, look at the mark
_KEPT_POLL_S = 0.1
#: the name of every connection's work dir starts so (``tempfile.mkdtemp``'s prefix)
WORK_PREFIX = "pytest-elastic-"


def host_lacks(mounts: str = "/proc/self/mounts", dev_fuse: str = "/dev/fuse") -> dict[str, str]:
    """What this host lacks of each capability a hosts file may list -> why, in a clause:
    looked up, not tried (cheap, and nothing is changed here). ``cgroups``: a cgroup
    filesystem mounted (``ip netns exec`` remounts ``/sys`` and hides them); ``fuse``:
    ``/dev/fuse`` to open and ``fusermount3``; ``netns``: ``nft`` and ``ip``."""
    import shutil

    lacks: dict[str, str] = {}
    try:
        with open(mounts) as fp:
            types = {line.split()[2] for line in fp if len(line.split()) > 2}
    except OSError as e:
        types, lacks["cgroups"] = set(), f"{mounts} cannot be read ({e.strerror})"
    if "cgroups" not in lacks and not types & {"cgroup", "cgroup2"}:
        lacks["cgroups"] = f"no cgroup filesystem is mounted ({mounts} lists none)"
    try:
        os.close(os.open(dev_fuse, os.O_RDWR | os.O_CLOEXEC))
    except OSError as e:
        lacks["fuse"] = f"{dev_fuse} cannot be opened ({e.strerror})"
    else:
        if shutil.which("fusermount3") is None and shutil.which("fusermount") is None:
            lacks["fuse"] = "no fusermount3 on its PATH (Debian: fuse3)"
    missing = [tool for tool in ("nft", "ip") if shutil.which(tool) is None]
    if missing:
        lacks["netns"] = f"no {' or '.join(missing)} on its PATH (Debian: nftables, iproute2)"
    return lacks


def _exit_on_signal(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def lease(lost_after: float, keep: float, base: str | None) -> None:
    import json
    import shutil
    import tempfile

    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):  # the work dir goes in any case
        signal.signal(sig, _exit_on_signal)
    report: dict[str, object] = {
        "python": ".".join(map(str, sys.version_info[:3])), "executable": sys.executable,
        "pytest_elastic": None, "problem": None, "work_dir": None, "pid": os.getpid(), "lacks": None}
    work_dir = lock = answers = None
    ended = "signal"  # a lease signalled (the host going down) removes everything at once
    try:
        try:
            from importlib.metadata import PackageNotFoundError, version

            try:
                report["pytest_elastic"] = version(DIST)
            except PackageNotFoundError:
                pass
            report["lacks"] = host_lacks()
            if base is not None and not os.path.isdir(base):
                report["problem"] = f"work_dir={base!r} does not exist"
            else:
                work_dir = report["work_dir"] = tempfile.mkdtemp(prefix=WORK_PREFIX, dir=base)
                _sweep_kept(os.path.dirname(work_dir))
                lock = os.open(os.path.join(work_dir, LEASE_LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
                fcntl.flock(lock, fcntl.LOCK_EX)
                os.close(os.open(os.path.join(work_dir, RUNNING_LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600))
                answers = _bind_answers(os.path.join(work_dir, ANSWERS))
        except Exception as e:  # reported to the controller as one line, never a traceback
            report["problem"] = f"{type(e).__name__}: {e}"
        sys.stdout.write(json.dumps(report) + "\n")
        sys.stdout.flush()
        ended = _serve(lost_after, answers)
    finally:
        if answers is not None:
            answers.close()
        if lock is not None:
            os.close(lock)  # every supervisor of this connection ends its command now
        if work_dir is not None:
            _settle(work_dir)
            _unmount_under(work_dir)
            try:
                if ended != "bye" and keep > 0:
                    _keep_events(work_dir, keep)
            finally:  # a signal while it keeps them (SIGHUP: the session went) ends the keeping
                shutil.rmtree(work_dir, ignore_errors=True)


def _keep_events(work_dir: str, keep: float) -> None:
    """A connection lost without the controller's ``bye``: it may come back over a new one
    and read what its relays never delivered. Only the events files stay (the secrets, the
    sockets, the nodes' files go now), for up to ``keep`` s or until the controller removes
    ``KEPT_MARK``, which says to it that what ran here has ended: the files are whole."""
    import time

    for root, _, files in os.walk(work_dir):
        for name in files:
            if name not in KEPT_FILES:
                try:
                    os.unlink(os.path.join(root, name))
                except OSError:
                    pass
    mark = os.path.join(work_dir, KEPT_MARK)
    try:  # who keeps them: a lease killed outright meanwhile leaves a mark naming a process gone
        fd = os.open(mark, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(f"{os.getpid()} {_started(os.getpid())}\n")
    except OSError:
        return
    deadline = time.monotonic() + keep
    while os.path.exists(mark) and time.monotonic() < deadline:
        time.sleep(_KEPT_POLL_S)


def _started(pid: int) -> str | None:
    """When process ``pid`` started (``/proc/PID/stat``'s starttime): a pid and this name
    one process, never a later one that reused the pid. None: no such process."""
    fields = _stat(str(pid))
    return fields[19].decode() if fields is not None and len(fields) > 19 else None


def _sweep_kept(base: str) -> None:
    """Remove the work dirs under ``base`` whose lease was keeping their events and died
    without removing them (killed outright: SIGKILL, the host's OOM killer): their mark
    names a process that is gone. A live lease's dir has no mark, or a mark naming it."""
    import shutil

    try:
        names = [name for name in os.listdir(base) if name.startswith(WORK_PREFIX)]
    except OSError:
        return
    for name in names:
        work_dir = os.path.join(base, name)
        try:
            with open(os.path.join(work_dir, KEPT_MARK)) as f:
                words = f.read().split()
        except OSError:  # no mark (a lease at work), or not ours to read
            continue
        if len(words) == 2 and words[0].isdigit() and _started(int(words[0])) != words[1]:
            _unmount_under(work_dir)
            shutil.rmtree(work_dir, ignore_errors=True)


def kept(work_dir: str, wait: float) -> int:
    """``kept``, ``gone`` or ``running`` (see the module doc), within ``wait`` s."""
    import time

    deadline = time.monotonic() + wait
    while True:
        if os.path.exists(os.path.join(work_dir, KEPT_MARK)):
            state = "kept"
        elif not os.path.isdir(work_dir):
            state = "gone"
        elif time.monotonic() >= deadline:
            state = "running"
        else:
            time.sleep(_KEPT_POLL_S)
            continue
        sys.stdout.write(state + "\n")
        return 0


def _bind_answers(path: str) -> socket.socket | None:
    """The answers' datagram socket at ``path`` (in the 0700 work dir: this user's only);
    None where its path is too long for a Unix socket (a question then goes unanswered,
    and the controller's wait for it says so)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        sock.bind(path)
    except OSError:
        sock.close()
        return None
    return sock


def _pass_answer(sock: socket.socket) -> None:
    """One datagram from a supervisor onto stdout, as a line, if it is an answer."""
    import json

    data = sock.recv(_ANSWER_MAX + 1)
    try:
        answer = json.loads(data) if len(data) <= _ANSWER_MAX and b"\n" not in data else None
    except ValueError:
        return
    if isinstance(answer, dict) and isinstance(answer.get("answer"), int):
        _write_all(1, data + b"\n")


def _serve(lost_after: float, answers: socket.socket | None = None) -> str:
    """Answer pings, and pass on the supervisors' answers, until the controller says
    ``bye`` (it closes: "bye"), EOF ("eof") or until it is lost (silent for too long:
    "silent")."""
    import json
    import select
    import time

    pending, last, longest = b"", time.monotonic(), 0.0
    readers: list[int | socket.socket] = [0] if answers is None else [0, answers]
    while True:
        limit = max(lost_after, _GAPS * longest) if lost_after > 0 else None
        wait = None if limit is None else max(0.0, last + limit - time.monotonic())
        ready = select.select(readers, [], [], wait)[0]
        if answers is not None and answers in ready:
            _pass_answer(answers)  # not a sign of the controller's life: no heartbeat
        if 0 not in ready:
            if limit is not None and time.monotonic() - last >= limit:
                sys.stderr.write(f"lease: the controller was silent for {time.monotonic() - last:.1f} s "
                                 f"(lost after {limit:g} s): ending this connection's commands\n")
                return "silent"
            continue
        chunk = os.read(0, 65536)
        if not chunk:
            return "eof"
        now = time.monotonic()
        longest, last = max(longest, now - last), now
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            words = line.split()
            if words == [b"bye"]:
                return "bye"
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


def _unmount_under(work_dir: str) -> None:
    """Detach every mount below the work dir (lazily) before it is removed: a node's disk
    there is a FUSE mount whose server unmounts when it ends, but a server killed outright
    leaves a dead one, into which the removal would descend and fail, leaving the dir."""
    import subprocess

    prefix = os.path.realpath(work_dir) + "/"
    try:
        with open("/proc/self/mountinfo") as fp:
            points = [line.split()[4].encode().decode("unicode_escape") for line in fp if len(line.split()) > 4]
    except OSError:
        return
    for point in sorted((p for p in points if p.startswith(prefix)), reverse=True):
        command = ["umount", "-l", point] if os.geteuid() == 0 else ["fusermount3", "-u", "-z", point]
        try:
            subprocess.run(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           check=False, timeout=10)
        except (OSError, subprocess.SubprocessError):
            pass


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
#: held by whoever signals by pid (checked, then acted on) and by the reap, which sets
#: ``_reaped`` under it: no pid of the command's is reused between a check and its act
_unreaped = threading.RLock()
_ending = threading.Lock()  # the end (EOF or the lease's) is begun once
#: questions taken and not answered yet (the supervisor answers them before it exits)
_open_questions = [0]
_answered = threading.Condition()
#: how long an ending supervisor waits for the answers it owes (each takes microseconds;
#: ``stopped`` hears of the command's end at once)
_ANSWER_S = 5.0


def _signal_group(pid: int, sig: int) -> None:
    with _unreaped:
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
        fields = _stat(entry) if entry.isdigit() else None
        if fields is not None and fields[1].isdigit():
            children.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = [], [root]
    while todo:
        kids = children.get(todo.pop(0), [])
        found += kids
        todo += kids
    return found


def _has_ended(pid: int) -> bool:
    """Whether ``pid`` has ended though its parent has not reaped it yet (a zombie): it is
    still below the command, and kill(2) still succeeds on it, yet nothing receives the
    signal. A pid with no /proc entry has ended too."""
    fields = _stat(str(pid))
    return fields is None or fields[0] in (b"Z", b"X")


def _stat(pid: str) -> list[bytes] | None:
    """The fields of ``/proc/PID/stat`` after the command name (state, ppid, ...: the name
    may hold spaces and parentheses, so they follow its last ")"); None: no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields if len(fields) > 1 else None


def _signal_tree(pid: int, sig: int) -> None:
    """``sig`` to every descendant of the command, then to its group (before the reap:
    its pid, and so its descendants' parent links, cannot be reused meanwhile)."""
    with _unreaped:
        if _reaped.is_set():
            return
        for child in _descendants(pid):
            try:
                os.kill(child, sig)
            except (ProcessLookupError, PermissionError):
                pass
        _signal_group(pid, sig)


def _signal_below(root: int, pid: int, sig: int) -> dict[str, str]:
    """``sig`` to ``pid`` only if it is a process below ``root`` (the command) now; what
    came of it (``pid Q PID N``'s answer). The process is held by a pidfd before it is
    looked for below ``root``, and signalled through it: if ``pid`` ends and is reused
    meanwhile, the signal goes nowhere, never to the stranger."""
    with _unreaped:  # ``root`` is not reaped (nor its pid reused) until this is done
        if _reaped.is_set():
            return {"result": "gone", "why": f"the command (pid {root}) has ended"}
        return _signal_held(root, pid, sig)


def _signal_held(root: int, pid: int, sig: int) -> dict[str, str]:
    """``_signal_below``'s look and act, ``root`` held unreaped."""
    try:
        handle: int | None = os.pidfd_open(pid)
    except ProcessLookupError:
        return {"result": "gone", "why": f"no process {pid} on this host"}
    except (AttributeError, OSError):  # no pidfds here (Linux < 5.3, Python < 3.9), or pid 0
        handle = None
    try:
        if pid not in _descendants(root):
            return {"result": "refused", "why": f"pid {pid} is not a process below the command (pid {root}) "
                    "on this host: only those are signalled"}
        if _has_ended(pid):  # a zombie takes a signal without a word, but nothing is there to get it
            return {"result": "gone", "why": f"process {pid} ended"}
        try:
            if handle is not None:
                signal.pidfd_send_signal(handle, sig)
            else:
                os.kill(pid, sig)
        except ProcessLookupError:
            return {"result": "gone", "why": f"process {pid} ended"}
        except (OSError, ValueError) as e:
            return {"result": "refused", "why": f"signal {sig} to pid {pid}: {getattr(e, 'strerror', None) or e}"}
        return {"result": "signalled"}
    finally:
        if handle is not None:
            os.close(handle)


def _answer_stopped(work_dir: str, question: int, pid: int, within: float) -> None:
    """Answer ``stopped Q MS``: once the command is stopped or has ended, or ``within`` s
    went by. The wait is the kernel's (``waitid`` for a stop, without reaping), in a
    thread of its own."""
    seen: list[str] = []
    done = threading.Event()

    def watch() -> None:
        try:
            info = os.waitid(os.P_PID, pid, os.WSTOPPED | os.WEXITED | os.WNOWAIT)
            seen.append("stopped" if info is not None and info.si_code == os.CLD_STOPPED else "exited")
        except ChildProcessError:  # reaped already
            seen.append("exited")
        done.set()

    threading.Thread(target=watch, daemon=True).start()
    done.wait(within)
    _answer(work_dir, question, lambda: {"result": seen[0] if seen else "running"})


def _taken() -> None:
    """A question was taken: it is answered before this process exits (``_settle_answers``)."""
    with _answered:
        _open_questions[0] += 1


def _settle_answers() -> None:
    """Until every question taken is answered (at most ``_ANSWER_S``): an answer sent
    before this process exits reaches the controller before it learns the command ended
    (it asks the lease, which passes answers on in order, once the command is gone)."""
    with _answered:
        _answered.wait_for(lambda: _open_questions[0] == 0, _ANSWER_S)


def _answer(work_dir: str, question: int, answer: Callable[[], dict[str, str]]) -> None:
    """Send ``answer()``, the answer to question ``question``, to the lease, which passes
    it on (once; the question was ``_taken``)."""
    try:
        _send_answer(work_dir, question, answer())
    finally:
        with _answered:
            _open_questions[0] -= 1
            _answered.notify_all()


def _send_answer(work_dir: str, question: int, answer: dict[str, str]) -> None:
    import json  # here, not at the top: most supervisors are never asked (json costs ~10 ms)

    data = json.dumps({"answer": question, **answer}).encode()
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        try:
            sock.sendto(data, os.path.join(work_dir, ANSWERS))
        except OSError:  # the lease is gone, and with it whoever asked
            pass


def _watch_stdin(pid: int, grace: float, work_dir: str) -> None:
    """Signals and questions asked for on stdin; at EOF, the end."""
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
            elif len(words) == 4 and words[0] == b"pid" and all(w.isdigit() for w in words[1:]):
                _taken()
                _answer(work_dir, int(words[1]), functools.partial(_signal_below, pid, int(words[2]), int(words[3])))
            elif len(words) == 3 and words[0] == b"stopped" and words[1].isdigit() and words[2].isdigit():
                _taken()
                threading.Thread(target=_answer_stopped, args=(work_dir, int(words[1]), pid, int(words[2]) / 1000),
                                 daemon=True).start()
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


#: after the command ended, how long what its output pipes still hold is copied (an orphan
#: still writing, or stuck holding them, ends the copy then)
_DRAIN_S = 0.3


def _relay(source: int, target: int, ended: threading.Event) -> None:
    """Copy the pipe ``source`` to ``target`` until EOF, or ``_DRAIN_S`` after ``ended``."""
    import select
    import time

    deadline = None
    while True:
        if deadline is None and ended.is_set():
            deadline = time.monotonic() + _DRAIN_S
        wait = 0.1 if deadline is None else max(0.0, deadline - time.monotonic())
        ready, _, _ = select.select([source], [], [], wait)
        if not ready:
            if deadline is not None and time.monotonic() >= deadline:
                break
            continue
        chunk = os.read(source, 65536)
        if not chunk:
            break
        try:
            while chunk:
                chunk = chunk[os.write(target, chunk):]
        except OSError:  # nobody reads the channel any more
            break
    os.close(source)


def run(grace: float, work_dir: str, argv: list[str]) -> int:
    joined = _join_lease(work_dir)
    if isinstance(joined, str):
        sys.stderr.write(f"not started on this host: {joined}\n")
        return _CODE_NOT_RUN
    lease_fd, _running = joined  # the running lock is held until this process exits
    pipes = [os.pipe(), os.pipe()]  # ARGV's stdout and stderr, copied to ours
    try:
        child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=pipes[0][1], stderr=pipes[1][1],
                                 start_new_session=True, preexec_fn=_die_with_parent())
    except OSError as e:
        sys.stderr.write(f"cannot run {argv[0]!r} on this host: {e.strerror or e}\n")
        return _CODE_NOT_RUN
    ended = threading.Event()
    relays = []
    for (read, write), target in zip(pipes, (1, 2), strict=True):
        os.close(write)
        relays.append(threading.Thread(target=_relay, args=(read, target, ended), daemon=True))
        relays[-1].start()
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):  # sshd or a user ending us
        signal.signal(sig, lambda signum, frame: _signal_group(child.pid, signum))
    threading.Thread(target=_watch_stdin, args=(child.pid, grace, work_dir), daemon=True).start()
    threading.Thread(target=_watch_lease, args=(lease_fd, child.pid, grace), daemon=True).start()
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)
    _signal_group(child.pid, signal.SIGKILL)  # what it left in its group, before the reap
    with _unreaped:
        _reaped.set()
    code = child.wait()
    ended.set()
    for relay in relays:
        relay.join()
    _settle_answers()
    return code if code >= 0 else 128 - code


def put(path: str) -> int:
    """Stdin to the new file ``path`` (0600, exclusive); its missing dirs made 0700. It is
    written beside ``path`` first and linked into place whole: a reader that finds it
    (a worker looking for an exit-code order) never reads half of it."""
    part = f"{path}.{os.getpid()}.part"
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except OSError as e:
        sys.stderr.write(f"cannot write {path}: {e.strerror or e}\n")
        return 1
    try:
        with os.fdopen(fd, "wb") as out:
            while True:
                chunk = os.read(0, 65536)
                if not chunk:
                    break
                out.write(chunk)
        os.link(part, path)  # fails on an existing path: never over another file
    except OSError as e:
        sys.stderr.write(f"cannot write {path}: {e.strerror or e}\n")
        return 1
    finally:
        try:
            os.unlink(part)
        except OSError:
            pass
    return 0


def main(args: list[str]) -> int:
    if args[:1] == ["lease"] and len(args) in (3, 4):
        lease(float(args[1]), float(args[2]), args[3] if len(args) > 3 else None)
        return 0
    if args[:1] == ["kept"] and len(args) == 3:
        return kept(args[1], float(args[2]))
    if args[:1] == ["release"] and len(args) == 2:
        try:
            os.unlink(os.path.join(args[1], KEPT_MARK))
        except FileNotFoundError:
            pass
        return 0
    if args[:1] == ["run"] and len(args) >= 4:
        return run(float(args[1]), args[2], args[3:])
    if args[:1] == ["put"] and len(args) == 2:
        return put(args[1])
    sys.stderr.write("usage: lease LOST_AFTER KEEP [BASE] | run GRACE WORK_DIR ARGV... | kept WORK_DIR WAIT | "
                     "release WORK_DIR | put PATH\n")
    return 2


if __name__ == "__main__":
    status = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)  # not waiting for the SIGKILL timer of a group already gone

"""The agent's side of the zygote: start or join one, ask it for workers, learn exits."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

from harness.errors import ElasticError
from harness.procs._cgroup import memory_cgroup, memory_limit, oom_kills
from harness.procs._handles import WorkerProcess, process_state
from harness.procs._import_cache import import_cache_dir
from harness.procs._prctl import die_with_parent
from harness.procs._zygote import ZYGOTE_ENV, make_socket, recv_message, send_message

__all__ = ["Zygote", "ZygoteError", "ZygoteProcess", "python_target"]

_START_TIMEOUT = 60.0
_REPLY_TIMEOUT = 30.0


class ZygoteError(ElasticError):
    """The zygote could not be started, reached, or asked for a worker."""


def python_target(argv: list[str]) -> tuple[str, list[str], bool] | None:
    """``[python, -u, (-m) target, args...]`` -> (target, args, is_module); None when the
    command is not a plain Python invocation the zygote can run (then exec it instead)."""
    if len(argv) < 3 or os.path.realpath(argv[0]) != os.path.realpath(sys.executable):
        return None
    rest = argv[1:]
    if rest[0] != "-u":
        return None
    rest = rest[1:]
    if rest and rest[0] == "-m":
        return (rest[1], rest[2:], True) if len(rest) > 1 else None
    if rest and not rest[0].startswith("-"):
        return rest[0], rest[1:], False
    return None


class ZygoteServerProcess:
    """A private zygote process, started by (and dying with) this process. What its workers
    import is kept in the import cache named by ``$HARNESS_IMPORT_CACHE`` (read here, once:
    ``harness.procs._import_cache``), so the next process's zygote preloads it. ``ahead``:
    it runs ahead of the agents it serves (``harness.procs._priority``): for a zygote
    that forks the workers of many nodes."""

    def __init__(self, ahead: bool = False) -> None:
        # a path (reachable from every network namespace, unlike an abstract name) in a
        # directory only we can enter; it carries our pid so a later starter can remove it
        # if we are SIGKILLed before close()
        _sweep_socket_dirs()
        self._dir = tempfile.mkdtemp(prefix=f"{_DIR_PREFIX}{os.getpid()}-", dir=_socket_base())
        self.path = os.path.join(self._dir, "sock")
        read_fd, write_fd = os.pipe()
        parent = os.getpid()
        self.import_cache = import_cache_dir(os.environ)
        # its own TMPDIR, removed with its dir: what it preloads may make dirs in its temp
        # dir at import (torch's inductor made /tmp/torchinductor_<user>, left by every
        # run); its workers get theirs from their agents (``run_as_main``)
        self.tmpdir = os.path.join(self._dir, "tmp")
        os.mkdir(self.tmpdir)
        self.process = subprocess.Popen(
            [sys.executable, "-c",
             "import sys; from harness.procs._zygote import serve; "
             "serve(sys.argv[1], int(sys.argv[2]), sys.argv[3] or None, sys.argv[4] == '1')",
             self.path, str(write_fd), self.import_cache or "", "1" if ahead else "0"],
            pass_fds=(write_fd,), start_new_session=True, stdin=subprocess.DEVNULL,
            preexec_fn=lambda: die_with_parent(parent), env={**os.environ, "TMPDIR": self.tmpdir},
        )
        os.close(write_fd)
        self._ready_fd = read_fd
        self._said: set[bytes] = set()  # lines read from the zygote: listening, ready
        self._pending = b""
        # the zygote starts in our memory cgroup: a SIGKILL of it that comes with a new OOM
        # kill there is the OOM killer's (it holds torch, ~300 MB, for every worker)
        self._memory_cgroup = memory_cgroup()
        self._oom_kills = oom_kills(self._memory_cgroup)

    def death(self, code: int | None, when: str = "") -> str:
        """How the zygote ended (``when``: e.g. " before it was ready"), for an error
        message: ``was killed by the OOM killer (...)`` when the kernel counted an OOM kill
        in its memory cgroup since it started (a bare ``Signal 9`` says nothing to the
        user), else its exit code."""
        if code == -9 and self._oom_kills is not None:
            now = oom_kills(self._memory_cgroup)
            if now is not None and now > self._oom_kills:
                where = self._memory_cgroup or "the system"
                limit = memory_limit(self._memory_cgroup) if self._memory_cgroup else None
                return (f"was killed by the OOM killer{when} (memory cgroup {where}"
                        + (f", limit {limit} bytes" if limit is not None else "")
                        + "): it holds torch for every worker it forks; raise the limit or use "
                        "--start-method=spawn")
        return f"exited with code {code}{when}"

    def wait_listening(self, timeout: float = _START_TIMEOUT) -> None:
        """Until the zygote accepts connections (it has not imported torch yet: requests
        made now are answered once it has)."""
        self._wait_for(b"listening\n", timeout)

    def wait_ready(self, timeout: float = _START_TIMEOUT) -> None:
        """Until the zygote has imported torch and serves."""
        self._wait_for(b"listening\n", timeout)
        self._wait_for(b"ready\n", timeout)

    def _wait_for(self, line: bytes, timeout: float) -> None:
        if self._ready_fd < 0 or line in self._said:
            return
        import selectors

        deadline = time.monotonic() + timeout
        ended = False  # the zygote closed its end: it died (or is dying) before saying it
        with selectors.DefaultSelector() as sel:
            sel.register(self._ready_fd, selectors.EVENT_READ)
            while line not in self._said:
                if not sel.select(max(0.0, deadline - time.monotonic())):
                    break
                data = os.read(self._ready_fd, 64)
                if not data:
                    ended = True
                    break
                self._pending += data
                while b"\n" in self._pending:
                    said, _, self._pending = self._pending.partition(b"\n")
                    self._said.add(said + b"\n")
        if line in self._said:
            if line == b"ready\n":
                os.close(self._ready_fd)
                self._ready_fd = -1
            return
        code = self.process.poll()
        if code is None and ended:  # its pipe closes a moment before its exit status is there
            try:
                code = self.process.wait(5)
            except subprocess.TimeoutExpired:
                pass
        self.close()
        what = line.decode().strip()
        if code is not None:
            raise ZygoteError(f"the zygote {self.death(code, f' before it was {what}')} "
                              "(its error, if any, is on stderr above)")
        raise ZygoteError(f"the zygote was not {what} within {timeout:g}s")

    def close(self) -> None:
        if self._ready_fd >= 0:
            os.close(self._ready_fd)
            self._ready_fd = -1
        if self.process.poll() is None:
            # it holds no state worth a graceful stop, and waiting out the kernel's teardown
            # of a torch-sized process would delay every agent's exit; the zombie is reaped
            # later (subprocess reaps on its next start) or by init once we are gone
            self.process.kill()
            self.process.poll()
        shutil.rmtree(self._dir, ignore_errors=True)


_DIR_PREFIX = "elastic-zygote-"
_SUN_PATH_MAX = 107  # sockaddr_un.sun_path less its terminating NUL


def _socket_base() -> str:
    """The temp dir, unless a socket path under it would be too long to bind."""
    base = tempfile.gettempdir()
    longest = os.path.join(base, f"{_DIR_PREFIX}{2 ** 22}-xxxxxxxx", "sock")
    return base if len(longest) <= _SUN_PATH_MAX else "/tmp"


def _sweep_socket_dirs() -> None:
    """Remove socket dirs of ours whose zygote starter is dead (it was SIGKILLed)."""
    for base in {tempfile.gettempdir(), "/tmp"}:
        try:
            names = os.listdir(base)
        except OSError:
            continue
        for name in names:
            match = re.fullmatch(rf"{_DIR_PREFIX}(\d+)-\w+", name)
            path = os.path.join(base, name)
            if match is None or process_state(int(match.group(1))) not in (None, "Z"):
                continue
            try:
                if os.lstat(path).st_uid == os.getuid():
                    shutil.rmtree(path, ignore_errors=True)
            except OSError:
                pass


class Zygote:
    """A connection to a zygote. ``Zygote.for_agent(env)`` joins the shared one named by
    ``$HARNESS_ZYGOTE`` or starts a private one (started at once so its torch import
    overlaps the agent's rendezvous)."""

    def __init__(self, path: str, server: ZygoteServerProcess | None = None):
        self.path = path
        self._server = server
        self._sock: socket.socket | None = None
        self._exits: dict[int, int] = {}
        self._next_id = 0

    @classmethod
    def for_agent(cls, env: dict[str, str] | Any) -> Zygote:
        shared = env.get(ZYGOTE_ENV)
        if shared:
            return cls(shared)
        server = ZygoteServerProcess()
        return cls(server.path, server)

    def _connect(self) -> socket.socket:
        if self._sock is None:
            if self._server is not None:
                self._server.wait_ready()
            sock = make_socket()
            try:
                sock.connect(self.path)
            except OSError as e:
                sock.close()
                raise ZygoteError(f"cannot reach the zygote at {self.path}: {e.strerror}") from None
            self._sock = sock
        return self._sock

    def _read(self, timeout: float | None) -> dict[str, Any] | None:
        sock = self._connect()
        sock.settimeout(timeout)
        try:
            message, fds = recv_message(sock)
        except TimeoutError:
            return None
        finally:
            sock.settimeout(None)
        for fd in fds:
            os.close(fd)
        if message is None:
            raise ZygoteError(self._closed())
        if message.get("op") == "exit":
            self._exits[int(message["pid"])] = int(message["exitcode"])
        return message

    def _closed(self) -> str:
        """Why the zygote closed our connection: a private one that died says how."""
        said = f"the zygote at {self.path} closed the connection"
        if self._server is None:
            return said
        try:
            code = self._server.process.wait(1.0)
        except subprocess.TimeoutExpired:
            return said
        return f"the zygote (pid {self._server.process.pid}) {self._server.death(code)}"

    def spawn(self, target: str, args: list[str], module: bool, env: dict[str, str],
              stdio: tuple[int, int, int], is_callable: bool = False) -> int:
        self._next_id += 1
        request = {"op": "spawn", "id": self._next_id, "target": target, "args": args,
                   "module": module, "callable": is_callable, "env": env, "cwd": os.getcwd(),
                   "sys_path": sys.path}
        send_message(self._connect(), request, list(stdio))
        # the first answer may wait for the zygote's torch import (it listens before it)
        limit = _START_TIMEOUT if self._next_id == 1 else _REPLY_TIMEOUT
        deadline = time.monotonic() + limit
        while True:
            message = self._read(max(0.0, deadline - time.monotonic()))
            if message is None:
                raise ZygoteError(f"the zygote did not answer a spawn within {limit:g}s")
            if message.get("id") == self._next_id:
                if message["op"] == "spawned":
                    return int(message["pid"])
                raise ZygoteError(f"the zygote could not start a worker: {message.get('message')}")

    def exit_code(self, pid: int, timeout: float) -> int | None:
        """The worker's exit code once the zygote reported it (waits up to ``timeout``)."""
        deadline = time.monotonic() + timeout
        while pid not in self._exits:
            remaining = deadline - time.monotonic()
            if remaining < 0 or self._read(remaining) is None:
                break
        return self._exits.pop(pid, None)

    def signal(self, pid: int, sig: int) -> None:
        send_message(self._connect(), {"op": "signal", "pid": pid, "sig": int(sig)})

    def start_callable(self, local_rank: int, payload_path: str, env: dict[str, str],
                       stdout: Any, stderr: Any) -> WorkerProcess:
        """Run the pickled ``(fn, args, return_path)`` at ``payload_path`` in a fork."""
        proc = self._start(local_rank, (payload_path, [], False, True), env, stdout, stderr)
        proc.return_path = os.path.join(os.path.dirname(payload_path), "return.pkl")
        return proc

    def start_worker(self, local_rank: int, argv: list[str], env: dict[str, str],
                     stdout: Any, stderr: Any) -> WorkerProcess:
        """Start ``argv`` in the zygote when it is a plain Python run; else exec it."""
        parsed = python_target(argv)
        if parsed is None:
            from harness.procs._handles import BinaryProcess

            return BinaryProcess(local_rank, argv, env, stdout, stderr)
        return self._start(local_rank, (*parsed, False), env, stdout, stderr)

    def _start(self, local_rank: int, what: tuple[str, list[str], bool, bool],
               env: dict[str, str], stdout: Any, stderr: Any) -> WorkerProcess:
        target, args, module, is_callable = what
        opened = []
        try:
            stdio = []
            for handle, default in ((subprocess.DEVNULL, 0), (stdout, 1), (stderr, 2)):
                if handle is None:
                    stdio.append(default)
                elif handle == subprocess.DEVNULL:
                    fd = os.open(os.devnull, os.O_RDWR)
                    opened.append(fd)
                    stdio.append(fd)
                elif isinstance(handle, int):
                    stdio.append(handle)
                else:
                    stdio.append(handle.fileno())
            pid = self.spawn(target, args, module, env, (stdio[0], stdio[1], stdio[2]), is_callable)
        finally:
            for fd in opened:
                os.close(fd)
        return ZygoteProcess(local_rank, pid, self)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()  # the zygote kills whatever workers we still had
            self._sock = None
        if self._server is not None:
            self._server.close()
            self._server = None


class ZygoteProcess(WorkerProcess):
    """A worker forked by the zygote; its exit code arrives over the zygote connection."""

    _sweep_safe = False  # the zygote sweeps and reaps

    def __init__(self, local_rank: int, pid: int, zygote: Zygote):
        super().__init__(local_rank, pid)
        self._zygote = zygote
        try:
            self._fd = os.pidfd_open(pid)
            self._own_pipe = -1
        except ProcessLookupError:  # already gone: hand out something already readable
            self._fd, self._own_pipe = os.pipe()
            os.write(self._own_pipe, b"x")

    def fileno(self) -> int:
        return self._fd

    def _exited_fd(self) -> bool:
        import select

        return bool(select.select([self._fd], [], [], 0)[0])

    def poll(self) -> int | None:
        if self.exitcode is None:
            code = self._zygote.exit_code(self.pid, 0)
            if code is None and self._exited_fd():
                code = self._zygote.exit_code(self.pid, _REPLY_TIMEOUT)  # report is on its way
            self.exitcode = code
        return self.exitcode

    def _reap(self) -> int:
        raise NotImplementedError  # poll() is overridden

    def signal_group(self, sig: int) -> None:
        if self.exitcode is None:
            self._zygote.signal(self.pid, sig)

    def release(self) -> None:
        for fd in (self._fd, self._own_pipe):
            if fd >= 0:
                os.close(fd)
        self._fd = self._own_pipe = -1

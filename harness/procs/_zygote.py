"""The zygote: a warm interpreter (torch imported, never CUDA) that forks workers.

Importing torch costs ~1.1 s and ~210 MB per process; a worker forked from the zygote
pays neither, and a restart reuses the same zygote. One zygote can serve many agents
(the harness shares one per process tree), so:

* agents talk to it over a ``SOCK_SEQPACKET`` unix socket: one message per request, the
  worker's stdin/stdout/stderr passed along as file descriptors (``SCM_RIGHTS``). The
  socket is a file in a private 0700 directory, not an abstract name: abstract names
  belong to a network namespace, and agents may live in other namespaces than the zygote;
* a worker runs in its agent's network namespace, as a spawned one would: the zygote
  learns the agent's pid from the connection (``SO_PEERCRED``), and a child forked for an
  agent in another namespace joins it (``setns``) before any of its code runs;
* a worker runs in its agent's cgroups, as a child of the agent would (a CPU quota or a
  memory limit put on a node's agent covers its workers): the zygote moves each child it
  forks into the cgroups of the agent that asked, before it replies ``spawned``. A worker
  whose agent names cgroups of the workers' own (``HARNESS_WORKER_CGROUP``, a simulated
  node's) moves itself there before any of its code runs, so none of it runs outside its
  node's limits and share of the CPU, however long its agent takes to see it started;
* a zygote shared by many agents (the simulation's) may run ahead of them
  (``harness.procs._priority``): it forks for every node, one fork after another;
* the zygote is the workers' parent: it reaps them (sweeping each process group with
  SIGKILL *before* the reap, while the group id cannot be reused) and reports every exit
  code to the agent that asked for the worker;
* workers die with their agent: when an agent's connection closes (the agent died), the
  zygote SIGKILLs that agent's workers; they also die with the zygote (PDEATHSIG), and
  the zygote with whoever started it.

What the zygote imported is kept out of its workers' cyclic garbage collections
(``harness.procs._heap``): torch's import, and before each fork whatever it imported since.

The forked child runs a script (``runpy.run_path``) or module (``runpy.run_module``) as
``__main__``. Differences from a fresh interpreter are listed in docs/elastic-run.md.

Wire format: each message is a JSON object; requests ``spawn`` (+3 fds) and ``signal``;
replies ``spawned``/``error``; events ``exit``. Workers send ``learn`` (the modules they
imported and their target's key, on a connection of their own; no reply): the zygote imports
those while idle, or before it forks the target's next worker, and keeps them in the import
cache for the zygotes of later processes (``harness.procs._preload``, ``_import_cache``), so
a restarted worker does not import them again.
"""

from __future__ import annotations

import gc
import json
import os
import select
import selectors
import signal
import socket
import struct
import sys
import traceback
from typing import Any, cast

from harness.procs._cgroup import cgroup_dirs, join_cgroups
from harness.procs._exit import exit_like_python
from harness.procs._handles import signal_process_group
from harness.procs._heap import frozen_imports
from harness.procs._import_cache import ImportCache, Interpreter
from harness.procs._placement import place_worker, worker_cgroup_files, worker_nice
from harness.procs._prctl import join_netns, same_netns, set_pdeathsig
from harness.procs._preload import (
    PRELOAD_ENV,
    Preloader,
    extra_packages,
    module_name,
    note_fork,
    share_imports,
    target_key,
)
from harness.procs._priority import Ahead, run_ahead
from harness.selfpipe import drain_pipe, self_pipe

__all__ = ["serve", "ZYGOTE_ENV", "MAX_MESSAGE"]

ZYGOTE_ENV = "HARNESS_ZYGOTE"  # socket path of a shared zygote, set by the harness
MAX_MESSAGE = 4 * 1024 * 1024


def send_message(sock: socket.socket, message: dict[str, Any], fds: list[int] | None = None) -> None:
    data = json.dumps(message, separators=(",", ":")).encode()
    if len(data) > MAX_MESSAGE:
        raise ValueError(f"zygote message of {len(data)} bytes exceeds {MAX_MESSAGE}")
    if fds:
        socket.send_fds(sock, [data], fds)
    else:
        sock.send(data)


def recv_message(sock: socket.socket) -> tuple[dict[str, Any] | None, list[int]]:
    """One message and the fds that came with it; (None, []) when the peer closed."""
    data, fds, _flags, _addr = socket.recv_fds(sock, MAX_MESSAGE, 8)
    if not data:
        for fd in fds:
            os.close(fd)
        return None, []
    return json.loads(data), fds


def make_socket() -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, MAX_MESSAGE)
    return sock


# ----------------------------------------------------------------------------------------
# server


class _Zygote:
    def __init__(self, listener: socket.socket, path: str, preloader: Preloader, ahead: Ahead | None = None):
        self.listener = listener
        self.ahead = ahead or Ahead()  # what this server raised of its CPU priority
        self.path = path
        self.preloader = preloader  # what workers imported, imported here while idle
        self.selector = selectors.DefaultSelector()
        self.selector.register(listener, selectors.EVENT_READ, "accept")
        self.wake_r, self.wake_w = self_pipe()
        self.selector.register(self.wake_r, selectors.EVENT_READ, "sigchld")
        self.owner: dict[int, socket.socket] = {}  # worker pid -> agent connection
        self.clients: set[socket.socket] = set()
        self.netns: dict[socket.socket, int] = {}  # agent connection -> its netns fd, when not ours
        self.agents: dict[socket.socket, int] = {}  # agent connection -> the agent's pid

    def run(self) -> None:
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        while True:
            ready = self.selector.select(self.preloader.idle_timeout(bool(self.owner)))
            if not ready:
                self.ahead.step_back()  # the preload thread starts behind the nodes, as it runs
                self.preloader.start(bool(self.owner))
            # new connections first: a worker's last ``learn`` (sent as its target returns) is
            # queued before its exit, and must be read before the exit is reported -- the agent
            # may close a private zygote as soon as it knows
            for key, _ in sorted(ready, key=lambda item: item[0].data != "accept"):
                if key.data == "accept":
                    self.accept()
                elif key.data == "sigchld":
                    drain_pipe(self.wake_r)
                    self.reap()
                else:
                    self.serve_client(cast(socket.socket, key.fileobj))  # registered in accept()

    def accept(self) -> None:
        conn, _ = self.listener.accept()
        pid, uid = _peer(conn)
        if uid != os.getuid():  # it runs code on request: our uid only
            conn.close()
            return
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, MAX_MESSAGE)
        self.clients.add(conn)
        self.selector.register(conn, selectors.EVENT_READ, "client")
        self.note_netns(conn, pid)
        self.agents[conn] = pid
        if _readable_now(conn):  # a message already waiting (a worker's learn)
            self.serve_client(conn)

    def serve_client(self, conn: socket.socket) -> None:
        if conn not in self.clients:  # dropped earlier in this round
            return
        try:
            self.handle(conn)
        except Exception as e:  # a vanished or confused agent affects only itself
            if not isinstance(e, OSError):
                print(f"[zygote] dropping a client after a bad request: {e!r}",
                      file=sys.stderr, flush=True)
            if conn in self.clients:
                self.drop(conn)

    def reap(self) -> None:
        for pid in list(self.owner):
            try:
                info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                info = None
            if info is None or info.si_pid != pid:
                continue
            signal_process_group(pid, signal.SIGKILL)  # sweep the group before the reap frees its id
            _, status = os.waitpid(pid, 0)
            code = os.waitstatus_to_exitcode(status)
            conn = self.owner.pop(pid)
            if conn in self.clients:
                try:
                    send_message(conn, {"op": "exit", "pid": pid, "exitcode": code})
                except OSError:
                    pass

    def note_netns(self, conn: socket.socket, agent_pid: int) -> None:
        """Keep a handle on the agent's network namespace when it is not ours. Taken at
        connect time, while the agent is certainly alive (its pid cannot have been reused)."""
        try:
            fd = os.open(f"/proc/{agent_pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return  # no /proc or no permission: workers stay where the zygote is
        if same_netns(fd):
            os.close(fd)
        else:
            self.netns[conn] = fd

    def drop(self, conn: socket.socket) -> None:
        """The agent is gone: its workers must follow."""
        self.selector.unregister(conn)
        self.clients.discard(conn)
        self.agents.pop(conn, None)
        fd = self.netns.pop(conn, None)
        if fd is not None:
            os.close(fd)
        conn.close()
        for pid, owner in self.owner.items():
            if owner is conn:
                signal_process_group(pid, signal.SIGKILL)

    def handle(self, conn: socket.socket) -> None:
        try:
            message, fds = recv_message(conn)
        except (OSError, ValueError):
            message, fds = None, []
        if message is None:
            self.drop(conn)
            return
        op = message.get("op")
        if op == "spawn":
            self.spawn(conn, message, fds)
        elif op == "learn":  # a worker's imports (harness.procs._preload.share_imports)
            for fd in fds:
                os.close(fd)
            self.preloader.learn(message.get("modules"), message.get("key"))
        elif op == "signal":
            pid = int(message["pid"])
            if self.owner.get(pid) is conn:  # only its own, never-reaped workers
                signal_process_group(pid, int(message["sig"]))
        else:
            for fd in fds:
                os.close(fd)
            send_message(conn, {"op": "error", "id": message.get("id"), "message": f"unknown op {op!r}"})

    def spawn(self, conn: socket.socket, request: dict[str, Any], fds: list[int]) -> None:
        key = target_key(str(request["target"]), bool(request["module"]), bool(request.get("callable")),
                         str(request["cwd"]))
        # never fork mid-import (a worker would inherit a held import lock); with no worker
        # alive, import first what this target's workers imported before
        env = request.get("env")
        allowed = extra_packages(env.get(PRELOAD_ENV) if isinstance(env, dict) else None)
        self.ahead.step_up()  # a node waits for what follows: the imports for its worker too
        self.preloader.before_fork(key, bool(self.owner), allowed)
        gc.freeze()  # what it imported since the last fork too: out of the worker's collections
        placed = _placed_by_its_agent(env)
        if not placed:
            self.ahead.lower_group()  # the child stays in this session's group
        agent_nice = self.agent_nice(conn) if placed else None
        self.ahead.before_fork()
        try:
            pid = os.fork()
        except OSError as e:
            self.ahead.after_fork()
            for fd in fds:
                os.close(fd)
            send_message(conn, {"op": "error", "id": request["id"], "message": f"fork failed: {e}"})
            return
        if pid == 0:
            self.become_worker(request, fds, self.netns.get(conn), key, agent_nice)  # never returns
        self.ahead.after_fork()
        try:
            os.setpgid(pid, pid)  # also done in the child: whichever runs first wins
        except OSError:
            pass
        if not placed:
            self.join_agent_cgroups(conn, pid, fds)
        for fd in fds:
            os.close(fd)
        self.owner[pid] = conn  # registered first: if the reply fails, drop() kills it
        send_message(conn, {"op": "spawned", "id": request["id"], "pid": pid})

    def join_agent_cgroups(self, conn: socket.socket, pid: int, fds: list[int]) -> None:
        """Move worker ``pid`` into its agent's cgroups (read now: the harness may have
        moved the agent since it connected); a cgroup it cannot join is said on the
        worker's stderr, and the worker runs on where it is."""
        agent = self.agents.get(conn)
        if agent is None:
            return
        for problem in join_cgroups(pid, cgroup_dirs(agent)):
            try:
                os.write(fds[2] if len(fds) > 2 else 2, f"[zygote] {problem}\n".encode())
            except OSError:
                pass

    def agent_nice(self, conn: socket.socket) -> int | None:
        """The nice value of the agent on ``conn`` (None: unknown, gone): its workers' is
        relative to it."""
        agent = self.agents.get(conn)
        try:
            return None if agent is None else os.getpriority(os.PRIO_PROCESS, agent)
        except OSError:
            return None

    def become_worker(self, request: dict[str, Any], fds: list[int], netns: int | None,
                      key: str | None, agent_nice: int | None = None) -> None:
        code = 1
        try:
            os.setpgid(0, 0)
            env = request.get("env")
            if _placed_by_its_agent(env):
                # the agent moves it too once it has its pid, to the same cgroups and the same
                # nice value (both relative to the agent's): whichever comes second changes nothing
                # (the agent's nice value unknown: its own call alone sets the worker's)
                place_worker(os.getpid(), 0 if agent_nice is None else worker_nice(env),
                             worker_cgroup_files(env), agent_nice)
            set_pdeathsig(signal.SIGKILL)
            if netns is not None:  # before anything of the worker's runs or opens a socket
                try:
                    join_netns(netns)
                except OSError as e:
                    os.write(fds[2] if len(fds) > 2 else 2,
                             f"[zygote] cannot join the agent's network namespace: {e}\n".encode())
                    os._exit(1)
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            for fd, target in zip(fds, (0, 1, 2), strict=False):
                os.dup2(fd, target)
            keep = set(range(3))
            self.selector.close()
            for sock in (self.listener, *self.clients):
                sock.close()
            for fd in (*fds, *self.netns.values(), self.wake_r, self.wake_w):
                if fd not in keep:
                    _close(fd)
            note_fork(self.path, key)
            code = run_as_main(request)
        except BaseException:  # the child must never return into the server loop
            try:
                traceback.print_exc()
            finally:
                code = 1
        finally:
            exit_like_python(code)


def _placed_by_its_agent(env: Any) -> bool:
    """Whether the worker's agent moves it into cgroups of the workers' own as soon as it
    has its pid (``HARNESS_WORKER_CGROUP``: ``procs._placement``, the simulation's nodes).
    Then the zygote's move into the agent's cgroups would be undone a moment later, and
    each move waits for the kernel: a cgroup v1 migration waits for an RCU grace period,
    one worker after another in the zygote (at 64 nodes 0.23 s of its 0.9 s of forks)."""
    return isinstance(env, dict) and bool(worker_cgroup_files(env))


def _peer(conn: socket.socket) -> tuple[int, int]:
    """(pid, uid) of the process that connected."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _gid = struct.unpack("3i", creds)
    return pid, uid


def _readable_now(sock: socket.socket) -> bool:
    poller = select.poll()  # not select.select: a busy zygote's fds may pass FD_SETSIZE
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


# ----------------------------------------------------------------------------------------
# the worker side of a fork


def _reset_stdio() -> None:
    import io

    for fd, name in ((1, "stdout"), (2, "stderr")):
        stream = io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), encoding="utf-8",
                                  errors="backslashreplace", line_buffering=True, write_through=True)
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)
    stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
    sys.stdin = sys.__stdin__ = stdin  # type: ignore[misc]  # typeshed: Final; a fresh worker does replace it


def _apply_threads(env: dict[str, str]) -> None:
    threads = env.get("OMP_NUM_THREADS")
    if threads and threads.isdigit() and int(threads) > 0:
        torch = sys.modules.get("torch")
        if torch is not None:
            torch.set_num_threads(int(threads))


def _run_callable(payload_path: str) -> None:
    """Call a pickled ``(fn, args, return_path)`` under ``@record``; pickle its result."""
    import pickle

    from harness.errors import record

    with open(payload_path, "rb") as fp:
        fn, args, return_path = pickle.load(fp)
    result = record(fn)(*args)
    tmp = return_path + ".tmp"
    with open(tmp, "wb") as fp:
        pickle.dump(result, fp)
    os.replace(tmp, return_path)


def run_as_main(request: dict[str, Any]) -> int:
    """Run ``python -u [-m] target args`` semantics (or a pickled callable) in this
    (forked) process."""
    import runpy

    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    import tempfile

    tempfile.tempdir = None  # the zygote's choice (its own TMPDIR), if made, is not the worker's
    _reset_stdio()
    _apply_threads(request["env"])
    from harness.procs._stackdump import install_from_env

    install_from_env(os.environ)  # SIGUSR1 -> Python stacks, when the plugin asks
    target, args, module = request["target"], request["args"], request["module"]
    agent_path = [p for p in request.get("sys_path", []) if p]
    base_path = agent_path[1:]  # a script or module gets its own sys.path[0], as python does
    try:
        if request.get("callable"):
            sys.path[:] = agent_path  # unpickling finds the callable where the agent did
            sys.argv = [sys.executable]
            _run_callable(target)
        elif module:
            sys.path[:] = [os.getcwd(), *base_path]
            sys.argv = [target, *args]
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            sys.path[:] = [os.path.dirname(os.path.abspath(target)), *base_path]
            sys.argv = [target, *args]
            runpy.run_path(target, run_name="__main__")
    except SystemExit as e:
        return _system_exit_code(e)
    except KeyboardInterrupt:
        traceback.print_exc()
        return 130
    except BaseException:
        traceback.print_exc()
        return 1
    finally:
        share_imports()  # what this worker imported, for the next one forked here
    return 0


def _system_exit_code(e: SystemExit) -> int:
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code & 0xFF
    print(e.code, file=sys.stderr)
    return 1


# ----------------------------------------------------------------------------------------
# entry


def serve(path: str, ready_fd: int | None = None, import_cache: str | None = None,
          ahead: bool = False) -> None:
    """Listen on ``path``, import torch, then serve forever (dies with its parent).

    It listens *before* the import (and says ``listening``, then ``ready``, on
    ``ready_fd``): agents may connect and ask for workers at once, their requests wait in
    the backlog, so the ~1 s torch import overlaps the agents' own start and rendezvous
    instead of preceding them. ``import_cache``: the directory where what workers import is
    kept across processes (``harness.procs._import_cache``; None: not kept). ``ahead``: run
    ahead of the agents it serves (``harness.procs._priority``), once torch is imported."""
    set_pdeathsig(signal.SIGKILL)
    listener = make_socket()
    listener.bind(path)
    os.chmod(path, 0o600)
    listener.listen(512)  # a whole simulated cluster may connect before the first accept
    if ready_fd is not None:
        os.write(ready_fd, b"listening\n")
    with frozen_imports():
        import torch  # noqa: F401  the whole point: pay for it once
        import torch.distributed  # noqa: F401

    raised = run_ahead() if ahead else None
    if ready_fd is not None:
        os.write(ready_fd, b"ready\n")
        os.close(ready_fd)
    cache = ImportCache(import_cache, Interpreter.current(), module_name) if import_cache else None
    _Zygote(listener, path, Preloader(cache), raised).run()


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else None,
          sys.argv[3] if len(sys.argv) > 3 and sys.argv[3] else None)

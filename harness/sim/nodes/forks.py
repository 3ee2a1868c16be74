"""``NodeForkServer``: node agents forked from one interpreter that has imported the runtime.

Why: a node agent is a Python process that imports the runtime (~0.1 s of CPU) before it
does anything; a 32-node cluster pays that 32 times, ~1.6 s of wall time on two cores,
the biggest single cost of starting it. The server imports the runtime once (the c10d
rendezvous backend an agent loads at its first round included) and forks a
node per request (~2 ms each), as the worker zygote does for workers.

The server is its own program, ``python -m harness.sim.nodes.forks FD [--parent PID]``;
it imports ``nodes.main`` (what each forked child runs), never the other way round.

A forked node is what ``python -m harness.sim.nodes.main SPEC`` would be: its own session
and process group, the harness's stdout, its ``agent.log`` as stderr, the node's
environment, working directory (first on ``sys.path``, as ``-m`` puts it) and network
namespace, dying with the server, which dies with the harness. Its exit status reaches
the harness from the server's ``waitpid`` (``ForkedNode.poll/wait``, Popen's meaning:
``-N`` for signal N). Where a fork could differ from a fresh interpreter, the harness
starts the node the plain way instead: when the node's environment changes a ``PYTHON*``
variable the server's interpreter was started without (``PYTHONPATH``,
``PYTHONHASHSEED``, ...: they act at interpreter start), or when the server is gone.

Protocol (one ``SOCK_SEQPACKET`` socket pair, pickled tuples; the harness serializes
requests): ``("fork", ident, request)`` with stdin/stdout/stderr as SCM_RIGHTS → the
server answers ``("started", ident, pid)`` or ``("failed", ident, reason)``; later, for
every node it reaped, ``("exit", ident, returncode)``. The server is single-threaded
(forking a threaded process is unsafe); it ends when the harness closes its end.

The server's imports are kept out of its nodes' cyclic garbage collections
(``harness.procs.frozen_imports``): an agent's collections look only at what it made.
"""

from __future__ import annotations

import os
import pickle
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from harness.selfpipe import drain_pipe, self_pipe
from harness.sim.nodes import main as node_main

__all__ = ["ForkedNode", "NodeForkServer", "serve"]

_MAX_MESSAGE = 1 << 20
_START_TIMEOUT_S = 30.0
_REPLY_TIMEOUT_S = 10.0


class ForkedNode:
    """The harness's handle on a forked node agent: the part of ``subprocess.Popen`` the
    harness uses (``pid``, ``returncode``, ``poll``, ``wait``)."""

    def __init__(self, server: NodeForkServer, ident: int, pid: int, args: list[str]):
        self._server = server
        self.ident = ident
        self.pid = pid
        self.args = args
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._server.exit_code(self.ident)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            code = self._server.wait_exit(self.ident, timeout)
            if code is None:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            self.returncode = code
        return self.returncode

    def when_exited(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` once the server has reaped this node (now, if it has)."""
        self._server.when_exited(self.ident, callback)

    def __repr__(self) -> str:
        return f"ForkedNode(pid={self.pid}, returncode={self.returncode})"


class NodeForkServer:
    """The harness's side: starts the server (returns at once: its imports overlap the
    harness's other start-up work), forks nodes through it, and tracks their exits."""

    def __init__(self) -> None:
        self._sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "harness.sim.nodes.forks", str(theirs.fileno()),
                 "--parent", str(os.getpid())],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, start_new_session=True,
            )
        except BaseException:
            self._sock.close()
            raise
        finally:
            theirs.close()
        #: the PYTHON* variables the server's interpreter started with (see module doc)
        self.python_env = _interpreter_settings(os.environ)
        self._replies: queue.Queue[tuple[Any, ...]] = queue.Queue()
        self._exits: dict[int, int] = {}
        #: ident -> what to call when the server reports that node reaped
        self._on_exit: dict[int, list[Callable[[], None]]] = {}
        self._pids: dict[int, int] = {}  # ident -> pid of every node forked
        self._abandoned: set[int] = set()  # requests given up on (the node starts the plain way)
        self._changed = threading.Condition()
        self._ready = threading.Event()
        self._gone = False
        self._request_lock = threading.Lock()
        self._next_ident = 0
        self._reader = threading.Thread(target=self._read, name="node-fork-server", daemon=True)
        self._reader.start()

    # -- the harness side -------------------------------------------------------------------

    def usable_for(self, env: dict[str, str]) -> bool:
        """Whether a node with this environment may be forked (see the module doc)."""
        if self._gone or self.process.poll() is not None:
            return False
        return _interpreter_settings(env) == self.python_env

    def fork(self, spec_path: str, netns: str | None, env: dict[str, str], cwd: str,
             stderr_fd: int) -> ForkedNode:
        """Fork a node agent running ``node_main.main(spec_path, ..., netns)``; raises
        ``OSError`` when the server cannot (the caller starts the node the plain way)."""
        if not self._ready.wait(_START_TIMEOUT_S) or self._gone:
            raise OSError("the node fork server did not start")
        args = [sys.executable, "-m", "harness.sim.nodes.main", spec_path]
        request = {"spec_path": spec_path, "netns": netns, "env": env, "cwd": cwd, "argv": args[2:]}
        with self._request_lock, open(os.devnull, "rb") as stdin:
            self._next_ident += 1
            ident = self._next_ident
            message = pickle.dumps(("fork", ident, request))
            socket.send_fds(self._sock, [message], [stdin.fileno(), sys.stdout.fileno(), stderr_fd])
            reply = self._reply_to(ident)
        if reply[0] != "started":
            raise OSError(f"the node fork server could not fork a node: {reply[2:]}")
        return ForkedNode(self, ident, reply[2], args)

    def exit_code(self, ident: int) -> int | None:
        with self._changed:
            return self._exits.get(ident)

    def wait_exit(self, ident: int, timeout: float | None) -> int | None:
        with self._changed:
            self._changed.wait_for(lambda: ident in self._exits, timeout)
            return self._exits.get(ident)

    def when_exited(self, ident: int, callback: Callable[[], None]) -> None:
        """``callback()`` on the reader thread when node ``ident``'s exit arrives (at once if
        it has): an agent the harness saw die (its pidfd) may be reaped only later, when a
        stopped or busy server gets to it, and its exit must still be recorded then."""
        with self._changed:
            if ident not in self._exits:
                self._on_exit.setdefault(ident, []).append(callback)
                return
        callback()

    def _reply_to(self, ident: int) -> tuple[Any, ...]:
        """The server's answer to request ``ident``. A late answer to a request given up on
        earlier is a node that started the plain way meanwhile: it is killed, never run twice."""
        deadline = time.monotonic() + _REPLY_TIMEOUT_S
        while True:
            try:
                reply = self._replies.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                with self._changed:
                    self._abandoned.add(ident)
                raise OSError("the node fork server did not answer") from None
            if reply[1] in (ident, 0):  # 0: the server is gone
                return reply
            if reply[0] == "started":
                os.kill(reply[2], signal.SIGKILL)

    def close(self) -> None:
        """End the server (nodes still running die with it: their PDEATHSIG) and reap it."""
        self._gone = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._reader.join(5)
        self._sock.close()

    def _read(self) -> None:
        while True:
            try:
                data = self._sock.recv(_MAX_MESSAGE)
            except OSError:
                data = b""
            if not data:
                break
            message = pickle.loads(data)
            if message[0] == "ready":
                self._ready.set()
            elif message[0] == "exit":
                with self._changed:
                    self._exits[message[1]] = message[2]
                    self._changed.notify_all()
                    callbacks = self._on_exit.pop(message[1], [])
                for callback in callbacks:
                    callback()
            elif message[0] == "started":
                with self._changed:  # known here, so its exit is told even if the server dies now
                    self._pids[message[1]] = message[2]
                    abandoned = message[1] in self._abandoned
                if abandoned:
                    os.kill(message[2], signal.SIGKILL)  # its node already started the plain way
                else:
                    self._replies.put(message)
            else:
                self._replies.put(message)
        # the server is gone: so is every node it forked (their PDEATHSIG is SIGKILL), once
        # the kernel has delivered it; nobody can tell their exit status any more
        self._gone = True
        self._ready.set()
        self._replies.put(("failed", 0, "the node fork server exited"))
        with self._changed:
            forked = list(self._pids.items())
        for ident, pid in forked:
            if self.exit_code(ident) is None:
                _await_gone(pid)
                with self._changed:
                    self._exits.setdefault(ident, -signal.SIGKILL)
                    self._changed.notify_all()


def _interpreter_settings(env: Mapping[str, str]) -> dict[str, str]:
    """The variables that act when an interpreter starts (``PYTHONPATH``, ...)."""
    return {k: v for k, v in env.items() if k.startswith("PYTHON")}


def _await_gone(pid: int, timeout: float = 10.0) -> None:
    """Until process ``pid`` (not our child) has exited, by its pidfd."""
    import select

    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return  # gone already
    try:
        select.select([fd], [], [], timeout)
    finally:
        os.close(fd)


# -- the server side ----------------------------------------------------------------------


def serve(fd: int, parent: int | None) -> int:
    """The server's loop (``python -m harness.sim.nodes.forks FD --parent PID``)."""
    import selectors

    from harness.procs import die_with_parent, frozen_imports, run_ahead

    if parent is not None:
        die_with_parent(parent)
    with frozen_imports():  # out of every agent's collections: they look only at what it made
        import encodings.idna  # noqa: F401  (socket.getaddrinfo's codec for a host name: every agent's)

        import harness.run  # noqa: F401  (the point of the server: every node finds it imported)
        from harness.rendezvous import import_backend

        import_backend("c10d")  # the simulated nodes' backend, loaded on an agent's first round

    ahead = run_ahead()  # it forks every node, one after another: the nodes' own work
    sock = socket.socket(fileno=fd)
    wake_read, wake_write = self_pipe()
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so the wakeup fd hears it
    idents: dict[int, int] = {}  # pid -> ident of every node not reaped yet
    me = os.getpid()
    sock.send(pickle.dumps(("ready",)))
    selector = selectors.DefaultSelector()
    selector.register(sock, selectors.EVENT_READ)
    selector.register(wake_read, selectors.EVENT_READ)
    while True:
        for key, _ in selector.select():
            if key.fileobj is sock:
                try:
                    data, fds, _, _ = socket.recv_fds(sock, _MAX_MESSAGE, 3)
                except OSError:
                    data, fds = b"", []
                if not data:
                    return 0
                _, ident, request = pickle.loads(data)
                ahead.before_fork()  # the node is born at the server's own priority
                try:
                    pid = os.fork()
                    if pid == 0:  # its own session leaves the server's group
                        _become_node(request, fds, me, [sock, wake_read, wake_write, selector])
                except OSError as e:
                    sock.send(pickle.dumps(("failed", ident, str(e))))
                else:
                    idents[pid] = ident
                    sock.send(pickle.dumps(("started", ident, pid)))
                finally:
                    ahead.after_fork()
                    for received in fds:
                        os.close(received)
            else:
                drain_pipe(wake_read)
        while idents:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            if pid in idents:
                sock.send(pickle.dumps(("exit", idents.pop(pid), os.waitstatus_to_exitcode(status))))


def _become_node(request: dict[str, Any], fds: list[int], server: int, server_handles: list[Any]) -> None:
    """In the forked child: become what ``python -m harness.sim.nodes.main SPEC`` would be,
    run the node, exit. Never returns."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for handle in server_handles:
            if isinstance(handle, int):
                os.close(handle)
            else:
                handle.close()
        os.setsid()
        for target, received in enumerate(fds):
            os.dup2(received, target)
            os.close(received)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        sys.path[0] = request["cwd"]  # what -m puts first: the working directory
        sys.argv = [node_main.__file__, *request["argv"][1:]]  # as -m harness.sim.nodes.main sets it
        import tempfile

        tempfile.tempdir = None  # the node's TMPDIR, not whatever the server computed
        code = node_main.main(request["spec_path"], server, request["netns"])
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        node_main.exit_now(code)


def _cli(argv: list[str]) -> int:
    """``python -m harness.sim.nodes.forks FD [--parent PID]`` (started by ``NodeForkServer``)."""
    options = dict(zip(argv[1::2], argv[2::2], strict=True))
    parent = options.get("--parent")
    return serve(int(argv[0]), int(parent) if parent else None)


if __name__ == "__main__":
    node_main.exit_now(_cli(sys.argv[1:]))  # no interpreter teardown, as a node

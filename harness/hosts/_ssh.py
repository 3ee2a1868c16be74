"""``SshHost``: one OpenSSH connection to a host, multiplexed, owned, checked.

``open()`` starts the *master*: ``ssh -o ControlMaster=yes`` in the foreground (never
``-f``: it stays our child, so we know its pid and reap it), its control socket in a
private 0700 dir, ``ControlPersist=no`` (it ends with its own session). Its own session
is the *lease* (``_remote.lease``): one JSON line with the host's interpreter, its
pytest-elastic version and a fresh work dir, then it waits for EOF on stdin and removes
the dir. That line is the readiness event (authenticated, socket listening, interpreter
runs) and the version check in one round trip, with no polling for the socket. The lease
stays the connection's line to the host: ``ping()`` takes a clock sample over it
(``_clock``), and a heartbeat on it every few seconds tells the host the controller is
alive: a host that hears nothing for ``lost_after`` seconds (a frozen controller, a link
that hangs without closing) ends this connection's commands and work dir by itself.

Commands go through the master (``ssh -o ControlMaster=no``: one channel each, no new
handshake) under the remote supervisor (``_remote.run``), their lifeline the client's stdin
(see ``_process``). ``ProxyCommand=false`` on them makes a missing master an error rather
than ssh's silent fallback to a fresh connection. ``multiplex=False`` gives every command a
connection of its own instead (the strategy ``bench/hosts.py`` compares).

sshd bounds the sessions of one connection (``MaxSessions``, 10 by default; the spec's
``max_sessions``): the lease is one, and each node's agent and event relay are one each, so
five nodes on one host would go past it, and sshd refuses the session that does
("administratively prohibited"). A command that would go
past the bound goes on another connection, opened then (``ssh -o ControlMaster=yes`` on a
socket of its own; its own session a ``cat`` on its stdin, which we hold: when we are gone,
it ends, and the connection with it). A host whose sshd allows fewer than ``max_sessions``
says so in one line naming the field.

Every option is on the command line: BatchMode=yes (a prompt would hang a run: keys only),
StrictHostKeyChecking=yes (``accept-new`` only with ``trust_on_first_use``), a known_hosts
file when the spec names one, keep-alives so a dead connection is noticed within
``ServerAliveInterval * ServerAliveCountMax`` seconds. ``close()`` lets every command go,
then the lease, then the master; nothing of ours is left on either side.
"""

from __future__ import annotations

import functools
import json
import math
import os
import shlex
import shutil
import subprocess
import threading
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from harness.errors import ConfigError
from harness.hosts._clock import ClockSample, LeaseChannel
from harness.hosts._control import make_control_dir
from harness.hosts._errors import (
    SSH_FAILED,
    HostCommandError,
    HostError,
    HostPythonError,
    HostTimeout,
    HostUnreachable,
    explain,
    last_line,
)
from harness.hosts._process import CommandResult, RemoteProcess, show_argv, stop_local
from harness.hosts._spec import FIELDS, HostSpec

__all__ = ["SILENT_LINK_S", "SshHost", "RemoteInfo"]

DIST = "pytest-elastic"
_SOCKET = "m"  # the first connection's control socket; another's is "m1", "m2", ...
_MOST_SOCKET = "m999"  # the longest name a control socket may have (the dir's path is chosen for it)
_ALIVE_INTERVAL_S, _ALIVE_COUNT = 5, 3
#: how long the host may stay silent before our ssh client gives the connection up
#: (``ServerAliveInterval * ServerAliveCountMax``): a shorter outage resumes (TCP retransmits)
SILENT_LINK_S = float(_ALIVE_INTERVAL_S * _ALIVE_COUNT)
#: the default of how long a host waits, hearing nothing from us, before it ends our commands
LOST_AFTER_S = 30.0
_MASTER_LOG = "master.log"


@functools.cache
def _remote_source() -> str:
    return (Path(__file__).with_name("_remote.py")).read_text()


@functools.cache
def controller_version() -> str:
    """This controller's pytest-elastic version, which every host must have too."""
    try:
        return metadata.version(DIST)
    except metadata.PackageNotFoundError:
        raise HostPythonError(f"this controller has no installed {DIST} to compare hosts with: "
                              "pip install it (pip install -e . in a checkout)") from None


@dataclass(frozen=True)
class RemoteInfo:
    """What the lease found on the host."""

    python: str  # its version, "3.11.2"
    executable: str  # sys.executable there
    pytest_elastic: str | None  # the installed version, None when missing
    work_dir: str  # this connection's work dir (removed with the connection)
    lease_pid: int | None = None  # the lease's pid on the host
    #: what the host lacks of each capability a hosts file may list -> why (``_remote.host_lacks``)
    lacks: dict[str, str] = field(default_factory=dict)


def check_capabilities(spec: HostSpec, info: RemoteInfo) -> None:
    """``HostError`` in one line naming every capability ``spec`` lists that the host lacks,
    and why: found when it connects, not when a fault that needs it fires."""
    lacking = [f"{name} ({info.lacks[name]})" for name in sorted(spec.capabilities) if name in info.lacks]
    if lacking:
        raise HostError(f"host {spec.label}: its capabilities list what it lacks: {'; '.join(lacking)}; "
                        "take them out of its capabilities in the hosts file, or give the host them")


@dataclass
class _Owned:
    """What close() must end, kept apart from the SshHost so a finalizer can run it."""

    owner: int
    control_dir: str | None = None
    master: subprocess.Popen[str] | None = None
    lease: LeaseChannel | None = None  # the master's stdin and stdout: the lease ends at its EOF
    more: list[tuple[subprocess.Popen[str], int]] = field(default_factory=list)  # more connections, their stdin
    beating: threading.Event = field(default_factory=threading.Event)  # set: the heartbeat stops
    processes: set[RemoteProcess] = field(default_factory=set)
    closed: bool = False


def _heartbeat(lease: LeaseChannel, every: float, stop: threading.Event) -> None:
    """A line on the lease every ``every`` s until ``stop`` (or the lease is gone)."""
    while not stop.wait(every) and lease.beat():
        pass


def _teardown(owned: _Owned, grace: float) -> None:
    """Commands first (all told at once, then reaped), then the lease, then the master."""
    if owned.closed or os.getpid() != owned.owner:  # a forked child owns none of it
        return
    owned.closed = True
    processes = list(owned.processes)
    for proc in processes:
        proc.let_go()
    for proc in processes:
        proc.close()
    owned.processes.clear()
    for popen, stdin in owned.more:  # their sessions are gone: each ends at its own session's EOF
        os.close(stdin)
        stop_local(popen, 1.0)
    owned.more.clear()
    owned.beating.set()
    if owned.lease is not None:
        owned.lease.close()
    if owned.master is not None:
        stop_local(owned.master, grace)
        if owned.master.stdout is not None:
            owned.master.stdout.close()
    if owned.control_dir is not None:
        shutil.rmtree(owned.control_dir, ignore_errors=True)


class SshHost:
    """One host over SSH. ``with SshHost(spec) as host: host.run(["uname", "-a"])``.

    ``ssh_command`` is the client's argv (another OpenSSH build, or a wrapper that execs
    it, such as ``nsenter --net=PATH ssh``); ``ssh_config`` is passed as ``-F`` ("none":
    no config file at all; None: the user's, as ssh reads it). ``lost_after``: how long the
    host waits, hearing nothing from us, before it ends what we started there (None: only
    when the connection closes); we send a heartbeat every ``min(5, lost_after / 4)`` s.
    ``keep_missed``: how long the host keeps the nodes' events files once it lost the
    connection without our ``close()`` (0: not at all; None: the spec's ``keep_missed``),
    for ``kept``; everything else of the connection goes at once.
    """

    def __init__(self, spec: HostSpec, *, ssh_command: Sequence[str] = ("ssh",), ssh_config: str | None = None,
                 connect_timeout: float = 10.0, multiplex: bool = True, check_version: bool = True,
                 lost_after: float | None = LOST_AFTER_S, keep_missed: float | None = None):
        if lost_after is not None and not (isinstance(lost_after, (int, float)) and lost_after > 0):
            raise ConfigError("lost_after", lost_after, "must be a number of seconds > 0, or None",
                              f"host {spec.label}")
        self.spec, self.ssh_command, self.ssh_config = spec, tuple(ssh_command), ssh_config
        self.connect_timeout, self.multiplex, self.check_version = connect_timeout, multiplex, check_version
        keep = spec.keep_missed if keep_missed is None else FIELDS["keep_missed"].check(keep_missed)
        if keep is None:  # the hosts file's own check of the field
            raise ConfigError("keep_missed", keep_missed, FIELDS["keep_missed"].constraint, f"host {spec.label}")
        self.lost_after, self.keep_missed = lost_after, float(keep)
        self.info: RemoteInfo | None = None
        self._owned = _Owned(owner=os.getpid())
        self._finalizer = weakref.finalize(self, _teardown, self._owned, 5.0)
        self._lock = threading.Lock()
        self._forwards = 0  # local forwards made (each its own socket path in the control dir)

    # -- connecting -----------------------------------------------------------------------

    def open(self) -> SshHost:
        """Connect, start the lease, check the interpreter and pytest-elastic's version."""
        if self._owned.master is not None or self._owned.closed:
            raise HostError(f"host {self.spec.label}: open() once per SshHost")
        if self.spec.key is not None and not os.path.isfile(self.spec.key):
            raise ConfigError("key", self.spec.key, "is not a file on this machine", f"host {self.spec.label}")
        try:
            self._owned.control_dir = make_control_dir(_MOST_SOCKET)
            self.info = self._start_master()
            if self.check_version:
                self._check_version(self.info)
            check_capabilities(self.spec, self.info)
        except BaseException:
            self.close()
            raise
        return self

    def _start_master(self) -> RemoteInfo:
        assert self._owned.control_dir is not None
        mux = ["-o", "ControlMaster=yes", "-o", "ControlPersist=no"] if self.multiplex else []
        lease = (["lease", repr(float(self.lost_after or 0)), repr(self.keep_missed)]
                 + ([self.spec.work_dir] if self.spec.work_dir else []))
        theirs, ours = os.pipe()  # ssh reads, we hold the write end (close() closes it)
        with open(os.path.join(self._owned.control_dir, _MASTER_LOG), "w") as log:
            try:
                master = self._owned.master = subprocess.Popen(
                    self._argv(mux, self._python(lease)), stdin=theirs, stdout=subprocess.PIPE, stderr=log,
                    text=True, start_new_session=True, env=self._popen_env())  # a ^C to us must not cut the link first
            except FileNotFoundError:
                os.close(ours)
                raise HostError(f"host {self.spec.label}: no ssh client {self.ssh_command[0]!r} on this machine "
                                "(OpenSSH's client: Debian/Ubuntu openssh-client)") from None
            finally:
                os.close(theirs)
        assert master.stdout is not None
        self._owned.lease = LeaseChannel(ours, master.stdout.fileno(), self.spec.label)
        line = self._first_line(self._owned.lease, self.connect_timeout * 2 + 10)
        if not line:
            raise self._master_failure("connecting")
        try:
            report: dict[str, Any] = json.loads(line)
        except json.JSONDecodeError:
            raise HostPythonError(f"host {self.spec.label}: python={self.spec.python!r} printed {line[:200]!r} "
                                  "instead of the lease's report (does the login print to stdout?)") from None
        if report.get("problem"):
            raise HostError(f"host {self.spec.label}: {report['problem']}")
        if self.lost_after is not None:
            every = min(float(_ALIVE_INTERVAL_S), self.lost_after / 4)
            threading.Thread(target=_heartbeat, args=(self._owned.lease, every, self._owned.beating),
                             name=f"heartbeat {self.spec.label}", daemon=True).start()
        lacks = report.get("lacks")
        lacking = {str(k): str(v) for k, v in lacks.items()} if isinstance(lacks, dict) else {}
        return RemoteInfo(report["python"], report["executable"], report["pytest_elastic"], report["work_dir"],
                          report.get("pid"), lacking)

    def _first_line(self, lease: LeaseChannel, timeout: float) -> str:
        """The lease's report line; '' when the master exits first. Waits on the pipe."""
        try:
            line = lease.readline(timeout)
        except HostTimeout:
            raise HostTimeout(f"host {self.spec.label}: no answer {timeout:g} s after connecting "
                              f"(ConnectTimeout={self._connect_timeout_s()})") from None
        return "" if line is None else line.decode(errors="replace")

    def _master_failure(self, doing: str) -> HostError:
        """Why the master exited (it is reaped here)."""
        assert self._owned.master is not None and self._owned.control_dir is not None
        code = stop_local(self._owned.master, 5.0)
        log = Path(self._owned.control_dir, _MASTER_LOG).read_text(errors="replace")
        if code == SSH_FAILED:
            return explain(self.spec, log, doing)
        return HostPythonError(f"host {self.spec.label}: python={self.spec.python!r} could not run there "
                               f"(exit {code}: {last_line(log)}); set python= to the host's interpreter")

    def _check_version(self, info: RemoteInfo) -> None:
        mine = controller_version()
        where = f"host {self.spec.label}: python={self.spec.python!r} ({info.executable}, Python {info.python})"
        if info.pytest_elastic is None:
            raise HostPythonError(f"{where} has no {DIST}; install {DIST}=={mine} there "
                                  "or set python= to an interpreter that has it")
        if info.pytest_elastic != mine:
            raise HostPythonError(f"{where} has {DIST} {info.pytest_elastic}, this controller {mine}: "
                                  f"install {DIST}=={mine} there")

    # -- commands -------------------------------------------------------------------------

    @property
    def work_dir(self) -> str:
        """This connection's own dir on the host; removed when the connection ends."""
        return self._require_open().work_dir

    def start(self, argv: Sequence[str], *, grace: float = 5.0, stdout: int | None = subprocess.PIPE,
              stderr: int | None = subprocess.PIPE) -> RemoteProcess:
        """Start ``argv`` on the host (an argv, never a shell line: quoted with ``shlex.join``
        for the remote shell). It ends when it exits, when ``terminate()``/``close()`` lets it
        go (SIGTERM, ``grace`` s, SIGKILL), or when this process dies."""
        if isinstance(argv, str) or not argv or not all(isinstance(a, str) for a in argv):
            raise TypeError(f"argv must be a non-empty sequence of str, not {argv!r}")
        with self._lock:
            work_dir = self._require_open().work_dir
            self._owned.processes -= {p for p in self._owned.processes if p.closed}  # the caller's, done
            connection = self._connection_with_room() if self.multiplex else 0
            theirs, lifeline = os.pipe()  # ssh reads, we hold the write end
            try:
                popen = subprocess.Popen(
                    self._argv(self._client_options(),
                               self._python(["run", repr(float(grace)), work_dir, *argv], bare=True), connection),
                    stdin=theirs, stdout=stdout, stderr=stderr, text=True, errors="replace",
                    start_new_session=True, env=self._popen_env())
            except BaseException:
                os.close(lifeline)
                raise
            finally:
                os.close(theirs)
            proc = RemoteProcess(self.spec.label, argv, popen, lifeline, grace, self._owned.lease, connection)
            self._owned.processes.add(proc)
            return proc

    def _connection_with_room(self) -> int:
        """The connection a new command's session goes on: the first with fewer than
        ``max_sessions`` (its own session counted: the lease, or the ``cat``), else a new one."""
        busy = [1] * (len(self._owned.more) + 1)
        for proc in self._owned.processes:
            if proc.popen.poll() is None:
                busy[proc.connection] += 1
        for connection, sessions in enumerate(busy):
            if sessions < self.spec.max_sessions:
                return connection
        return self._open_another()

    def _open_another(self) -> int:
        """One more connection (``ssh -o ControlMaster=yes`` on socket ``m<N>``); its number
        once its control socket is there."""
        assert self._owned.control_dir is not None
        connection = len(self._owned.more) + 1
        log_path = os.path.join(self._owned.control_dir, f"{_MASTER_LOG}.{connection}")
        theirs, ours = os.pipe()  # its session's stdin: it ends at EOF, when we close ours or die
        with open(log_path, "w") as log:
            try:
                popen = subprocess.Popen(
                    self._argv(["-o", "ControlMaster=yes", "-o", "ControlPersist=no"], "exec cat >/dev/null",
                               connection),
                    stdin=theirs, stdout=subprocess.DEVNULL, stderr=log, text=True, start_new_session=True)
            except BaseException:
                os.close(ours)
                raise
            finally:
                os.close(theirs)
        self._owned.more.append((popen, ours))
        deadline = time.monotonic() + self.connect_timeout * 2 + 10
        while not os.path.exists(self._socket(connection)):
            if popen.poll() is not None or time.monotonic() > deadline:
                stop_local(popen, 1.0)
                raise explain(self.spec, Path(log_path).read_text(errors="replace"),
                              f"opening connection {connection + 1} (more than max_sessions="
                              f"{self.spec.max_sessions} commands at once)")
            time.sleep(0.01)
        return connection

    def run(self, argv: Sequence[str], *, timeout: float = 30.0, check: bool = True) -> CommandResult:
        """Run ``argv`` on the host to its end; raises ``HostCommandError`` on a non-zero
        status when ``check``, ``HostTimeout`` (after ending it) past ``timeout`` s."""
        proc = self.start(argv)
        try:
            out, err = proc.communicate(timeout)
        finally:
            self._forget(proc)
        shown = show_argv(argv)
        code = proc.popen.returncode
        if code == SSH_FAILED:
            raise self._client_failure(err, f"running {shown}")
        if check and code != 0:
            raise HostCommandError(f"host {self.spec.label}: {shown} exited {code}: {last_line(err)}",
                                   code, out, err)
        return CommandResult(self.spec.label, tuple(argv), code, out, err)

    def put(self, relative: str, data: bytes, *, timeout: float = 30.0) -> str:
        """Write ``data`` to the new file ``relative`` (to the work dir) on the host, mode
        0600, its missing dirs made; its path there. The bytes travel on the channel's
        stdin, never on a command line (every user of the host can read those): a secret
        may go this way. The file goes with the work dir."""
        work_dir = self._require_open().work_dir
        parts = relative.split("/")
        if relative.startswith("/") or any(part in ("", ".", "..") for part in parts):
            raise ValueError(f"relative={relative!r} must be a plain relative path inside the work dir")
        return self.write(f"{work_dir}/{relative}", data, timeout=timeout)

    def kept(self, work_dir: str, wait: float) -> str:
        """What became of ``work_dir``, an earlier connection's to this host, lost without
        ``close()``: "kept" (its lease has ended what it ran and keeps the nodes' events
        files, whole: read them, then ``release``), "gone" (removed: its ``keep_missed``
        ran out) or "running" (its lease has not noticed the loss within ``wait`` s)."""
        argv = self._remote_argv("kept", work_dir, repr(float(wait)))
        return self.run(argv, timeout=wait + self.connect_timeout + 20).stdout.strip()

    def release(self, work_dir: str) -> None:
        """Let the lease of the lost ``work_dir`` remove it now (``kept``)."""
        self.run(self._remote_argv("release", work_dir), check=False)

    def _remote_argv(self, *args: str) -> list[str]:
        """``_remote`` run as a command (under its supervisor), with the host's bare interpreter."""
        return [self.spec.python, "-I", "-S", "-c", _remote_source(), *args]

    def write(self, path: str, data: bytes, *, timeout: float = 30.0) -> str:
        """``put`` to the absolute ``path``, outside the work dir: a dir the job owns
        elsewhere on the host (its share of a filesystem the hosts share), which the
        caller removes itself; ``path``."""
        if not path.startswith("/") or any(part in (".", "..") for part in path.split("/")):
            raise ValueError(f"path={path!r} must be an absolute path without . or .. parts")
        self._require_open()
        argv = self._argv(self._client_options(), self._python(["put", path], bare=True))
        try:
            done = subprocess.run(argv, input=data, capture_output=True, timeout=timeout, env=self._popen_env())
        except subprocess.TimeoutExpired:
            raise HostTimeout(f"host {self.spec.label}: writing {path} did not finish within {timeout:g} s") from None
        err = done.stderr.decode(errors="replace")
        if done.returncode == SSH_FAILED:
            raise self._client_failure(err, f"writing {path}")
        if done.returncode != 0:
            raise HostCommandError(f"host {self.spec.label}: writing {path} exited {done.returncode}: "
                                   f"{last_line(err)}", done.returncode, "", err)
        return path

    def forward_remote(self, local_socket: str, *, timeout: float = 30.0) -> int:
        """Forward a port on the host's loopback, picked there, over this connection to the
        Unix socket ``local_socket`` on this machine (``ssh -O forward -R 127.0.0.1:0:PATH``
        to the master); that port. A process on the host reaches what listens at
        ``local_socket`` at ``127.0.0.1:PORT``; it ends with the connection. The host's
        sshd must allow it (``AllowTcpForwarding yes`` or ``remote``, its default ``yes``).
        A Unix socket, not a TCP address, on our side: ssh connects to it from wherever
        it runs (another network namespace too), and only this machine's users can."""
        done = self._forward("-R", f"127.0.0.1:0:{local_socket}", timeout, "forward_remote",
                             f"the port forward to {local_socket}")
        words = done.stdout.split()
        if done.returncode != 0 or len(words) != 1 or not words[0].isdigit():
            raise HostError(f"host {self.spec.label}: cannot forward a port there to {local_socket} "
                            f"(ssh -O forward exited {done.returncode}: {last_line(done.stderr or done.stdout)}); "
                            "the host's sshd must allow it: AllowTcpForwarding yes (or remote)")
        return int(words[0])

    def forward_local(self, remote_socket: str, *, timeout: float = 30.0) -> str:
        """Forward a Unix socket here, in this connection's private control dir, over this
        connection to the Unix socket ``remote_socket`` on the host (``ssh -O forward -L
        LOCAL:REMOTE`` to the master); the local path. Each connect here opens a channel
        to whatever listens at ``remote_socket`` then (a refused one closes at once); it
        ends with the connection. Only this machine's user reaches the path here (the dir
        is 0700), and only the host's user, who made it, the socket there. The host's sshd
        must allow it: ``AllowTcpForwarding yes`` or ``local`` (sshd grants a socket forward
        from the client's side under the same rule as a TCP one: ``remote`` alone denies
        it) and ``AllowStreamLocalForwarding yes``, both their defaults."""
        with self._lock:
            self._forwards += 1
            local = os.path.join(self._owned.control_dir or "", f"fwd{self._forwards}")
        done = self._forward("-L", f"{local}:{remote_socket}", timeout, "forward_local",
                             f"the forward to {remote_socket} there")
        if done.returncode != 0:
            raise HostError(f"host {self.spec.label}: cannot forward a socket here to {remote_socket} there "
                            f"(ssh -O forward exited {done.returncode}: {last_line(done.stderr or done.stdout)}); "
                            "the host's sshd must allow it: AllowTcpForwarding yes (or local)")
        return local

    def _forward(self, flag: str, spec: str, timeout: float, caller: str,
                 what: str) -> subprocess.CompletedProcess[str]:
        """``ssh -O forward FLAG SPEC`` to the master: ssh's answer, to read."""
        self._require_open()
        if not self.multiplex:
            raise HostError(f"host {self.spec.label}: {caller}() needs the multiplexed connection")
        config = ["-F", self.ssh_config] if self.ssh_config is not None else []
        argv = [*self.ssh_command, *config, "-o", f"ControlPath={self._socket()}", "-o", "LogLevel=ERROR",
                "-O", "forward", flag, spec, "-p", str(self.spec.port), "-l", self.spec.user, "--", self.spec.address]
        try:
            return subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise HostTimeout(f"host {self.spec.label}: {what} not set up within {timeout:g} s") from None

    def ping(self, timeout: float = 10.0) -> ClockSample:
        """One clock sample over the lease (``measure_offset(host)`` takes several)."""
        self._require_open()
        assert self._owned.lease is not None
        return self._owned.lease.ping(timeout)

    def _forget(self, proc: RemoteProcess) -> None:
        proc.close()
        with self._lock:
            self._owned.processes.discard(proc)

    def _client_failure(self, stderr: str, doing: str) -> HostError:
        master = self._owned.master
        if self.multiplex and master is not None and master.poll() is not None:
            return HostUnreachable(f"host {self.spec.label}: {doing}: the connection is closed "
                                   f"(ssh exited {master.returncode})")
        return explain(self.spec, stderr, doing)

    # -- the ssh command line -------------------------------------------------------------

    def _connect_timeout_s(self) -> int:
        return max(1, math.ceil(self.connect_timeout))

    def _argv(self, extra: list[str], remote: str, connection: int = 0) -> list[str]:
        spec = self.spec
        options = {
            "BatchMode": "yes",
            "StrictHostKeyChecking": "accept-new" if spec.trust_on_first_use else "yes",
            "ConnectTimeout": str(self._connect_timeout_s()),
            "ServerAliveInterval": str(_ALIVE_INTERVAL_S),
            "ServerAliveCountMax": str(_ALIVE_COUNT),
            "LogLevel": "ERROR",  # errors only: what stderr says is then what went wrong
            "ClearAllForwardings": "yes",
            "ForwardAgent": "no",
            "ForwardX11": "no",
            **({"UserKnownHostsFile": spec.known_hosts} if spec.known_hosts else {}),
            **({"IdentityFile": spec.key, "IdentitiesOnly": "yes"} if spec.key else {}),
            **({"ControlPath": self._socket(connection)} if self.multiplex else {}),
        }
        config = ["-F", self.ssh_config] if self.ssh_config is not None else []
        opts = [arg for name, value in options.items() for arg in ("-o", f"{name}={value}")]
        return [*self.ssh_command, *config, *opts, *extra, "-T", "-p", str(spec.port), "-l", spec.user,
                "--", spec.address, remote]

    def ssh_argv(self, remote: str) -> list[str]:
        """The local command line that runs the remote shell line ``remote`` the way
        ``start()`` does (same options and connection), without the supervisor: to see by
        hand what ssh says, or to time the transport alone (``bench/hosts.py``)."""
        self._require_open()
        return self._argv(self._client_options(), remote)

    def _popen_env(self) -> dict[str, str] | None:
        """The client's environment (None: ours)."""
        return None

    def _client_options(self) -> list[str]:
        if not self.multiplex:
            return []
        return ["-o", "ControlMaster=no", "-o", "ProxyCommand=false"]

    def _python(self, args: list[str], bare: bool = False) -> str:
        """The remote shell line that runs ``_remote`` with the host's interpreter. ``bare``
        (the supervisor of every command): ``-I -S``, no site and no PYTHON* variables,
        ~10-20 ms less a command and nothing on the host's path can shadow the stdlib
        (the command itself still gets the environment as it is). The lease runs as the
        agent will, site included: it must find pytest-elastic where the agent would."""
        return shlex.join([self.spec.python, *(["-I", "-S"] if bare else []), "-c", _remote_source(), *args])

    def _socket(self, connection: int = 0) -> str:
        assert self._owned.control_dir is not None
        return os.path.join(self._owned.control_dir, f"{_SOCKET}{connection or ''}")

    def _require_open(self) -> RemoteInfo:
        if self.info is None or self._owned.closed:
            raise HostError(f"host {self.spec.label}: not open (call open(), or use it as a context manager)")
        master = self._owned.master
        if master is not None and master.poll() is not None:
            raise HostUnreachable(f"host {self.spec.label}: the connection is closed (ssh exited {master.returncode})")
        return self.info

    # -- lifetime -------------------------------------------------------------------------

    def pids(self) -> list[int]:
        """The local ssh processes this host runs now (the master first)."""
        with self._lock:
            found = [self._owned.master] if self._owned.master is not None else []
            found += [popen for popen, _ in self._owned.more]
            found += [p.popen for p in self._owned.processes]
            return [p.pid for p in found if p.poll() is None]

    @property
    def control_dir(self) -> str | None:
        return self._owned.control_dir

    @property
    def closed(self) -> bool:
        return self._owned.closed

    def connected(self) -> bool:
        """Whether the connection (its first, which holds the lease) is up now: False once
        closed, or once the client gave it up (the host silent for ``SILENT_LINK_S``)."""
        master = self._owned.master
        return not self._owned.closed and master is not None and master.poll() is None

    def close(self) -> None:
        """End every command, the lease (the work dir goes) and the connection. Idempotent."""
        with self._lock:
            self._finalizer()

    def __enter__(self) -> SshHost:
        return self if self.info is not None else self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = ("closed" if self._owned.closed else "not open" if self.info is None else
                 f"open, {len(self._owned.processes)} commands, work_dir={self.info.work_dir!r}")
        return f"<SshHost {self.spec.label} {'multiplexed' if self.multiplex else 'unmultiplexed'} {state}>"

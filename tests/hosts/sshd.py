"""Real OpenSSH servers as hosts on this machine: one ``sshd`` per network namespace.

``SshdLab(root_dir, nhosts)`` builds a ``harness.sim.net.Network`` (a namespace per host on
a bridge, addresses from 198.18.0.0/15; this machine's own interfaces and routes are never
touched) and starts, per host, ``sshd -D`` inside the host's namespace with a host key and
an authorized user key made here by ``ssh-keygen``; the only login is root with that key
(remote port forwards allowed: a job's store is reached through one).
The client side lives in the network's store namespace: ``lab.ssh_command`` is
``nsenter --net=<it> ssh`` (nsenter execs, so the pid stays ssh's), and ``lab.spec(i)``
the ``HostSpec`` to reach host i. ``close()`` ends every sshd process (listeners and their
sessions, by pid) and removes the namespaces; the keys and configs stay in ``root_dir``
(the caller's temp dir). ``checkout_python(path)`` writes the hosts' interpreter for jobs
placed on them: this one, with this checkout first on its path.

sshd needs its privilege separation dir ``/run/sshd`` (compiled in). Rather than create it
on this machine, each sshd runs in a private mount namespace with a fresh tmpfs on /run.
The hosts share this machine's kernel, so its clocks: ``start(i, monotonic_offset=N)``
puts host i in a time namespace whose ``CLOCK_MONOTONIC`` runs N seconds ahead, as a
host booted N seconds earlier would (wall clocks cannot be shifted per namespace).
Standard library, psutil and harness only (no pytest): ``bench/hosts.py`` uses it too.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from harness.hosts import HostSpec, SshHost
from harness.sim.net import Network, netns_missing

__all__ = ["SshdLab", "SshdHost", "checkout_python", "sshd_missing", "TOOLS"]

TOOLS = ("ssh", "ssh-keygen", "nsenter", "unshare", "mount")
_READY_TIMEOUT_S = 15.0
#: the checkout these tests belong to
CHECKOUT = Path(__file__).resolve().parents[2]


def sshd_missing() -> str | None:
    """Why real sshd hosts cannot run here (one line), or None."""
    if os.geteuid() != 0:
        return "needs root (sshd in network namespaces)"
    if shutil.which("sshd", path="/usr/sbin:/usr/local/sbin:" + os.environ.get("PATH", "")) is None:
        return "needs OpenSSH's sshd (Debian: openssh-server)"
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        return f"needs {', '.join(missing)}"
    netns = netns_missing()
    return f"needs network namespaces: {'; '.join(netns)}" if netns else None


def checkout_python(path: Path) -> Path:
    """A shell wrapper at ``path`` that runs this interpreter with this checkout first on
    ``PYTHONPATH``: a host's ``python`` (``lab.spec(i, python=str(path))``) for a job placed
    on it, so the hosts, which share this machine's files, run the code under test."""
    path.write_text(f"#!/bin/sh\nPYTHONPATH={shlex.quote(str(CHECKOUT))}${{PYTHONPATH:+:$PYTHONPATH}}\n"
                    f"export PYTHONPATH\nexec {shlex.quote(sys.executable)} \"$@\"\n")
    path.chmod(0o755)
    return path


def keygen(path: Path) -> Path:
    """A new ed25519 key pair at ``path`` (and ``path.pub``), no passphrase."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", path.name, "-f", str(path)],
                   check=True, capture_output=True)
    return path


@dataclass
class SshdHost:
    index: int
    address: str
    port: int
    host_key: Path  # private; host_key.with_suffix(".pub") is what known_hosts gets
    process: subprocess.Popen[bytes]
    log: Path

    def known_hosts_line(self, key: Path | None = None) -> str:
        """The known_hosts line for this host: its own key, or ``key`` (a stranger's)."""
        public = Path(f"{key or self.host_key}.pub").read_text().split()[:2]
        target = self.address if self.port == 22 else f"[{self.address}]:{self.port}"
        return f"{target} {' '.join(public)}\n"


class SshdLab:
    """``nhosts`` namespaces ready for sshd; ``start(i)`` starts host i's. Close it.

    ``clean_rc``: the hosts' root has an empty ``~/.bashrc`` (bind-mounted in sshd's private
    mount namespace). bash sources it for every command sshd runs, and this machine's
    (``pyenv init``) costs ~100 ms a command: the tests and the bench measure our side, not
    the machine's rc file (the bench shows it too, with ``clean_rc=False``)."""

    def __init__(self, root: Path, nhosts: int, clean_rc: bool = True):
        self.root = root
        self.clean_rc = clean_rc
        self.user_key = keygen(root / "user_key")
        self.known_hosts = root / "known_hosts"
        self.known_hosts.write_text("")
        self.hosts: dict[int, SshdHost] = {}
        self.net = Network(nhosts, "netns")
        assert self.net.store_namespace is not None
        self.ssh_command = ("nsenter", f"--net=/run/netns/{self.net.store_namespace}", "ssh")

    def start(self, index: int, *, port: int = 22, password_only: bool = False, known: bool = True,
              monotonic_offset: int = 0, max_sessions: int = 10) -> SshdHost:
        """Start host ``index``'s sshd and wait until it answers. ``password_only``: it
        offers password authentication and nothing else. ``known``: its key goes into
        ``known_hosts``. ``monotonic_offset``: its monotonic clock is this many seconds
        ahead of ours (a time namespace). ``max_sessions``: its ``MaxSessions``."""
        address = self.net.address(index)
        where = self.root / f"host{index}"
        where.mkdir()
        host_key = keygen(where / "host_key")
        (where / "authorized_keys").write_text(Path(f"{self.user_key}.pub").read_text())
        methods = ("AuthenticationMethods password\nPasswordAuthentication yes\nPubkeyAuthentication no\n"
                   if password_only else
                   "AuthenticationMethods publickey\nPasswordAuthentication no\nPubkeyAuthentication yes\n")
        (where / "sshd_config").write_text(
            f"ListenAddress {address}:{port}\nHostKey {host_key}\nPidFile none\n"
            f"AuthorizedKeysFile {where / 'authorized_keys'}\n{methods}KbdInteractiveAuthentication no\n"
            "PermitRootLogin yes\nAllowUsers root\nUsePAM no\n"
            # StrictModes would refuse the keys under /tmp (world-writable, if sticky); TCP
            # forwarding both ways, sshd's default: the store is a remote forward, a node's
            # disk server's control link a local socket forward (sshd denies that one with "remote")
            "StrictModes no\nPrintMotd no\nX11Forwarding no\nAllowTcpForwarding yes\nLogLevel ERROR\n"
            f"MaxSessions {max_sessions}\n")
        sshd = shutil.which("sshd", path="/usr/sbin:/usr/local/sbin:" + os.environ.get("PATH", ""))
        assert sshd is not None
        inner = "mount -t tmpfs -o mode=0755 pe-sshd /run && mkdir -m 0755 /run/sshd && "
        rc = Path(pwd.getpwnam("root").pw_dir, ".bashrc")
        if self.clean_rc and rc.exists():
            inner += f"mount --bind /dev/null {shlex.quote(str(rc))} && "
        inner += "exec " + shlex.join([sshd, "-D", "-e", "-f", str(where / "sshd_config")])  # re-exec: a full path
        namespace = self.net.namespace_path(index)
        log = where / "sshd.log"
        clock = (["--time", "--monotonic", str(monotonic_offset), "--boottime", str(monotonic_offset),
                  "--fork", "--kill-child"] if monotonic_offset else [])
        with open(log, "wb") as out:
            process = subprocess.Popen(
                ["nsenter", f"--net={namespace}", "unshare", "--mount", "--propagation", "private", *clock,
                 "sh", "-c", inner], stdin=subprocess.DEVNULL, stdout=out, stderr=out)
        host = self.hosts[index] = SshdHost(index, address, port, host_key, process, log)
        self._wait_ready(host)
        if known:
            with open(self.known_hosts, "a") as fp:
                fp.write(host.known_hosts_line())
        return host

    def _wait_ready(self, host: SshdHost) -> None:
        """Until the server's banner comes back over TCP, from the client's namespace."""
        deadline = time.monotonic() + _READY_TIMEOUT_S

        def banner() -> bytes:
            with socket.create_connection((host.address, host.port), timeout=2) as sock:
                sock.sendall(b"SSH-2.0-pe-lab-probe\r\n")  # a client's hello: sshd logs no noise
                return sock.recv(64)

        while time.monotonic() < deadline:
            if host.process.poll() is not None:
                raise RuntimeError(f"sshd of host {host.index} exited {host.process.returncode}: "
                                   f"{host.log.read_text(errors='replace').strip()[-500:]}")
            with contextlib.suppress(OSError):
                if self.net.call_in_store(banner).startswith(b"SSH-2.0-"):
                    return
            time.sleep(0.02)  # a listening socket gives no event to wait on from here
        raise RuntimeError(f"sshd of host {host.index} not answering on {host.address}:{host.port} "
                           f"after {_READY_TIMEOUT_S:g} s")

    def spec(self, index: int, **fields: object) -> HostSpec:
        """Host ``index`` as root with the lab's key and known_hosts, the venv's python
        (port 22 for a host whose sshd was not started)."""
        host = self.hosts.get(index)
        values: dict[str, object] = {"address": self.net.address(index), "user": "root",
                                     "port": host.port if host else 22,
                                     "key": str(self.user_key), "python": sys.executable,
                                     "known_hosts": str(self.known_hosts), **fields}
        return HostSpec(**values)  # type: ignore[arg-type]

    def ssh_host(self, spec: HostSpec, **options: object) -> SshHost:
        """An ``SshHost`` whose client runs in the lab's client namespace, no ssh config."""
        return SshHost(spec, ssh_command=self.ssh_command, ssh_config="none", **options)  # type: ignore[arg-type]

    def remote_processes(self, index: int) -> list[psutil.Process]:
        """Everything host ``index``'s sshd started: its per-connection sshd processes and
        what runs in their sessions (a host's processes are this machine's)."""
        try:
            return psutil.Process(self.hosts[index].process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def sessions(self, index: int) -> list[psutil.Process]:
        """Host ``index``'s per-connection sshd processes (killing them drops connections)."""
        found = []
        for proc in self.remote_processes(index):
            try:
                if proc.name() == "sshd":
                    found.append(proc)
            except psutil.NoSuchProcess:
                pass
        return found

    def close(self) -> None:
        """Every sshd process (sessions first, then listeners; by pid), then the namespaces."""
        try:
            for index, host in self.hosts.items():
                for proc in self.remote_processes(index):
                    try:
                        proc.kill()
                    except psutil.NoSuchProcess:
                        pass
                if host.process.poll() is None:
                    host.process.send_signal(signal.SIGTERM)
                try:
                    host.process.wait(5)
                except subprocess.TimeoutExpired:
                    host.process.kill()
                    host.process.wait()
        finally:
            self.net.close()

    def __enter__(self) -> SshdLab:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

"""Helpers for multi-node tests: real agents (``python -m harness.run``) on loopback."""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import SCRIPTS

HERE = Path(__file__).parent
LOOP = str(HERE / "scripts" / "elastic_loop.py")
ALLREDUCE = str(SCRIPTS / "allreduce.py")
ENV_DUMP = str(SCRIPTS / "env_dump.py")
ALWAYS_FAIL = str(SCRIPTS / "always_fail.py")


def form_round(*handlers) -> list:
    """Run ``next_rendezvous`` on every handler at once (in threads), as their nodes do; the
    ``RendezvousInfo`` each returned, in the handlers' order (None where one did not)."""
    infos: list = [None] * len(handlers)

    def join(i: int) -> None:
        infos[i] = handlers[i].next_rendezvous()

    rounds = [threading.Thread(target=join, args=(i,)) for i in range(len(handlers))]
    for thread in rounds:
        thread.start()
    for thread in rounds:
        thread.join(30)
    return infos


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Node:
    """One agent process in its own process group; its output is collected by a thread."""

    def __init__(self, args: list[str], env: dict | None = None, module: str = "harness.run"):
        #: the agent's own temp dir (its log tree goes there): a node the test SIGKILLs cannot
        #: remove its tree, and the test removes that node's alone; in a dir they all shared,
        #: every tree of the run id would go, a survivor's too while it makes its next round's
        self.tmp = tempfile.mkdtemp(prefix="elastic_node_")
        full_env = {**os.environ, "LOGLEVEL": "INFO", "TMPDIR": self.tmp, **(env or {})}
        full_env.pop("TORCHELASTIC_ERROR_FILE", None)
        self.args = args
        self.proc = subprocess.Popen([sys.executable, "-m", module, *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env=full_env, start_new_session=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, text: str, timeout: float = 60, count: int = 1) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if sum(text in line for line in list(self.lines)) >= count:
                return
            if self.proc.poll() is not None:
                self._reader.join(2)
                if sum(text in line for line in list(self.lines)) >= count:
                    return
                raise AssertionError(f"agent exited rc={self.proc.returncode} before {text!r}:\n{self.output}")
            time.sleep(0.05)
        raise AssertionError(f"no {text!r} within {timeout}s:\n{self.output}")

    def wait(self, timeout: float = 60) -> int:
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"agent did not exit within {timeout}s:\n{self.output}") from None
        self._reader.join(5)
        return rc

    def signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.signal_group(signal.SIGKILL)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass

    def close(self) -> None:
        """Kill it and close its output pipe (once the reader has drained it); remove its
        temp dir unless an agent that ended on its own left a log tree there (``no_leaks``
        then names the dir)."""
        killed = self.proc.poll() is None
        self.kill()
        self._reader.join(5)
        assert self.proc.stdout is not None
        self.proc.stdout.close()
        if killed or not glob.glob(os.path.join(self.tmp, "elastic_*")):
            shutil.rmtree(self.tmp, ignore_errors=True)


@pytest.fixture
def nodes(warm_workers):
    """Start agents with ``nodes(args...)``; all are killed (process group) at teardown.
    Their workers fork from the test process's warm zygote (``warm_workers``): these tests
    are about the rendezvous, not about how a worker starts."""
    started: list[Node] = []

    def start(*args: str, env: dict | None = None) -> Node:
        node = Node(list(args), {**warm_workers, **(env or {})})
        started.append(node)
        return node

    yield start
    for node in started:
        node.close()
    # their workers die with them (the zygote kills an agent's workers when its connection
    # closes), a moment later: ``no_leaks`` waits for that, up to 5 s, after this teardown


def c10d_args(port: int, nnodes: str, run_id: str, *extra: str, nproc: int = 1) -> list[str]:
    return [f"--nnodes={nnodes}", f"--nproc-per-node={nproc}", "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id={run_id}", *extra]


def kill_node(node: Node) -> None:
    """SIGKILL an agent and all its workers at once (a node dying)."""
    import psutil

    try:
        procs = [psutil.Process(node.proc.pid)]
        procs += procs[0].children(recursive=True)
    except psutil.NoSuchProcess:
        return
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    node.proc.wait(10)
    # a SIGKILLed agent cannot remove its log tree; the test does it for it (its own alone)
    for path in glob.glob(os.path.join(node.tmp, "elastic_*")):
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def etcd_endpoint(tmp_path_factory):
    """A real etcd server on free loopback ports, for this module; dies with the test run."""
    yield from _etcd(tmp_path_factory)


#: the password of ``etcd_auth_endpoint``'s one user
ETCD_PASSWORD = "the job's password"


@pytest.fixture(scope="module")
def etcd_auth_endpoint(tmp_path_factory):
    """As ``etcd_endpoint``, with authentication on as the harness turns it on for its
    own (``enable_auth``): user root, ``ETCD_PASSWORD``."""
    from harness.rendezvous._etcd import enable_auth

    for endpoint in _etcd(tmp_path_factory):
        host, port = endpoint.split(":")
        enable_auth(host, int(port), ETCD_PASSWORD)
        yield endpoint


def _etcd(tmp_path_factory):
    import shutil

    binary = shutil.which("etcd")
    if binary is None:
        pytest.skip("etcd is not installed (Debian: apt-get install etcd-server; .ci/run does)")
    from harness.procs._prctl import set_pdeathsig

    for _ in range(3):
        data = tmp_path_factory.mktemp("etcd")
        client, peer = free_port(), free_port()
        proc = subprocess.Popen(
            [binary, "--data-dir", str(data), "--name", "test",
             "--listen-client-urls", f"http://127.0.0.1:{client}",
             "--advertise-client-urls", f"http://127.0.0.1:{client}",
             "--listen-peer-urls", f"http://127.0.0.1:{peer}",
             "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
             "--initial-cluster", f"test=http://127.0.0.1:{peer}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=set_pdeathsig)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                socket.create_connection(("127.0.0.1", client), timeout=0.5).close()
                break
            except OSError:
                time.sleep(0.05)
        if proc.poll() is None:
            break
        shutil.rmtree(data, ignore_errors=True)
    else:
        pytest.fail("etcd did not start on a free port in 3 tries")
    try:
        yield f"127.0.0.1:{client}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(data, ignore_errors=True)

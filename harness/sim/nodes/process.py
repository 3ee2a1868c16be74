"""A node agent's process, as the harness holds it, and how it is started.

A node is started by the pool's node fork server where it can be (``nodes.forks``), else
as ``python -m harness.sim.nodes.main``: either way a session leader that dies with its
parent and lives in its network namespace, whose ``RunResult`` lands in a file.
"""

from __future__ import annotations

import os
import pickle
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any, Protocol, TypeAlias

from harness.agent import RunResult
from harness.procs import is_same_process, signal_process_group
from harness.rendezvous import SECRET_ENV, SECRET_FILE_ENV

if TYPE_CHECKING:
    from harness.sim.nodes.forks import ForkedNode, NodeForkServer
    from harness.sim.truth.stacks import WorkerAccess

__all__ = ["NodeHandle", "NodeProcess", "job_secret_env", "start_node"]

#: a node agent's process: forked by the node server, started the plain way, or on a host
NodeHandle: TypeAlias = "subprocess.Popen[bytes] | ForkedNode | HostedAgent"


class HostedAgent(Protocol):
    """An agent on a host, held as a local agent's ``Popen`` is (``harness.sim.places.hosts.nodes.RemoteAgent``):
    named here by what it offers, so this module need not import the hosts' side."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def signal_group(self, sig: int) -> None: ...

    def signal_tree(self, sig: int) -> None: ...

    def close(self) -> None: ...


@dataclass
class NodeProcess:
    index: int
    name: str
    addr: str
    directory: str
    popen: NodeHandle
    result_path: str
    slot: int = 0
    gpus: tuple[str, ...] = ()

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def placed(self) -> dict[str, str]:
        """Where the node runs, for its ``node_start`` event (nothing: on this machine)."""
        return {}

    def worker_access(self) -> WorkerAccess | None:
        """How its workers are reached for their stacks when not directly, from here
        (``harness.sim.truth.stacks``): None, they are this machine's."""
        return None

    def live_workers(self, starts: Mapping[int, Mapping[str, Any]]) -> dict[int, int]:
        """local_rank -> pid of the workers of ``starts`` (each rank's latest ``worker_start``)
        still running: the same process as started, never a reused pid."""
        return {rank: s["worker_pid"] for rank, s in starts.items()
                if is_same_process(s["worker_pid"], s.get("start_time"))}

    def signal_agent(self, sig: int) -> None:
        """``sig`` to the agent alone (its workers must follow on their own); nothing if it
        just ended."""
        _signal(self.pid, sig)

    def signal_worker(self, pid: int, sig: int) -> None:
        """``sig`` to worker ``pid`` (one of ``live_workers``); nothing if it just ended."""
        _signal(pid, sig)

    def signal_node(self, sig: int, worker_pids: Iterable[int] = ()) -> None:
        """``sig`` to the agent's process group and to each of ``worker_pids``' (its live
        workers lead groups of their own): the whole node at once."""
        signal_process_group(self.pid, sig)
        for pid in worker_pids:
            signal_process_group(pid, sig)

    def kill_workers(self, starts: Iterable[Mapping[str, Any]]) -> list[int]:
        """SIGKILL, with its process group, every worker of ``starts`` (its ``worker_start``
        events) whose pid still names the process that started (never a reused pid); the
        pids killed, for the caller to reap."""
        killed = []
        for start in starts:
            pid = start["worker_pid"]
            if is_same_process(pid, start.get("start_time")):
                signal_process_group(pid, signal.SIGKILL)
                killed.append(pid)
        return killed

    def await_stopped(self, timeout: float) -> None:
        """Until the agent (just SIGSTOPped) is stopped or gone, at most ``timeout`` s: a
        bounded poll of one process (a forked node's parent is the node server: gone to us)."""
        deadline = time.monotonic() + timeout
        pause = 0.0005
        while time.monotonic() < deadline:
            try:
                if os.waitid(os.P_PID, self.pid, os.WSTOPPED | os.WEXITED | os.WNOHANG | os.WNOWAIT):
                    return
            except ChildProcessError:
                return
            time.sleep(pause)
            pause = min(pause * 2, 0.01)

    def result(self) -> RunResult | None:
        try:
            with open(self.result_path, "rb") as fp:
                result: RunResult | None = pickle.load(fp)
                return result
        except (FileNotFoundError, EOFError, pickle.UnpicklingError):
            return None



def job_secret_env(job_directory: str) -> dict[str, str]:
    """What hands the job's rendezvous secret to its store and its node agents:
    ``HARNESS_RDZV_SECRET_FILE`` naming a 0600 file in the job's directory, made on first
    use. It is an environment entry, because a command line is readable by every user of
    the host. The agents keep the secret from their workers."""
    path = os.path.join(job_directory, "rdzv.secret")
    if not os.path.exists(path):
        fd, tmp = tempfile.mkstemp(dir=job_directory, prefix=".rdzv.secret.")  # 0600
        with os.fdopen(fd, "w") as fp:
            fp.write(secrets.token_hex(32))
        try:
            os.link(tmp, path)  # whole or not at all; a second maker keeps the first's
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp)
    return {SECRET_FILE_ENV: path}


def start_node(server: NodeForkServer | None, spec_path: str, netns: str | None,
                env: dict[str, str], log: IO[bytes]) -> NodeHandle:
    """A node agent: forked by the pool's node server where it can be (a tenth of a second
    of imports saved per node), else ``python -m harness.sim.nodes.main``. Either way it is
    a session leader, dies with its parent, lives in its network namespace. It gets its
    job's rendezvous secret (the job's directory holds its nodes' directories, and the
    spec sits in one of them). A ``HARNESS_RDZV_SECRET`` from the caller is dropped:
    the job has one secret."""
    env = {**env, **job_secret_env(os.path.dirname(os.path.dirname(spec_path)))}
    env.pop(SECRET_ENV, None)
    if server is not None and server.usable_for(env):
        try:
            return server.fork(spec_path, netns, env, os.getcwd(), log.fileno())
        except OSError as e:
            log.write(f"node fork server: {e}; starting the node the plain way\n".encode())
            log.flush()
    settle = ["--parent", str(os.getpid())]  # the node dies with us, lives in its network
    if netns is not None:
        settle += ["--netns", netns]
    return subprocess.Popen(
        [sys.executable, "-m", "harness.sim.nodes.main", spec_path, *settle], env=env,
        cwd=os.getcwd(), stdin=subprocess.DEVNULL, stdout=None, stderr=log, start_new_session=True,
    )


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass

"""A real Slurm cluster on this machine: ``slurmctld`` and one ``slurmd`` per network namespace.

``SlurmLab(root_dir, nnodes)`` builds a ``harness.sim.net.Network`` (a namespace per node on
a bridge, addresses from 198.18.0.0/15; this machine's own interfaces and routes are never
touched), writes a ``slurm.conf`` into ``root_dir``, and starts ``slurmctld`` in the
network's store namespace (the controller's side: ``srun``, ``salloc``, ``scontrol`` and
``squeue`` run there too, ``lab.command(...)``) and ``slurmd -N nodeK`` in node K's
namespace, entered with ``nsenter --net`` only (``ip netns exec`` remounts ``/sys`` and hides
the cgroup mounts). Debian's build has multiple-slurmd: every ``slurmd`` is this machine's
process, named by ``-N``, with its own spool dir, pid file and log.

The lab's settings are the smallest that run job steps: ``auth/none`` and ``cred/none`` (no
munge: nothing outside the lab's namespaces can reach its daemons, and nothing listens on
this machine's own interfaces), ``proctrack/linuxproc`` and ``task/none`` (no cgroups made:
nothing under ``/sys/fs/cgroup`` to leave), ``ReturnToService=2`` (a node set DOWN by hand
comes back when its ``slurmd`` registers), ports 46817/46818 (inside the lab's namespaces
only). The controller's host name must be this machine's (``slurmctld`` checks it).

A node's ``slurmd`` can be killed and started again, as an operator would on a real cluster:
``slurmd_kill``/``slurmd_start`` are the commands for a Slurm file (``{node}``: the node's
name), a script in ``root_dir`` that kills the node's daemon by the pid in its pid file, or
starts it again in its namespace (it daemonizes; the lab finds it by its pid file).

``close()`` cancels every job of the lab's controller, ends every daemon by pid (SIGTERM,
then SIGKILL after a grace; a restarted ``slurmd`` by its pid file, if it is the lab's) and
removes the namespaces; the config, logs and state stay in
``root_dir`` (the caller's temp dir). Standard library, psutil and harness only (no pytest):
a bench may use it too.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import psutil

from harness.sim.net import Network, netns_missing

__all__ = ["SlurmLab", "slurm_missing", "TOOLS", "CONTROLLER_PORT", "NODE_PORT"]

#: what the lab runs: the daemons, the clients, and nsenter to enter the namespaces
TOOLS = ("slurmctld", "slurmd", "srun", "salloc", "scontrol", "squeue", "sinfo", "scancel", "nsenter")
CONTROLLER_PORT, NODE_PORT = 46817, 46818
_SBIN = "/usr/sbin:/usr/local/sbin:"
_READY_S = 30.0
_GRACE_S = 10.0


def _which(tool: str) -> str | None:
    return shutil.which(tool, path=_SBIN + os.environ.get("PATH", ""))


def slurm_missing() -> str | None:
    """Why a Slurm lab cannot run here (one line), or None."""
    if os.geteuid() != 0:
        return "needs root (slurmd in network namespaces)"
    missing = [tool for tool in TOOLS if _which(tool) is None]
    if missing:
        return f"needs {', '.join(missing)} (Debian: slurm-wlm)"
    netns = netns_missing()
    return f"needs network namespaces: {'; '.join(netns)}" if netns else None


class SlurmLab:
    """A Slurm cluster of ``nnodes`` nodes, up and idle when made. Close it."""

    def __init__(self, root: Path, nnodes: int, *, cpus: int = 2, slurmd_timeout: int = 10):
        self.root = root
        self.nnodes = nnodes
        self.net = Network(nnodes, "netns")
        self._daemons: list[tuple[str, subprocess.Popen[bytes]]] = []
        assert self.net.store_namespace is not None
        self._controller_ns = f"/run/netns/{self.net.store_namespace}"
        self.conf = root / "slurm.conf"
        self.control = root / "slurmd-ctl"
        #: the nodes' spool dirs: short, for the step sockets slurmd makes there (a Unix
        #: socket's path holds at most 107 bytes, and a test's tmp_path may take most of them)
        self.spool = Path(tempfile.mkdtemp(prefix="pe-slurm-"))
        #: the base of the connection work dirs on the nodes (a Slurm file's ``work_dir``):
        #: the lab's, so that it goes with the lab. A node's lease that Slurm or the lab kills
        #: outright (a node marked down, its slurmd killed, the lab closed) cannot remove its
        #: work dir, and under the nodes' default temp dir (this machine's /tmp: the lab's
        #: steps have no TMPDIR) each CI run left two there. Right under /tmp: a node's event
        #: relay binds a Unix socket below a work dir, and under xdist the test's TMPDIR is
        #: two private dirs deep
        self.work_dir = Path(tempfile.mkdtemp(prefix="pe-slurm-work-", dir="/tmp"))
        try:
            self._write_conf(cpus, slurmd_timeout)
            self._write_control()
            self._start()
            self.wait_idle()
        except BaseException:
            self.close()
            raise

    # -- the cluster ------------------------------------------------------------------------

    def node_name(self, index: int) -> str:
        return f"node{index}"

    @property
    def controller_address(self) -> str:
        """Where ``slurmctld`` listens, and where a step reaches the controller's side."""
        return self.net.store_address

    @property
    def env(self) -> dict[str, str]:
        """This process's environment with ``SLURM_CONF`` naming the lab's config."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def command(self, *argv: str) -> list[str]:
        """``argv`` (a Slurm client: ``srun``, ``scontrol``...) as run on the controller's
        side, in its namespace (run it with ``env``)."""
        return ["nsenter", f"--net={self._controller_ns}", *argv]

    def run(self, *argv: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client on the controller's side to its end; its output."""
        return subprocess.run(self.command(*argv), env=self.env, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)

    def node_states(self) -> dict[str, str]:
        """node name -> its state as ``sinfo`` says it (``idle``, ``alloc``, ``down*``...)."""
        done = self.run("sinfo", "-h", "-N", "-o", "%N %t")
        return dict(line.split() for line in done.stdout.splitlines() if len(line.split()) == 2)

    def state_of(self, name: str, wanted: tuple[str, ...], timeout: float = 10.0) -> str | None:
        """Node ``name``'s state once ``sinfo`` says one of ``wanted``, or its last state after
        ``timeout``: a fault is on the timeline as it begins, before Slurm carries it out, and
        a node released at a close passes through ``comp`` before ``idle``."""
        deadline = time.monotonic() + timeout
        while True:
            state = self.node_states().get(name)
            if state in wanted or time.monotonic() >= deadline:
                return state
            time.sleep(0.05)

    def wait_idle(self, timeout: float = _READY_S) -> None:
        """Until every node is idle (registered and free)."""
        deadline = time.monotonic() + timeout
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            for name, proc in self._daemons:
                if proc.poll() is not None and self._restarted(name) is None:
                    raise RuntimeError(f"{name} exited {proc.returncode}: {self._log_tail(name)}")
            states = self.node_states()
            if len(states) == self.nnodes and all(state == "idle" for state in states.values()):
                return
            time.sleep(0.05)  # slurmctld says nothing when a node registers: sinfo is the way to see it
        raise RuntimeError(f"the Slurm lab's nodes are not idle after {timeout:g} s: {states} "
                           f"({self._log_tail('slurmctld')})")

    @property
    def slurmd_kill(self) -> list[str]:
        """A Slurm file's ``slurmd_kill`` for this lab (``{node}``: the node's name)."""
        return [str(self.control), "kill", "{node}"]

    @property
    def slurmd_start(self) -> list[str]:
        """A Slurm file's ``slurmd_start`` for this lab."""
        return [str(self.control), "start", "{node}"]

    def daemon_pids(self) -> list[int]:
        """The pids of the lab's daemons still running (slurmctld first; a node's restarted
        ``slurmd`` by its pid file)."""
        pids = []
        for name, proc in self._daemons:
            pid = proc.pid if proc.poll() is None else self._restarted(name)
            if pid is not None:
                pids.append(pid)
        return pids

    def _restarted(self, name: str) -> int | None:
        """The pid of node ``name``'s ``slurmd`` started again by ``slurmd-ctl start``: the
        one its pid file names, if that process is this lab's slurmd of that node."""
        try:
            pid = int((self.root / f"slurmd.{name}.pid").read_text().split()[0])
            proc = psutil.Process(pid)
            argv = proc.cmdline()
            ours = proc.environ().get("SLURM_CONF") == str(self.conf)
        except (OSError, ValueError, IndexError, psutil.Error):
            return None
        return pid if ours and Path(argv[0]).name == "slurmd" and "-N" in argv and name in argv else None

    def processes(self) -> list[psutil.Process]:
        """The daemons and everything below them (``slurmstepd`` and its steps' processes)."""
        found = []
        for pid in self.daemon_pids():
            try:
                daemon = psutil.Process(pid)
                found += [daemon, *daemon.children(recursive=True)]
            except psutil.NoSuchProcess:
                continue
        return found

    # -- making and ending it ---------------------------------------------------------------

    def _write_conf(self, cpus: int, slurmd_timeout: int) -> None:
        root = self.root
        (root / "state").mkdir()
        host = os.uname().nodename.split(".")[0]
        lines = [
            "ClusterName=pelab", f"SlurmctldHost={host}({self.controller_address})",
            f"SlurmctldPort={CONTROLLER_PORT}", f"SlurmdPort={NODE_PORT}", "SlurmUser=root", "SlurmdUser=root",
            "AuthType=auth/none", "CredType=cred/none", "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core", "SchedulerType=sched/builtin",
            "MpiDefault=none", "ReturnToService=2", f"SlurmdTimeout={slurmd_timeout}", "SlurmctldTimeout=10",
            "InactiveLimit=0", "KillWait=2", "MinJobAge=2", "MailProg=/bin/true",
            f"StateSaveLocation={root}/state", f"SlurmdSpoolDir={self.spool}/%n",
            f"SlurmctldPidFile={root}/slurmctld.pid", f"SlurmdPidFile={root}/slurmd.%n.pid",
            f"SlurmctldLogFile={root}/slurmctld.log", f"SlurmdLogFile={root}/slurmd.%n.log",
            "JobCompType=jobcomp/none", "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
        ]
        lines += [f"NodeName={self.node_name(i)} NodeHostname={self.node_name(i)} NodeAddr={self.net.address(i)} "
                  f"CPUs={cpus} State=UNKNOWN" for i in range(self.nnodes)]
        lines.append("PartitionName=lab Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:8")
        self.conf.write_text("\n".join(lines) + "\n")

    def _write_control(self) -> None:
        """``slurmd-ctl kill|start NODE``: an operator's way to lose and restore a node's daemon."""
        starts = "\n".join(f"    {self.node_name(i)}) exec nsenter --net={self.net.namespace_path(i)} "
                           f"{_which('slurmd') or 'slurmd'} -N {self.node_name(i)} ;;" for i in range(self.nnodes))
        self.control.write_text(f"""#!/bin/sh
# slurmd-ctl kill|start NODE: the Slurm lab's node daemons, as an operator would kill and start them
set -e
export SLURM_CONF={self.conf}
case "$1" in
kill) exec kill -KILL "$(cat {self.root}/slurmd.$2.pid)" ;;
start)
  case "$2" in
{starts}
  *) echo "no node $2" >&2; exit 2 ;;
  esac ;;
*) echo "usage: slurmd-ctl kill|start NODE" >&2; exit 2 ;;
esac
""")
        self.control.chmod(0o755)

    def _start(self) -> None:
        env = self.env
        self._spawn("slurmctld", ["nsenter", f"--net={self._controller_ns}", _which("slurmctld") or "slurmctld",
                                  "-D", "-i"], env)
        for index in range(self.nnodes):
            namespace = self.net.namespace_path(index)
            self._spawn(self.node_name(index), ["nsenter", f"--net={namespace}", _which("slurmd") or "slurmd",
                                                "-D", "-N", self.node_name(index)], env)

    def _spawn(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        with open(self.root / f"{name}.out", "wb") as out:  # nsenter execs: the pid is the daemon's
            proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
        self._daemons.append((name, proc))

    def _log_tail(self, name: str) -> str:
        path = self.root / ("slurmctld.log" if name == "slurmctld" else f"slurmd.{name}.log")
        out = self.root / f"{name}.out"
        text = "".join(p.read_text(errors="replace") for p in (out, path) if p.exists())
        return text.strip().splitlines()[-1] if text.strip() else "no log"

    def step_processes(self) -> list[psutil.Process]:
        """The processes of this lab's job steps: what a step runs has the lab's ``SLURM_CONF``
        in its environment (which names no other cluster's); a ``slurmstepd`` has not (slurmd
        clears it) and is init's child, but holds its node's log file in this lab's dir open
        (one outlived the lab's close that way: a step whose srun was SIGKILLed, the lab
        closed at once)."""
        found = []
        daemons = self.daemon_pids()
        for proc in psutil.process_iter(["pid", "name"]):
            try:
                if proc.pid in daemons:
                    continue
                if proc.environ().get("SLURM_CONF") == str(self.conf) or (
                        proc.info["name"] == "slurmstepd"
                        and any(Path(f.path).is_relative_to(self.root) for f in proc.open_files())):
                    found.append(proc)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        return [p for p in found if p.pid != os.getpid()]

    def close(self) -> None:
        """Cancel every job and wait for its steps to end, end every daemon by pid (and any
        step process left), remove the namespaces. Idempotent."""
        if any(name == "slurmctld" for name, proc in self._daemons if proc.poll() is None):
            try:
                self.run("scancel", "--full", "--quiet", "--user=root", timeout=10)
            except (OSError, subprocess.SubprocessError):
                pass
            deadline = time.monotonic() + _GRACE_S
            while self.step_processes() and time.monotonic() < deadline:
                time.sleep(0.05)
        restarted = []
        for name, _ in self._daemons:
            pid = self._restarted(name)
            try:
                daemon = psutil.Process(pid) if pid is not None else None
                if daemon is not None:
                    daemon.terminate()
                    restarted.append(daemon)
            except psutil.Error:
                continue
        for _, popen in reversed(self._daemons):  # the node daemons first, then the controller
            if popen.poll() is None:
                popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + _GRACE_S
        for _, popen in self._daemons:
            try:
                popen.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                popen.kill()
                popen.wait()
        for proc in psutil.wait_procs(restarted, timeout=max(0.0, deadline - time.monotonic()))[1]:
            proc.kill()
        self._daemons.clear()
        left = self.step_processes()
        for proc in left:  # a step the daemons did not end: ours by its SLURM_CONF
            proc.kill()
        psutil.wait_procs(left, timeout=5)
        self.net.close()
        shutil.rmtree(self.spool, ignore_errors=True)
        shutil.rmtree(self.work_dir, ignore_errors=True)

    def __enter__(self) -> SlurmLab:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

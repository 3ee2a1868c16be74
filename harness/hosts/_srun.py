"""``SrunHost``: one node of a Slurm allocation, reached through job steps instead of SSH.

The same channel as ``SshHost``'s, with ``srun`` where ``ssh`` was: every command is a job
step on the node (``srun --overlap --jobid=JOB -N1 -n1 --nodelist=NODE``) running the same
supervisor (``_remote``, sent as source with ``python -c``), its stdin the step's (srun
forwards it, and its end), its stdout unbuffered. The lease is a step of its own: its first
line says the node's interpreter, pytest-elastic's version and a fresh work dir; its stdin
carries the heartbeats and the clock samples, as over SSH. So a command, a file put there,
the lease's ownership (nothing of ours is left on the node when we close, die, or go
silent) and the events relay are the same code as on an SSH host.

What a step cannot do is forward: there is no port or socket forward through Slurm. A node
reaches the controller's side over the cluster's network (the job's store listens at an
address the nodes reach, and says so with the job's secret), and ``forward_remote`` and
``forward_local`` refuse in one line. Slurm reports a step it could not launch by srun's
own ``srun: error:`` lines: a failure to start says the last of them.

``srun_command`` is the client's argv (a wrapper that execs ``srun``: ``nsenter --net=PATH
srun`` on a lab cluster in a network namespace); ``env`` its environment (``SLURM_CONF``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from harness.hosts._errors import HostError, HostPythonError, HostUnreachable, last_line
from harness.hosts._process import stop_local
from harness.hosts._spec import HostSpec
from harness.hosts._ssh import _MASTER_LOG, LOST_AFTER_S, SshHost

__all__ = ["SrunHost"]

#: what a step takes of the controller's environment (besides Slurm's own ``SLURM_*``)
_EXPORTED = "PATH,HOME,USER,LANG"


class SrunHost(SshHost):
    """Node ``node`` of Slurm job ``job_id`` (an allocation), as a host: ``with
    SrunHost(spec, job_id="42", node="node1") as host: host.run(["hostname"])``."""

    def __init__(self, spec: HostSpec, *, job_id: str, node: str, srun_command: Sequence[str] = ("srun",),
                 env: Mapping[str, str] | None = None, connect_timeout: float = 10.0, check_version: bool = True,
                 lost_after: float | None = LOST_AFTER_S, keep_missed: float | None = None):
        super().__init__(spec, ssh_command=tuple(srun_command), connect_timeout=connect_timeout, multiplex=False,
                         check_version=check_version, lost_after=lost_after, keep_missed=keep_missed)
        self.job_id, self.node = str(job_id), node
        self._env = dict(env) if env is not None else None

    def _argv(self, extra: list[str], remote: str, connection: int = 0) -> list[str]:
        """One job step on the node running the remote shell line ``remote`` (``extra``,
        ssh's options, mean nothing to srun). ``--overlap``: beside the node's other steps,
        whatever they hold; ``--unbuffered``: each line as it comes; ``--quiet``: no
        progress lines of srun's in what the command prints; ``--export``: the node's own
        environment but for a few variables, as an SSH login has it (srun would hand the
        step all of ours: our ``TMPDIR``, ``CUDA_VISIBLE_DEVICES``, ``PYTHONPATH``...)."""
        return [*self.ssh_command, "--overlap", f"--jobid={self.job_id}", "--nodes=1", "--ntasks=1",
                f"--nodelist={self.node}", "--unbuffered", "--quiet", "--kill-on-bad-exit=1",
                f"--export={_EXPORTED}", "sh", "-c", remote]

    def _popen_env(self) -> dict[str, str] | None:
        return self._env

    def _master_failure(self, doing: str) -> HostError:
        """Why the lease's step ended before its first line: srun's own error, else the
        interpreter's."""
        assert self._owned.master is not None and self._owned.control_dir is not None
        code = stop_local(self._owned.master, 5.0)
        log = Path(self._owned.control_dir, _MASTER_LOG).read_text(errors="replace")
        errors = [line for line in log.splitlines() if line.startswith("srun: error:")]
        if errors:
            return HostUnreachable(f"node {self.node} of Slurm job {self.job_id}: {doing}: {errors[-1]}")
        return HostPythonError(f"node {self.node} of Slurm job {self.job_id}: python={self.spec.python!r} could not "
                               f"run there (exit {code}: {last_line(log)}); set python= to the node's interpreter")

    def _client_failure(self, stderr: str, doing: str) -> HostError:
        errors = [line for line in stderr.splitlines() if line.startswith("srun: error:")]
        return HostUnreachable(f"node {self.node} of Slurm job {self.job_id}: {doing}: "
                               f"{errors[-1] if errors else last_line(stderr)}")

    def forward_remote(self, local_socket: str, *, timeout: float = 30.0) -> int:
        raise HostError(f"node {self.node} of Slurm job {self.job_id}: no port forward through Slurm: a step "
                        "reaches the controller's side over the cluster's network")

    def forward_local(self, remote_socket: str, *, timeout: float = 30.0) -> str:
        raise HostError(f"node {self.node} of Slurm job {self.job_id}: no socket forward through Slurm: the "
                        "controller reaches a node's listener over the cluster's network")

    def __repr__(self) -> str:
        state = ("closed" if self._owned.closed else "not open" if self.info is None else
                 f"open, {len(self._owned.processes)} commands, work_dir={self.info.work_dir!r}")
        return f"<SrunHost {self.node} of job {self.job_id} {state}>"

"""A Slurm allocation as the hosts a job's nodes run on: ``SlurmSpec`` (the ``[slurm]`` table
of a Slurm file, or keywords) and ``SlurmAllocation`` (the allocation itself, and a host per
node of it, reached with ``SrunHost``).

The spec says where to allocate (``partition``, ``account``, ``time_limit``, ``nodes``), what
each node offers (``python``, ``capabilities``, ``shared_dir``, ``work_dir``), and how the
controller's side is reached from the nodes (``controller_address``: the address the job's
store listens at, which every node must reach; Slurm forwards no port). Inside an
allocation (``SLURM_JOB_ID`` set, or ``job_id`` given) the job uses it and leaves it;
otherwise it makes its own (``salloc --no-shell``) and releases it (``scancel``) at close.

``client_prefix`` runs every Slurm client through a wrapper that execs it (``nsenter
--net=PATH`` for a cluster whose controller's side is a network namespace, as the tests'
lab), ``slurm_conf`` names the cluster's config for them (``SLURM_CONF``), and
``controller_netns`` is the network namespace the controller's side listens in (the job's
store), where it is not this process's. Bad fields are one ``ConfigError`` line naming the
field and the file.
"""

from __future__ import annotations

import getpass
import os
import re
import signal
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomllib

from harness.errors import ConfigError
from harness.hosts._errors import HostError
from harness.hosts._spec import HostSpec, _absolute, _address, _capabilities, _Field, _label, _text, check_fields
from harness.hosts._srun import SrunHost

__all__ = ["SlurmAllocation", "SlurmSpec", "SLURM_FIELDS", "allocation_refusal", "load_slurm", "slurm_spec",
           "stand_ins"]

#: how long a Slurm client may take (salloc waits for its nodes this long, by default)
_CLIENT_S = 60.0
#: scancel's exit code where it signalled a step of an allocation of several nodes (and said "error")
_SCANCEL_DELIVERED = 225
#: the capability of a node whose slurmd the harness can kill and start (``harness.sim.schema.SLURMD``)
SLURMD = "slurmd"
_TIME = re.compile(r"(\d+-)?\d+(:\d{1,2}){0,2}|UNLIMITED|INFINITE")


@dataclass(frozen=True)
class SlurmSpec:
    """Where a job's nodes are allocated on a Slurm cluster, and how they are reached."""

    controller_address: str  # the address every node reaches the controller's side at (the job's store)
    partition: str | None = None
    account: str | None = None
    time_limit: str | None = None  # salloc --time (MM, HH:MM:SS, D-HH...); None: the partition's default
    nodes: int | None = None  # how many to allocate; None: the job's most nodes
    job_id: str | None = None  # an allocation to use; None: $SLURM_JOB_ID, else one of our own
    python: str = "python3"  # the nodes' interpreter, which must have pytest-elastic
    capabilities: frozenset[str] = field(default_factory=frozenset)
    shared_dir: str | None = None  # a filesystem every node of the allocation shares
    work_dir: str | None = None  # the nodes' base of the connection work dirs; None: their temp dir
    client_prefix: tuple[str, ...] = ()  # what runs each Slurm client (nsenter --net=PATH)
    slurm_conf: str | None = None  # SLURM_CONF for the clients; None: theirs
    controller_netns: str | None = None  # the network namespace the controller's side listens in
    #: the commands that kill (SIGKILL) and start a node's ``slurmd``, ``{node}`` its Slurm
    #: name (``["ssh", "{node}", "sudo", "systemctl", "kill", "-s", "KILL", "slurmd"]``): an
    #: operator's, run on this machine; both or neither (the ``kill_slurmd`` fault needs them)
    slurmd_kill: tuple[str, ...] = ()
    slurmd_start: tuple[str, ...] = ()

    @property
    def node_capabilities(self) -> frozenset[str]:
        """What each node of the allocation can do: the listed ``capabilities``, and
        ``slurmd`` where the Slurm file gives the commands that kill and start its daemon."""
        return self.capabilities | ({SLURMD} if self.slurmd_kill else set())


def _time(value: Any) -> str | None:
    return value if isinstance(value, str) and _TIME.fullmatch(value) else None


def _count(value: Any) -> int | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 100_000
    return value if ok else None


def _job(value: Any) -> str | None:
    text = str(value) if isinstance(value, int) and not isinstance(value, bool) else value
    return text if isinstance(text, str) and text.isdigit() else None


def _argv(value: Any) -> tuple[str, ...] | None:
    ok = isinstance(value, (list, tuple)) and all(_text(v) is not None for v in value)
    return tuple(value) if ok else None


SLURM_FIELDS: dict[str, _Field] = {
    "controller_address": _Field(_address, "must be the IP address (or host name) the nodes reach this machine at"),
    "partition": _Field(_label, "must be a partition name"),
    "account": _Field(_label, "must be an account name"),
    "time_limit": _Field(_time, 'must be a Slurm time limit ("30", "1:00:00", "1-0", "UNLIMITED")'),
    "nodes": _Field(_count, "must be an int >= 1: the nodes to allocate"),
    "job_id": _Field(_job, "must be a Slurm job id (digits): an allocation to use"),
    "python": _Field(_text, "must be the nodes' interpreter (a path or a command name)"),
    "capabilities": _Field(_capabilities, "must be a list of names like \"netns\", \"cgroups\""),
    "shared_dir": _Field(_absolute, "must be an absolute path of a filesystem every node shares"),
    "work_dir": _Field(_absolute, "must be an absolute path on the nodes"),
    "client_prefix": _Field(_argv, 'must be a list of strings: a command that execs the Slurm client after it'),
    "slurm_conf": _Field(_text, "must be the path of a slurm.conf on this machine", local_path=True, must_exist=True),
    "slurmd_kill": _Field(_argv, 'must be a list of strings: the command that kills a node\'s slurmd ("{node}": '
                                 'its Slurm name)'),
    "slurmd_start": _Field(_argv, 'must be a list of strings: the command that starts a node\'s slurmd ("{node}": '
                                  'its Slurm name)'),
    "controller_netns": _Field(_absolute, "must be the absolute path of a network namespace (/run/netns/NAME)",
                               must_exist=True),
}


def slurm_spec(source: str = "Cluster(slurm=...)", base_dir: Path | None = None, **raw: Any) -> SlurmSpec:
    """A ``SlurmSpec`` from raw fields, each checked by its row (one ``ConfigError`` line)."""
    values = check_fields(raw, SLURM_FIELDS, source, base_dir, "Slurm")
    if "controller_address" not in values:
        raise ConfigError("controller_address", None, "is required: the address the nodes reach this machine at "
                          "(the job's store listens there)", source)
    for given, other in (("slurmd_kill", "slurmd_start"), ("slurmd_start", "slurmd_kill")):
        if values.get(given) and not values.get(other):
            raise ConfigError(given, list(values[given]), f"needs {other} too: what a kill_slurmd fault stops, its "
                              "heal starts again", source)
    if SLURMD in values.get("capabilities", ()):
        raise ConfigError("capabilities", sorted(values["capabilities"]), f"must not list {SLURMD!r}: a node can have "
                          "its slurmd killed where slurmd_kill and slurmd_start are given", source)
    return SlurmSpec(**values)


def load_slurm(path: str | os.PathLike[str]) -> SlurmSpec:
    """The ``[slurm]`` table of a TOML Slurm file."""
    file = Path(path)
    try:
        data = tomllib.loads(file.read_text())
    except OSError as e:
        raise ConfigError("slurm file", str(file), f"cannot be read: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError("slurm file", str(file), f"is not TOML: {e}") from None
    unknown = set(data) - {"slurm"}
    if unknown:
        raise ConfigError("table", sorted(unknown)[0], "is not one of a Slurm file's ([slurm])", str(file))
    table = data.get("slurm")
    if not isinstance(table, dict):
        raise ConfigError("slurm", table, "needs a [slurm] table", str(file))
    return slurm_spec(file.name, file.parent, **table)


def stand_ins(spec: SlurmSpec, count: int) -> tuple[HostSpec, ...]:
    """``count`` hosts standing for the nodes of an allocation not made yet, as ``spec``
    describes them (its capabilities, shared dir, interpreter): what a fault or a chaos kind
    is judged by before a job starts (``slurm-node<i>``: each a node of its own)."""
    return tuple(HostSpec(address=f"slurm-node{i}", user=getpass.getuser(), python=spec.python,
                          capabilities=spec.node_capabilities, shared_dir=spec.shared_dir, work_dir=spec.work_dir,
                          name=f"slurm-node{i}", scheduler="slurm") for i in range(count))


def client_env(spec: SlurmSpec, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment a Slurm client runs in: ``env`` (default ours) with the spec's ``SLURM_CONF``."""
    environ = dict(os.environ if env is None else env)
    if spec.slurm_conf is not None:
        environ["SLURM_CONF"] = spec.slurm_conf
    return environ


def partition_size(spec: SlurmSpec, env: Mapping[str, str] | None = None) -> tuple[str, int] | None:
    """(name, node count) of the partition an allocation of ``spec`` would come from (its
    ``partition``, else the cluster's default), as ``sinfo`` counts it; None where sinfo
    cannot say (no client, no answer, no such partition: salloc then says why)."""
    try:
        listed = subprocess.run([*spec.client_prefix, "sinfo", "--noheader", "--format=%P %D"],
                                env=client_env(spec, env), capture_output=True, text=True, timeout=_CLIENT_S,
                                stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    counts: dict[str, int] = {}
    default: str | None = None
    for line in listed.stdout.splitlines() if listed.returncode == 0 else []:
        name, _, count = line.partition(" ")
        if not count.strip().isdigit():
            continue
        if name.endswith("*"):
            name = default = name[:-1]
        counts[name] = counts.get(name, 0) + int(count)  # one line per state of its nodes
    wanted = spec.partition or default
    return (wanted, counts[wanted]) if wanted is not None and wanted in counts else None


def given_allocation(spec: SlurmSpec, env: Mapping[str, str]) -> str | None:
    """The job id of the caller's allocation the nodes run in (``job_id``, else
    ``$SLURM_JOB_ID``); None: the harness makes one of its own."""
    return spec.job_id or env.get("SLURM_JOB_ID")


def allocation_refusal(spec: SlurmSpec, nodes: int, env: Mapping[str, str] | None = None) -> str | None:
    """Why the allocation of our own a job of ``nodes`` nodes needs (the spec's ``nodes``,
    else one per node) can never be had from ``spec``'s partition (it has fewer: salloc
    would queue the request until its wait ran out); None where it can, where sinfo cannot
    say, or where the allocation is the caller's (``given_allocation``)."""
    environ = client_env(spec, env)
    if given_allocation(spec, environ) is not None:
        return None
    count = spec.nodes or nodes
    size = partition_size(spec, environ)
    if size is None or size[1] >= count:
        return None
    name, nodes = size
    return (f"Slurm: the job needs {count} node(s) (one per node, up to nnodes' most) and partition {name!r} "
            f"has {nodes}: set nodes = {nodes} (or fewer) in the Slurm file to share them (round robin), "
            "or use a larger partition")


class SlurmAllocation:
    """The allocation a job's nodes run in: ours (made with ``salloc --no-shell``, released
    at ``close``) or the caller's (``job_id``, ``$SLURM_JOB_ID``: used and left)."""

    def __init__(self, spec: SlurmSpec, nodes: int, env: Mapping[str, str] | None = None,
                 wait: float = _CLIENT_S):
        self.spec = spec
        environ = client_env(spec, env)
        self.env = environ
        given = given_allocation(spec, environ)
        self.ours = given is None
        started = time.monotonic()
        self.job_id = given if given is not None else self._allocate(spec.nodes or nodes, wait)
        #: seconds ``salloc`` took to grant ours (None: the caller's)
        self.granted_in = time.monotonic() - started if self.ours else None
        self._nodes: list[tuple[str, str]] | None = None
        #: the Slurm nodes ``set_state`` took out of service (name -> DOWN or DRAIN): back at close
        self.changed: dict[str, str] = {}
        self.daemons_lost: set[str] = set()  # the Slurm nodes whose slurmd ``kill_slurmd`` killed: started at close

    def client(self, *argv: str) -> list[str]:
        """A Slurm client's argv, as this allocation runs it (its ``client_prefix`` first)."""
        return [*self.spec.client_prefix, *argv]

    def run(self, *argv: str, timeout: float = _CLIENT_S) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run(self.client(*argv), env=self.env, capture_output=True, text=True,
                                  timeout=timeout, stdin=subprocess.DEVNULL)
        except FileNotFoundError:
            raise HostError(f"Slurm: no {argv[0]!r} on this machine (Slurm's clients: Debian slurm-client)") from None
        except subprocess.TimeoutExpired:
            raise HostError(f"Slurm: {' '.join(argv)} did not finish within {timeout:g} s") from None

    def _allocate(self, count: int, wait: float) -> str:
        """Our own allocation of ``count`` nodes, waiting at most ``wait`` s for them; a
        request still pending then is withdrawn (salloc revokes it on SIGTERM), never left
        in the queue. ``--no-kill``: a node lost to the job (Slurm marks it DOWN) ends the
        steps there, not the whole allocation, so an elastic job goes on without it."""
        spec = self.spec
        argv = ["salloc", "--no-shell", f"--nodes={count}", "--job-name=pytest-elastic", "--no-kill",
                *([f"--partition={spec.partition}"] if spec.partition else []),
                *([f"--account={spec.account}"] if spec.account else []),
                *([f"--time={spec.time_limit}"] if spec.time_limit else [])]
        refusal = allocation_refusal(spec, count, self.env)
        if refusal is not None:
            raise HostError(refusal)
        try:
            proc = subprocess.Popen(self.client(*argv), env=self.env, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        except FileNotFoundError:
            raise HostError("Slurm: no 'salloc' on this machine (Slurm's clients: Debian slurm-client)") from None
        try:
            out, err = proc.communicate(timeout=wait)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGTERM)
            proc.communicate(timeout=_CLIENT_S)
            raise HostError(f"Slurm: salloc of {count} node(s) got none within {wait:g} s "
                            "(its request withdrawn)") from None
        found = re.search(r"Granted job allocation (\d+)", err + out)
        if proc.returncode != 0 or found is None:
            said = [line for line in (err + out).splitlines() if line.strip()]
            raise HostError(f"Slurm: salloc of {count} node(s) failed (exit {proc.returncode}): "
                            f"{said[-1] if said else 'no word'}")
        return found.group(1)

    def nodes(self) -> list[tuple[str, str]]:
        """(name, address) of each node of the allocation, in Slurm's order."""
        if self._nodes is None:
            listed = self.run("squeue", "--noheader", f"--jobs={self.job_id}", "--format=%N")
            hostlist = listed.stdout.strip()
            if listed.returncode != 0 or not hostlist:
                raise HostError(f"Slurm: job {self.job_id} has no nodes ({listed.stderr.strip() or 'not running'})")
            names = self.run("scontrol", "show", "hostnames", hostlist).stdout.split()
            self._nodes = [(name, self._address(name)) for name in names]
        return list(self._nodes)

    def _address(self, name: str) -> str:
        shown = self.run("scontrol", "show", "node", name).stdout
        found = re.search(r"\bNodeAddr=(\S+)", shown)
        if found is None:
            raise HostError(f"Slurm: scontrol says no NodeAddr of node {name}")
        return found.group(1)

    def host_spec(self, name: str, address: str) -> HostSpec:
        """Node ``name`` as a host of the hosts' place (its label its Slurm name)."""
        spec = self.spec
        return HostSpec(address=address, user=getpass.getuser(), python=spec.python, work_dir=spec.work_dir,
                        capabilities=spec.node_capabilities, shared_dir=spec.shared_dir, name=name, scheduler="slurm")

    def connect(self, host: HostSpec, **options: Any) -> SrunHost:
        """``host``'s channel: job steps on its node."""
        return SrunHost(host, job_id=self.job_id, node=host.name or host.address,
                        srun_command=self.client("srun"), env=self.env, **options)

    def signal_step(self, step: str, sig: int) -> None:
        """``sig`` to every process of job step ``step`` (``JOB.STEP``) of this allocation, by
        Slurm: ``scancel --signal``, as the scheduler signals a step it ends (``SIGTERM``,
        then ``SIGKILL`` after its ``KillWait``). What scancel says is no verdict: on a
        step of an allocation of several nodes it delivers the signal and still prints
        ``Kill job error on job step id N: No error`` (or ``Invalid job id specified``) and
        exits 225 or 0 (measured on Slurm 22.05): ``HostError`` only where it could not run
        or exited otherwise. Whether the step ended is the caller's to see (the agent's exit)."""
        if not step.startswith(f"{self.job_id}."):
            raise HostError(f"Slurm: step {step!r} is not one of job {self.job_id}'s")
        done = self.run("scancel", f"--signal={signal.Signals(sig).name[3:]}", step)
        if done.returncode not in (0, _SCANCEL_DELIVERED):
            raise HostError(f"Slurm: scancel --signal of step {step} exited {done.returncode}: "
                            f"{done.stderr.strip() or 'no word'}")

    def set_state(self, node: str, state: str, reason: str) -> None:
        """Slurm node ``node`` set to ``state`` (``scontrol update State=...``: an operator's
        right). ``DOWN``, the scheduler's own node failure: Slurm ends every step there at
        once, and the whole job too unless it was allocated ``--no-kill`` (ours is).
        ``DRAIN``: the steps there go on, and no new job lands there (a step of this
        allocation still may: the harness places none there). ``RESUME``: back in
        service. ``close`` puts back what is still out."""
        done = self.run("scontrol", "update", f"NodeName={node}", f"State={state}",
                        *([f"Reason={reason}"] if state != "RESUME" else []))
        if done.returncode != 0:
            raise HostError(f"Slurm: scontrol could not set node {node} {state} (exit {done.returncode}): "
                            f"{done.stderr.strip() or done.stdout.strip() or 'no word'}")
        if state == "RESUME":
            self.changed.pop(node, None)
        else:
            self.changed[node] = state

    def kill_slurmd(self, node: str) -> None:
        """Slurm node ``node``'s ``slurmd`` killed (the spec's ``slurmd_kill``): its steps run
        on unseen until Slurm misses the daemon (its ``SlurmdTimeout``, and the ping round
        after it) and marks the node DOWN. ``start_slurmd`` (or ``close``) starts it again."""
        self._daemon_command("slurmd_kill", self.spec.slurmd_kill, node)
        self.daemons_lost.add(node)

    def start_slurmd(self, node: str) -> None:
        """Slurm node ``node``'s ``slurmd`` started again (the spec's ``slurmd_start``): the
        node is back once it registers (Slurm's ``ReturnToService`` decides whether a node
        it marked DOWN for not responding comes back by itself; ``close`` resumes it)."""
        self._daemon_command("slurmd_start", self.spec.slurmd_start, node)
        self.daemons_lost.discard(node)

    def _daemon_command(self, name: str, argv: tuple[str, ...], node: str) -> None:
        if not argv:
            raise HostError(f"Slurm: the Slurm file gives no {name}: the command for node {node}'s slurmd")
        command = [part.replace("{node}", node) for part in argv]
        try:
            done = subprocess.run(command, env=self.env, capture_output=True, text=True, timeout=_CLIENT_S,
                                  stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise HostError(f"Slurm: {name} for node {node} ({' '.join(command)}) could not run: {e}") from None
        if done.returncode != 0:
            raise HostError(f"Slurm: {name} for node {node} exited {done.returncode}: "
                            f"{done.stderr.strip() or done.stdout.strip() or 'no word'}")

    def out_of_service(self) -> set[str]:
        """The Slurm nodes a fault took out (DOWN, drained, their slurmd killed): no node lands there."""
        return set(self.changed) | self.daemons_lost

    def _restore(self) -> list[str]:
        """Every node a fault took out back in service (its slurmd started, then resumed
        where still down or drained); what failed, one line each."""
        problems = []
        for node in sorted(self.daemons_lost):
            try:
                self.start_slurmd(node)
                self.changed.setdefault(node, "DOWN")  # Slurm may have marked it DOWN meanwhile
            except HostError as e:
                problems.append(f"{e} (its slurmd was killed by a kill_slurmd fault)")
        for node, state in list(self.changed.items()):
            try:
                shown = self.run("sinfo", "--noheader", "--Node", f"--nodes={node}", "--format=%T").stdout
                if "down" in shown or "drain" in shown:
                    self.set_state(node, "RESUME", "")
                self.changed.pop(node, None)
            except HostError as e:
                problems.append(f"{e} (set {state} by a fault, it could not be put back in service)")
        return problems

    def close(self) -> list[str]:
        """Release the allocation if it is ours (``scancel``: its steps end with it), and
        wait until it has left Slurm's queue; put back in service the nodes its faults took
        out; what went wrong, one line each."""
        resumed = self._restore()
        if not self.ours:
            return resumed
        return resumed + self._release()

    def _release(self) -> list[str]:
        try:
            done = self.run("scancel", self.job_id)
            if done.returncode != 0:
                return [f"Slurm: scancel {self.job_id} exited {done.returncode}: {done.stderr.strip()}"]
            deadline = time.monotonic() + _CLIENT_S  # scancel returns at once; the job leaves once its steps end
            state = ""
            while time.monotonic() < deadline:
                state = self.run("squeue", "--noheader", f"--jobs={self.job_id}", "--format=%T").stdout.strip()
                if not state:
                    return []
                time.sleep(0.1)  # Slurm tells no one when a job leaves its queue: squeue is the way to see it
            return [f"Slurm: job {self.job_id} still {state} {_CLIENT_S:g} s after scancel"]
        except HostError as e:  # a client that would not run: said, never a close cut short
            return [str(e)]

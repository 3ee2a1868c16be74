"""A job's nodes on real sshd hosts (``Cluster(hosts=[...])``).

Two hosts (``SshdLab``: an sshd per network namespace, on one bridge); the job's store runs
here and each host reaches it through its own connection (a remote port forward). The
hosts' interpreter is this one, started with this checkout first on its path (a shell
wrapper: the hosts share this machine's files), so the hosts run the code under test.

What is checked, each from where it can be seen: the job's timeline (events relayed from
the hosts, node_start naming each host), the agents' logs (the workers' output came back
over the channel), and the hosts themselves, over a fresh connection of their own, after
``close()``: no process and no file of the job left there.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from harness import Cluster
from harness.errors import ConfigError
from harness.faults import After, AtStep, FaultRefused, NodeFreeze, OnState, Partition, WorkerHang, WorkerKill
from harness.sim.leftovers import remove_dead_owners
from harness.sim.places.hosts import nodes as remote
from harness.sim.places.hosts import refusals as host_refusals
from harness.sim.resources import CgroupSupport, probe
from harness.sim.storage.mount import fuse_missing
from harness.sim.truth.stacks import all_stacks
from harness.sim.truth.timeline import HARNESS
from harness.states import WorkerState
from tests.conftest import survivors
from tests.hosts.observe import left_on, processes_naming

#: each test starts agents and workers on two hosts of this (loaded, 2-core) machine
pytestmark = pytest.mark.timeout(240)

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "tests" / "scripts"

def _work_dirs(job) -> dict[str, str]:
    """host label -> the job's work dir there (the connection's)."""
    assert isinstance(job.place, remote.RemoteNodes)
    return {spec.label: link.host.work_dir for spec, link in job.place._links.items()}


#: a stranger on a host: every key of the etcd at 127.0.0.1:argv[1], asked without a token
_ETCD_STRANGER = ("import http.client, sys\n"
                  "c = http.client.HTTPConnection('127.0.0.1', int(sys.argv[1]), timeout=10)\n"
                  "c.request('POST', '/v3/kv/range', body='{\"key\": \"Lw==\", \"range_end\": \"MA==\"}')\n"
                  "r = c.getresponse()\n"
                  "print(r.status, r.read().decode())\n")


def test_a_node_killed_on_its_host_leaves_the_survivor_going(lab, hosts):
    """kill_node on a host: the agent and its workers die there (SIGKILL, on the host), the
    harness sees the exit, the survivor re-forms alone and finishes. The job rendezvouses on
    etcd (every other job on hosts here uses the harness's c10d store): the harness's etcd,
    here, reached through each host's connection (the port it forwards there), with
    authentication on: each node authenticates with the job's password, while a stranger
    on a host, at that same port, reads no key. The hosts list 2 GPUs each: each node's
    worker gets its host's device 0 (CUDA_VISIBLE_DEVICES there), and the backend is nccl."""
    with_gpus = [dataclasses.replace(spec, gpus=("0", "1")) for spec in hosts]
    with Cluster(nnodes="1:2", nproc_per_node=1, hosts=with_gpus, rdzv_backend="etcd",
                 start_method="spawn") as cluster:
        job = cluster.launch(str(SCRIPTS / "stepper.py"), "60", "0.05")
        job.wait_for_state(WorkerState.HEALTHY, timeout=90)
        assert job.store is not None and job.store.name == "etcd"
        host, port = job.place.connection(0)
        out = host.run([host.spec.python, "-c", _ETCD_STRANGER, str(port)]).stdout
        assert out.startswith("400 ") and "user name is empty" in out, out
        victims = job.worker_pids(1)
        assert list(victims) == [0]
        assert cluster.backend == "nccl" and job.gpus_for(1) == ("0",)
        assert psutil.Process(victims[0]).environ().get("CUDA_VISIBLE_DEVICES") == "0"  # set on its host
        job.kill_node(1)  # the host's processes are this machine's (one kernel): watched from here
        assert survivors(list(victims.values()), 15) == []  # the worker leads its own group: the tree reached it
        exit_of_1 = [e for e in job.timeline.events("node_exit", HARNESS) if e["target_node"] == 1]
        assert [(e["cause"], e["signal"]) for e in exit_of_1] == [("kill_node", 9)]
        assert job.timeline.states(1)[-1] == WorkerState.FAILED
        result = job.wait(timeout=120)
        assert result.state == WorkerState.SUCCEEDED, job.agent_log(0)
        assert job.timeline.world_sizes() == [2, 1]
        assert job.worker_pids(1) == {}


def test_close_leaves_nothing_on_the_hosts(lab, hosts):
    """A job still running when the cluster closes: every process it started on each
    host and its work dir there are gone, seen from the host."""
    with Cluster(nnodes=2, nproc_per_node=1, hosts=hosts, start_method="spawn",
                 check_invariants=False) as cluster:
        job = cluster.launch(str(SCRIPTS / "sleeper.py"))
        job.wait_for_state(WorkerState.HEALTHY, timeout=90)
        work_dirs = _work_dirs(job)
        secret = Path(job.directory, "rdzv.secret").read_text()
        for spec in hosts:  # the watch sees the job's processes while they run
            left = left_on(lab, spec, [work_dirs[spec.label]])
            assert len(left["procs"]) >= 2 and left["dirs"] == [work_dirs[spec.label]]
            # the secret reached the host in a 0600 file, on no command line and in no environment
            assert left_on(lab, spec, [secret])["procs"] == []
            path = f"{work_dirs[spec.label]}/node{hosts.index(spec)}/rdzv.secret"
            with lab.ssh_host(spec) as observer:
                assert observer.run(["stat", "-c", "%a", path]).stdout == "600\n"
    for spec in hosts:
        assert left_on(lab, spec, [work_dirs[spec.label]]) == {"procs": [], "dirs": []}


def test_faults_a_host_cannot_do_are_refused_in_one_line(lab, hosts):
    """A network fault on a node of a host without ``netns``, a resource fault on one
    without ``cgroups``: refused when injected and when called, naming the host and what
    it lacks; nothing was done."""
    with Cluster(nnodes=2, nproc_per_node=1, hosts=hosts, start_method="spawn",
                 check_invariants=False) as cluster:
        job = cluster.launch(str(SCRIPTS / "sleeper.py"))
        with pytest.raises(FaultRefused) as info:
            job.inject(Partition(node=1))
        message = str(info.value)
        assert message.startswith("fault='Partition(node=1, peers=all, direction=both) @ Immediately()' is "
                                  f"refused: host {hosts[1].label} cannot do it: it needs netns, which the host's "
                                  "capabilities (none) do not list")
        assert "\n" not in message and job.pending_faults() == []
        with pytest.raises(FaultRefused, match=rf"Partition\(node=0.* refused: host {hosts[0].label} cannot do it: "
                                               "it needs netns"):
            job.partition(0)
        with pytest.raises(FaultRefused, match=rf"SlowNode\(node=1.* refused: host {hosts[1].label} cannot do it: "
                                               "it needs cgroups, which the host's capabilities \\(none\\)"):
            job.slow_node(1, cpu=0.5)
        with pytest.raises(FaultRefused, match=r"WorkerKill\(node=0, local_rank=0, sig=9, exit_code=3\) @ "
                           r"AtStep\(step=2, rank=0\)' is refused: the job's nodes are on hosts, and an exact "
                           r"\(rank, step\) exit order"):
            job.inject(WorkerKill(exit_code=3), AtStep(step=2, rank=0))
        assert not [e for e in job.timeline.events("fault", HARNESS)]
        with pytest.raises(ConfigError, match=r"^entrypoint=.* must be a script path or a module"):
            cluster.launch(print)


# -- process faults, carried out on the host ----------------------------------------------


def _until(predicate: Callable[[], object], timeout: float, what: str, job) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"{what}: not within {timeout:g} s\n{job.timeline.format()}"
        time.sleep(0.05)


def _status(pid: int) -> str:
    """A host process's status, seen from here (the lab's hosts share this machine's /proc)."""
    try:
        return str(psutil.Process(pid).status())
    except psutil.NoSuchProcess:
        return "gone"


def test_a_worker_killed_on_its_host_restarts_the_job(lab, hosts):
    """Round robin: node 0 on host 0, node 1 on host 1; both nodes' events in the
    timeline, the workers' output in the agents' logs. kill_worker at a step (SIGTERM) on
    node 1's host: its supervisor signals the worker's pid there; the worker's exit is on
    the timeline with the signal, the job restarts once and succeeds; nothing left on the
    hosts. (gloo between two hosts: the DDP trainer of the host_unreachable and plugin tests.)"""
    with Cluster(nnodes=2, nproc_per_node=1, max_restarts=1, hosts=hosts, start_method="spawn") as cluster:
        job = cluster.launch(str(SCRIPTS / "stepper.py"), "30", "0.05")
        job.inject(WorkerKill(node=1, sig=int(signal.SIGTERM)), AtStep(step=4, rank=0))
        result = job.wait(timeout=150)
        assert result.state == WorkerState.SUCCEEDED, [job.agent_log(0), job.agent_log(1)]
        starts = {e["target_node"]: e for e in job.timeline.events("node_start", HARNESS)}
        assert {i: (e["host"], e["addr"]) for i, e in starts.items()} == {
            0: (hosts[0].label, hosts[0].address), 1: (hosts[1].label, hosts[1].address)}
        for node in (0, 1):  # the agents' and the workers' own events, relayed
            assert job.timeline.states(node)[-1] == WorkerState.SUCCEEDED
            assert len(job.timeline.events("worker_start", node)) == 2
            assert f"DONE rank={node} attempt=1" in job.agent_log(node)
        assert {e["master_addr"] for e in job.timeline.events("rendezvous")} == {hosts[0].address}
        assert [job.node_address(i) for i in (0, 1)] == [hosts[0].address, hosts[1].address]
        assert set(result.run_results) == {0, 1}
        assert all(r.state == WorkerState.SUCCEEDED for r in result.run_results.values())
        [fault] = job.timeline.faults()
        assert (fault["fault"], fault["target_node"], fault["sig"]) == ("kill_worker", 1, signal.SIGTERM)
        [victim] = [e for e in job.timeline.events("worker_start", 1) if e["restart_count"] == 0]
        exits = [e for e in job.timeline.events("worker_exit", 1) if e["worker_pid"] == victim["worker_pid"]]
        assert [e["exitcode"] for e in exits] == [-signal.SIGTERM]
        assert job.timeline.restart_counts() == {0: 1, 1: 1}
        work_dirs = _work_dirs(job)
    for spec in hosts:
        assert left_on(lab, spec, [work_dirs[spec.label]]) == {"procs": [], "dirs": []}


def _keeps_port(argv: list[str], address: str) -> bool:
    """Whether ``argv`` is a port keeper's (``python -I -S -c SOURCE ADDRESS``) for ``address``."""
    return len(argv) == 6 and argv[1:4] == ["-I", "-S", "-c"] and "signal.pause()" in argv[4] and argv[5] == address


def test_hosts_that_copy_the_script_run_their_copy(lab, hosts, tmp_path):
    """``copy_script``: the script's dir (not its hidden entries nor ``__pycache__``) is
    copied into each host's work dir, and each node runs the copy, which imports its
    sibling from there; the copy goes with the work dir."""
    src = tmp_path / "job"
    src.mkdir()
    (src / ".env").write_text("TOKEN=not-for-the-hosts\n")
    (src / "helper.py").write_text("GREETING = 'hello from the copy'\n")
    (src / "main.py").write_text("import os\nimport helper\n\nprint(helper.GREETING, os.path.abspath(__file__), "
                                 "os.path.abspath(helper.__file__), flush=True)\n")
    copying = [dataclasses.replace(spec, copy_script=True) for spec in hosts]
    with Cluster(nnodes=2, nproc_per_node=1, max_restarts=0, hosts=copying, start_method="spawn") as cluster:
        job = cluster.launch(str(src / "main.py"))
        result = job.wait(timeout=90)
        assert result.state == WorkerState.SUCCEEDED, [job.agent_log(0), job.agent_log(1)]
        work_dirs = _work_dirs(job)
        for node, spec in enumerate(copying):
            there = f"{work_dirs[spec.label]}/script"
            assert f"hello from the copy {there}/main.py {there}/helper.py" in job.agent_log(node)
            listed = job.place.connection(node)[0].run(["ls", "-A", there]).stdout.split()
            assert set(listed) - {"__pycache__"} == {"helper.py", "main.py"}, listed  # its own bytecode aside
    for spec in copying:
        assert left_on(lab, spec, [work_dirs[spec.label]]) == {"procs": [], "dirs": []}


def test_the_script_copy_leaves_out_hidden_entries_and_bytecode_and_refuses_a_large_dir(tmp_path, monkeypatch):
    import io
    import tarfile

    from harness.sim.places.hosts import script as host_script

    (tmp_path / "pkg" / "__pycache__").mkdir(parents=True)
    (tmp_path / "pkg" / "__pycache__" / "util.cpython-311.pyc").write_bytes(b"stale")
    (tmp_path / "pkg" / "util.py").write_text("X = 1\n")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "HEAD").write_text("ref\n")
    (tmp_path / ".env").write_text("TOKEN=x\n")
    (tmp_path / "main.py").write_text("print(1)\n")
    packed = host_script.ScriptCopy(str(tmp_path / "main.py"))._pack()
    assert sorted(tarfile.open(fileobj=io.BytesIO(packed)).getnames()) == ["main.py", "pkg/util.py"]
    (tmp_path / "data.bin").write_bytes(b"x" * 2048)
    monkeypatch.setattr(host_script, "MAX_BYTES", 1024)
    with pytest.raises(ConfigError, match=r"^copy_script=True cannot copy the script's dir .*: it holds more than 0 "
                                          r"MiB; put the script on the hosts at the same path instead"):
        host_script.ScriptCopy(str(tmp_path / "main.py"))._pack()


def test_node0_hosts_the_store_on_its_host_and_its_loss_fails_the_other_fast(lab, hosts):
    """store_host="node0": node 0's agent hosts the store at its host's address, on a port
    a keeper there held for the job; node 1, on the other host, reaches it across the
    hosts' network. kill_store_host kills node 0 on its host, and node 1 fails fast naming
    the lost store, as on this machine; nothing of the job (the keeper included) is left."""
    with Cluster(nnodes="1:2", nproc_per_node=1, max_restarts=3, hosts=hosts, start_method="spawn",
                 store_host="node0") as cluster:
        job = cluster.launch(str(SCRIPTS / "sleeper.py"))
        job.wait_for_state(WorkerState.HEALTHY, timeout=90)
        assert job.timeline.world_sizes() == [2]
        endpoint = job.store.endpoint
        assert endpoint.rsplit(":", 1)[0] == hosts[0].address, endpoint
        [keeper] = [p.pid for p in psutil.process_iter(["cmdline"])  # on host 0 (its /proc is ours): not its
                    if _keeps_port(p.info["cmdline"] or [], hosts[0].address)]  # supervisor, whose argv holds it
        job.kill_store_host()
        result = job.wait(timeout=60)
        [fault] = job.timeline.faults()
        assert fault["fault"] == "kill_store_host" and fault["target_node"] == 0
        assert result.state == WorkerState.FAILED and result.exit_codes[1] == 1, job.agent_log(1)
        assert f"lost the rendezvous store at {endpoint}" in job.agent_log(1)
        work_dirs = _work_dirs(job)
    for spec in hosts:
        assert left_on(lab, spec, [work_dirs[spec.label]]) == {"procs": [], "dirs": []}
    assert not psutil.pid_exists(keeper), keeper


def test_exit_code_orders_on_hosts_that_share_a_filesystem(lab, hosts, tmp_path):
    """On two hosts naming one ``shared_dir``: an exact (rank, step) order and kill_worker with exit_code on node
    1 once HEALTHY are each one file in the job's orders dir there, which every node's
    workers see: each obeyed once (exit 3, then 4 at rank 0's step 12; no copy left on the
    other host to obey again after the restart), the job restarts twice and succeeds, the
    orders count as obeyed, and the dir goes with the job. Its ``{tmp}`` is one dir there too."""
    nfs = tmp_path / "nfs"
    nfs.mkdir()
    shared = [dataclasses.replace(spec, shared_dir=str(nfs)) for spec in hosts]
    with Cluster(nnodes=2, nproc_per_node=1, max_restarts=2, hosts=shared, start_method="spawn") as cluster:
        job = cluster.launch(str(SCRIPTS / "stepper.py"), "24", "0.05", "{tmp}")
        job.inject(WorkerKill(exit_code=4), AtStep(step=12, rank=0))
        job.inject(WorkerKill(node=1, exit_code=3), OnState(WorkerState.HEALTHY))
        result = job.wait(timeout=150)
        assert result.state == WorkerState.SUCCEEDED, [job.agent_log(0), job.agent_log(1)]
        assert [e["exitcode"] for e in job.timeline.events("worker_exit") if e["exitcode"] > 0] == [3, 4]
        obeyed = [(f["exit_code"], f["target_node"]) for f in job.timeline.faults()]
        assert obeyed[0] == (3, 1) and obeyed[1][0] == 4 and len(obeyed) == 2, obeyed
        assert job.timeline.restart_counts() == {0: 2, 1: 2}
        assert job.processes.unobeyed() == []
        [orders] = nfs.glob("pe-shared-*/orders")
        assert list(orders.iterdir()) == []
        # {tmp}: one dir of the job's in the shared filesystem, where both hosts' ranks finished
        assert sorted(p.name for p in orders.parent.joinpath("scratch").iterdir()) == ["done-0-2", "done-1-2"]
    assert list(nfs.iterdir()) == []


def test_an_exact_exit_order_needs_one_dir_every_node_sees():
    """Refused on two hosts that share no filesystem, in one line naming them; left where
    the hosts name one ``shared_dir``, or every node of the job is on one host."""
    from harness.faults import ScheduledFault
    from harness.hosts import parse_host

    two = [parse_host("ssh://ci@10.0.0.5"), parse_host("ssh://ci@10.0.0.6")]
    exact = [ScheduledFault(WorkerKill(exit_code=3), AtStep(step=2, rank=1))]
    with pytest.raises(FaultRefused, match=r"is refused: the job's nodes are on hosts, and an exact \(rank, step\) "
                       r"exit order .* may be on hosts ci@10.0.0.5:22, ci@10.0.0.6:22, which share no filesystem: "
                       r"name one they share \(shared_dir in the hosts or Slurm file\)"):
        host_refusals.refuse_faults(exact, two, None, 2)
    host_refusals.refuse_faults(exact, two, [0, 0], 2)  # one host: its own orders dir is every node's
    host_refusals.refuse_faults(exact, two, None, 1)
    host_refusals.refuse_faults(exact, [dataclasses.replace(spec, shared_dir="/nfs") for spec in two], None, 2)


def test_a_hung_worker_on_a_host_is_stopped_there_and_its_stack_read_there(lab, hosts):
    """hang_worker after a delay: the worker is SIGSTOPped on its host (stuck, not dead:
    its agent cannot tell, the node stays HEALTHY). Its stack and its peer's are read on
    the host, as a hang's report reads them (the stopped one continued for its dump and
    stopped again, by the agent's supervisor there); the job's close ends it there."""
    with Cluster(nnodes=1, nproc_per_node=2, max_restarts=0, hosts=hosts, check_invariants=False) as cluster:
        job = cluster.launch(str(SCRIPTS / "sleeper.py"))  # forked by the host agent's zygote: a dump handler
        job.wait_for_state(WorkerState.HEALTHY, timeout=90)
        pids = job.worker_pids(0)
        pid = pids[1]
        job.inject(WorkerHang(local_rank=1), After(0.2))
        _until(lambda: _status(pid) == psutil.STATUS_STOPPED, 15, "the worker stopped on its host", job)
        [fault] = job.timeline.faults()
        assert fault["fault"] == "hang_worker" and fault.recovery_latency is None
        assert _status(pids[0]) != psutil.STATUS_STOPPED  # its peer runs on
        assert job.in_state(WorkerState.HEALTHY)
        stacks = all_stacks(job, job.stacks_dir)
        assert f"local_rank 0 rank 0 pid {pids[0]}\n" in stacks + "\n", stacks
        assert f"local_rank 1 rank 1 pid {pid} [stopped: continued for the dump, then stopped again]" in stacks
        assert stacks.count("sleeper.py\", line 6 in <module>") == 2, stacks  # both, from the files there
        _until(lambda: _status(pid) == psutil.STATUS_STOPPED, 15, "the worker stopped again", job)
        work_dirs = _work_dirs(job)
    assert survivors([pid], 15) == []
    assert left_on(lab, hosts[0], [work_dirs[hosts[0].label]]) == {"procs": [], "dirs": []}


def test_a_node_frozen_on_its_host_is_left_behind(lab, hosts):
    """freeze_node on node 1's host: the agent and its worker are SIGSTOPped there, the
    harness hears from the supervisor that the agent stopped and ends the node's timeline;
    the survivor re-forms alone and succeeds; close() kills the frozen node (SIGKILL)."""
    with Cluster(nnodes="1:2", nproc_per_node=1, max_restarts=0, hosts=hosts, start_method="spawn") as cluster:
        job = cluster.launch(str(SCRIPTS / "stepper.py"), "60", "0.05")
        job.inject(NodeFreeze(node=1), OnState(WorkerState.HEALTHY))
        result = job.wait(timeout=150)  # the frozen node never finishes: wait does not wait for it
        assert result.state == WorkerState.SUCCEEDED and sorted(result.run_results) == [0], job.timeline.format()
        assert [f["fault"] for f in job.timeline.faults()] == ["freeze_node"]
        assert job.timeline.world_sizes() == [2, 1]
        [entry] = [e for e in job.timeline.events("state", 1) if e.get("source") == HARNESS]
        assert (entry["cause"], entry["signal"]) == ("freeze_node", signal.SIGSTOP)
        agent = {e["pid"] for e in job.timeline.events("state", 1) if e.get("source") != HARNESS}
        frozen = [*agent, *job.worker_pids(1).values()]
        assert len(frozen) == 2 and {_status(pid) for pid in frozen} == {psutil.STATUS_STOPPED}
        work_dirs = _work_dirs(job)
    exits = {e["target_node"]: e for e in job.timeline.events("node_exit", HARNESS)}
    assert (exits[1]["cause"], exits[1]["signal"]) == ("freeze_node", signal.SIGKILL)  # at close
    for spec in hosts:
        assert left_on(lab, spec, [work_dirs[spec.label]]) == {"procs": [], "dirs": []}


def test_each_hosts_clock_is_measured_again_while_the_job_runs(lab, hosts, monkeypatch):
    """Clock upkeep (every ``CLOCK_UPKEEP_S``, here 0.5 s): each host's offset is measured
    again over its lease and handed to the relays of its nodes; each measurement is on the
    timeline (``clock_offset``: the host, how far the offset moved, its error bound). The
    lab's hosts share this machine's clocks: the offsets stay within their bounds of 0."""
    monkeypatch.setattr(remote, "CLOCK_UPKEEP_S", 0.5)
    with Cluster(nnodes=2, nproc_per_node=1, hosts=hosts, start_method="spawn",
                 check_invariants=False) as cluster:
        job = cluster.launch(str(SCRIPTS / "sleeper.py"))
        first = {i: job.nodes[i].agent.relay.offset for i in (0, 1)}
        deadline = time.monotonic() + 30  # a node that started during a measurement gets the next one
        while len({e["host"] for e in job.timeline.events("clock_offset", HARNESS)}) < 2 or \
                any(job.nodes[i].agent.relay.offset is first[i] for i in (0, 1)):
            assert time.monotonic() < deadline, job.timeline.format()
            time.sleep(0.1)
        measured = job.timeline.events("clock_offset", HARNESS)
        assert {e["host"] for e in measured} == {h.label for h in hosts}
        for event in measured:
            assert abs(event["mono_offset_s"]) <= event["error_bound_s"] + 0.005, event
            assert abs(event["moved_s"]) <= 0.05, event


#: a controller of its own: a 2-node job on the lab's two hosts, its workers running; it
#: prints the hosts' work dirs and the workers' pids, then waits to be killed
_JOB_CONTROLLER = r"""
import json, sys, time
from harness import Cluster
from harness.hosts import HostSpec, SshHost
from harness.sim.places.hosts import nodes as remote
from harness.sim.resources import CgroupSupport, probe
from harness.sim.storage.mount import fuse_missing
from harness.states import WorkerState
specs = [HostSpec(**{**fields, "capabilities": frozenset(fields.get("capabilities", ()))})
         for fields in json.loads(sys.argv[1])]
command = json.loads(sys.argv[2])
remote.connector = lambda spec: SshHost(spec, ssh_command=command, ssh_config="none")
cluster = Cluster(nnodes=2, nproc_per_node=2, hosts=specs, start_method="zygote", check_invariants=False)
job = cluster.launch(sys.argv[3])
job.wait_for_state(WorkerState.HEALTHY, timeout=90)
while sum(len(job.worker_pids(i)) for i in (0, 1)) < 4:
    time.sleep(0.05)
cgroups = [d for i in (0, 1) for d in job.resources.cgroup(i).distinct()] if "cgroups" in specs[0].capabilities else []
print(json.dumps({"work_dirs": [link.host.work_dir for link in job.place._links.values()],
                  "workers": [pid for i in (0, 1) for pid in job.worker_pids(i).values()], "cgroups": cgroups,
                  "disks": [job.node_disk(i) for i in (0, 1)]}),
      flush=True)
time.sleep(1000)
"""


def test_a_killed_controller_leaves_nothing_of_its_job_on_the_hosts(lab, hosts):
    """The controller of a 2-node job SIGKILLed while its workers run (each leads a process
    group of its own, so the supervisors' group signal misses them): within the bound, no
    process on either host names the job's work dirs, the workers are gone, and so are the
    work dirs and, where this machine has cgroups, the nodes' cgroups (their keepers remove
    them when their connection ends), and where it has FUSE, the nodes' disks mounted there
    (a work dir with a mount in it could not be removed). The hosts keep no events files
    for a controller that might come back (keep_missed 0 here; 20 s by default, checked in
    test_ownership.py). Seen from here: the lab's hosts share this machine's /proc, files
    and cgroups."""
    with_cgroups = ["cgroups"] if isinstance(probe(), CgroupSupport) else []
    with_fuse = ["fuse"] if fuse_missing() is None else []  # a mounted disk pins its work dir
    fields = [{**{name: getattr(spec, name) for name in ("address", "user", "port", "key", "python", "known_hosts")},
               "capabilities": with_cgroups + with_fuse, "keep_missed": 0.0} for spec in hosts]
    controller = subprocess.Popen([sys.executable, "-c", _JOB_CONTROLLER, json.dumps(fields),
                                   json.dumps(list(lab.ssh_command)), str(SCRIPTS / "sleeper.py")],
                                  stdout=subprocess.PIPE, text=True, cwd=ROOT,
                                  env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert controller.stdout is not None
        seen = json.loads(controller.stdout.readline())
        assert len(seen["workers"]) == 4 and all(_status(pid) != "gone" for pid in seen["workers"])
        assert all(os.path.isdir(d) for d in seen["cgroups"]) and len(seen["cgroups"]) >= 2 * len(with_cgroups)
        assert all(("/fs/" in d) == bool(with_fuse) for d in seen["disks"]), seen["disks"]  # served there
        controller.kill()
        controller.wait()
        deadline = time.monotonic() + 30
        while True:
            left = [p for d in seen["work_dirs"] for p in processes_naming(d)]
            dirs = [d for d in seen["work_dirs"] + seen["cgroups"] if os.path.exists(d)]
            alive = [pid for pid in seen["workers"] if _status(pid) not in ("gone", psutil.STATUS_ZOMBIE)]
            if not left and not dirs and not alive:
                break
            assert time.monotonic() < deadline, f"left: processes {left}, workers {alive}, dirs {dirs}"
            time.sleep(0.2)
        # here, the dead controller's dirs wait for the next cluster's sweep, as any killed run's do: sweep now
        assert {*remove_dead_owners("elastic_cluster_", tempfile.gettempdir()),
                *remove_dead_owners("elastic_bridge_", tempfile.gettempdir())}
    finally:
        if controller.poll() is None:
            controller.kill()
            controller.wait()
        if controller.stdout is not None:
            controller.stdout.close()


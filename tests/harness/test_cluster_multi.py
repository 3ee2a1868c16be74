"""Multi-node Cluster jobs: every fault kind and trigger, each test asserting that the fault
fired (``timeline.faults()``) and the recovery (or failure) that must follow; ``close()``
checks the job's invariants on every one of them."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from harness import Cluster, WorkerState
from harness.errors import ConfigError
from harness.faults import (
    After,
    AtStep,
    NodeAdd,
    NodeFreeze,
    NodeKill,
    NodeRemove,
    OnState,
    ScheduledFault,
    WorkerHang,
    WorkerKill,
)
from tests.conftest import SCRIPTS

STEPPER = str(SCRIPTS / "stepper.py")
ALLREDUCE = str(SCRIPTS / "allreduce.py")
SLEEPER = str(SCRIPTS / "sleeper.py")
S = WorkerState


def _fault_kinds(job) -> list[str]:
    return [f["fault"] for f in job.timeline.faults()]


def _wait_until(predicate, timeout: float, what: str, job=None) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            detail = f"\n{job.timeline.format()}" if job is not None else ""
            raise AssertionError(f"{what}: not within {timeout:g}s{detail}")
        time.sleep(0.02)


def _gone(pids) -> bool:
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            pass
    return True


def _node_done(job, node: int, timeout: float = 60) -> int:
    """Wait for one node's agent to exit (the others may be frozen); its exit code."""
    try:
        return job.nodes[node].popen.wait(timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"node {node} did not finish within {timeout}s\n"
                             f"{job.timeline.format()}") from None


# -- a healthy job ------------------------------------------------------------------------


def test_allreduce_2x2_unique_ranks_distinct_nodes(capfd, warm_pool):
    with Cluster(pool=warm_pool, nnodes=2, nproc_per_node=2, max_restarts=0) as cluster:
        job = cluster.launch(ALLREDUCE)
        result = job.wait(timeout=60)
        assert result.state == S.SUCCEEDED, job.timeline.format()
        assert sorted(result.run_results) == [0, 1] and result.exit_codes == {0: 0, 1: 0}
        # one agent per node: its own loopback address and a readable (seeded) name
        names = [job.node_name(i) for i in (0, 1)]
        assert len(set(names)) == 2 and all(re.fullmatch(r"[a-z]+-\d", n) for n in names)
        addresses = [job.node_address(i) for i in (0, 1)]  # each node its own host
        assert [job.nodes[i].addr for i in (0, 1)] == addresses and len(set(addresses)) == 2
        starts = job.timeline.events("worker_start")
        assert sorted(s["rank"] for s in starts) == [0, 1, 2, 3]
        by_node = {i: sorted(s["rank"] for s in starts if s["node"] == i) for i in (0, 1)}
        assert job.timeline.labels() == dict(enumerate(names))
        assert sorted(by_node.values()) == [[0, 1], [2, 3]]
        assert job.timeline.world_sizes() == [4]
        [rdzv] = {e["master_addr"] for e in job.timeline.events("rendezvous")}
        assert rdzv in addresses
        assert job.store.describe().startswith(f"store_server at {job.net.store_address}:")
    out = capfd.readouterr().out
    sums = sorted(re.findall(r"SUM rank=(\d) world=4 value=(\S+)", out))
    assert sums == [("0", "10"), ("1", "10"), ("2", "10"), ("3", "10")], out


def test_each_node_runs_in_its_own_process_group(warm_pool):
    with Cluster(pool=warm_pool, nnodes=2, nproc_per_node=1) as cluster:
        job = cluster.launch(SLEEPER)
        job.wait_for_state(S.HEALTHY, timeout=30)
        for node in job.nodes.values():
            assert os.getpgid(node.pid) == node.pid
            command = psutil.Process(node.pid).cmdline()
            # a node forked by the node fork server keeps the server's command line
            assert command[1:3] in (["-m", "harness.sim.nodes.main"], ["-m", "harness.sim.nodes.forks"]), command
        assert job.store.alive() and os.getpgid(job.store.pid) == job.store.pid
        store = job.store
    assert not store.alive()  # closed with the job


# -- worker faults --------------------------------------------------------------------------


def test_worker_kill_on_one_node_restarts_every_node(warm_pool):
    with Cluster(pool=warm_pool, nnodes=2, nproc_per_node=2, max_restarts=2) as cluster:
        job = cluster.launch(STEPPER, "30", "0.03")
        job.wait_for_state(S.HEALTHY, timeout=30)
        before = {i: set(job.worker_pids(i).values()) for i in (0, 1)}
        job.kill_worker(node=1, local_rank=0)
        job.wait_for_recovery(timeout=30)
        result = job.wait(timeout=60)
        assert _fault_kinds(job) == ["kill_worker"]
        assert result.state == S.SUCCEEDED, job.timeline.format()
        for i in (0, 1):  # every node started a fresh set of workers
            starts = job.timeline.events("worker_start", i)
            assert len(starts) == 4 and before[i].isdisjoint(s["worker_pid"] for s in starts[2:])
            assert S.STOPPED in job.timeline.states(i)
        assert job.timeline.world_sizes() == [4, 4]
        assert job.timeline.restart_counts()[1] == 1
        assert any(e["exitcode"] == -signal.SIGKILL and e["node"] == 1
                   for e in job.timeline.events("worker_exit"))
        assert sorted(result.return_values) == [0, 1, 2, 3]


def test_exit_code_crash_at_rank_and_step_on_the_second_node(warm_pool):
    """The stepper's ranks share no collective: the other node's go on after rank 3's crash,
    and must still be running when its node restarts (60 steps: ~1.1 s for that). With 12
    (0.16 s left), a busy machine let them finish first; their node then ended the job's
    rendezvous, the restarting node found it closed (torch's agent raises there too) and the
    job had one round."""
    with Cluster(pool=warm_pool, nnodes=2, nproc_per_node=2, max_restarts=1) as cluster:
        job = cluster.launch(STEPPER, "60", "0.02")
        job.inject(WorkerKill(exit_code=5), AtStep(step=4, rank=3))
        result = job.wait(timeout=60)
        # group ranks follow the rendezvous join order: find the node rank 3 ran on
        [host] = {s["node"] for s in job.timeline.events("worker_start")
                  if s["rank"] == 3 and s["round"] == 0}
        [fault] = job.timeline.faults()
        assert fault["fault"] == "kill_worker" and fault["rank"] == 3 and fault["exit_code"] == 5
        assert fault["target_node"] == host
        assert result.state == S.SUCCEEDED, job.timeline.format()
        crashed = [e for e in job.timeline.events("worker_exit") if e["exitcode"] == 5]
        assert [(e["node"], e["rank"]) for e in crashed] == [(host, 3)]
        assert max(e["step"] for e in job.timeline.steps(3) if e["restart_count"] == 0) == 4
        assert job.timeline.world_sizes() == [4, 4]


def test_worker_hang_on_state_trigger_stops_it_without_a_restart(warm_pool):
    with Cluster(pool=warm_pool, nnodes=2, nproc_per_node=1, max_restarts=0) as cluster:
        job = cluster.launch(SLEEPER)
        job.inject(WorkerHang(node=1, local_rank=0), OnState(S.HEALTHY, node=1))
        _wait_until(lambda: _fault_kinds(job) == ["hang_worker"], 30, "hang fired", job)
        pid = job.worker_pids(1)[0]
        _wait_until(lambda: psutil.Process(pid).status() == psutil.STATUS_STOPPED, 10,
                    "worker stopped", job)
        # stuck, not dead: no agent can tell. (Every node: node 0 may still be starting its
        # worker when node 1's HEALTHY fires the trigger, so it gets there, and stays.)
        job.wait_for_state(S.HEALTHY, timeout=30)
        assert job.timeline.states(1)[-1] == S.HEALTHY
        assert job.timeline.world_sizes() == [2] and not job.pending_faults()


# -- losing and adding nodes ----------------------------------------------------------------


def test_agent_kill_workers_follow_and_survivor_continues_alone(warm_pool):
    with Cluster(pool=warm_pool, nnodes="1:2", nproc_per_node=2, max_restarts=0) as cluster:
        job = cluster.launch(STEPPER, "40", "0.03")
        job.wait_for_state(S.HEALTHY, timeout=30)
        orphans = list(job.worker_pids(1).values())
        job.kill_agent(node=1)
        _wait_until(lambda: _gone(orphans), 15, "node 1's workers followed their agent", job)
        result = _finish_survivors(job, [0])
        assert _fault_kinds(job) == ["kill_agent"]
        assert result.state == S.SUCCEEDED, job.timeline.format()
        assert result.exit_codes[1] == -signal.SIGKILL and 1 not in result.run_results
        assert job.timeline.world_sizes() == [4, 2]  # the world shrank, no restart used
        assert sorted(result.return_values) == [0, 1]


def _finish_survivors(job, nodes: list[int]):
    for node in nodes:
        _node_done(job, node)
    return job.result()


def test_node_kill_three_nodes_survivors_shrink(warm_pool):
    with Cluster(pool=warm_pool, nnodes="1:3", nproc_per_node=1, max_restarts=0) as cluster:
        job = cluster.launch(STEPPER, "40", "0.03")
        job.wait_for_state(S.HEALTHY, timeout=30)
        victims = [job.nodes[2].pid, *job.worker_pids(2).values()]
        job.kill_node(node=2)
        result = job.wait(timeout=60)
        assert _fault_kinds(job) == ["kill_node"] and _gone(victims)
        assert result.state == S.SUCCEEDED, job.timeline.format()
        assert job.timeline.world_sizes() == [3, 2]
        assert sorted(result.run_results) == [0, 1] and result.exit_codes[2] == -signal.SIGKILL
        for i in (0, 1):
            assert job.timeline.restart_counts()[i] == 0


def test_graceful_leave_removes_the_node_and_the_rest_continue(warm_pool):
    with Cluster(pool=warm_pool, nnodes="1:2", nproc_per_node=2, max_restarts=0) as cluster:
        job = cluster.launch(STEPPER, "40", "0.03")
        job.wait_for_state(S.HEALTHY, timeout=30)
        leaving = list(job.worker_pids(1).values())
        job.remove_node(node=1)
        assert _node_done(job, 1) != 0  # stopped by SIGTERM, as elastic-run exits
        assert _gone(leaving)
        result = job.wait(timeout=60)
        assert _fault_kinds(job) == ["remove_node"]
        assert result.state == S.SUCCEEDED, job.timeline.format()
        assert job.timeline.world_sizes() == [4, 2]
        assert "stopped by SIGTERM" in job.agent_log(1)


def test_node_join_grows_the_world(warm_pool):
    with Cluster(pool=warm_pool, nnodes="1:3", nproc_per_node=1, max_restarts=0) as cluster:
        job = cluster.launch(STEPPER, "60", "0.03", nodes=2)
        job.wait_for_state(S.HEALTHY, timeout=30)
        index = job.add_node()
        assert index == 2
        _wait_until(lambda: job.timeline.world_sizes()[-1:] == [3], 30, "world grew to 3", job)
        result = job.wait(timeout=60)
        assert _fault_kinds(job) == ["add_node"]
        assert result.state == S.SUCCEEDED, job.timeline.format()
        assert job.timeline.world_sizes() == [2, 3]
        assert sorted(result.run_results) == [0, 1, 2] and sorted(result.return_values) == [0, 1, 2]


def test_node_freeze_survivors_continue_frozen_node_killed_at_close(warm_pool):
    cluster = Cluster(pool=warm_pool, nnodes="1:2", nproc_per_node=1, max_restarts=0)
    with cluster:
        job = cluster.launch(STEPPER, "40", "0.03")
        job.inject(NodeFreeze(node=1), OnState(S.HEALTHY))
        _node_done(job, 0)
        result = job.result()
        assert _fault_kinds(job) == ["freeze_node"]
        assert result.state == S.SUCCEEDED and sorted(result.run_results) == [0], job.timeline.format()
        assert job.timeline.world_sizes() == [2, 1]
        frozen = job.nodes[1]
        assert psutil.Process(frozen.pid).status() == psutil.STATUS_STOPPED  # alive to TCP
    assert frozen.popen.returncode == -signal.SIGKILL  # close() ended it


# -- the store ------------------------------------------------------------------------------


def test_store_host_loss_on_node0_fails_the_others_fast_naming_the_store(warm_pool):
    with Cluster(pool=warm_pool, nnodes="1:2", nproc_per_node=1, max_restarts=3, store_host="node0") as cluster:
        job = cluster.launch(SLEEPER)
        job.wait_for_state(S.HEALTHY, timeout=30)
        survivors = list(job.worker_pids(1).values())
        endpoint = job.store.endpoint
        job.kill_store_host()
        assert _node_done(job, 1, timeout=30) == 1
        result = job.wait(timeout=30)
        [fault] = job.timeline.faults()
        assert fault["fault"] == "kill_store_host" and fault["target_node"] == 0
        assert result.state == S.FAILED and result.run_results == {}
        assert result.exit_codes[0] == -signal.SIGKILL
        assert f"lost the rendezvous store at {endpoint}" in job.agent_log(1)
        assert "store_server" in job.agent_log(1)  # ... and says how to survive it
        assert _gone(survivors)


def test_harness_store_loss_fails_every_node(warm_pool):
    with Cluster(pool=warm_pool, nnodes=2, nproc_per_node=1, max_restarts=3) as cluster:
        job = cluster.launch(SLEEPER)
        job.wait_for_state(S.HEALTHY, timeout=30)
        endpoint = job.store.endpoint
        job.kill_store_host()
        result = job.wait(timeout=30)
        [fault] = job.timeline.faults()
        assert fault["fault"] == "kill_store_host" and "target_node" not in fault
        assert result.state == S.FAILED and result.exit_codes == {0: 1, 1: 1}
        for i in (0, 1):
            assert f"lost the rendezvous store at {endpoint}" in job.agent_log(i)


@pytest.mark.parametrize("victim", [0, 1])
def test_harness_store_survives_losing_any_node(victim, warm_pool):
    with Cluster(pool=warm_pool, nnodes="1:2", nproc_per_node=1, max_restarts=0) as cluster:
        job = cluster.launch(STEPPER, "40", "0.03")
        job.inject(NodeKill(node=victim), OnState(S.HEALTHY))
        survivor = 1 - victim
        _node_done(job, survivor)
        result = job.result()
        assert _fault_kinds(job) == ["kill_node"]
        assert result.state == S.SUCCEEDED and sorted(result.run_results) == [survivor], \
            job.timeline.format()
        assert job.timeline.world_sizes() == [2, 1]


def test_kill_store_host_needs_a_store_outside_the_harness():
    with Cluster(nnodes=1) as cluster:
        job = cluster.launch(SLEEPER)
        with pytest.raises(ConfigError, match="no separate store process"):
            job.kill_store_host()


# -- triggers on multi-node -----------------------------------------------------------------


def test_scheduled_join_after_delay_then_node_kill_on_state(warm_pool):
    with Cluster(pool=warm_pool, nnodes="1:3", nproc_per_node=1, max_restarts=0) as cluster:
        job = cluster.launch(STEPPER, "60", "0.03", nodes=2)
        job.wait_for_state(S.HEALTHY, timeout=30)
        job.schedule([ScheduledFault(NodeAdd(), After(0.3))])
        _wait_until(lambda: job.timeline.world_sizes()[-1:] == [3], 30, "world grew to 3", job)
        job.wait_for_state(S.HEALTHY, timeout=30)
        job.inject(NodeKill(node=0), OnState(S.HEALTHY, node=2))
        result = job.wait(timeout=60)
        faults = job.timeline.faults()
        assert [f["fault"] for f in faults] == ["add_node", "kill_node"]
        assert faults[1]["target_node"] == 0
        assert result.state == S.SUCCEEDED, job.timeline.format()
        assert job.timeline.world_sizes() == [2, 3, 2]
        assert sorted(result.run_results) == [1, 2]


# -- backends and configuration -------------------------------------------------------------


@pytest.mark.skipif(shutil.which("etcd") is None,
                    reason="etcd is not installed (Debian: apt-get install etcd-server)")
@pytest.mark.slow  # the default run is at its 5-minute budget; etcd jobs: tests/rendezvous/test_etcd.py
def test_etcd_backend_two_nodes_node_kill_and_etcd_loss(capfd, warm_pool):
    with Cluster(pool=warm_pool, nnodes="1:2", nproc_per_node=1, rdzv_backend="etcd", max_restarts=0) as cluster:
        first = cluster.launch(ALLREDUCE).wait(timeout=60)
        assert first.state == S.SUCCEEDED
        job = cluster.launch(STEPPER, "40", "0.03")
        assert job.store.name == "etcd"
        job.inject(NodeKill(node=1), OnState(S.HEALTHY))
        _node_done(job, 0)
        assert _fault_kinds(job) == ["kill_node"]
        assert job.result().state == S.SUCCEEDED and job.timeline.world_sizes() == [2, 1]
        lost = cluster.launch(SLEEPER)
        lost.wait_for_state(S.HEALTHY, timeout=30)
        lost.net.call_in_store(lambda: _strangers_cannot_use(lost.store.endpoint))  # beside etcd, as a peer
        lost.kill_store_host()  # etcd dies: no node can go on
        assert lost.wait(timeout=30).exit_codes == {0: 1, 1: 1}
        assert _fault_kinds(lost) == ["kill_store_host"]
        assert all("lost the etcd rendezvous store" in lost.agent_log(i) for i in (0, 1))
    assert sorted(re.findall(r"SUM rank=(\d) world=2 value=3", capfd.readouterr().out)) == ["0", "1"]


def _strangers_cannot_use(endpoint: str) -> None:
    """The harness's etcd has authentication on (its user's password derived from the job
    secret): a client without the password reads no key, one with a wrong one is refused,
    each in one line. The job's nodes got in (the job formed above)."""
    from harness.rendezvous._etcd import EtcdStore
    from harness.rendezvous._store import StoreConnectionError

    host, port = endpoint.rsplit(":", 1)
    stranger = EtcdStore(host, int(port), prefix="/", timeout=5)
    try:
        with pytest.raises(StoreConnectionError, match=r"^etcd .* wants the job's secret \(authentication is on "
                                                       r"there\), and this node has none"):
            stranger.num_keys()
    finally:
        stranger.close()
    with pytest.raises(StoreConnectionError, match=r"^etcd .* refused this node's job secret \(HTTP 400: etcdserver: "
                                                   r"authentication failed, invalid user ID or password\)"):
        EtcdStore(host, int(port), prefix="/", timeout=5, password="not the job's")


def test_bad_multinode_configurations_are_clear_errors():
    with pytest.raises(ConfigError, match=re.escape("rdzv_backend='static' must be one of c10d, etcd, "
                                                    "etcd-v2 (from Cluster(rdzv_backend=...))")):
        Cluster(nnodes=2, rdzv_backend="static")
    with Cluster(nnodes=2, rdzv_backend="etcd", store_host="node0") as cluster:
        with pytest.raises(ConfigError, match="store_host='node0' must be 'harness'"):
            cluster.launch(SLEEPER)


# -- everything dies with the harness -------------------------------------------------------


def test_everything_dies_with_a_killed_harness(tmp_path):
    script = tmp_path / "harness_main.py"
    script.write_text(textwrap.dedent(f"""
        import os, sys, time
        from harness import Cluster, WorkerState
        cluster = Cluster(nnodes=2, nproc_per_node=1)
        job = cluster.launch({SLEEPER!r})
        job.wait_for_state(WorkerState.HEALTHY, timeout=60)
        pids = [cluster.pool.pid, job.store.pid] + [n.pid for n in job.nodes.values()]
        pids += [p for i in job.nodes for p in job.worker_pids(i).values()]
        os.write(1, ("PIDS " + " ".join(map(str, pids)) + "\\n").encode())
        time.sleep(120)
    """))
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)
    try:
        line = "?"
        while line and not line.startswith("PIDS "):  # workers share its stdout
            line = proc.stdout.readline()
        assert line.startswith("PIDS "), "the harness script died before it printed its pids"
        pids = [int(p) for p in line.split()[1:]]
        assert len(pids) == 6  # zygote, store, 2 agents, 2 workers
        procs = [psutil.Process(p) for p in pids]
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
    _, alive = psutil.wait_procs(procs, timeout=15)
    assert not alive, f"outlived the harness: {alive}"


# -- the invariant checker across nodes -----------------------------------------------------


def _write_events(path, events) -> None:
    import json

    with open(path, "w") as fp:
        for mono, node, kind, fields in events:
            fp.write(json.dumps({"ts": mono, "mono": mono, "node": node, "pid": 1,
                                 "run_id": "r", "kind": kind, **fields}) + "\n")


def _start(rank: int, world: int, rnd: int, pid: int) -> tuple[str, dict]:
    return "worker_start", {"local_rank": 0, "rank": rank, "world_size": world,
                            "worker_pid": pid, "round": rnd}


@pytest.mark.parametrize("fault, exempt", [("freeze_node", True), ("kill_store_host", True), ("remove_node", False),
                                           # an older run's events, recorded under the retired names
                                           ("node_freeze", True), ("store_host_loss", True), ("node_leave", False)])
def test_a_frozen_or_store_hosting_node_may_keep_old_workers(tmp_path, fault, exempt):
    """A frozen node (or node 0 lost with the store it hosted) cannot stop its workers, so
    the survivors' next round may start while they exist; any other node must stop its own."""
    from harness.sim.truth.invariants import JobFacts, check_timeline
    from harness.sim.truth.timeline import Timeline

    path = tmp_path / "events.jsonl"
    _write_events(path, [
        (1.0, "a-0", "state", {"state": "INIT"}), (1.0, "b-1", "state", {"state": "INIT"}),
        (1.1, "a-0", *_start(0, 2, 0, 10)), (1.1, "b-1", *_start(1, 2, 0, 11)),
        (1.2, "a-0", "state", {"state": "HEALTHY"}), (1.2, "b-1", "state", {"state": "HEALTHY"}),
        (1.3, "harness", "fault", {"fault": fault, "target_node": "b-1"}),
        (2.0, "a-0", "worker_exit", {"local_rank": 0, "rank": 0, "worker_pid": 10, "exitcode": -15}),
        (2.0, "a-0", "state", {"state": "STOPPED"}),
        (2.1, "a-0", *_start(0, 1, 1, 12)), (2.2, "a-0", "state", {"state": "HEALTHY"}),
    ])
    problems = check_timeline(Timeline(str(path)), JobFacts(max_restarts=0, nproc_per_node=1))
    if exempt:
        assert problems == []
    else:
        assert problems == ["round 1 started while b-1 rank 1 (pid 11) of round 0 was still alive"]


def test_a_leaving_node_is_a_membership_change_and_its_workers_never_overlap_the_next_round(warm_pool):
    """Node 1 leaves (SIGTERM to its agent) while its local rank 1 ignores SIGTERM, so its
    agent needs the whole shutdown grace to stop its workers. Its local rank 0 dies at once
    and node 0's all_reduce breaks: node 0 must read the announced leave (no failure of its
    own: max_restarts=0 would end the job), and must not form the next round before node
    1's last worker is gone (the overlap invariant)."""
    with Cluster(pool=warm_pool, nnodes="1:2", nproc_per_node=2, max_restarts=0, shutdown_timeout=2.0) as cluster:
        job = cluster.launch(str(SCRIPTS / "leave_probe.py"), "40")
        job.inject(NodeRemove(node=1), AtStep(step=5, rank=0))
        result = job.wait(timeout=120)
        assert result.state == WorkerState.SUCCEEDED, job.timeline.format()
        assert job.timeline.world_sizes() == [4, 2]
        job.check_invariants()

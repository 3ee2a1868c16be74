"""Node agents forked by the pool's node server (``harness.sim.nodes.forks``): each is what
``python -m harness.sim.nodes.main`` would be (its own session, the node's environment,
working directory and temp dir, the harness's stdout), its exit status reaches the
harness, and the plain start stays the fallback where a fork could differ."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import textwrap

import psutil

from harness import Cluster, WarmPool, WorkerState
from harness.procs._priority import AHEAD_STEPS
from harness.sim.nodes.forks import ForkedNode
from tests.conftest import SCRIPTS, survivors

SLEEPER = str(SCRIPTS / "sleeper.py")
S = WorkerState

PROBE = textwrap.dedent("""
    import json, os, sys, tempfile
    line = "PROBE " + json.dumps({"var": os.environ.get("NODE_PROBE"), "cwd": os.getcwd(),
                                   "tmp": tempfile.gettempdir(), "rank": os.environ["RANK"]})
    os.write(1, (line + "\\n").encode())  # one write: print() under -u writes the newline apart
""")


def _probe_lines(out: str) -> list[dict]:
    return [json.loads(line[len("PROBE "):]) for line in out.splitlines() if line.startswith("PROBE ")]


def test_nodes_are_forked_sessions_of_the_pool_server(capfd):
    with Cluster(nnodes="1:2", nproc_per_node=1) as cluster:
        job = cluster.launch(SLEEPER)
        job.wait_for_state(S.HEALTHY, timeout=30)
        server = cluster.pool.node_server()
        assert server is not None
        ours = os.getpriority(os.PRIO_PROCESS, 0)
        for node in job.nodes.values():
            assert isinstance(node.popen, ForkedNode)
            assert psutil.Process(node.pid).ppid() == server.process.pid
            assert os.getpgid(node.pid) == node.pid and os.getsid(node.pid) == node.pid
            assert psutil.Process(node.pid).nice() == ours  # the server runs ahead, its nodes do not
        if os.geteuid() == 0:  # where a priority may be raised, the servers shared by all nodes are
            assert psutil.Process(server.process.pid).nice() == ours - AHEAD_STEPS
        job.kill_node(1)
        exits = [e for e in job.timeline.events("node_exit") if e["target_node"] == 1]
        assert exits and exits[-1]["signal"] == signal.SIGKILL, exits
        assert job.nodes[1].popen.poll() == -signal.SIGKILL
        job.wait_for_recovery(timeout=60)


def test_a_forked_node_has_the_nodes_environment_cwd_and_temp_dir(tmp_path, capfd, monkeypatch):
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    workdir = tmp_path / "work"
    workdir.mkdir()
    monkeypatch.chdir(workdir)  # after the pool's server started elsewhere: the node follows
    with WarmPool() as pool:
        pool.node_server()
        with Cluster(nnodes=2, nproc_per_node=1, env={"NODE_PROBE": "given"}, pool=pool) as cluster:
            job = cluster.launch(str(script))
            assert job.wait(timeout=60).state == S.SUCCEEDED
            assert all(isinstance(n.popen, ForkedNode) for n in job.nodes.values())
            tmps = {n.index: job.storage.tmp_of(n.index) for n in job.nodes.values()}  # on its disk
    probes = _probe_lines(capfd.readouterr().out)  # the nodes wrote to this process's stdout
    assert sorted(p["rank"] for p in probes) == ["0", "1"], probes
    for probe in probes:
        assert probe["var"] == "given" and probe["cwd"] == str(workdir), probe
    # each node's own temp dir (a rank need not sit on the node of the same index)
    assert sorted(p["tmp"] for p in probes) == sorted(tmps.values()), (probes, tmps)


def test_a_node_whose_interpreter_settings_differ_starts_the_plain_way(tmp_path, capfd):
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    with Cluster(nnodes=1, nproc_per_node=1, env={"PYTHONHASHSEED": "7"}) as cluster:
        job = cluster.launch(str(script))
        assert job.wait(timeout=60).state == S.SUCCEEDED
        assert isinstance(job.nodes[0].popen, subprocess.Popen)
    assert len(_probe_lines(capfd.readouterr().out)) == 1


def test_nodes_die_with_their_server_and_their_exits_are_still_recorded():
    with WarmPool() as pool, Cluster(nnodes=2, nproc_per_node=1, max_restarts=0, pool=pool,
                                     check_invariants=False) as cluster:
        job = cluster.launch(SLEEPER)
        job.wait_for_state(S.HEALTHY, timeout=30)
        server = pool.node_server()
        assert server is not None
        nodes = [n.pid for n in job.nodes.values()]
        server.process.kill()
        assert all(n.popen.wait(10) == -signal.SIGKILL for n in job.nodes.values())
        assert not survivors(nodes, timeout=0)
        assert pool.node_server() is not server  # the next launch gets a new one


def test_a_fork_answered_after_the_harness_gave_up_is_killed_not_run_twice(tmp_path, monkeypatch):
    import harness.sim.nodes.forks as node_forks

    spec = tmp_path / "spec.fifo"
    os.mkfifo(spec)  # a node that got this far would block here, reading its spec
    with WarmPool() as pool:
        server = pool.node_server()
        assert server is not None
        assert server._ready.wait(30)
        monkeypatch.setattr(node_forks, "_REPLY_TIMEOUT_S", 0.3)
        os.kill(server.process.pid, signal.SIGSTOP)  # too slow to answer in time
        try:
            with open(os.devnull, "wb") as log:
                try:
                    server.fork(str(spec), None, dict(os.environ), os.getcwd(), log.fileno())
                except OSError as e:
                    assert "did not answer" in str(e)
                else:
                    raise AssertionError("a stopped server answered")
        finally:
            os.kill(server.process.pid, signal.SIGCONT)
        ident = server._next_ident
        assert server.wait_exit(ident, 10) == -signal.SIGKILL  # the late fork, killed on arrival

"""Fencing with real agents: a node that cannot reach the rendezvous store for the
keep-alive bound stops its workers, starts none, and rejoins when the store answers.

The store is a standalone store server that the test freezes with SIGSTOP: it keeps
its sockets (no RST, no FIN) but answers nothing, which is what a partition looks like
to the agents. (Network-namespace partitions come with the simulation's netns mode.)
"""

from __future__ import annotations

import json
import re
import signal
import time

import psutil

from harness.rendezvous._store import StoreClient
from tests.rendezvous.conftest import LOOP, c10d_args, kill_node
from tests.rendezvous.store_proc import proxy_to, store_process


def worker_pids(node) -> set[int]:
    return {int(m.group(1)) for line in node.lines if (m := re.search(r"^START .*pid=(\d+)", line))}


def alive(pids: set[int]) -> set[int]:
    return {p for p in pids if psutil.pid_exists(p)
            and psutil.Process(p).status() != psutil.STATUS_ZOMBIE}


def events(path) -> list[dict]:
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except FileNotFoundError:
        return []


def test_a_frozen_store_fences_every_agent_and_the_job_finishes_after_it_thaws(nodes, tmp_path):
    release = tmp_path / "release"
    with store_process() as store:
        agents = []
        for i in range(2):
            args = c10d_args(store.port, "2", "fence", "--rdzv-conf=is_host=false",
                             "--max-restarts=0")
            env = {"HARNESS_EVENTS": str(tmp_path / f"events{i}.jsonl"), "HARNESS_NODE": f"n{i}"}
            agents.append(nodes(*args, LOOP, "--finish-world=2", f"--until={release}",
                                "--max-seconds=120", env=env))
        for agent in agents:
            agent.wait_for("START")
        first_workers = [worker_pids(a) for a in agents]
        assert all(first_workers)

        store.freeze()
        for agent in agents:
            agent.wait_for("fenced: no answer from the rendezvous store", timeout=30)
        # the fenced agents stopped their workers (the store still answers nothing)
        deadline = time.monotonic() + 30
        while any(alive(p) for p in first_workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(alive(p) for p in first_workers), [a.output for a in agents]
        time.sleep(1.0)  # and start none while they cannot reach the store
        assert [len(worker_pids(a)) for a in agents] == [len(p) for p in first_workers]
        assert all(a.proc.poll() is None for a in agents)

        release.touch()
        store.thaw()  # they rejoin and finish
        rcs = [a.wait(90) for a in agents]
        assert rcs == [0, 0], "\n".join(a.output for a in agents)
    for i, agent in enumerate(agents):
        assert len(worker_pids(agent)) > len(first_workers[i]), agent.output  # new workers
        kinds = [e["kind"] for e in events(tmp_path / f"events{i}.jsonl")]
        assert "fenced" in kinds and "unfenced" in kinds
        assert kinds.index("fenced") < kinds.index("unfenced")
        assert "restart=0" in [l for l in agent.lines if l.startswith("START")][-1]  # not charged


def test_survivors_reform_when_a_peer_goes_silent_without_rst_or_fin(nodes):
    """A frozen node (agent and workers SIGSTOPped) keeps every socket open: no reset, no
    EOF. The survivor must still declare it gone (its heartbeat stops) and go on alone."""
    with store_process() as store:
        args = c10d_args(store.port, "1:2", "silent", "--rdzv-conf=is_host=false",
                         "--max-restarts=0")
        a = nodes(*args, LOOP, "--finish-world=1", "--max-seconds=120")
        b = nodes(*args, LOOP, "--finish-world=1", "--max-seconds=120")
        a.wait_for("world=2")
        b.wait_for("world=2")
        b.signal_group(signal.SIGSTOP)
        try:
            assert a.wait(90) == 0, a.output
        finally:
            kill_node(b)
    assert any(l.startswith("START") and "world=1 " in l and "restart=0" in l for l in a.lines)
    assert any("lost " in l for l in a.lines), a.output  # declared gone, not a restart


def wait_until_joined(port: int, run_id: str, timeout: float = 30.0) -> None:
    """Until a node has joined the forming round of ``run_id`` in the store at ``port``: read
    from the store itself, as the agents print nothing while they wait for peers."""
    from harness.rendezvous._state import RendezvousState, StoreKeys

    keys = StoreKeys(run_id, f"127.0.0.1:{port}")
    client = StoreClient("127.0.0.1", port, timeout=10)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if client.check([keys.state]):
                state = RendezvousState.from_json(client.get(keys.state), run_id, keys.endpoint)
                if state.participants:
                    return
            time.sleep(0.05)
    finally:
        client.close()
    raise AssertionError(f"no node joined rendezvous {run_id} within {timeout}s")


def test_a_store_frozen_during_the_rendezvous_is_waited_out(nodes):
    """The first agent waits for its peer when the store freezes: its requests go
    unanswered (``read_timeout`` shortened here from 60 s), it is fenced, and once the
    store thaws it reconnects and the round forms with the late peer."""
    with store_process() as store:
        args = c10d_args(store.port, "2", "frozen-join",
                         "--rdzv-conf=is_host=false,read_timeout=2", "--max-restarts=0")
        a = nodes(*args, LOOP, "--finish-world=2")
        wait_until_joined(store.port, "frozen-join")  # a is in next_rendezvous, waiting for a second node
        store.freeze()
        a.wait_for("fenced", timeout=30)
        # a request of a's main thread timed out (read_timeout) and did not end the rendezvous
        a.wait_for("retrying", timeout=30)
        store.thaw()
        b = nodes(*args, LOOP, "--finish-world=2")
        assert [a.wait(90), b.wait(90)] == [0, 0], a.output + "\n" + b.output


def test_a_node_cut_off_from_the_store_fences_and_rejoins_as_a_new_member(nodes, tmp_path):
    """Only node b loses the store (its traffic goes through a relay the test freezes);
    the peers still reach each other. a declares b gone and goes on alone; b stops its
    workers and starts none; once b reaches the store again it rejoins and the world
    grows back to two."""
    release = tmp_path / "release"
    with store_process() as store, proxy_to(store.port) as relay:
        def agent(port: int, name: str):
            args = c10d_args(port, "1:2", "cut", "--rdzv-conf=is_host=false", "--max-restarts=0")
            env = {"HARNESS_EVENTS": str(tmp_path / f"{name}.jsonl"), "HARNESS_NODE": name}
            return nodes(*args, LOOP, "--finish-world=2", f"--until={release}",
                         "--max-seconds=120", env=env)

        a, b = agent(store.port, "a"), agent(relay.port, "b")
        a.wait_for("world=2")
        b.wait_for("world=2")
        b_workers = worker_pids(b)
        relay.freeze()
        b.wait_for("fenced: no answer", timeout=30)
        a.wait_for("world=1", timeout=60)  # a went on alone
        deadline = time.monotonic() + 30
        while alive(b_workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(b_workers), b.output
        assert worker_pids(b) == b_workers  # none started while cut off
        release.touch()
        relay.thaw()
        assert [a.wait(90), b.wait(90)] == [0, 0], a.output + "\n" + b.output
    assert len([l for l in a.lines if l.startswith("START") and "world=2 " in l]) == 2
    assert [l for l in b.lines if l.startswith("START")][-1].count("world=2 ") == 1
    assert all("restart=0" in l for l in a.lines + b.lines if l.startswith("START"))
    kinds = [e["kind"] for e in events(tmp_path / "b.jsonl")]
    assert kinds.count("fenced") == 1 and kinds.count("unfenced") == 1
    assert "fenced" not in [e["kind"] for e in events(tmp_path / "a.jsonl")]


def two_of_two(nodes, port: int, run_id: str, name: str, tmp_path):
    """One of two 1:2 agents that train until ``tmp_path/release`` exists, with events."""
    args = c10d_args(port, "1:2", run_id, "--rdzv-conf=is_host=false", "--max-restarts=0")
    env = {"HARNESS_EVENTS": str(tmp_path / f"{name}.jsonl"), "HARNESS_NODE": name}
    return nodes(*args, LOOP, "--finish-world=2", f"--until={tmp_path / 'release'}",
                 "--max-seconds=120", env=env)


def test_a_node_not_scheduled_past_its_lease_fences_itself_the_moment_it_runs_again(nodes, tmp_path):
    """Only b's agent stops (SIGSTOP of its pid: its workers run on), as an agent starved
    of the CPU on an overloaded host would: its request times out on no clock of its own,
    or it asks nothing at all, yet its peers hear no heartbeat and go on without it. The
    lease runs out all the same: when b runs again, the first thing it does is fence (its
    workers stop), whatever the store answers meanwhile; then it rejoins."""
    release = tmp_path / "release"
    with store_process() as store:
        a, b = (two_of_two(nodes, store.port, "lapse", name, tmp_path) for name in "ab")
        a.wait_for("world=2")
        b.wait_for("world=2")
        b_workers = worker_pids(b)
        b.proc.send_signal(signal.SIGSTOP)  # the agent only
        try:
            a.wait_for("world=1", timeout=60)  # a declared b gone and went on alone
        finally:
            b.proc.send_signal(signal.SIGCONT)
        b.wait_for("past this node's lease", timeout=30)
        deadline = time.monotonic() + 30
        while alive(b_workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(b_workers), b.output
        release.touch()
        assert [a.wait(90), b.wait(90)] == [0, 0], a.output + "\n" + b.output
    kinds = [e["kind"] for e in events(tmp_path / "b.jsonl")]
    assert "fenced" in kinds, kinds
    assert "membership_change" not in kinds[:kinds.index("fenced")]  # the fence came first
    # and it says where the silence went: stopped is asleep (not runnable), not starved
    reason = next(e["reason"] for e in events(tmp_path / "b.jsonl") if e["kind"] == "fenced")
    split = re.search(r"its keep-alive thread waited ([\d.]+)s for a CPU, ran ([\d.]+)s and slept ([\d.]+)s", reason)
    assert split is not None, reason
    waited, _, slept = map(float, split.groups())
    assert slept > 0.7 > waited, reason


def test_a_node_whose_keep_alive_stalled_before_gets_a_longer_lease_and_is_not_taken_for_dead(nodes, tmp_path):
    """b's agent stalls (SIGSTOP of its pid) three times for 0.4 s, under its 0.7 s lease:
    its keep-alive gaps grow, so its lease grows (3 x 0.4 s) and it publishes that. A later
    1.1 s stall, past the configured 0.8 s bound, is then within what its peers allow: the
    world never shrinks and b never fences. With a fixed bound a would declare b dead."""
    release = tmp_path / "release"
    with store_process() as store:
        a, b = (two_of_two(nodes, store.port, "grow", name, tmp_path) for name in "ab")
        a.wait_for("world=2")
        b.wait_for("world=2")

        def stall(seconds: float) -> None:
            b.proc.send_signal(signal.SIGSTOP)
            time.sleep(seconds)
            b.proc.send_signal(signal.SIGCONT)
            time.sleep(1.0)  # b beats, grows its lease, publishes it; a reads it

        for _ in range(3):
            stall(0.4)
        stall(1.1)
        release.touch()
        assert [a.wait(90), b.wait(90)] == [0, 0], a.output + "\n" + b.output
    assert not any("world=1" in l for l in a.lines if l.startswith("START")), a.output
    assert not any("lost " in l for l in a.lines), a.output
    assert "fenced" not in [e["kind"] for e in events(tmp_path / "b.jsonl")]
    assert "lease is now" in b.output  # it grew, and said so

"""The c10d dynamic rendezvous with real agents (``python -m harness.run``) on loopback."""

from __future__ import annotations

import json
import pickle
import re
import signal
from dataclasses import fields

import pytest

from harness.errors import ConfigError
from harness.rendezvous import (
    RendezvousParameters,
    RendezvousStateError,
    get_rendezvous_handler,
)
from harness.rendezvous._state import RendezvousState
from harness.rendezvous._store import StoreClient, StoreServer
from tests.conftest import SCRIPTS, run_elastic
from tests.rendezvous.conftest import (
    ALLREDUCE,
    ALWAYS_FAIL,
    ENV_DUMP,
    LOOP,
    c10d_args,
    free_port,
    kill_node,
)
from tests.rendezvous.store_proc import store_process

PROBE = str(SCRIPTS / "agent_store_probe.py")


def hosts_store(node) -> bool:
    return any("hosting the rendezvous store" in line for line in node.lines)


def starts(node, world: int) -> list[str]:
    return [l for l in node.lines if l.startswith("START") and f"world={world} " in l]


# -- state and configuration ------------------------------------------------------------


def test_state_round_trips_and_rejects_foreign_data():
    state = RendezvousState(run_id="job", participants=["a"], restarts=2,
                            nodes={"a": {"name": "n", "addr": "h", "live": "h:1", "port": 5}})
    assert RendezvousState.from_json(state.to_json(), "job", "here") == state
    for raw, why in [
        (pickle.dumps({"round": 1}), "not JSON"),
        (b'{"round": 1}', "no 'kind'"),
        (state.to_json().replace(b'"schema":2', b'"schema":1'), "schema 1, this agent speaks schema 2"),
        (state.to_json().replace(b'"restarts":2', b'"restarts":-1'), "field"),
        (state.to_json(), "run id 'job'"),
        (state.to_json().replace(b'"seq":0', b'"seq":"x"'), "field"),
    ]:
        with pytest.raises(RendezvousStateError, match=re.escape(why)):
            RendezvousState.from_json(raw, "other" if "run id" in why else "job", "key k")


def test_state_json_carries_every_field():
    """Each field, set away from its default, comes back: one the writer forgot is lost on
    the next agent's read (``from_json`` needs every key)."""
    state = RendezvousState(run_id="job", seq=3, round=2, complete=True, closed=True, close_reason="done",
                            cause="death", restarts=4, participants=["a", "b"], expected=["a"], waiting=["c"],
                            nodes={"a": {"name": "n", "addr": "h", "live": "h:1", "port": 5, "finished": True}})
    defaults = RendezvousState(run_id="job")
    assert all(getattr(state, f.name) != getattr(defaults, f.name) for f in fields(state) if f.name != "run_id")
    assert RendezvousState.from_json(state.to_json(), "job", "here") == state


def test_agent_refuses_pickled_state_with_a_clear_error():
    server = StoreServer("", 0).start()
    try:
        client = StoreClient("127.0.0.1", server.port, timeout=5)
        client.set("harness/rdzv/evil/state", pickle.dumps(("torch", "state")))
        out = run_elastic(*c10d_args(server.port, "1:2", "evil", "--rdzv-conf=is_host=false"),
                          ENV_DUMP, timeout=60)
        assert out.returncode == 1
        assert "is not ours (not JSON" in out.stderr and "Traceback" not in out.stderr
        client.close()
    finally:
        server.stop()


@pytest.mark.parametrize("conf, message", [
    ("heartbeat_timeout=0.05", "must be > keep_alive_interval"),
    ("keep_alive_interval=-1", "must be a number > 0"),
    ("is_host=maybe", "must be a boolean"),
    ("join_timeout=soon", "must be a number"),
    ("first_round_nodes=-1", "must be an int >= 0"),
    ("first_round_nodes=all", "must be an integer"),
    ("settle_time=-0.1", "must be a number of seconds in 0..1"),
    ("settle_time=5", "must be a number of seconds in 0..1"),
])
def test_bad_rdzv_conf_is_a_one_line_error(conf, message):
    out = run_elastic(*c10d_args(free_port(), "2", "conf", f"--rdzv-conf={conf}"), ENV_DUMP)
    assert out.returncode == 1
    assert message in out.stderr and "Traceback" not in out.stderr


def test_port_zero_needs_a_single_node_job():
    with pytest.raises(ConfigError, match="port 0 only for a single-node job"):
        get_rendezvous_handler(RendezvousParameters("c10d", "127.0.0.1:0", "x", 1, 2))


def test_unreachable_store_fails_fast_and_clearly():
    out = run_elastic(*c10d_args(free_port(), "2", "nobody", "--rdzv-conf=is_host=false,read_timeout=1"),
                      ENV_DUMP)
    assert out.returncode == 1
    assert "could not reach the rendezvous store" in out.stderr and "Traceback" not in out.stderr


# -- jobs ---------------------------------------------------------------------------------


def test_two_nodes_two_workers_allreduce(nodes):
    port = free_port()
    agents = [nodes(*c10d_args(port, "2", "pair", nproc=2), ALLREDUCE) for _ in range(2)]
    assert [a.wait(90) for a in agents] == [0, 0], "\n".join(a.output for a in agents)
    sums = [l for a in agents for l in a.lines if l.startswith("SUM")]
    assert sorted(int(re.search(r"rank=(\d)", l).group(1)) for l in sums) == [0, 1, 2, 3]
    assert all("world=4 value=10" in l for l in sums)
    groups = {a.lines[[i for i, l in enumerate(a.lines) if "round 0 complete" in l][0]].split("rank ")[1][0]
              for a in agents}
    assert groups == {"0", "1"}


def test_env_per_rank(nodes):
    port = free_port()
    agents = [nodes(*c10d_args(port, "2", "envs", nproc=2), ENV_DUMP) for _ in range(2)]
    assert [a.wait(60) for a in agents] == [0, 0]
    decoder = json.JSONDecoder()  # two workers share a pipe: lines may run together
    rows = [decoder.raw_decode(chunk)[0]["env"] for a in agents
            for chunk in a.output.split("ENV ")[1:]]
    assert sorted(r["RANK"] for r in rows) == ["0", "1", "2", "3"]
    for r in rows:
        assert r["WORLD_SIZE"] == "4" and r["GROUP_WORLD_SIZE"] == "2"
        assert r["GROUP_RANK"] == str(int(r["RANK"]) // 2)
        assert r["TORCHELASTIC_USE_AGENT_STORE"] == "True" and r["TORCHELASTIC_RUN_ID"] == "envs"
    assert len({(r["MASTER_ADDR"], r["MASTER_PORT"]) for r in rows}) == 1


def test_one_node_of_one_to_two(nodes):
    # a lone node of a MIN<MAX job waits out the first round's last call (shortened here)
    agent = nodes(*c10d_args(free_port(), "1:2", "solo", "--rdzv-conf=last_call_timeout=1"),
                  LOOP, "--finish-world=1")
    assert agent.wait(60) == 0, agent.output
    assert starts(agent, 1)


@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
def test_scale_down(nodes, how):
    port = free_port()
    extra = ("--max-restarts=0",)
    a = nodes(*c10d_args(port, "1:2", f"down-{how}", *extra), LOOP, "--finish-world=1")
    b = nodes(*c10d_args(port, "1:2", f"down-{how}", *extra), LOOP, "--finish-world=1")
    a.wait_for("world=2")
    b.wait_for("world=2")
    host, other = (a, b) if hosts_store(a) else (b, a)  # the store host must survive
    if how == "sigterm":
        other.proc.send_signal(signal.SIGTERM)
        assert other.wait(30) != 0
    else:
        kill_node(other)
    # the survivor restarts with the smaller world without using its (zero) restarts
    assert host.wait(60) == 0, host.output
    assert starts(host, 1) and "restart=0" in starts(host, 1)[-1]


def test_scale_up(nodes):
    port = free_port()
    conf = "--rdzv-conf=last_call_timeout=1"  # the first round forms with one node
    first = nodes(*c10d_args(port, "1:3", "up", conf), LOOP, "--finish-world=2")
    first.wait_for("world=1")
    second = nodes(*c10d_args(port, "1:3", "up", conf), LOOP, "--finish-world=2")
    assert second.wait(60) == 0, second.output
    assert first.wait(60) == 0, first.output
    assert starts(first, 2) and starts(second, 2)
    assert "restart=0" in starts(first, 2)[-1]


def test_worker_crash_restarts_every_node(nodes):
    port = free_port()
    agents = [nodes(*c10d_args(port, "2", "crash", "--max-restarts=1"), LOOP,
                    "--finish-world=2", "--crash-rank=1") for _ in range(2)]
    assert [a.wait(90) for a in agents] == [0, 0], "\n".join(a.output for a in agents)
    for a in agents:  # one count per job: the node that only re-formed runs with 1 too
        assert [l.split()[3] for l in starts(a, 2)] == ["restart=0", "restart=1"], a.output


def test_rank0_agent_hosts_the_workers_store(nodes):
    """As torch's agents (``TORCHELASTIC_USE_AGENT_STORE=True``): worker rank 0 may exit
    without ``destroy_process_group`` while the other node's worker still uses the store."""
    port = free_port()
    agents = [nodes(*c10d_args(port, "2", "agentstore", nproc=1), PROBE) for _ in range(2)]
    assert [a.wait(120) for a in agents] == [0, 0], "\n".join(a.output for a in agents)
    probes = sorted(l.split("PROBE ", 1)[1] for a in agents for l in a.lines if "PROBE " in l)
    assert probes == ["rank=0 attempt=0 agent_store=True stale=False",
                      "rank=1 attempt=0 agent_store=True stale=False after_rank0=ok"], probes


def test_max_restarts_exhausted_fails_every_node(nodes):
    port = free_port()
    agents = [nodes(*c10d_args(port, "2", "exhaust", "--max-restarts=1", nproc=1), ALWAYS_FAIL)
              for _ in range(2)]
    rcs = [a.wait(90) for a in agents]
    assert rcs == [1, 1], "\n".join(a.output for a in agents)
    joined = "\n".join(a.output for a in agents)
    assert "ChildFailedError" in joined or "Root Cause" in joined


def test_store_host_loss_is_a_clear_fast_error(nodes):
    port = free_port()
    host = nodes(*c10d_args(port, "2", "hostloss"), LOOP, "--finish-world=9")
    other = nodes(*c10d_args(port, "2", "hostloss"), LOOP, "--finish-world=9")
    host.wait_for("world=2")
    other.wait_for("world=2")
    hosting = host if hosts_store(host) else other
    survivor = other if hosting is host else host
    kill_node(hosting)
    assert survivor.wait(30) == 1
    assert "lost the rendezvous store" in survivor.output
    assert "Traceback" not in survivor.output


def test_standalone_store_survives_losing_any_node(nodes):
    with store_process() as store:
        args = c10d_args(store.port, "1:2", "standalone", "--rdzv-conf=is_host=false",
                         "--max-restarts=0")
        a = nodes(*args, LOOP, "--finish-world=1")
        b = nodes(*args, LOOP, "--finish-world=1")
        a.wait_for("world=2")
        b.wait_for("world=2")
        kill_node(a)  # either node; neither hosts the store
        assert b.wait(60) == 0, b.output
        assert starts(b, 1)


# -- the first round's last call ------------------------------------------------------------


def test_staggered_start_forms_one_world(nodes):
    """Agents started seconds apart (pods) form one world, as under torchrun: the first
    round waits torch's 30 s last call instead of closing with the first node alone."""
    import time

    port = free_port()
    a = nodes(*c10d_args(port, "1:2", "stagger"), LOOP, "--finish-world=2", "--max-seconds=20")
    a.wait_for("hosting the rendezvous store")
    time.sleep(1.5)  # more than our old 1 s last call
    b = nodes(*c10d_args(port, "1:2", "stagger"), LOOP, "--finish-world=2", "--max-seconds=20")
    assert [a.wait(90), b.wait(90)] == [0, 0], a.output + "\n" + b.output
    for agent in (a, b):
        rounds = [l for l in agent.lines if re.search(r"round \d+ complete", l)]
        assert len(rounds) == 1 and "round 0 complete" in rounds[0], agent.output
        assert " of 2 (" in rounds[0] and starts(agent, 2), agent.output


def test_a_late_agent_of_an_ended_job_says_so_in_one_line(nodes):
    with store_process() as store:
        args = c10d_args(store.port, "1:2", "ended", "--rdzv-conf=is_host=false,last_call_timeout=0.5")
        first = nodes(*args, ENV_DUMP)
        assert first.wait(60) == 0, first.output
        late = nodes(*args, ENV_DUMP)
        assert late.wait(60) == 1, late.output
    errors = [l for l in late.lines if l.startswith("elastic-run: error")]
    assert len(errors) == 1, late.output
    assert "is closed: the job ended" in errors[0] and "came too late" in errors[0]
    assert "Traceback" not in late.output


def test_peer_dying_during_exit_barrier_does_not_hold_the_survivor(nodes, tmp_path):
    script = tmp_path / "early.py"
    script.write_text(
        "import os, time\n"
        "print('RUNNING group', os.environ['GROUP_RANK'], flush=True)\n"
        "if os.environ['GROUP_RANK'] == '1':\n"
        "    time.sleep(60)\n")
    port = free_port()
    a = nodes(*c10d_args(port, "2", "barrier"), str(script))
    b = nodes(*c10d_args(port, "2", "barrier"), str(script))
    a.wait_for("RUNNING")
    b.wait_for("RUNNING")
    finisher, sleeper = (a, b) if any("RUNNING group 0" in l for l in a.lines) else (b, a)
    import time

    time.sleep(0.5)  # the finisher is now waiting in the exit barrier
    assert finisher.proc.poll() is None
    kill_node(sleeper)
    assert finisher.wait(30) == 0, finisher.output  # the default barrier timeout is 300 s
    assert "exit barrier did not complete" in finisher.output


def test_store_host_election_survives_a_simultaneous_bind():
    """Two agents binding at once can both fail to listen (SO_REUSEADDR lets both binds
    through; each listen() then sees the other): neither hosted, both waited 60 s for a
    store that never came. A lost election now counts only if someone really listens."""
    import socket
    import threading

    from harness.endpoints import PortReservation
    from harness.rendezvous._store_host import elect_store_host as _elect_store_host

    with PortReservation("127.0.0.1") as reservation:
        port = reservation.port
    rival = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)  # the other agent, mid-bind
    rival.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    rival.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    rival.bind(("::", port))
    timer = threading.Timer(0.2, rival.close)  # ... which then loses its own listen()
    timer.start()
    try:
        server = _elect_store_host("127.0.0.1", port)
        assert server is not None, "nobody hosts the store"
        server.stop()
    finally:
        timer.cancel()
        rival.close()

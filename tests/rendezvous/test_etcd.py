"""The etcd backend against a real etcd server (started per module on free loopback ports)."""

from __future__ import annotations

import re
import threading
import time

import pytest

from harness.rendezvous._etcd import EtcdStore
from harness.rendezvous._store import StoreConnectionError, StoreTimeoutError
from tests.conftest import run_elastic
from tests.rendezvous.conftest import ALLREDUCE, ENV_DUMP, ETCD_PASSWORD, HERE, LOOP, kill_node


def etcd_args(endpoint: str, nnodes: str, run_id: str, *extra: str, backend: str = "etcd",
              nproc: int = 1) -> list[str]:
    return [f"--nnodes={nnodes}", f"--nproc-per-node={nproc}", f"--rdzv-backend={backend}",
            f"--rdzv-endpoint={endpoint}", f"--rdzv-id={run_id}", *extra]


def test_etcd_store_api(etcd_endpoint):
    host, port = etcd_endpoint.split(":")
    store = EtcdStore(host, int(port), prefix="/t-api", timeout=5)
    try:
        store.set("k", b"v1")
        assert store.get("k") == b"v1"
        assert store.add("n", 5) == 5 and store.add("n", 2) == 7
        assert store.compare_set("k", b"v1", b"v2") == b"v2"
        assert store.compare_set("k", b"zz", b"v3") == b"v2"
        assert store.compare_set("new", b"", b"x") == b"x"
        assert store.check(["k"]) and not store.check(["k", "missing"])
        with pytest.raises(StoreTimeoutError, match="timed out after 0.2s"):
            store.wait(["missing"], 0.2)
        import threading

        other = store.clone()
        threading.Timer(0.2, lambda: other.set("late", b"1")).start()
        assert store.get("late", timeout=5) == b"1"
        store.multi_set(["a", "b"], [b"1", b"2"])
        assert store.multi_get(["a", "b"]) == [b"1", b"2"]
        assert store.delete_key("a") and not store.delete_key("a")
        store.append("b", b"3")
        assert store.get("b") == b"23"
        assert store.num_keys() >= 5
        other.close()
    finally:
        store.close()


def test_a_node_whose_lease_expired_writes_again_with_a_new_one(etcd_endpoint):
    """A node silent past its lease's TTL (starved of CPU, say) finds its lease gone: etcd
    answers "requested lease not found". That is not the store lost (it read so once, and
    ended an upstream test's agent in a loaded full suite): the node grants a new lease and
    writes again. The lease is revoked here, which is what expiry does, without a wait."""
    host, port = etcd_endpoint.split(":")
    store = EtcdStore(host, int(port), prefix="/t-lease", timeout=5, lease_ttl=30)
    try:
        store.attach_lease("beat")
        store.set("beat", b"1")
        first = store._lease.id
        store._call("/v3/lease/revoke", {"ID": first})
        assert not store.check(["beat"])  # gone with its lease, as a dead node's key goes
        assert store.add("beat", 1) == 1 and store.compare_set("beat", b"1", b"2") == b"2"
        assert store.leases_regranted == 1 and store._lease.id not in (None, first)
        store._call("/v3/lease/revoke", {"ID": store._lease.id})
        store.set("beat", b"3")
        assert store.get("beat") == b"3" and store.leases_regranted == 2
    finally:
        store.close()


@pytest.mark.parametrize("backend", ["etcd", "etcd-v2"])
def test_two_nodes_on_etcd(nodes, etcd_endpoint, backend):
    agents = [nodes(*etcd_args(etcd_endpoint, "2", f"pair-{backend}", backend=backend, nproc=2),
                    ALLREDUCE) for _ in range(2)]
    assert [a.wait(90) for a in agents] == [0, 0], "\n".join(a.output for a in agents)
    sums = [l for a in agents for l in a.lines if l.startswith("SUM")]
    assert sorted(int(re.search(r"rank=(\d)", l).group(1)) for l in sums) == [0, 1, 2, 3]
    assert all("world=4 value=10" in l for l in sums)


def test_scale_down_and_up_on_etcd(nodes, etcd_endpoint):
    args = etcd_args(etcd_endpoint, "1:2", "elastic-etcd", "--max-restarts=0")
    a = nodes(*args, LOOP, "--finish-world=1")
    b = nodes(*args, LOOP, "--finish-world=1")
    a.wait_for("world=2")
    b.wait_for("world=2")
    kill_node(b)  # either may go: etcd hosts the store
    assert a.wait(60) == 0, a.output
    assert any("world=1" in l and l.startswith("START") for l in a.lines)


def test_max_restarts_exhausted_on_etcd(nodes, etcd_endpoint, scripts):
    agents = [nodes(*etcd_args(etcd_endpoint, "2", "fail-etcd", "--max-restarts=1"),
                    str(scripts / "always_fail.py")) for _ in range(2)]
    assert [a.wait(90) for a in agents] == [1, 1], "\n".join(a.output for a in agents)


def test_unreachable_etcd_is_a_clear_error():
    from tests.rendezvous.conftest import free_port

    out = run_elastic(*etcd_args(f"127.0.0.1:{free_port()}", "2", "none",
                                 "--rdzv-conf=read_timeout=1"), ENV_DUMP)
    assert out.returncode == 1
    assert "could not reach etcd" in out.stderr and "Traceback" not in out.stderr


def test_a_node_that_finished_first_does_not_stop_a_slower_one(nodes, etcd_endpoint, tmp_path):
    """Upstream's test_correct_rank_assignment_homogeneous_etcd (7 agents, 23 workers) lost
    every slower node this way on 2 loaded cores (``KeyError: 'trainer'``): the fast node's
    exit barrier timed out, it left and closed the rendezvous, and the slower nodes took the
    closed rendezvous for a membership change, stopped their healthy workers and died on
    ``RendezvousClosedError``. As under torch, the running round goes on to its end."""
    go = tmp_path / "go"
    args = etcd_args(etcd_endpoint, "2", "finish-first", "--max-restarts=0",
                     "--exit-barrier-timeout=0.5")
    agents = [nodes(*args, str(HERE / "scripts" / "finish_on_file.py"), str(go)) for _ in range(2)]
    first = _first_to_exit(agents, timeout=90)
    assert first.proc.returncode == 0, first.output
    slow = agents[1 - agents.index(first)]
    time.sleep(1.0)  # ten keep-alive intervals: the slower node has seen the closed rendezvous
    go.touch()
    assert slow.wait(60) == 0, slow.output
    assert "DONE group_rank=1 restarts=0" in slow.output, slow.output


def _first_to_exit(agents: list, timeout: float):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for agent in agents:
            if agent.proc.poll() is not None:
                agent.wait(5)
                return agent
        time.sleep(0.05)
    raise AssertionError("no agent exited:\n" + "\n".join(a.output for a in agents))


def test_an_etcd_with_authentication_admits_only_the_password_and_renews_a_token(etcd_auth_endpoint):
    """The harness's etcd has authentication on (``enable_auth``): a client with the
    password reads and writes; one without reads no key and one with a wrong password is
    refused, each in one line. A token etcd no longer takes ("invalid auth token": expired;
    here one etcd never issued) is renewed once, for a request and for a watch."""
    host, port = etcd_auth_endpoint.split(":")
    store = EtcdStore(host, int(port), prefix="/t-auth", timeout=5, password=ETCD_PASSWORD)
    other, stranger = store.clone(), EtcdStore(host, int(port), prefix="/t-auth", timeout=5)
    try:
        store.set("k", b"v")
        assert other.get("k") == b"v"
        with pytest.raises(StoreConnectionError, match=r"wants the job's secret .* and this node has none"):
            stranger.get("k")
        with pytest.raises(StoreConnectionError, match=r"refused this node's job secret \(HTTP 400: etcdserver: "
                                                       r"authentication failed, invalid user ID or password\)"):
            EtcdStore(host, int(port), prefix="/t-auth", timeout=5, password="a stranger's")
        store._token = "expired.1"
        assert store.get("k") == b"v" and store._token != "expired.1"
        _, revision = store._range_many(["w"])
        store._token = "expired.2"
        threading.Timer(0.2, lambda: other.set("w", b"1")).start()
        store._watch_for("w", revision + 1, time.monotonic() + 5, 5)  # returns once "w" is put
        assert store._token != "expired.2"
    finally:
        for client in (store, other, stranger):
            client.close()

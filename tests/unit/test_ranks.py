"""Rank assignment: the identical fast path and the store-based slow path for several roles."""

from __future__ import annotations

import threading

import pytest

from harness.agent import WorkerSpec
from harness.agent._ranks import assign_worker_ranks
from harness.rendezvous._store import StoreClient, StoreServer


class _Handler:
    def get_run_id(self):
        return "r"


def spec(role: str, lws: int) -> WorkerSpec:
    return WorkerSpec(role=role, local_world_size=lws, rdzv_handler=_Handler(), entrypoint="python")


def test_identical_fast_path_is_arithmetic():
    workers = assign_worker_ranks(None, group_rank=2, group_world_size=3, spec=spec("t", 2), identical=True)
    assert [(w.global_rank, w.role_rank, w.world_size, w.role_world_size) for w in workers] == [
        (4, 4, 6, 6), (5, 5, 6, 6)]


@pytest.fixture
def store():
    server = StoreServer("127.0.0.1", 0)
    server.start()
    try:
        yield server
    finally:
        server.stop()


class _SetAndGetOnly:
    """A store with torch's oldest API only: no ``multi_get``, no ``multi_set``."""

    def __init__(self, client: StoreClient):
        self._client = client

    def set(self, key, value):
        self._client.set(key, value)

    def get(self, key):
        return self._client.get(key)


@pytest.mark.parametrize("api", ["multi", "set_and_get_only"])
def test_several_roles_through_a_real_store(store, api):
    """Three agents (group ranks 0..2) with roles trainer(2), ps(1), trainer(2), each in a
    thread with its own store connection, as separate agents would be. Group rank 0 reads
    every role in one request and writes every assignment in one, as torch's agent does;
    a store without those requests gets one per key."""
    specs = {0: spec("trainer", 2), 1: spec("ps", 1), 2: spec("trainer", 2)}
    results: dict[int, list] = {}

    def agent(group_rank: int) -> None:
        client = StoreClient("127.0.0.1", store.port, timeout=10)
        try:
            results[group_rank] = assign_worker_ranks(
                client if api == "multi" else _SetAndGetOnly(client), group_rank, 3, specs[group_rank],
                identical=False, timeout=10)
        finally:
            client.close()

    threads = [threading.Thread(target=agent, args=(i,)) for i in (2, 1, 0)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    ranks = {g: [(w.global_rank, w.role_rank, w.world_size, w.role_world_size) for w in ws]
             for g, ws in results.items()}
    assert ranks == {
        0: [(0, 0, 5, 4), (1, 1, 5, 4)],   # trainer: role ranks 0,1 of 4
        1: [(2, 0, 5, 1)],                 # ps: role rank 0 of 1
        2: [(3, 2, 5, 4), (4, 3, 5, 4)],   # trainer: role ranks 2,3 of 4
    }
    served = store.served()
    if api == "multi":
        assert served.get("MULTI_GET") == 4 and served.get("MULTI_SET") == 1, served  # rank 0's, and one each
        assert "GET" not in served, served
    else:
        assert served.get("GET") == 6 and "MULTI_SET" not in served, served  # 3 roles, 3 assignments

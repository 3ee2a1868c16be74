"""A join starts each step from the state a compare-and-set answered with: the state it
wrote where the write landed, the state another node wrote where it did not. At 128 nodes
a join takes three tries at the median and up to eighteen, each on a state of 11 KB; a
read after each answer was a round trip that told the joiner nothing new."""

from __future__ import annotations

from typing import Any

from harness.rendezvous import RendezvousParameters
from harness.rendezvous._c10d import C10dRendezvousHandler
from harness.rendezvous._store import StoreClient, StoreServer


class CountingClient:
    """The handler's store client, its state reads counted; ``before_cas`` runs before the
    first compare-and-set (another node's write then lands first)."""

    def __init__(self, client: Any, state_key: str):
        self._client = client
        self._state_key = state_key
        self.state_reads = 0
        self.cas_answers: list[bytes] = []
        self.before_cas: Any = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def peek_many(self, keys: list[str]) -> list[bytes]:
        self.state_reads += keys.count(self._state_key)
        return self._client.peek_many(keys)

    def multi_get(self, keys: list[str], timeout: Any = None) -> list[bytes]:
        self.state_reads += keys.count(self._state_key)
        return self._client.multi_get(keys, timeout)

    def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        if self.before_cas is not None:
            hook, self.before_cas = self.before_cas, None
            hook()
        answer = self._client.compare_set(key, expected, desired)
        self.cas_answers.append(answer)
        return answer


def _handler(port: int, run_id: str, nodes: int) -> Any:
    """The c10d handler itself (``get_rendezvous_handler`` gives one node a solo handler):
    with ``max_nodes`` of one, a join completes its round."""
    return C10dRendezvousHandler(RendezvousParameters(
        "c10d", f"127.0.0.1:{port}", run_id, nodes, nodes, is_host=False, last_call_timeout=0.1))


def _counted(handler: Any) -> CountingClient:
    handler._start()
    counting = CountingClient(handler._store.client, handler._keys.state)
    handler._store._client = counting
    return counting


def test_a_landed_join_is_not_read_back():
    server = StoreServer("", 0).start()
    handler = _handler(server.port, "landed", 1)
    try:
        counting = _counted(handler)
        info = handler.next_rendezvous()
        assert info.world_size == 1
        # one read to join; the join completes the round and the answer says so
        assert counting.state_reads == 1 and len(counting.cas_answers) == 1
    finally:
        handler.shutdown()
        server.stop()


def test_a_join_that_lost_its_compare_and_set_goes_on_from_the_answer():
    server = StoreServer("", 0).start()
    handler = _handler(server.port, "lost", 1)
    other = StoreClient("127.0.0.1", server.port, timeout=5)
    try:
        counting = _counted(handler)
        state_key = handler._keys.state

        def another_node_writes_first() -> None:
            raw = other.peek_many([state_key])[0]
            assert other.compare_set(state_key, raw, raw + b" ") == raw + b" "  # other bytes, same state

        counting.before_cas = another_node_writes_first
        info = handler.next_rendezvous()
        assert info.world_size == 1
        lost, landed = counting.cas_answers
        assert lost.endswith(b" ") and not landed.endswith(b" ")
        # the retry wrote over the other node's state as the answer gave it, and the landed
        # write completed the round: the state was read once, before the first try
        assert counting.state_reads == 1
    finally:
        other.close()
        handler.shutdown()
        server.stop()

"""Rendezvous parameters, the backend registry and static endpoints: ours beside torch's."""

from __future__ import annotations

import pytest

from harness.rendezvous import (
    RendezvousHandlerRegistry,
    RendezvousParameters,
    get_rendezvous_handler,
)


def _theirs():
    from torch.distributed.elastic.rendezvous import RendezvousParameters as Params
    from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler as get

    return Params, get


def _outcome(call):
    try:
        return ("value", call())
    except Exception as e:  # compared by kind, below
        return ("raises", e)


@pytest.mark.parametrize("value", [True, False, 1, 0, 2, -1, "1", "0", "yes", "N", "T", "2", "maybe", None])
def test_get_as_bool_matches_torch(value):
    TorchParams, _ = _theirs()
    ours = _outcome(lambda: RendezvousParameters("x", "", "r", 1, 1, flag=value).get_as_bool("flag"))
    theirs = _outcome(lambda: TorchParams("x", "", "r", 1, 1, flag=value).get_as_bool("flag"))
    if theirs[0] == "raises":
        assert ours[0] == "raises" and isinstance(ours[1], type(theirs[1])), (ours, theirs)
    else:
        assert ours == theirs


def test_unknown_backend_raises_what_torch_raises():
    TorchParams, get = _theirs()
    with pytest.raises(ValueError) as theirs:
        get(TorchParams("nosuch", "", "r", 1, 1))
    with pytest.raises(type(theirs.value)):
        get_rendezvous_handler(RendezvousParameters("nosuch", "", "r", 1, 1))


def test_a_creator_for_another_backend_is_a_runtime_error_like_torch():
    registry = RendezvousHandlerRegistry()
    params = RendezvousParameters("static", "localhost:1234", "r", 1, 1, rank=0)
    registry.register("mine", lambda p: get_rendezvous_handler(params))
    with pytest.raises(RuntimeError, match="static"):
        registry.create_handler(RendezvousParameters("mine", "localhost:1234", "r", 1, 1, rank=0))


@pytest.mark.parametrize("endpoint", ["", "   ", "localhost", "[::1", "[::1]x", "[::1]:port",
                                      "host:notaport", "host:70000", "localhost:29512",
                                      "[::1]:29512"])
def test_static_endpoints_accepted_and_refused_like_torch(endpoint):
    TorchParams, get = _theirs()
    theirs = _outcome(lambda: get(TorchParams("static", endpoint, "r", 1, 1, rank=0)))
    ours = _outcome(lambda: get_rendezvous_handler(
        RendezvousParameters("static", endpoint, "r", 1, 1, rank=0)))
    assert ours[0] == theirs[0], (endpoint, ours, theirs)
    if ours[0] == "raises":
        assert isinstance(ours[1], ValueError) and "\n" not in str(ours[1])
    else:
        ours[1].shutdown()


def test_single_node_static_returns_a_usable_store():
    handler = get_rendezvous_handler(RendezvousParameters("static", "localhost:0", "r", 1, 1, rank=0))
    try:
        info = handler.next_rendezvous()
        info.store.set("k", b"v")
        assert info.store.get("k") == b"v"
        assert info.bootstrap_store_info.use_agent_store
        again = handler.next_rendezvous()  # a new round: a new, empty store
        assert not again.store.check(["k"])
    finally:
        handler.shutdown()


@pytest.mark.parametrize("backend,nnodes", [("c10d", 1), ("static", 1), ("c10d", 2), ("etcd", 2)])
def test_malformed_endpoint_is_a_value_error_for_every_backend(backend, nnodes):
    with pytest.raises(ValueError, match="notaport:xyz"):
        get_rendezvous_handler(RendezvousParameters(backend, "notaport:xyz", "r", 1, nnodes, rank=0))


@pytest.mark.parametrize("backend, endpoint", [("static", "localhost:0"), ("c10d", "localhost:0")])
def test_single_node_handler_counts_the_jobs_restarts(backend, endpoint):
    """The single-node rendezvous counts restarts as the multi-node one: a charged round's
    successor carries one more, however many charges; an uncharged re-rendezvous none."""
    handler = get_rendezvous_handler(RendezvousParameters(backend, endpoint, "r", 1, 1, rank=0))
    try:
        assert handler.next_rendezvous().restart_count == 0
        handler.charge_restart()
        handler.charge_restart()  # the same failure, reported twice
        assert handler.next_rendezvous().restart_count == 1
        assert handler.next_rendezvous().restart_count == 1  # re-formed, nothing failed
        handler.charge_restart()
        assert handler.next_rendezvous().restart_count == 2
    finally:
        handler.shutdown()

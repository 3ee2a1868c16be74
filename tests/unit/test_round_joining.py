"""A join takes in every node that asked to join the forming round (``_round.RoundMachine``,
its joining list: ``_state.parse_joining``), on a fake clock."""

from __future__ import annotations

from harness.rendezvous._round import RoundMachine, RoundRules
from harness.rendezvous._state import RendezvousState, joining_line, parse_joining
from harness.timer import FakeClock


def _meta(node: str) -> dict:
    return {"name": node, "addr": "h", "live": f"h:{len(node)}"}


def _asked(*nodes: str, owed: int = 0) -> dict:
    return parse_joining(b"".join(joining_line(n, _meta(n), owed) for n in nodes))


def _machine(node: str, rules: RoundRules) -> RoundMachine:
    machine = RoundMachine(node, rules, FakeClock())
    machine.begin()
    return machine


def test_one_write_takes_in_every_node_that_asked_in_the_order_they_asked():
    rules = RoundRules(min_nodes=2, max_nodes=8, first_round_nodes=4)
    step = _machine("c", rules).step(RendezvousState(run_id="j"), set(), _meta("c"), _asked("a", "b", "c", "d"))
    assert step.kind == "write" and step.state is not None
    assert step.state.participants == ["c", "a", "b", "d"]
    assert set(step.state.nodes) == {"a", "b", "c", "d"} and step.state.nodes["a"] == _meta("a")
    assert not step.state.complete  # the round completes in a write of its own, as before


def test_a_node_taken_in_by_another_writes_nothing_to_join():
    rules = RoundRules(min_nodes=2, max_nodes=8, first_round_nodes=3, last_call_timeout=30)
    first = _machine("a", rules).step(RendezvousState(run_id="j"), set(), _meta("a"), _asked("a", "b"))
    assert first.state is not None
    step = _machine("b", rules).step(first.state, set(), _meta("b"), _asked("a", "b"))
    assert step.kind == "wait"  # b is in: it waits for the third, as a node that joined itself


def test_the_dead_and_those_already_in_are_not_taken_in_again():
    rules = RoundRules(min_nodes=1, max_nodes=8)
    state = RendezvousState(run_id="j", participants=["a"], nodes={"a": _meta("a")})
    step = _machine("c", rules).step(state, {"b"}, _meta("c"), _asked("a", "b", "c", "d"))
    assert step.state is not None and step.state.participants == ["a", "c", "d"]


def test_no_more_than_max_nodes_are_taken_in_and_the_writer_first():
    rules = RoundRules(min_nodes=1, max_nodes=3)
    state = RendezvousState(run_id="j", participants=["a"], nodes={"a": _meta("a")})
    step = _machine("z", rules).step(state, set(), _meta("z"), _asked("b", "c", "d", "z"))
    assert step.state is not None
    assert step.state.participants == ["a", "z", "b"] and step.state.complete  # full: complete
    assert "c" not in step.state.nodes and "d" not in step.state.nodes


def test_a_node_taken_in_raises_the_restart_count_as_its_own_join_would_have():
    rules = RoundRules(min_nodes=1, max_nodes=8)
    step = _machine("a", rules).step(RendezvousState(run_id="j", restarts=1), set(), _meta("a"),
                                     _asked("b", owed=3))
    assert step.state is not None and step.state.restarts == 3


def test_a_node_taken_in_leaves_the_waiting_list():
    rules = RoundRules(min_nodes=1, max_nodes=8)
    state = RendezvousState(run_id="j", round=2, waiting=["b"], expected=["a"], nodes={"b": _meta("b")})
    step = _machine("a", rules).step(state, set(), _meta("a"), _asked("b"))
    assert step.state is not None and step.state.waiting == [] and step.state.participants == ["a", "b"]


def test_the_joining_list_keeps_each_nodes_last_line_and_skips_what_is_not_ours():
    raw = (joining_line("a", _meta("a"), 0) + b"garbage\n" + b'{"id": 7, "meta": {}, "owed": 0}\n'
           + b'{"id": "x", "meta": "no", "owed": 0}\n' + b'{"id": "y", "meta": {}, "owed": -1}\n'
           + joining_line("b", _meta("b"), 1) + joining_line("a", {**_meta("a"), "port": 29500}, 2))
    asked = parse_joining(raw)
    assert list(asked) == ["a", "b"]
    assert asked["a"] == ({**_meta("a"), "port": 29500}, 2) and asked["b"] == (_meta("b"), 1)
    assert parse_joining(b"") == {} and parse_joining(b"\xff\xfe\n") == {}

"""``find_hang``: a node still going ``bound`` seconds after another node's workers all
succeeded, or a worker alive ``bound`` seconds after a worker of its round exited 0. The
job's wait asks at every node's exit, so the check is linear in the nodes; these tests pin
its answers against the plain definition (every node against every other), on hand-made
and random timelines."""

from __future__ import annotations

import json
import random
from typing import Any

from harness.sim.truth import hangs
from harness.sim.truth.timeline import Timeline

BOUND = 5.0


def _timeline(tmp_path, events, name="events.jsonl") -> Timeline:
    path = tmp_path / name
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    return Timeline(str(path))


def _success(node: int, mono: float) -> dict[str, Any]:
    return {"kind": "state", "node": node, "state": "SUCCEEDED", "mono": mono, "round": 0}


def _by_definition(timeline: Timeline, running: list[int], now: float, bound: float,
                   alive: dict[int, list[int]] | None) -> hangs.Hang | None:
    """The definition, node by node against every other: quadratic, and the spec."""
    succeeded: dict[Any, dict[str, Any]] = {}
    for event in timeline.events("state"):
        if event.get("state") == "SUCCEEDED":
            succeeded.setdefault(event["node"], event)
    for node in running:
        others = [e for n, e in succeeded.items() if n != node]
        if others:
            first = min(others, key=lambda e: e["mono"])
            if now - first["mono"] > bound:
                return hangs.Hang(node, f"node {first['node']}'s workers all", first["mono"],
                                  first.get("round"), now - first["mono"])
    if not alive:
        return None
    rounds = {e.get("worker_pid"): e.get("round") for e in timeline.events("worker_start")}
    done: dict[Any, dict[str, Any]] = {}
    for event in timeline.events("worker_exit"):
        if event.get("exitcode") == 0:
            done.setdefault(event.get("round", rounds.get(event.get("worker_pid"))), event)
    for node in running:
        for pid in alive.get(node, ()):
            ended = done.get(rounds.get(pid))
            if ended is not None and ended.get("worker_pid") != pid and now - ended["mono"] > bound:
                return hangs.Hang(node, f"rank {ended.get('rank')} (pid {ended.get('worker_pid')})",
                                  ended["mono"], ended.get("round"), now - ended["mono"])
    return None


def test_a_node_is_judged_by_another_nodes_success_never_its_own(tmp_path):
    timeline = _timeline(tmp_path, [_success(0, 1.0), _success(1, 5.0)])
    hang = hangs.find_hang(timeline, [1, 2], 1.0 + BOUND + 0.1, BOUND)
    assert hang is not None and hang.node == 1 and hang.finished == "node 0's workers all"
    # node 0 waits on node 1's success, the earliest of the others
    assert hangs.find_hang(timeline, [0], 1.0 + BOUND + 0.1, BOUND) is None
    hang = hangs.find_hang(timeline, [0], 5.0 + BOUND + 0.1, BOUND)
    assert hang is not None and hang.node == 0 and hang.finished == "node 1's workers all"


def test_live_workers_are_read_only_once_a_worker_of_the_round_exited_long_enough_ago(tmp_path):
    timeline = _timeline(tmp_path, [
        {"kind": "worker_start", "node": 0, "worker_pid": 10, "round": 0, "mono": 0.5},
        {"kind": "worker_start", "node": 1, "worker_pid": 11, "round": 0, "mono": 0.5},
        {"kind": "worker_exit", "node": 0, "worker_pid": 10, "round": 0, "rank": 0, "exitcode": 0, "mono": 2.0},
    ])
    asked: list[int] = []

    def alive(node: int) -> list[int]:
        asked.append(node)
        return [11] if node == 1 else []

    assert hangs.find_hang(timeline, [0, 1], 2.0 + BOUND - 0.1, BOUND, alive) is None
    assert asked == []  # nothing exited 0 long enough ago: no worker's /proc is read
    hang = hangs.find_hang(timeline, [0, 1], 2.0 + BOUND + 0.1, BOUND, alive)
    assert hang is not None and hang.node == 1 and hang.finished == "rank 0 (pid 10)"
    assert asked == [0, 1]


def test_the_answers_are_the_definitions_on_random_timelines(tmp_path):
    rng = random.Random(7)
    for case in range(200):
        nodes = rng.randint(1, 12)
        events: list[dict[str, Any]] = []
        alive: dict[int, list[int]] = {}
        for node in range(nodes):
            pid = 100 + node
            round_ = rng.randint(0, 2)
            events.append({"kind": "worker_start", "node": node, "worker_pid": pid, "round": round_,
                           "mono": rng.uniform(0, 5)})
            if rng.random() < 0.4:
                events.append({"kind": "worker_exit", "node": node, "worker_pid": pid, "round": round_,
                               "rank": node, "exitcode": rng.choice([0, 0, 1]), "mono": rng.uniform(5, 15)})
            else:
                alive[node] = [pid]
            if rng.random() < 0.3:
                events.append(_success(node, round(rng.uniform(5, 15), 1)))  # ties too
        events.sort(key=lambda e: e["mono"])
        timeline = _timeline(tmp_path, events, f"case{case}.jsonl")
        running = rng.sample(range(nodes), rng.randint(0, nodes))
        now = rng.uniform(5, 25)
        for with_alive in (None, alive):
            expected = _by_definition(timeline, running, now, BOUND, with_alive)
            found = hangs.find_hang(timeline, running, now, BOUND,
                                    None if with_alive is None else (lambda n, a=with_alive: a.get(n, [])))
            assert found == expected, (case, with_alive is not None)

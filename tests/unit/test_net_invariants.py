"""Network invariants on event lists: split brain, fencing, unhealed faults."""

from __future__ import annotations

from harness.sim.truth.net_invariants import (
    cut_off_from_store,
    split_brain,
    unfenced_workers,
    unhealed_message,
    unobserved,
)


def start(node, pid, round_, t):
    return {"kind": "worker_start", "node": node, "worker_pid": pid, "round": round_, "mono": t}


def step(node, pid, n, t, rank=0):
    return {"kind": "step", "node": node, "pid": pid, "step": n, "rank": rank, "mono": t}


def exit_(node, pid, t):
    return {"kind": "worker_exit", "node": node, "worker_pid": pid, "mono": t}


def cut(node, t, peers="store"):
    return {"kind": "fault", "fault": "partition", "target_node": node, "peers": peers, "mono": t,
            "node": "harness"}


def heal(node, t):
    return {"kind": "heal", "target_node": node, "mono": t, "node": "harness"}


def test_an_old_round_worker_stepping_after_the_new_round_trains_is_split_brain():
    events = [start(0, 10, 0, 0.0), start(1, 11, 0, 0.0), step(0, 10, 1, 1.0), step(1, 11, 1, 1.0),
              start(0, 20, 1, 2.0), step(0, 20, 2, 3.0),
              step(1, 11, 2, 3.5, rank=1)]  # node 1 never learned of round 1
    [problem] = split_brain(events)
    assert "rank 1 on node 1 (round 0) made step 2 0.500s after round 1 had begun" in problem


def test_rounds_that_follow_each_other_are_not_split_brain():
    events = [start(0, 10, 0, 0.0), step(0, 10, 1, 1.0), exit_(0, 10, 1.5),
              start(0, 20, 1, 2.0), step(0, 20, 2, 3.0)]
    assert split_brain(events) == []


def test_a_node_that_lost_the_store_must_stop_its_workers_within_the_bound():
    events = [start(1, 11, 0, 0.0), cut(1, 1.0), step(1, 11, 5, 4.0), {"kind": "state", "mono": 9.0}]
    [problem] = unfenced_workers(events, bound=2.0)
    assert "node 1 lost the store but its worker pid 11 exited never" in problem
    fenced = [start(1, 11, 0, 0.0), cut(1, 1.0), exit_(1, 11, 1.8), {"kind": "state", "mono": 9.0}]
    assert unfenced_workers(fenced, bound=2.0) == []


def test_no_fencing_is_owed_for_a_peer_partition_or_one_healed_in_time():
    peer = [start(1, 11, 0, 0.0), cut(1, 1.0, peers=[0]), {"kind": "state", "mono": 9.0}]
    assert unfenced_workers(peer, bound=2.0) == []
    healed = [start(1, 11, 0, 0.0), cut(1, 1.0), heal(1, 1.5), {"kind": "state", "mono": 9.0}]
    assert unfenced_workers(healed, bound=2.0) == []
    slow_healed = [start(1, 11, 0, 0.0), cut(1, 1.0), {**heal(1, 1.5), "healed": ["slow_node"]},
                   {"kind": "state", "mono": 9.0}]  # a node's straggling ended: its partition did not
    assert len(unfenced_workers(slow_healed, bound=2.0)) == 1


def test_unhealed_faults_are_named():
    assert unhealed_message({}) is None
    assert unhealed_message({1: ["partition"], 0: ["packet_loss", "bandwidth"]}) == (
        "network faults still in place when the job ended (heal them in the test, or expect "
        "their effect): node 0: bandwidth, packet_loss; node 1: partition")


def test_a_node_named_by_its_label_is_still_the_cut_off_one():
    """Agents may name their node by its label; the harness's node_start maps index -> label."""
    events = [{"kind": "node_start", "node": "harness", "target_node": 1, "label": "n1", "mono": 0.0},
              start("n1", 11, 0, 0.0), cut(1, 1.0), {"kind": "state", "mono": 9.0}]
    [problem] = unfenced_workers(events, bound=2.0)
    assert "worker pid 11 exited never" in problem


def test_a_node_that_fenced_just_after_its_heal_was_stopping_its_workers_until_then():
    """flapping_link heals as soon as the world shrinks: the survivor's new round starts a
    moment after the heal, while the cut-off node, whose lease ran out during the cut, is
    fencing (stopping its workers). Its workers are the fencing's until its fenced event."""
    fenced = {"kind": "fenced", "node": 1, "mono": 10.3}
    assert cut_off_from_store([cut(1, 6.0, "all"), heal(1, 10.13), fenced]) == {
        1: [(6.0, 10.3)], "1": [(6.0, 10.3)]}
    # a node that never fenced (healed before its lease ran out) was cut off until the heal
    assert cut_off_from_store([cut(1, 6.0, "all"), heal(1, 6.5)])[1] == [(6.0, 6.5)]
    # a fence much later belongs to another story
    late = {"kind": "fenced", "node": 1, "mono": 30.0}
    assert cut_off_from_store([cut(1, 6.0, "all"), heal(1, 6.5), late])[1] == [(6.0, 6.5)]


def unreachable(node, t):
    return {"kind": "fault", "fault": "host_unreachable", "target_node": node, "seconds": 3, "mono": t,
            "node": "harness"}


def reachable(node, t, connection):
    return {"kind": "host_reachable", "target_node": node, "connection": connection, "mono": t, "node": "harness"}


def test_an_unreachable_host_cuts_its_node_from_the_store_until_it_answers_on_the_same_connection():
    """The store rides the lost connection: a cut, ended by ``host_reachable`` "kept"; the
    node must fence within the bound like a partitioned one. "reconnected" (or no answer)
    never ends it, and that node is ``unobserved``: no fencing is owed of it, its workers'
    ends never reached us."""
    kept = [start(1, 11, 0, 0.0), unreachable(1, 1.0), exit_(1, 11, 1.8), reachable(1, 5.0, "kept")]
    assert cut_off_from_store(kept)[1] == [(1.0, 5.0)] and unobserved(kept) == set()
    assert unfenced_workers(kept, bound=2.0) == []
    unfenced = [start(1, 11, 0, 0.0), unreachable(1, 1.0), step(1, 11, 9, 4.5), reachable(1, 5.0, "kept")]
    assert len(unfenced_workers(unfenced, bound=2.0)) == 1
    lost = [start(1, 11, 0, 0.0), unreachable(1, 1.0), reachable(1, 25.0, "reconnected")]
    assert cut_off_from_store(lost)[1] == [(1.0, float("inf"))]
    assert {1, "1"} <= unobserved(lost) and unfenced_workers(lost, bound=2.0) == []
    never = [start(1, 11, 0, 0.0), unreachable(1, 1.0), {"kind": "state", "mono": 9.0}]
    assert {1, "1"} <= unobserved(never)
    partitioned = [start(1, 11, 0, 0.0), cut(1, 1.0), {"kind": "state", "mono": 9.0}]
    assert unobserved(partitioned) == set()  # a partition's node is still seen

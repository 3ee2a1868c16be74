"""What a fault cost the training, and the job's goodput, on hand-made timelines.

The events are what agents and workers write (``worker_start`` with ``worker_pid``/``round``,
``step`` with ``pid``), with ``mono`` times chosen so every figure has one right answer.
"""

from __future__ import annotations

import pytest

from harness.sim.truth.training import LOST_CATEGORIES, annotate_steps, fault_cost, goodput, worker_rounds


def start(t, pid, rnd, attempt=0, rank=0):
    return {"kind": "worker_start", "mono": t, "worker_pid": pid, "round": rnd, "restart_count": attempt,
            "rank": rank, "pid": 1}


def step(t, pid, n, rank=0):
    return {"kind": "step", "mono": t, "pid": pid, "step": n, "rank": rank}


# round 0: two workers (pids 10, 11) start at 0.0/0.1, steps 0..5 each second from 1.0;
# the fault at 6.5 (after step 5 at 6.0); the agent reacts at 6.7; round 1's workers
# (20, 21) start at 7.0 and 7.4; they resume from the checkpoint at step 3, first step at 8.0
EVENTS = [
    start(0.0, 10, 0), start(0.1, 11, 0, rank=1),
    *[step(1.0 + i, 10, i) for i in range(6)],
    {"kind": "fault", "mono": 6.5, "fault": "worker_crash"},
    {"kind": "state", "mono": 6.7, "state": "UNHEALTHY"},
    start(7.0, 20, 1, attempt=1), start(7.4, 21, 1, attempt=1, rank=1),
    step(8.0, 20, 3), step(9.0, 20, 4), step(10.0, 20, 5), step(11.0, 20, 6),
    {"kind": "result", "mono": 12.0},
]


def test_the_four_costs_add_up_to_the_resume_latency():
    cost = fault_cost(EVENTS[8], EVENTS, detection_latency=0.2)
    assert cost.resume_latency == pytest.approx(1.5)  # 6.5 -> 8.0
    assert cost.lost == pytest.approx({"detection": 0.2, "recovery": 0.7, "startup": 0.6, "wasted": 2.5})
    assert set(cost.lost) == set(LOST_CATEGORIES)
    assert sum(cost.lost[k] for k in ("detection", "recovery", "startup")) == pytest.approx(cost.resume_latency)


def test_an_old_rounds_late_step_is_not_a_resume():
    late = [*EVENTS[:9], step(6.6, 10, 6), *EVENTS[9:]]  # the old worker still reports after the fault
    assert fault_cost(late[8], late, 0.2).resume_latency == pytest.approx(1.5)


def test_no_resume_keeps_every_key():
    cut = EVENTS[:10]
    cost = fault_cost(cut[8], cut, detection_latency=0.2)
    assert cost.resume_latency is None
    assert cost.lost == {"detection": 0.2, "recovery": 0.0, "startup": 0.0, "wasted": 0.0}


def test_nothing_redone_wastes_nothing():
    # resuming at step 6 (nothing lost: the checkpoint was taken at the last step)
    events = [e for e in EVENTS if not (e["kind"] == "step" and e["pid"] == 20 and e["step"] < 6)]
    assert fault_cost(EVENTS[8], events, 0.2).lost["wasted"] == 0.0


def test_steps_say_their_round_and_attempt():
    steps = [dict(e) for e in EVENTS if e["kind"] == "step"]
    annotate_steps(steps, worker_rounds(EVENTS))
    assert {(s["pid"], s["round"], s["attempt"]) for s in steps} == {(10, 0, 0), (20, 1, 1)}


def test_goodput_is_wall_minus_what_can_be_attributed():
    checkpoint = {"kind": "checkpoint", "mono": 4.3, "seconds": 0.3, "step": 3, "rank": 0, "restart_count": 0}
    events = sorted([*EVENTS, checkpoint], key=lambda e: e["mono"])
    cost = fault_cost(EVENTS[8], EVENTS, detection_latency=0.2)
    g = goodput(events, [cost], [6.5])
    assert g.wall_s == pytest.approx(12.0)
    # the checkpoint (4.0..4.3) lies inside the wasted work (4.0..6.5): counted once, as checkpoint
    assert g.badput == pytest.approx({"initial_startup": 1.0, "detection": 0.2, "recovery": 0.7, "startup": 0.6,
                                      "wasted": 2.2, "checkpoint": 0.3, "tail": 1.0})
    assert g.productive_s == pytest.approx(6.0)
    assert g.ratio == pytest.approx(0.5)
    assert g.faults == 1 and g.restart_cost_s == pytest.approx(1.5) and g.checkpoint_cost_s == pytest.approx(0.3)
    assert g.summary() == ("goodput 0.50; lost 3.70 s to 1 fault: detection 0.20 s, recovery 0.70 s, "
                           "startup 0.60 s, wasted 2.20 s")


def test_a_fault_during_the_initial_start_up_is_not_charged_twice():
    events = [start(0.0, 10, 0), {"kind": "fault", "mono": 0.5}, {"kind": "state", "mono": 0.6, "state": "FAILED"},
              start(1.0, 20, 1, attempt=1), *[step(2.0 + i, 20, i) for i in range(3)], {"kind": "result", "mono": 5.0}]
    cost = fault_cost(events[1], events, detection_latency=0.1)
    assert cost.resume_latency == pytest.approx(1.5)
    g = goodput(events, [cost], [0.5])
    assert g.badput["initial_startup"] == pytest.approx(0.5)  # 0.0..0.5; the fault owns 0.5..2.0
    assert sum(g.badput.values()) + g.productive_s == pytest.approx(g.wall_s)
    assert g.productive_s == pytest.approx(2.0)


def test_a_fault_free_job():
    events = [start(0.0, 10, 0), *[step(1.0 + i, 10, i) for i in range(4)], {"kind": "result", "mono": 5.5}]
    g = goodput(events, [])
    assert g.ratio == pytest.approx(3.0 / 5.5) and g.faults == 0 and g.restart_cost_s is None
    assert g.summary() == "goodput 0.55"


def test_what_the_judges_add_after_the_job_is_not_its_time():
    """The twin runs after the job, and its verdict is the timeline's last event: the seconds
    the twin took are neither the job's wall time nor its tail."""
    events = [start(0.0, 10, 0), *[step(1.0 + i, 10, i) for i in range(4)], {"kind": "result", "mono": 5.5},
              {"kind": "storage_unhealed", "mono": 5.6}, {"kind": "golden", "mono": 13.5}]
    g = goodput(events, [])
    assert g.wall_s == pytest.approx(5.5) and g.badput["tail"] == pytest.approx(1.5)

"""A stall (``harness.sim.truth.hangs``): no event at all for max(50 steps, a floor), the
floor longer where the agents run the watchdog (its timers must run out first), and the
one clause that names what the job lacks. Hand-made timelines."""

from __future__ import annotations

import json

from harness.sim.truth import hangs
from harness.sim.truth.timeline import Timeline


def _timeline(tmp_path, events) -> Timeline:
    path = tmp_path / "events.jsonl"
    path.write_text("".join(json.dumps({"node": 0, **e}) + "\n" for e in events))
    return Timeline(str(path))


def test_the_bound_is_fifty_steps_or_the_floor_longer_with_a_watchdog(tmp_path):
    steps = [{"kind": "step", "step": s, "pid": 7, "mono": 10.0 + 0.1 * s} for s in range(5)]
    timeline = _timeline(tmp_path, steps)
    last = 10.4
    assert abs((hangs.step_time(timeline) or 0) - 0.1) < 1e-9
    assert hangs.find_stall(timeline, last + hangs.STALL_FLOOR_S - 0.1) is None
    stall = hangs.find_stall(timeline, last + hangs.STALL_FLOOR_S + 0.1)
    assert stall is not None and stall.bound == hangs.STALL_FLOOR_S
    assert hangs.find_stall(timeline, last + hangs.STALL_FLOOR_S + 0.1, watchdog=True) is None
    assert hangs.find_stall(timeline, last + hangs.STALL_WATCHDOG_FLOOR_S + 0.1, watchdog=True) is not None
    assert hangs.find_stall(timeline, last + hangs.STALL_FLOOR_S + 0.1, waiting_until=last + 30) is None  # a heal due


def test_no_step_no_stall_and_one_step_is_timed_from_its_workers_start(tmp_path):
    assert hangs.find_stall(_timeline(tmp_path, [{"kind": "state", "state": "HEALTHY", "mono": 1.0}]), 1e6) is None
    one = _timeline(tmp_path, [{"kind": "worker_start", "worker_pid": 7, "mono": 1.0},
                               {"kind": "step", "step": 0, "pid": 7, "mono": 3.0}])
    assert hangs.step_time(one) == 2.0
    assert hangs.stall_bound(2.0) == 100.0  # 50 steps of 2 s


def test_the_cause_names_what_the_job_lacks(tmp_path):
    hung = _timeline(tmp_path, [{"kind": "fault", "fault": "hang_worker", "target_node": 0, "local_rank": 1,
                                 "mono": 1.0}])
    assert "is reaped by nothing: run each step under a timer" in hangs.stall_cause(hung, watchdog=False)
    assert "held no timer when it was stopped" in hangs.stall_cause(hung, watchdog=True)
    cut = _timeline(tmp_path, [{"kind": "fault", "fault": "partition", "target_node": 1, "mono": 1.0}])
    assert "gloo's timeout" in hangs.stall_cause(cut, watchdog=False)


def test_a_node_whose_agent_runs_no_worker_is_named_first(tmp_path):
    """flapping_node: node 2 was removed as it joined a round; its agent ran no worker and its
    peer waited in init_process_group. The cause is that agent, not a stuck worker."""
    removed = _timeline(tmp_path, [{"kind": "fault", "fault": "remove_node", "target_node": 2, "mono": 1.0}])
    assert hangs.stall_cause(removed, watchdog=False, idle=[2]) == (
        "the agent of node 2 runs no worker and has not moved on (its log ends below), and its peers wait "
        "for it, after remove_node (node 2)")
    assert "nothing in it reaps a stuck worker" in hangs.stall_cause(removed, watchdog=False)


def test_the_watchdog_is_read_as_the_agent_reads_it(monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_ENABLE_FILE_TIMER", raising=False)
    assert not hangs.runs_watchdog({})
    assert hangs.runs_watchdog({"TORCHELASTIC_ENABLE_FILE_TIMER": "1"})
    monkeypatch.setenv("TORCHELASTIC_ENABLE_FILE_TIMER", "1")
    assert hangs.runs_watchdog({}) and not hangs.runs_watchdog({"TORCHELASTIC_ENABLE_FILE_TIMER": "0"})

"""Step rate per rank, and the straggler named by its CPU wait, on hand-made step events
(``step`` events with ``pid``, ``mono`` and the ``cpu_wait`` report_step sends)."""

from __future__ import annotations

import json
import re
import statistics
from types import SimpleNamespace

import pytest

from harness.sim.truth.timeline import Timeline
from harness.sim.truth.training import rank_rates, rates_report, rates_summary, slow_windows, step_cpu, straggler
from pytest_elastic import _scenarios


def step(t, rank, pid, wait=None, run=None):
    event = {"kind": "step", "mono": t, "rank": rank, "pid": pid, "step": 0}
    if wait is not None:
        event["cpu_wait"] = wait
    if run is not None:
        event["cpu_run"] = run
    return event


def lockstep(waits: dict[int, float], steps: int = 11, period: float = 0.5) -> list[dict]:
    """Ranks stepping together every ``period`` s, each waiting ``waits[rank]`` of it for a CPU."""
    return [step(i * period, rank, 100 + rank, wait=i * period * share)
            for i in range(steps) for rank, share in waits.items()]


def test_rates_and_cpu_wait_per_rank():
    rates = rank_rates(lockstep({0: 0.05, 1: 0.8}))
    assert rates[0].rate == pytest.approx(2.0) and rates[1].rate == pytest.approx(2.0)  # lockstep
    assert rates[0].cpu_wait == pytest.approx(0.05) and rates[1].cpu_wait == pytest.approx(0.8)
    assert straggler(rates) == 1
    assert rates_summary(rates) == ("step rate per rank: rank 0 2.0 steps/s, cpu wait 5%; rank 1 2.0 steps/s, "
                                    "cpu wait 80% — rank 1 waited most for a CPU: the straggler")


def test_no_straggler_when_every_rank_waits_alike_or_little():
    assert straggler(rank_rates(lockstep({0: 0.45, 1: 0.55, 2: 0.5}))) is None  # a loaded machine
    assert straggler(rank_rates(lockstep({0: 0.0, 1: 0.2}))) is None  # below a quarter


def test_attempts_add_up_and_a_window_selects_steps():
    # rank 0: one worker (pid 1) 4 steps over 3 s, restarted as pid 2: 3 steps over 1 s
    events = [step(t, 0, 1) for t in (0.0, 1.0, 2.0, 3.0)] + [step(t, 0, 2) for t in (10.0, 10.5, 11.0)]
    [rate] = rank_rates(events).values()
    assert (rate.steps, rate.seconds, rate.cpu_wait) == (5, 4.0, None)  # no cpu_wait reported
    assert rank_rates(events, since=9.0)[0].rate == pytest.approx(2.0)
    assert rank_rates(events, until=1.5)[0].steps == 1
    assert rank_rates([step(0.0, 3, 7)]) == {}  # one step is no rate
    assert rates_summary({}) == ""


def test_the_report_names_the_straggler_while_its_node_was_slowed():
    # rank 1 waits for a CPU only between 2.0 and 4.0 s, while node 1 was slowed: over the
    # whole 10 s that is diluted below the straggler's margin, over the window it is not
    events = [step(t / 10, rank, 100 + rank, wait=(min(max(t / 10, 2.0), 4.0) - 2.0) * 0.9 if rank else 0.0)
              for t in range(0, 101, 5) for rank in (0, 1)]
    fault = {"kind": "fault", "fault": "slow_node", "target_node": 1, "cpu": 0.1, "mono": 2.0}
    heal = {"kind": "heal", "healed": ["slow_node"], "target_node": 1, "mono": 4.0}
    timeline = sorted([*events, fault, heal], key=lambda e: e["mono"])
    assert slow_windows(timeline) == [(fault, 2.0, 4.0)]
    whole, during = rates_report(timeline).splitlines()
    assert whole.startswith("step rate per rank: rank 0 2.0 steps/s") and "straggler" not in whole
    assert during == ("while node 1 was slowed to cpu=0.1: rank 0 2.0 steps/s, cpu wait 0%; rank 1 2.0 steps/s, "
                      "cpu wait 90% — rank 1 waited most for a CPU: the straggler")
    assert slow_windows([fault]) == [(fault, 2.0, None)]  # never healed: to the end


def test_the_resource_expect_keys_are_enforced(tmp_path):
    """[expect] straggler_node, min_slowdown and oom_kills, on a timeline: node 1 (rank 0)
    slowed from 2.0 s to 4.0 s, steps every 0.1 s before and 0.4 s during; one OOM kill."""
    events = [{"kind": "worker_start", "node": node, "rank": rank, "worker_pid": 10 + rank, "mono": 0.0}
              for node, rank in ((1, 0), (0, 1))]
    times = [t / 10 for t in range(21)] + [2.0 + 0.4 * i for i in range(1, 6)]
    events += [step(t, rank, 10 + rank, wait=max(0.0, t - 2.0) * 0.9 if rank == 0 else 0.0)
               for t in times for rank in (0, 1)]
    events += [{"kind": "fault", "fault": "slow_node", "target_node": 1, "cpu": 0.1, "mono": 2.0, "node": "harness"},
               {"kind": "heal", "healed": ["slow_node"], "target_node": 1, "mono": 4.0, "node": "harness"},
               {"kind": "worker_exit", "node": 0, "rank": 1, "worker_pid": 11, "exitcode": -9, "reason": "oom",
                "mono": 4.5}]
    path = tmp_path / "events.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in sorted(events, key=lambda e: e["mono"])))
    job = SimpleNamespace(timeline=Timeline(str(path)))
    result = SimpleNamespace(state=None)
    _scenarios._check_expectations({"straggler_node": 1, "min_slowdown": 3.5, "oom_kills": 1}, job, result, None,
                                   chaotic=False)
    for key, value, message in (("straggler_node", 0, "straggler node 1 (rank 0), expected 0"),
                                ("min_slowdown", 5.0, "step time grew 4.00x while node 1 was slowed, expected "
                                                      "at least 5.0x"),
                                ("oom_kills", 0, "1 worker(s) killed by the OOM killer, expected 0")):
        with pytest.raises(_scenarios.ScenarioFailure, match=re.escape(message)):
            _scenarios._check_expectations({key: value}, job, result, None, chaotic=False)


def test_the_slowdown_floor_scales_with_the_load_the_job_ran_under():
    """A quota slows only the time a worker would have run: with the ranks already waiting
    80 % of the time for a CPU (a load of 10 on 2 cores), a 1.5x floor becomes 1.1x."""
    quiet = rank_rates([step(t, 0, 1, wait=0.0) for t in (0.0, 1.0, 2.0)])
    loaded = rank_rates([step(0.0, 0, 1, wait=0.0), step(1.0, 0, 1, wait=0.8), step(2.0, 0, 1, wait=1.6),
                         step(0.0, 1, 2, wait=0.0), step(2.0, 1, 2, wait=0.2)])
    assert _scenarios.slowdown_floor(1.5, quiet) == (1.5, 0.0)
    floor, waited = _scenarios.slowdown_floor(1.5, loaded)
    assert waited == pytest.approx(0.8) and floor == pytest.approx(1.1)
    assert _scenarios.slowdown_floor(1.5, {}) == (1.5, 0.0)  # no cpu_wait reported: unscaled


def test_a_quota_below_what_the_ranks_ran_before_is_not_judged():
    """At a load of 10 on 2 cores both ranks ran on ~15 % of a CPU: a 10 % quota cannot make
    a straggler of either, so the straggler expectations are not judged (and say why)."""
    fault = {"fault": "slow_node", "target_node": 1, "cpu": 0.1}
    loaded = rank_rates([step(0.0, r, r, run=0.0) for r in (0, 1)] + [step(2.0, r, r, run=0.28) for r in (0, 1)])
    quiet = rank_rates([step(0.0, r, r, run=0.0) for r in (0, 1)] + [step(2.0, r, r, run=1.6) for r in (0, 1)])
    assert loaded[0].cpu_run == pytest.approx(0.14)
    why = _scenarios.quota_cannot_bite(fault, loaded)
    assert why is not None and "ran on at most 14% of a CPU" in why
    assert _scenarios.quota_cannot_bite(fault, quiet) is None
    assert _scenarios.quota_cannot_bite(fault, rank_rates([step(0.0, 0, 1), step(1.0, 0, 1)])) is None  # not reported


def test_a_steps_cpu_is_the_median_growth_of_cpu_run():
    """A first step's warm-up (DDP's first buckets) is not what a step costs."""
    events = [step(t, 1, 11, run=run) for t, run in ((0.0, 0.0), (0.1, 0.05), (0.2, 0.054), (0.3, 0.058),
                                                      (0.4, 0.062))]
    assert step_cpu(events, 1) == pytest.approx(0.004)
    assert step_cpu(events, 1, until=0.25) == pytest.approx(0.027)  # two steps: their mean is their median
    assert step_cpu(events, 0) is None  # no such rank
    assert step_cpu([step(0.0, 1, 11), step(0.1, 1, 11)], 1) is None  # no cpu_run reported


def test_a_quota_spent_in_bursts_slows_the_job_by_its_mean_step():
    """A 10 % quota on a rank whose step needs 4 ms of CPU: each 100 ms period it runs two
    steps at full speed and waits out the rest of the period in the third. Their median
    is the full-speed step (1x); the job's pace is their mean (3.3x)."""
    before = [0.01] * 10
    slowed = [0.01, 0.01, 0.08] * 5
    assert _scenarios.slowdown_of(before, slowed) == pytest.approx(0.1 / 3 / 0.01)
    assert statistics.median(slowed) / statistics.median(before) == 1.0  # what the median said


def test_the_quota_headroom_judges_whether_a_slowdown_can_be_asked():
    """The slowed node's steps took 4.3 ms of CPU; a 10 % quota gives 0.73 ms in a 7.3 ms
    step (5.9x: the quota must slow the job), 5 ms in a 50 ms one (0.86x: it cannot)."""
    fault = {"fault": "slow_node", "target_node": 1, "cpu": 0.1}
    quiet = _scenarios.quota_headroom(fault, [0.0043], [0.0073] * 5)
    loaded = _scenarios.quota_headroom(fault, [None, 0.0043], [0.05] * 5)
    assert quiet == pytest.approx(5.89, abs=0.01) and loaded == pytest.approx(0.86)
    assert _scenarios.quota_cannot_bite(fault, {}, quiet) is None
    why = _scenarios.quota_cannot_bite(fault, {}, loaded)
    assert why is not None and "took 0.86x the CPU the quota gives" in why
    assert _scenarios.quota_headroom(fault, [None], [0.05]) is None  # no cpu_run: the rates decide
    assert _scenarios.quota_headroom({"fault": "slow_node"}, [0.004], [0.05]) is None  # no quota
    # the floor never asks more than half way to what the quota forces
    assert _scenarios.slowdown_floor(1.5, {}, 1.6) == (pytest.approx(1.3), 0.0)
    assert _scenarios.slowdown_floor(1.5, {}, quiet) == (1.5, 0.0)


def _bursting_straggler(path, cpu_per_step: float) -> SimpleNamespace:
    """Node 1 (rank 1) slowed to cpu=0.1 from 1.0 s: steps every 10 ms before, each taking
    ``cpu_per_step`` of CPU, and during the window two fast steps and one that waits out
    the quota's period, again and again (3.3x the pace)."""
    events = [{"kind": "worker_start", "node": node, "rank": node, "worker_pid": 10 + node, "mono": 0.0}
              for node in (0, 1)]
    times = [i * 0.01 for i in range(101)]
    for gap in [0.01, 0.01, 0.08] * 6:
        times.append(times[-1] + gap)
    events += [step(t, rank, 10 + rank, wait=0.0, run=cpu_per_step * i) for i, t in enumerate(times)
               for rank in (0, 1)]
    events += [{"kind": "fault", "fault": "slow_node", "target_node": 1, "cpu": 0.1, "mono": 1.0, "node": "harness"},
               {"kind": "heal", "healed": ["slow_node"], "target_node": 1, "mono": times[-1], "node": "harness"}]
    path.write_text("".join(json.dumps(e) + "\n" for e in sorted(events, key=lambda e: e["mono"])))
    return SimpleNamespace(timeline=Timeline(str(path)))


def test_a_straggler_whose_quota_bursts_passes_its_min_slowdown(tmp_path):
    """The main job's straggler, as it ran: ``min_slowdown = 1.5`` holds (3.3x), where the
    median step (1.0x) went red. A floor is never more than half way to what the quota
    forces: steps of 4 ms of CPU under a quota of 1 ms a 10 ms step must go 4x slower, so
    ``min_slowdown = 4`` asks 2.5x; steps of 9 ms (9x) are held to the full 4x."""
    result = SimpleNamespace(state=None)
    needs_4x = _bursting_straggler(tmp_path / "a.jsonl", 0.004)
    _scenarios._check_expectations({"min_slowdown": 1.5}, needs_4x, result, None, chaotic=False)
    _scenarios._check_expectations({"min_slowdown": 4.0}, needs_4x, result, None, chaotic=False)
    needs_9x = _bursting_straggler(tmp_path / "b.jsonl", 0.009)
    with pytest.raises(_scenarios.ScenarioFailure,
                       match=re.escape("step time grew 3.33x while node 1 was slowed, expected at least 4.0x")):
        _scenarios._check_expectations({"min_slowdown": 4.0}, needs_9x, result, None, chaotic=False)

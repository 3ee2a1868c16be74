"""Step rate per rank, and the straggler named by its CPU wait, on hand-made step events
(``step`` events with ``pid``, ``mono`` and the ``cpu_wait`` report_step sends)."""

from __future__ import annotations

import pytest

from harness.sim.training import rank_rates, rates_summary, straggler


def step(t, rank, pid, wait=None):
    event = {"kind": "step", "mono": t, "rank": rank, "pid": pid, "step": 0}
    if wait is not None:
        event["cpu_wait"] = wait
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

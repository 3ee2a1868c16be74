"""``project_goodput``: the scale model checked against closed-form cases."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from harness.errors import ConfigError
from harness.sim.truth.projection import (
    FAILURE_RATES,
    effective_ratio,
    project_goodput,
    young_daly_interval,
)


def test_the_ratio_is_the_closed_form():
    # tau=600 s, C=60 s, R=120 s, M=10 h: 600/660 * (1 - (120 + 330)/36000)
    assert effective_ratio(600, 60, 120, 36000) == pytest.approx(600 / 660 * (1 - 450 / 36000), rel=1e-12)
    assert effective_ratio(600, 0, 0, math.inf) == 1.0
    assert effective_ratio(1e9, 60, 120, 36000) == 0.0  # an interval longer than the MTBF: no progress


def test_the_optimum_is_youngs_interval_when_checkpoints_are_cheap():
    c, m = 10.0, 1024 * 3600 / 1024  # 10 s checkpoints, one failure an hour
    p = project_goodput(nodes=1024, mtbf_node_hours=1024, restart_cost_s=30, checkpoint_cost_s=c,
                        checkpoint_interval_s=1800)
    assert p.mtbf_s == pytest.approx(m)
    young = math.sqrt(2 * c * m)
    assert p.optimal_interval_s == pytest.approx(young, rel=0.05)
    assert p.young_daly_s == pytest.approx(young, rel=0.05)
    assert p.optimal_interval_s == pytest.approx(p.young_daly_s, rel=0.05)
    # the optimum is a maximum: a little either side is worse, and so is the interval given
    for tau in (p.optimal_interval_s * 0.8, p.optimal_interval_s * 1.25, 1800):
        assert effective_ratio(tau, c, 30, m) < p.optimal_ratio
    assert p.ratio == pytest.approx(effective_ratio(1800, c, 30, m))


def test_more_nodes_less_goodput_and_shorter_intervals():
    small = project_goodput(nodes=64, restart_cost_s=2.6, checkpoint_cost_s=5, checkpoint_interval_s=600)
    big = project_goodput(nodes=16384, restart_cost_s=2.6, checkpoint_cost_s=5, checkpoint_interval_s=600)
    assert big.ratio < small.ratio and big.optimal_interval_s < small.optimal_interval_s
    assert small.mtbf_s / big.mtbf_s == pytest.approx(16384 / 64)


def test_published_rates_are_the_defaults():
    assert FAILURE_RATES["llama3"] == pytest.approx(54 * 24 * 16384 / 419 / 8)
    assert FAILURE_RATES["meta-rsc"] == pytest.approx(1024)
    p = project_goodput(nodes=2048, restart_cost_s=1, checkpoint_cost_s=1, checkpoint_interval_s=60)
    assert p.mtbf_s == pytest.approx(FAILURE_RATES["llama3"] * 3600 / 2048)
    assert "at 2048 nodes" in p.summary() and "Young/Daly" in p.summary()


def test_costs_come_from_a_goodput_and_explicit_ones_win():
    g = SimpleNamespace(restart_cost_s=4.0, checkpoint_cost_s=2.0, checkpoint_interval_s=30.0)
    p = project_goodput(g, nodes=8)
    assert (p.restart_cost_s, p.checkpoint_cost_s, p.checkpoint_interval_s) == (4.0, 2.0, 30.0)
    assert project_goodput(g, nodes=8, checkpoint_interval_s=90).checkpoint_interval_s == 90
    job = SimpleNamespace(goodput=lambda: g)
    assert project_goodput(job, nodes=8) == p


@pytest.mark.parametrize("kwargs, names", [
    ({"nodes": 0}, "nodes=0 must be an integer >= 1"),
    ({"nodes": 8, "mtbf_node_hours": "nope"}, "mtbf_node_hours='nope' must be hours or one of"),
    ({"nodes": 8, "mtbf_node_hours": -1}, "mtbf_node_hours=-1 must be > 0 hours"),
    ({"nodes": 8, "checkpoint_interval_s": 0}, "checkpoint_interval_s=0 must be > 0"),
])
def test_bad_input_names_the_argument(kwargs, names):
    args = {"restart_cost_s": 1, "checkpoint_cost_s": 1, "checkpoint_interval_s": 60, **kwargs}
    with pytest.raises(ConfigError, match=names.replace("(", r"\(")):
        project_goodput(**args)


def test_a_missing_cost_says_what_to_pass():
    with pytest.raises(ConfigError, match="restart_cost_s=None is needed: no job or Goodput was given; "
                                          "pass restart_cost_s="):
        project_goodput(nodes=8, checkpoint_cost_s=1, checkpoint_interval_s=60)
    assert young_daly_interval(100, 10) == 10  # C >= 2M: checkpoint at the MTBF

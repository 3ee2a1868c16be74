"""From one machine to a thousand, on paper: what a job's measured fault cost means at scale.

A job run here measures what one interruption costs it (detection + recovery + startup: the
time from the fault to the first training step of the new round) and what one checkpoint
costs. At scale interruptions are not rare events but a rate: with ``N`` nodes each failing
once per ``M_node`` hours, the job is interrupted every ``M = M_node / N`` hours. Each
interruption costs the restart ``R`` plus the work done since the last checkpoint (on
average half an interval, and half the checkpoint being written); each checkpoint costs
``C``. With checkpoints every ``tau`` seconds of training, the fraction of wall time that is
training (the *effective training time ratio*, first order in ``1/M``) is::

    ratio(tau) = tau / (tau + C) * (1 - (R + (tau + C) / 2) / M)

Writing checkpoints more often wastes less work per failure but pays ``C`` more often; the
interval that balances the two is Young's ``tau ~ sqrt(2 C M)`` (Daly's refinement adds terms
of order ``C/M``). ``project_goodput`` gives the ratio at the interval the job uses, the
interval that maximises it (found on the formula itself, and Young/Daly's closed form beside
it), and the ratio there.

The default failure rates are published ones, per node of 8 GPUs:

* ``llama3``: Llama 3 405B pre-training, 419 unplanned interruptions in 54 days on 16,384
  GPUs (The Llama 3 Herd of Models, 2024): 54 * 24 * 16384 / 419 / 8 ~ 6,336 node-hours.
* ``meta-rsc``: Meta's study of its research clusters (Kokolis et al., 2024), mean time to
  failure about 8 hours for a 1,024-GPU job: 8 * 1024 / 8 = 1,024 node-hours.

A simulated node here is one agent; read ``nodes`` as the real job's node count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from harness.errors import ConfigError

__all__ = ["FAILURE_RATES", "DEFAULT_FAILURE_RATE", "Projection", "project_goodput", "young_daly_interval"]

#: node MTBF in hours (a node = 8 GPUs), from the published figures in the module doc
FAILURE_RATES: dict[str, float] = {
    "llama3": 54 * 24 * 16384 / 419 / 8,
    "meta-rsc": 8 * 1024 / 8,
}
DEFAULT_FAILURE_RATE = "llama3"


@dataclass(frozen=True)
class Projection:
    """What a job's measured costs give at ``nodes`` nodes (all times in seconds)."""

    nodes: int
    mtbf_s: float                 # the whole job's mean time between interruptions
    restart_cost_s: float         # R: one interruption, fault -> training resumed
    checkpoint_cost_s: float      # C: one checkpoint
    checkpoint_interval_s: float  # tau: training time between checkpoints, as given or measured
    ratio: float                  # effective training time ratio at tau
    optimal_interval_s: float     # the tau that maximises the ratio
    optimal_ratio: float          # the ratio there
    young_daly_s: float           # Daly's closed form for the optimum (Young's sqrt(2CM), refined)

    def summary(self) -> str:
        return (f"at {self.nodes} nodes (MTBF {self.mtbf_s / 3600:.2f} h, restart {self.restart_cost_s:.2f} s, "
                f"checkpoint {self.checkpoint_cost_s:.2f} s): effective training time ratio "
                f"{self.ratio:.3f} with a checkpoint every {self.checkpoint_interval_s:.0f} s; "
                f"best {self.optimal_ratio:.3f} every {self.optimal_interval_s:.0f} s "
                f"(Young/Daly: {self.young_daly_s:.0f} s)")


def effective_ratio(tau: float, checkpoint_cost_s: float, restart_cost_s: float, mtbf_s: float) -> float:
    """The fraction of wall time spent training (module doc), never below 0."""
    lost_per_failure = restart_cost_s + (tau + checkpoint_cost_s) / 2
    return max(0.0, tau / (tau + checkpoint_cost_s) * (1 - lost_per_failure / mtbf_s))


def young_daly_interval(checkpoint_cost_s: float, mtbf_s: float) -> float:
    """Daly's optimum checkpoint interval (2006), Young's ``sqrt(2 C M)`` to first order."""
    c, m = checkpoint_cost_s, mtbf_s
    if c >= 2 * m:
        return m
    return math.sqrt(2 * c * m) * (1 + math.sqrt(c / (2 * m)) / 3 + c / (18 * m)) - c


def project_goodput(job_or_goodput: Any = None, *, nodes: int, mtbf_node_hours: float | str = DEFAULT_FAILURE_RATE,
                    checkpoint_interval_s: float | None = None, restart_cost_s: float | None = None,
                    checkpoint_cost_s: float | None = None) -> Projection:
    """Project a job's measured costs to ``nodes`` nodes.

    ``job_or_goodput``: a ``Job`` or its ``Goodput`` (or None when every cost is given): the
    restart cost is its mean lost time per fault (detection + recovery + startup), the
    checkpoint cost its mean ``checkpoint`` badput per checkpoint. Explicit arguments win.
    ``mtbf_node_hours``: hours, or a name in ``FAILURE_RATES``.
    """
    goodput = job_or_goodput.goodput() if hasattr(job_or_goodput, "goodput") else job_or_goodput
    if restart_cost_s is None:
        restart_cost_s = _measured(goodput, "restart_cost_s", "restart_cost_s")
    if checkpoint_cost_s is None:
        checkpoint_cost_s = _measured(goodput, "checkpoint_cost_s", "checkpoint_cost_s")
    if checkpoint_interval_s is None:
        checkpoint_interval_s = _measured(goodput, "checkpoint_interval_s", "checkpoint_interval_s")
    node_hours = _node_mtbf_hours(mtbf_node_hours)
    if not isinstance(nodes, int) or isinstance(nodes, bool) or nodes < 1:
        raise ConfigError("nodes", nodes, "must be an integer >= 1", "project_goodput")
    for name, value in (("restart_cost_s", restart_cost_s), ("checkpoint_cost_s", checkpoint_cost_s)):
        if not value >= 0:
            raise ConfigError(name, value, "must be >= 0 seconds", "project_goodput")
    if not checkpoint_interval_s > 0:
        raise ConfigError("checkpoint_interval_s", checkpoint_interval_s, "must be > 0 seconds", "project_goodput")
    mtbf_s = node_hours * 3600 / nodes
    best_tau = _argmax(lambda t: effective_ratio(t, checkpoint_cost_s, restart_cost_s, mtbf_s), 1e-3, 2 * mtbf_s)
    return Projection(
        nodes=nodes, mtbf_s=mtbf_s, restart_cost_s=restart_cost_s, checkpoint_cost_s=checkpoint_cost_s,
        checkpoint_interval_s=checkpoint_interval_s,
        ratio=effective_ratio(checkpoint_interval_s, checkpoint_cost_s, restart_cost_s, mtbf_s),
        optimal_interval_s=best_tau,
        optimal_ratio=effective_ratio(best_tau, checkpoint_cost_s, restart_cost_s, mtbf_s),
        young_daly_s=young_daly_interval(checkpoint_cost_s, mtbf_s),
    )


def _node_mtbf_hours(value: float | str) -> float:
    if isinstance(value, str):
        if value not in FAILURE_RATES:
            raise ConfigError("mtbf_node_hours", value, f"must be hours or one of {sorted(FAILURE_RATES)}",
                              "project_goodput")
        return FAILURE_RATES[value]
    if isinstance(value, bool) or not value > 0:
        raise ConfigError("mtbf_node_hours", value, "must be > 0 hours", "project_goodput")
    return float(value)


def _measured(goodput: Any, attribute: str, argument: str) -> float:
    value = getattr(goodput, attribute, None)
    if value is None:
        what = "the job measured none" if goodput is not None else "no job or Goodput was given"
        raise ConfigError(argument, None, f"is needed: {what}; pass {argument}=", "project_goodput")
    return float(value)


def _argmax(f: Any, lo: float, hi: float) -> float:
    """The maximum of a unimodal ``f`` on [lo, hi] (golden-section search, in log space:
    the optimum spans seconds to days)."""
    a, b = math.log(lo), math.log(hi)
    g = (math.sqrt(5) - 1) / 2
    c, d = b - g * (b - a), a + g * (b - a)
    for _ in range(200):
        if f(math.exp(c)) >= f(math.exp(d)):
            b, d = d, c
            c = b - g * (b - a)
        else:
            a, c = c, d
            d = a + g * (b - a)
    return math.exp((a + b) / 2)

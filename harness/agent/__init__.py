"""The elastic agent: worker specs, states, results and the agents that supervise workers."""

from harness.agent._api import (
    DEFAULT_ROLE,
    ElasticAgent,
    RunResult,
    Worker,
    WorkerGroup,
    WorkerSpec,
    WorkerState,
)
from harness.agent._local import LocalElasticAgent
from harness.agent._simple import SimpleElasticAgent

__all__ = [
    "DEFAULT_ROLE",
    "ElasticAgent",
    "LocalElasticAgent",
    "RunResult",
    "SimpleElasticAgent",
    "Worker",
    "WorkerGroup",
    "WorkerSpec",
    "WorkerState",
]

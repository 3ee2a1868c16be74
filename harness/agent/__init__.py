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
from harness.agent._health import HealthCheckServer, create_healthcheck_server
from harness.agent._local import LocalElasticAgent
from harness.agent._simple import SimpleElasticAgent

__all__ = [
    "DEFAULT_ROLE",
    "ElasticAgent",
    "HealthCheckServer",
    "LocalElasticAgent",
    "RunResult",
    "SimpleElasticAgent",
    "Worker",
    "WorkerGroup",
    "WorkerSpec",
    "WorkerState",
    "create_healthcheck_server",
]

"""The elastic agent: worker specs, states, results and the agents that supervise workers."""

from harness.agent._api import (
    DEFAULT_MAX_RESTARTS,
    DEFAULT_MONITOR_INTERVAL,
    DEFAULT_ROLE,
    AgentEvent,
    ElasticAgent,
    RunResult,
    Worker,
    WorkerGroup,
    WorkerSpec,
    WorkerState,
)
from harness.agent._health import HealthCheckServer, create_healthcheck_server
from harness.agent._local import (
    TORCHELASTIC_HEALTH_CHECK_PORT,
    TORCHELASTIC_TIMER_FILE,
    LocalElasticAgent,
)
from harness.agent._rules import MAX_MONITOR_INTERVAL, MAX_RESTARTS_RULE, MONITOR_INTERVAL_RULE, SettingRule
from harness.agent._simple import SimpleElasticAgent

__all__ = [
    "AgentEvent",
    "DEFAULT_MAX_RESTARTS",
    "DEFAULT_MONITOR_INTERVAL",
    "DEFAULT_ROLE",
    "ElasticAgent",
    "HealthCheckServer",
    "LocalElasticAgent",
    "MAX_MONITOR_INTERVAL",
    "MAX_RESTARTS_RULE",
    "MONITOR_INTERVAL_RULE",
    "RunResult",
    "SettingRule",
    "SimpleElasticAgent",
    "TORCHELASTIC_HEALTH_CHECK_PORT",
    "TORCHELASTIC_TIMER_FILE",
    "Worker",
    "WorkerGroup",
    "WorkerSpec",
    "WorkerState",
    "create_healthcheck_server",
]

"""The elastic agent: worker specs, states, results and the agents that supervise workers.

``WorkerState`` lives in ``harness.states`` and the settings' defaults and rules in
``harness.settings`` (leaves, so that what only names them need not load the agent); both are
re-exported here, the names users import.
"""

from harness.agent._api import (
    DEFAULT_ROLE,
    AgentEvent,
    ElasticAgent,
    RunResult,
    Worker,
    WorkerGroup,
    WorkerSpec,
)
from harness.agent._health import HealthCheckServer, create_healthcheck_server
from harness.agent._local import (
    TORCHELASTIC_HEALTH_CHECK_PORT,
    TORCHELASTIC_TIMER_FILE,
    WORKER_IDENTICAL_ENV,
    LocalElasticAgent,
)
from harness.agent._simple import SimpleElasticAgent
from harness.settings import (
    DEFAULT_MAX_RESTARTS,
    DEFAULT_MONITOR_INTERVAL,
    MAX_MONITOR_INTERVAL,
    MAX_RESTARTS_RULE,
    MONITOR_INTERVAL_RULE,
    SettingRule,
)
from harness.states import WorkerState

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
    "WORKER_IDENTICAL_ENV",
    "Worker",
    "WorkerGroup",
    "WorkerSpec",
    "WorkerState",
    "create_healthcheck_server",
]

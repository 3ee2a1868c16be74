"""``harness.agent`` has the names torch's ``torch.distributed.elastic.agent.server`` users reach for."""

from __future__ import annotations

import signal

import pytest

import harness.agent as agent
from harness.agent import LocalElasticAgent, SimpleElasticAgent, WorkerSpec
from harness.rendezvous import RendezvousParameters, get_rendezvous_handler

PINNED = {
    "AgentEvent", "DEFAULT_MAX_RESTARTS", "DEFAULT_MONITOR_INTERVAL", "DEFAULT_ROLE", "ElasticAgent",
    "HealthCheckServer", "LocalElasticAgent", "MAX_MONITOR_INTERVAL", "MAX_RESTARTS_RULE", "MONITOR_INTERVAL_RULE",
    "RunResult", "SettingRule", "SimpleElasticAgent", "TORCHELASTIC_HEALTH_CHECK_PORT", "TORCHELASTIC_TIMER_FILE",
    "WORKER_IDENTICAL_ENV",
    "Worker", "WorkerGroup", "WorkerSpec", "WorkerState", "create_healthcheck_server",
}


def test_exported_names_are_pinned():
    assert set(agent.__all__) == PINNED
    for name in agent.__all__:
        assert hasattr(agent, name)


def test_env_var_names_match_torch():
    from torch.distributed.elastic.agent.server import local_elastic_agent as theirs

    assert agent.TORCHELASTIC_TIMER_FILE == theirs.TORCHELASTIC_TIMER_FILE
    assert agent.TORCHELASTIC_HEALTH_CHECK_PORT == theirs.TORCHELASTIC_HEALTH_CHECK_PORT


class _Idle(SimpleElasticAgent):
    """The smallest concrete agent: the event methods need no workers."""

    def _start_workers(self, worker_group):
        return {}

    def _stop_workers(self, worker_group):
        pass

    def _monitor_workers(self, worker_group):
        raise NotImplementedError

    def _shutdown(self, death_sig=signal.SIGTERM):
        pass


@pytest.fixture
def idle_agent():
    params = RendezvousParameters("static", "localhost:0", "evt", 1, 1, rank=0)
    handler = get_rendezvous_handler(params)
    spec = WorkerSpec(role="trainer", local_world_size=1, entrypoint="true", rdzv_handler=handler,
                      max_restarts=2)
    yield _Idle(spec)
    handler.shutdown()


def test_get_event_succeeded_and_failed_like_torch(idle_agent):
    ok = idle_agent.get_event_succeeded()
    assert (ok.name, ok.source) == ("torchelastic.worker.status.SUCCEEDED", "AGENT")
    assert ok.metadata["state"] == "SUCCEEDED" and ok.metadata["role"] == "trainer"
    assert ok.metadata["rdzv_backend"] == "static" and ok.metadata["run_id"] == "evt"
    assert ok.metadata["agent_restarts"] == 0
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        failed = idle_agent.get_event_failed()
    assert failed.metadata["state"] == "FAILED" and "boom" in failed.metadata["raw_error"]
    from torch.distributed.elastic.events.api import Event, EventSource

    theirs = Event.deserialize(failed.serialize())  # torch reads ours as one of its events
    assert theirs.source == EventSource.AGENT and theirs.metadata == failed.metadata
    assert LocalElasticAgent.get_event_succeeded is SimpleElasticAgent.get_event_succeeded

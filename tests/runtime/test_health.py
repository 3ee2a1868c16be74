"""HealthCheckServer: healthy while the agent loop progresses, 503 when it stalls."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from harness.agent import HealthCheckServer
from harness.errors import ConfigError
from tests.conftest import SCRIPTS


def get(port):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_status_follows_progress_with_a_fake_clock():
    now = [100.0]
    progress = [100.0]
    server = HealthCheckServer(lambda: progress[0], port=0, timeout=5, clock=lambda: now[0])
    server.start()
    try:
        assert get(server.port)[0] == 200
        now[0] = 104.9
        assert get(server.port)[0] == 200
        now[0] = 105.1
        status, body = get(server.port)
        assert status == 503 and body["healthy"] is False and body["seconds_since_progress"] == pytest.approx(5.1)
        progress[0] = 105.0
        assert get(server.port)[0] == 200
    finally:
        server.stop()


def test_bad_port():
    with pytest.raises(ConfigError, match="port=70000"):
        HealthCheckServer(lambda: 0.0, port=70000, timeout=1)


def test_agent_serves_health_when_asked(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    agent = subprocess.Popen([sys.executable, "-m", "harness.run", "--standalone", str(SCRIPTS / "sleeper.py")],
                             stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "TORCHELASTIC_HEALTH_CHECK_PORT": str(port)})
    try:
        assert agent.stdout.readline().startswith("PID")
        deadline = time.monotonic() + 10
        while True:
            try:
                status, body = get(port)
                break
            except (ConnectionRefusedError, urllib.error.URLError):
                assert time.monotonic() < deadline
                time.sleep(0.05)
        assert status == 200 and body["healthy"] is True
    finally:
        agent.terminate()
        agent.wait(20)
        agent.stdout.close()


def test_exit_barrier_counts_as_progress():
    """A node waiting for slow peers in the exit barrier must stay healthy."""
    from harness.launch import LaunchConfig, build_agent

    agent = build_agent(LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=1, rdzv_backend="c10d",
                                     rdzv_endpoint="localhost:0"), sys.executable, ["-c", "pass"])
    try:
        agent._last_progress = time.monotonic() - 1000
        server = HealthCheckServer(agent.last_progress, port=0, timeout=60)
        assert server.status()[0] is False
        agent._in_exit_barrier = True
        assert server.status()[0] is True
    finally:
        agent._shutdown()


def test_a_taken_port_is_one_warning_and_the_job_runs_on(caplog):
    """Two agents in one process asking for one health port: the second says so and runs."""
    from harness.agent import LocalElasticAgent, WorkerSpec
    from harness.rendezvous import RendezvousParameters, get_rendezvous_handler

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        handler = get_rendezvous_handler(RendezvousParameters("c10d", "localhost:0", "hc", 1, 1))
        spec = WorkerSpec(role="default", local_world_size=1, entrypoint=sys.executable,
                          args=("-c", "pass"), rdzv_handler=handler, max_restarts=0)
        agent = LocalElasticAgent(spec, env={**os.environ, "TORCHELASTIC_HEALTH_CHECK_PORT": str(port)})
        try:
            result = agent.run()
        finally:
            handler.shutdown()
    assert not result.is_failed()
    warnings = [r.getMessage() for r in caplog.records if "health check" in r.getMessage()]
    assert len(warnings) == 1 and f":{port}" in warnings[0] and "\n" not in warnings[0]

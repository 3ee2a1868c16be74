"""Jobs with a rendezvous secret, end to end: two agents (``elastic-run``, and
``harness.Cluster``'s nodes with their per-job secret) rendezvous and finish. An agent
with the wrong secret is refused with one line on both sides, and a stranger on the
job's network is refused and appears on the timeline as ``store_refused``. The secret
appears in no command line (``ps``), no agent log and no worker's environment."""

from __future__ import annotations

import json
import os
import socket
import stat
import struct
import subprocess
import time
from pathlib import Path

import pytest

from harness import Cluster, WorkerState
from harness.rendezvous import SECRET_ENV, SECRET_FILE_ENV
from harness.rendezvous._store import MAGIC, SET, VALIDATE
from tests.rendezvous.conftest import c10d_args, free_port

SECRET = "job-secret-" + "7f3a" * 8

#: a worker that writes its environment to OUT/env<rank>.json, then waits for OUT/go
WORKER = '''
import json, os, sys, time
out = sys.argv[1]
with open(os.path.join(out, "env%s.json" % os.environ["RANK"]), "w") as fp:
    json.dump(dict(os.environ), fp)
deadline = time.monotonic() + 120
while not os.path.exists(os.path.join(out, "go")) and time.monotonic() < deadline:
    time.sleep(0.05)
'''


def _wait(predicate, what: str, timeout: float = 60.0, detail=lambda: "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:g}s\n{detail()}")
        time.sleep(0.05)


def _command_lines() -> str:
    return subprocess.run(["ps", "-eww", "-o", "args"], capture_output=True, text=True,
                          check=True).stdout


def _assert_workers_hold_no_secret(out: Path, secret: str, ranks: int) -> None:
    for rank in range(ranks):
        env = json.loads((out / f"env{rank}.json").read_text())
        assert SECRET_ENV not in env and SECRET_FILE_ENV not in env, sorted(env)
        assert not any(secret in value for value in env.values())
        assert env["WORLD_SIZE"] == str(ranks)


def _knock(host: str, port: int) -> bytes:
    """A stranger's attempt to overwrite a key; what the store answered."""
    key, value = b"/x", b"garbage"
    with socket.create_connection((host, port), timeout=5) as sock:
        sock.sendall(bytes([VALIDATE]) + struct.pack("<I", MAGIC) + bytes([SET])
                     + struct.pack("<Q", len(key)) + key + struct.pack("<Q", len(value)) + value)
        return sock.recv(64)


def test_two_agents_with_a_secret_and_one_with_the_wrong_one(nodes, tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    out = tmp_path / "out"
    out.mkdir()
    events = tmp_path / "events.jsonl"
    port = free_port()
    args = [*c10d_args(port, "2", "auth-job", "--rdzv-conf=last_call_timeout=1"), str(script), str(out)]
    env = {SECRET_ENV: SECRET, "HARNESS_EVENTS": str(events), "LOGLEVEL": "DEBUG"}
    host = nodes(*args, env=env)
    host.wait_for("hosting the rendezvous store", timeout=60)
    other = nodes(*args, env=env)
    _wait(lambda: all((out / f"env{r}.json").exists() for r in (0, 1)), "both workers started",
          detail=lambda: host.output + "\n" + other.output)
    assert SECRET not in _command_lines()

    intruder = nodes(*args, env={SECRET_ENV: "wrong-" + SECRET})
    assert intruder.wait(60) == 1
    [error] = [line for line in intruder.lines if "error" in line.lower()]
    assert error == (f"elastic-run: error: the rendezvous store at 127.0.0.1:{port} refused this "
                     f"agent: wrong or missing job secret ({SECRET_ENV} or {SECRET_FILE_ENV} must "
                     f"give every agent of the job, and the store, the same secret)")
    host.wait_for("rendezvous store: refused 127.0.0.1:", timeout=10)
    refusals = [json.loads(line) for line in events.read_text().splitlines()
                if '"store_refused"' in line]
    assert [(e["reason"], e["peer"].startswith("127.0.0.1:")) for e in refusals] == \
        [("wrong job secret", True)]

    (out / "go").touch()
    assert host.wait(60) == 0 and other.wait(60) == 0, host.output + "\n" + other.output
    _assert_workers_hold_no_secret(out, SECRET, 2)
    for node in (host, other, intruder):
        assert SECRET not in node.output and "Traceback" not in node.output


@pytest.mark.parametrize("store_host", ["node0", "harness"])
def test_a_cluster_job_has_its_own_secret_and_refuses_a_stranger(store_host, tmp_path, warm_pool):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    with Cluster(pool=warm_pool, nnodes=2, nproc_per_node=1, max_restarts=0, store_host=store_host) as cluster:
        job = cluster.launch(str(script), "{shared}")
        out = Path(job.shared_dir)
        _wait(lambda: all((out / f"env{r}.json").exists() for r in (0, 1)), "both workers started",
              detail=job.timeline.format)
        secret_file = Path(job.directory) / "rdzv.secret"
        assert stat.S_IMODE(secret_file.stat().st_mode) == 0o600
        secret = secret_file.read_text()
        assert len(secret) == 64 and secret not in _command_lines()

        assert job.store is not None
        host, port = job.store.endpoint.rsplit(":", 1)
        # a stranger on the job's network (the store's namespace, where nodes are hosts)
        assert job.net.call_in_store(lambda: _knock(host, int(port))) == b"UFER"
        if store_host == "node0":  # the agent hosting the store puts it on the timeline
            _wait(lambda: job.timeline.events("store_refused"), "a store_refused event",
                  detail=job.timeline.format)
            [event] = job.timeline.events("store_refused")
            assert event["node"] == 0 and event["peer"].startswith(f"{job.net.store_address}:")
            assert "sent SET without proving it knows the job secret" in event["reason"]

        (out / "go").touch()
        result = job.wait(timeout=60)
        assert result.state == WorkerState.SUCCEEDED, job.timeline.format()
        _assert_workers_hold_no_secret(out, secret, 2)
        for node in (0, 1):
            assert secret not in job.agent_log(node)
        if store_host == "harness":
            log = (Path(job.directory) / "store.log").read_text()
            assert f"rendezvous store: refused {job.net.store_address}:" in log
            assert secret not in log


def secret_seen_by_worker() -> str | None:
    """A callable worker: what its environment says of the job secret."""
    return os.environ.get(SECRET_ENV) or os.environ.get(SECRET_FILE_ENV)


@pytest.mark.parametrize("start_method", ["spawn", "fork"])
def test_a_callable_worker_does_not_inherit_the_agent_s_secret(monkeypatch, start_method):
    """A callable's worker inherits the agent's environment, not just the one it is given."""
    from harness.launch import LaunchConfig, elastic_launch

    monkeypatch.setenv(SECRET_ENV, SECRET)
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=1, rdzv_backend="c10d",
                          run_id="secret-callable", start_method=start_method, max_restarts=0)
    assert elastic_launch(config, secret_seen_by_worker)() == {0: None}
    assert os.environ[SECRET_ENV] == SECRET  # the agent's own environment is as it was


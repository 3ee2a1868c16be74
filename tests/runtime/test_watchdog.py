"""TORCHELASTIC_ENABLE_FILE_TIMER=1: the agent's watchdog reaps stuck workers."""

from __future__ import annotations

import json
import re

import pytest

from tests.conftest import SCRIPTS, run_elastic


@pytest.mark.parametrize("client", ["ours", "torch"])
def test_stuck_worker_is_reaped_and_the_group_restarts(client, tmp_path):
    events = tmp_path / "events.jsonl"
    out = run_elastic("--standalone", "--nproc-per-node=2", "--max-restarts=1", str(SCRIPTS / "stuck_in_timer.py"),
                      client, env={"TORCHELASTIC_ENABLE_FILE_TIMER": "1", "HARNESS_EVENTS": str(events)})
    assert out.returncode == 0, out.stderr
    assert sorted(re.findall(r"DONE rank=(\d) attempt=1", out.stdout)) == ["0", "1"]
    lines = [json.loads(l) for l in events.read_text().splitlines()]
    [expired] = [l for l in lines if l["kind"] == "timer_expired"]
    assert expired["scope"] == "train_step" and expired["local_rank"] == 1 and expired["signal"] == "SIGKILL"
    exits = [l for l in lines if l["kind"] == "worker_exit" and l["local_rank"] == 1 and l["restart_count"] == 0]
    assert exits[0]["exitcode"] == -9


def test_expiry_without_restarts_names_the_scope():
    out = run_elastic("--standalone", "--nproc-per-node=2", str(SCRIPTS / "stuck_in_timer.py"), "ours",
                      env={"TORCHELASTIC_ENABLE_FILE_TIMER": "1"})
    assert out.returncode == 1
    root = out.stderr.split("Root Cause (first observed failure):")[1]
    assert "timer expired in scope train_step" in root and "SIGKILL" in root


@pytest.mark.parametrize("enabled", ["0", "1"])
def test_timer_file_is_given_to_workers_only_when_enabled(enabled, tmp_path):
    script = tmp_path / "show.py"
    script.write_text("import os\n"
                      "os.write(1, f\"TIMER_FILE={os.environ.get('TORCHELASTIC_TIMER_FILE')}\\n\".encode())\n")
    out = run_elastic("--standalone", str(script), env={"TORCHELASTIC_ENABLE_FILE_TIMER": enabled})
    assert out.returncode == 0, out.stderr
    [line] = [l for l in out.stdout.splitlines() if l.startswith("TIMER_FILE=")]
    assert (line == "TIMER_FILE=None") == (enabled == "0")

"""The Python API: LocalElasticAgent / elastic_launch with callables and binaries."""

from __future__ import annotations

import json
import sys

import pytest

from harness.agent import WorkerState
from harness.errors import ChildFailedError
from harness.launch import LaunchConfig, elastic_launch, run_agent
from harness.procs import LogsSpecs, Std
from tests.runtime import workers


def config(**kw) -> LaunchConfig:
    base = dict(min_nodes=1, max_nodes=1, nproc_per_node=2, rdzv_backend="c10d",
                rdzv_endpoint="localhost:0", max_restarts=0, monitor_interval=0.1, shutdown_timeout=5)
    base.update(kw)
    return LaunchConfig(**base)


@pytest.mark.parametrize("method", ["spawn", "fork", "forkserver"])
def test_callable_return_values_keyed_by_global_rank(method):
    values = elastic_launch(config(nproc_per_node=3, start_method=method), workers.rank_times)(10)
    assert values == {0: 0, 1: 10, 2: 20}


def test_callable_failure_raises_child_failed_with_root_cause():
    with pytest.raises(ChildFailedError) as info:
        elastic_launch(config(), workers.fail_on_rank_one)()
    rank, failure = info.value.get_first_failure()
    assert rank == 1 and failure.exitcode == 1
    assert "ValueError: rank one is broken" in str(info.value)
    assert list(info.value.failures) == [1]  # the stopped rank 0 is not a failure


def test_callable_restart_counts_and_states(tmp_path):
    events = tmp_path / "events.jsonl"
    import os
    os.environ["HARNESS_EVENTS"] = str(events)
    try:
        result = run_agent(config(max_restarts=2), workers.crash_first_attempt, [])
    finally:
        del os.environ["HARNESS_EVENTS"]
    assert result.state == WorkerState.SUCCEEDED
    assert result.return_values == {0: "attempt 1", 1: "attempt 1"}
    lines = [json.loads(l) for l in events.read_text().splitlines()]
    for line in lines:
        assert {"ts", "node", "pid", "run_id", "kind"} <= line.keys()
    states = [l["state"] for l in lines if l["kind"] == "state"]
    assert states == ["INIT", "HEALTHY", "FAILED", "STOPPED", "HEALTHY", "SUCCEEDED"]
    exits = [(l["local_rank"], l["exitcode"]) for l in lines if l["kind"] == "worker_exit" and l["restart_count"] == 0]
    assert (0, 7) in exits
    starts = [l for l in lines if l["kind"] == "worker_start"]
    assert [s["restart_count"] for s in starts] == [0, 0, 1, 1]
    [result_event] = [l for l in lines if l["kind"] == "result"]
    assert result_event["result"]["state"] == "SUCCEEDED"
    rdzv = [l for l in lines if l["kind"] == "rendezvous"]
    assert [r["world_size"] for r in rdzv] == [2, 2]
    assert rdzv[0]["master_port"] != rdzv[1]["master_port"]  # a fresh store per attempt


def test_binary_entrypoint_return_values_are_none():
    values = elastic_launch(config(), sys.executable)("-c", "pass")
    assert values == {0: None, 1: None}


def test_callable_redirect_and_tee(tmp_path, capfd):
    specs = LogsSpecs(log_dir=str(tmp_path), redirects=Std.ALL, tee={1: Std.OUT})
    values = elastic_launch(config(logs_specs=specs), workers.print_and_return)()
    assert values == {0: 1, 1: 1}
    out = capfd.readouterr().out
    assert "[default_role1]:hello from 1" in out and "hello from 0" not in out
    [run_dir] = list(tmp_path.iterdir())
    assert (run_dir / "attempt_0" / "0" / "stdout.log").read_text() == "hello from 0\n"
    assert (run_dir / "attempt_0" / "1" / "stdout.log").read_text() == "hello from 1\n"


def test_local_ranks_substitution():
    from harness.agent._local import _substitute_local_rank

    assert _substitute_local_rank(("--local-rank=${local_rank}", 3), 2) == ("--local-rank=2", 3)


def test_callables_in_the_zygote():
    values = elastic_launch(config(nproc_per_node=2, start_method="zygote", max_restarts=1),
                            workers.crash_first_attempt)()
    assert values == {0: "attempt 1", 1: "attempt 1"}
    with pytest.raises(ChildFailedError, match="ValueError: rank one is broken"):
        elastic_launch(config(start_method="zygote"), workers.fail_on_rank_one)()

"""The report and resource faults: a slow node or a memory limit is a span until its heal, a
worker the OOM killer took says so, and the page shows each rank's step rate with the
straggler named. Hand-made events, as agents, workers and ``Job`` write them."""

from __future__ import annotations

import html

from harness.sim.truth.training import rank_rates, rates_summary
from pytest_elastic.report.failures import explain_failures
from pytest_elastic.report.model import build_model
from pytest_elastic.report.page import build_page


def _event(t: float, node, kind: str, **fields) -> dict:
    return {"ts": t, "mono": t, "node": node, "pid": 1, "run_id": "r", "kind": kind, **fields}


EVENTS = [_event(0, 0, "state", state="HEALTHY"), _event(0, 1, "state", state="HEALTHY"),
          _event(0.1, 0, "worker_start", local_rank=0, rank=0, worker_pid=10, round=0),
          _event(1, "harness", "fault", fault="slow_node", target_node=1, cpu=0.2),
          _event(2, "harness", "fault", fault="memory_limit", target_node=0, limit="300M"),
          _event(3, 0, "worker_exit", local_rank=0, rank=0, worker_pid=10, exitcode=-9, reason="oom"),
          _event(4, "harness", "heal", healed=["memory_limit", "slow_node"]),  # as Job.heal writes it
          _event(10, 0, "state", state="SUCCEEDED")]


def test_resource_faults_last_until_their_heal_and_an_oom_kill_says_so():
    model = build_model(EVENTS)
    assert {(f.kind, f.at, f.end) for f in model.faults} == {("slow_node", 1, 4), ("memory_limit", 2, 4)}
    [span] = model.lanes[0].workers[0]
    assert span.text.endswith("exit -9 (SIGKILL): killed by the OOM killer")
    assert "rank 0 (local rank 0) on node 0: signal SIGKILL (exit code -9), killed by the OOM killer" \
        in explain_failures([], EVENTS)


def test_the_page_shows_each_ranks_step_rate_and_the_straggler():
    steps = [_event(i * 0.5, node, "step", rank=node, pid=20 + node, step=i, cpu_wait=i * 0.5 * share)
             for i in range(11) for node, share in ((0, 0.05), (1, 0.8))]
    line = rates_summary(rank_rates(steps))
    page = build_page("t", build_model(EVENTS + steps), EVENTS + steps, info={"step_rates": line})
    assert "rank 1 2.0 steps/s, cpu wait 80% — rank 1 waited most for a CPU: the straggler" in page


def test_the_page_lists_what_chaos_left_out_and_why():
    why = "nothing reaps a hung worker: the job's agents run no watchdog"
    page = build_page("t", build_model(EVENTS), EVENTS, info={"chaos_left_out": {"hang_worker": why}})
    assert "<h2>Chaos left out</h2>" in page and f"<li><b>hang_worker</b>: {html.escape(why)}</li>" in page
    assert "Chaos left out" not in build_page("t", build_model(EVENTS), EVENTS, info={})


def test_an_agent_that_failed_with_no_failed_worker_is_named_with_its_log(tmp_path):
    """A node's agent can end FAILED on its own (a rendezvous or store error) with no rank
    failed: the report said nothing of it, and its cause was only in its log."""
    from types import SimpleNamespace

    from harness import WorkerState
    from harness.agent import RunResult
    from harness.sim.truth.timeline import Timeline
    from pytest_elastic.report.failures import agents_failed_alone, explain_job

    (tmp_path / "events.jsonl").write_text("")
    runs = {0: RunResult(WorkerState.FAILED), 1: RunResult(WorkerState.SUCCEEDED)}
    job = SimpleNamespace(result=lambda: SimpleNamespace(run_results=runs),
                          timeline=Timeline(str(tmp_path / "events.jsonl")),
                          nodes={0: SimpleNamespace(name="tammie-0"), 1: SimpleNamespace(name="hunter-1")},
                          agent_log=lambda index: "starting\nelastic-run: error: rendezvous 'r' timed out\n")
    text = agents_failed_alone(job)
    assert text.splitlines() == ["node tammie-0 (index 0): its agent failed with no failed worker; its log ends:",
                                 "  starting", "  elastic-run: error: rendezvous 'r' timed out"]
    assert explain_job(job) == text

    # an agent that raised (a rendezvous error) writes no result: its exit code says it failed
    crashed = SimpleNamespace(result=lambda: SimpleNamespace(run_results={1: runs[1]}, exit_codes={0: 1, 1: 0}),
                              timeline=job.timeline, nodes=job.nodes, agent_log=job.agent_log)
    assert agents_failed_alone(crashed).splitlines()[0] == ("node tammie-0 (index 0): its agent exited 1 with no "
                                                             "result; its log ends:")

    # a scenario's cluster closes before its report is made: what was read before stays
    def gone():
        raise FileNotFoundError("the job's dir went with its cluster")

    closed = SimpleNamespace(result=gone, timeline=job.timeline, nodes=job.nodes, agent_log=lambda index: gone())
    assert agents_failed_alone(closed) == "" and explain_job(closed, [], text) == text

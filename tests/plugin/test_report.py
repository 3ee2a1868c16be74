"""The drawn report from event lists: synthetic ones (any size, both node identities) and a
real ``harness.Cluster`` run. The page's SVG is parsed as XML, so a malformed drawing fails."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from bench.synth import synthetic_events
from pytest_elastic.report.chart import timeline_chart
from pytest_elastic.report.failures import explain_failures, failures_from_events
from pytest_elastic.report.model import build_model, fault_latencies, labeler
from pytest_elastic.report.page import write_html
from tests.conftest import SCRIPTS

SVG = "{http://www.w3.org/2000/svg}"


def _svgs(page: str) -> dict[str, ET.Element]:
    found = {}
    for match in re.finditer(r"<svg .*?</svg>", page, re.S):
        element = ET.fromstring(match.group(0))
        found[element.get("id", "")] = element
    return found


def _by_class(root: ET.Element, cls: str) -> list[ET.Element]:
    return [e for e in root.iter() if cls in (e.get("class") or "").split()]


def _event(t: float, node, kind: str, **fields) -> dict:
    return {"ts": t, "mono": t, "node": node, "pid": 1, "run_id": "r", "kind": kind, **fields}


@pytest.mark.parametrize("int_nodes", [False, True], ids=["named-nodes", "indexed-nodes"])
def test_page_draws_lanes_workers_rounds_faults_and_steps(tmp_path, int_nodes):
    events = synthetic_events(nodes=6, nproc=2, duration=60, faults=8, seed=3, int_nodes=int_nodes)
    path = tmp_path / "page.html"
    figures = write_html(str(path), "synthetic", events, nproc=2)
    page = path.read_text()
    svgs = _svgs(page)
    timeline = svgs["timeline"]
    lanes = _by_class(timeline, "lane")
    assert len(lanes) == 6
    faults = [e for e in events if e["kind"] == "fault" and e["fault"] != "heal"]
    assert len({m.get("data-f") for m in _by_class(timeline, "fault-marker")}) == len(faults) == len(figures["faults"])
    rounds = {(e["round"]) for e in events if e["kind"] == "rendezvous"}
    assert len(_by_class(timeline, "round")) == len(rounds) == figures["rounds"]
    assert _by_class(timeline, "st-HEALTHY") and _by_class(timeline, "wk-stopped")
    assert len(_by_class(svgs["steps"], "step-line")) == 12  # one per rank
    assert 'id="legend"' in page and "http" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    if int_nodes:  # indexes are shown by the label the harness gave them
        assert [lane.get("data-node") for lane in lanes] == [f"host-{i:02d}" for i in range(6)]


def test_lasting_faults_are_spans_that_end_at_their_heal_or_duration():
    events = [_event(0, 0, "state", state="HEALTHY"), _event(0, 1, "state", state="HEALTHY"),
              _event(1, "harness", "fault", fault="partition", target_node=1, peers="store"),
              _event(2, "harness", "fault", fault="packet_loss", target_node=0, duration=1.5),
              _event(3, "harness", "heal", target_node=1, healed=["partition/packet_loss"]),  # as Job.heal writes it
              _event(4, "harness", "fault", fault="link_down", target_node=0),
              _event(10, 0, "state", state="SUCCEEDED")]
    model = build_model(events)
    spans = {(f.kind, f.at, f.end) for f in model.faults}
    assert spans == {("partition", 1, 3), ("packet_loss", 2, 3.5), ("link_down", 4, 10)}
    assert [f.kind for f in model.ends] == ["heal"]
    svg = _svgs(write_page(events))["timeline"]
    assert {e.get("class") for e in _by_class(svg, "fault-span") if "on-lane" not in e.get("class")} == {
        "fault-span f-partition", "fault-span f-packet_loss", "fault-span f-link_down"}
    assert len(_by_class(svg, "fault-end")) == 1


def write_page(events: list[dict]) -> str:
    from pytest_elastic.report.model import build_model as build
    from pytest_elastic.report.page import build_page

    return build_page("t", build(events), events)


def test_a_killed_node_is_dead_from_that_moment():
    events = [_event(0, "a-0", "state", state="HEALTHY"), _event(0, "b-1", "state", state="HEALTHY"),
              _event(0.1, "b-1", "worker_start", local_rank=0, rank=1, worker_pid=7, round=0),
              _event(2, "harness", "fault", fault="kill_node", target_node="b-1"),
              _event(2.1, "a-0", "state", state="STOPPED"), _event(2.5, "a-0", "state", state="HEALTHY"),
              _event(8, "a-0", "state", state="SUCCEEDED")]
    model = build_model(events)
    dead = {lane.key: lane.dead_at for lane in model.lanes}
    assert dead == {"a-0": None, "b-1": 2}
    lane = model.lanes[1]
    assert lane.states[-1].end == 2 and lane.workers[0][0].end == 2
    assert _by_class(_svgs(write_page(events))["timeline"], "dead")
    chart = timeline_chart(events, width=40)
    assert re.search(r"b-1 \|=+_+\|", chart), chart
    # an older run's events name a leave by its retired name: read as today's (remove_node)
    left = build_model([*events[:-1], _event(6, "harness", "fault", fault="node_leave", target_node="a-0"),
                        _event(6.5, "a-0", "worker_exit", local_rank=0, rank=0, worker_pid=8, exitcode=-15),
                        _event(9, "b-1", "membership_change")])
    assert (left.lanes[0].dead_at, left.lanes[0].dead_by) == (6.5, "remove_node")  # once its agent is done
    terminal = build_model([*events, _event(8.5, "a-0", "state", state="KILLED")])  # a harness terminal entry
    assert (terminal.lanes[0].dead_at, terminal.lanes[0].dead_by) == (8.5, "killed")
    assert [s.cls for s in terminal.lanes[0].states] == ["HEALTHY", "STOPPED", "HEALTHY", "SUCCEEDED"]


def test_labels_come_from_the_timeline_then_node_start_events_then_the_key():
    events = [_event(0, "harness", "node_start", target_node=0, label="ada-0"), _event(0, 0, "state", state="INIT")]

    class WithLabels:
        def label(self, node):
            if node == 1:
                return "grace-1"
            raise KeyError(node)

    label = labeler(WithLabels(), events)
    assert (label(0), label(1), label(2)) == ("ada-0", "grace-1", "2")


def test_fast_latencies_match_the_timeline_definition(tmp_path):
    from harness.sim.truth.timeline import Timeline

    events = synthetic_events(nodes=5, nproc=2, duration=120, faults=12, seed=5)
    path = tmp_path / "events.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    expected = [(f.detection_latency, f.recovery_latency) for f in Timeline(str(path)).faults()]
    assert fault_latencies(events) == expected
    assert any(d is not None for d, _ in expected) and any(r is not None for _, r in expected)


def test_failures_put_the_root_cause_first_with_signal_names_and_traceback():
    callstack = "Traceback (most recent call last):\n" + "".join(f'  File "x.py", line {i}\n' for i in range(30)) \
        + "ValueError: boom\n"
    final = [{"node": "b-1", "node_index": 1, "rank": 3, "local_rank": 1, "pid": 11, "exitcode": -9,
              "message": "Signal 9 (SIGKILL) received by PID 11", "traceback": "", "timestamp_ns": 20},
             {"node": "a-0", "node_index": 0, "rank": 0, "local_rank": 0, "pid": 10, "exitcode": 1,
              "message": "ValueError: boom", "traceback": callstack, "timestamp_ns": 10}]
    events = [_event(1, "a-0", "worker_exit", local_rank=1, rank=1, worker_pid=5, exitcode=2)]
    text = explain_failures(final, events)
    lines = text.splitlines()
    assert lines[0] == "root cause (first observed failure):"
    assert lines[1] == "  rank 0 (local rank 0) on node a-0 (index 0): exit code 1, pid 10"
    assert lines[2] == "    ValueError: boom" and "ValueError: boom" in lines[-6]
    assert "  rank 3 (local rank 1) on node b-1 (index 1): signal SIGKILL (exit code -9), pid 11" in lines
    assert sum("line" in line for line in lines) < 12 and "... (" in text
    assert "rank 1 (local rank 1) on node a-0: exit code 2" in text


def test_a_rank_without_an_error_file_is_shown_with_its_nodes_last_traceback(warm_pool, tmp_path):
    """A script without ``@record`` that raises: no error file, so torch's summary says only
    "To enable traceback see ...". The failure is read with what its node's log ends with,
    from its last traceback on (a red run's cause in one look: a gloo error)."""
    from harness import Cluster
    from pytest_elastic.report.failures import collect_failures

    script = tmp_path / "raises.py"
    script.write_text("import os\nprint('noise', flush=True)\n"
                      "raise RuntimeError(f'Connection closed by peer, rank {os.environ[\"RANK\"]}')\n")
    with Cluster(pool=warm_pool, nnodes=1, nproc_per_node=1, max_restarts=0) as cluster:
        job = cluster.launch(str(script))
        job.wait(timeout=60)
        [failure] = collect_failures(job)
    assert failure["traceback"] == ""
    assert failure["log_tail"].startswith("Traceback (most recent call last)")
    assert "RuntimeError: Connection closed by peer, rank 0" in failure["log_tail"]
    assert "noise" not in failure["log_tail"]  # from the last traceback on
    lines = explain_failures([failure], []).splitlines()
    assert lines[2] == "    To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html"  # torch's
    assert lines[3:5] == ["    no error file (no @record); its node's log ends:",
                          "      Traceback (most recent call last):"]
    assert "      RuntimeError: Connection closed by peer, rank 0" in lines  # then the agent's own lines


def test_failures_from_result_events():
    events = [_event(1, 1, "result", result={"state": "FAILED", "failures": {"3": {
        "local_rank": 1, "pid": 9, "exitcode": 1, "message": "RuntimeError: x", "timestamp_ns": 5}}})]
    found = failures_from_events(events, lambda node: f"host-{node}")
    assert found[0]["node"] == "host-1" and found[0]["rank"] == "3"
    assert "rank 3 (local rank 1) on node host-1 (index 1): exit code 1" in explain_failures(found, events)


def test_page_of_a_real_cluster_run_with_a_killed_node(tmp_path, warm_pool):
    from harness import Cluster, WorkerState
    from harness.faults import AtStep, NodeKill

    with Cluster(pool=warm_pool, nnodes="1:2", nproc_per_node=1, max_restarts=1) as cluster:
        job = cluster.launch(str(SCRIPTS / "stepper.py"), "40", "0.02")
        job.inject(NodeKill(node=1), AtStep(step=10, rank=0))
        assert job.wait(timeout=90).state == WorkerState.SUCCEEDED
        events = job.timeline.events()
        (fault,) = [e for e in events if e["kind"] == "fault"]
        killed = labeler(job.timeline, events)(fault["target_node"])
        path = tmp_path / "real.html"
        write_html(str(path), "real", job.timeline, nproc=1)
    svg = _svgs(path.read_text())["timeline"]
    lanes = _by_class(svg, "lane")
    assert len(lanes) == 2
    dead = [lane for lane in lanes if _by_class(lane, "dead")]
    assert [lane.get("data-node") for lane in dead] == [str(killed)]
    assert len(_by_class(svg, "fault-marker")) == 1 and len(_by_class(svg, "round")) >= 2


def test_index_and_summary_json_carry_every_test(tmp_path):
    from pytest_elastic._settings import Settings
    from pytest_elastic.report.index import write_index

    settings = Settings(chaos=True, seed=9)
    stats = [{"elastic_test": "t.py::test_ok", "elastic_outcome": "passed", "elastic_fault_count": 2,
              "elastic_faults": "worker_kill; node_kill", "elastic_restarts": 1, "elastic_seed": 9,
              "elastic_detection_latencies": [0.02, 0.04], "elastic_recovery_latencies": [0.2],
              "elastic_resume_latencies": [1.5, 2.5], "elastic_goodput": 0.8,
              "elastic_lost": {"detection": 0.06, "recovery": 0.3, "startup": 3.6, "wasted": 1.0},
              "elastic_replay": "pytest 't.py::test_ok' --elastic-chaos --elastic-seed=9",
              "elastic_pages": ["t.py_test_ok.job0.html", "t.py_test_ok.job1.html"]},
             {"elastic_test": "t.py::test_bad", "elastic_outcome": "failed", "elastic_fault_count": 1,
              "elastic_faults": "worker_kill", "elastic_minimal_faults": 1, "elastic_minimal_schedule": "[[1]]",
              "elastic_pages": ["t.py_test_bad.job0.html"]}]
    index = write_index(str(tmp_path), stats, ["elastic tests: 2 (1 failed)"], settings)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [r["test"] for r in summary["results"]] == ["t.py::test_bad", "t.py::test_ok"]  # failures first
    ok = summary["results"][1]
    assert ok["detection_s"] == {"median": 0.03, "p95": 0.04, "n": 2}
    assert ok["fault_kinds"] == ["kill_worker", "kill_node"]  # an older session's names, in today's spelling
    assert ok["resume_s"] == {"median": 2.0, "p95": 2.5, "n": 2} and ok["goodput"] == 0.8
    assert ok["lost_s"]["startup"] == 3.6 and summary["resume_s"]["n"] == 2
    assert summary["results"][0]["minimal_replay"] == \
        "pytest 't.py::test_bad' --elastic-chaos --elastic-seed=9 --elastic-schedule='[[1]]'"
    assert (summary["tests"], summary["failed"], summary["faults"], summary["seed"]) == (2, 1, 3, 9)
    page = Path(index).read_text()
    assert "href='t.py_test_ok.job0.html'" in page and "href='t.py_test_ok.job1.html'>job 1<" in page
    assert page.count("<th data-k=") == 10 and "training resumed ms" in page and ">0.80<" in page
    assert "--elastic-schedule=&#x27;[[1]]&#x27;" in page


def test_a_fault_shows_when_training_resumed_and_what_it_cost(tmp_path):
    """The page prices each fault on the training: resume latency in the table, the lost
    seconds as a stacked bar on the time axis and in the table; the header shows goodput."""
    from tests.unit.test_training_cost import EVENTS

    events = [dict(e, node=0, ts=e["mono"]) for e in EVENTS]
    path = tmp_path / "page.html"
    write_html(str(path), "priced", events, info={"goodput": "goodput 0.48; lost 4.00 s to 1 fault"})
    page = path.read_text()
    assert "<th>training resumed</th>" in page and "<td>1500 ms</td>" in page
    assert all(f'class="lost lost-{k}"' in page for k in ("wasted", "detection", "recovery", "startup"))
    assert "goodput 0.48; lost 4.00 s to 1 fault" in page and "4.00 s" in page


def test_the_session_summary_says_goodput_and_resume_latency():
    from pytest_elastic._settings import Settings
    from pytest_elastic.report.stats import session_summary

    stats = [{"elastic_jobs": 1, "elastic_fault_count": 1, "elastic_resume_latencies": [2.0],
              "elastic_productive_s": 8.0, "elastic_wall_s": 10.0,
              "elastic_lost": {"detection": 0.1, "recovery": 0.4, "startup": 1.5, "wasted": 0.5, "tail": 0.2}}]
    lines = session_summary(stats, Settings())
    assert "training resumed latency: median 2000 ms, p95 2000 ms (n=1)" in lines
    assert ("goodput 0.80 (8.0 s of 10.0 s trained); lost 2.5 s to 1 fault(s): detection 0.1 s, "
            "recovery 0.4 s, startup 1.5 s, wasted 0.5 s") in lines

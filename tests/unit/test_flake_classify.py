"""bench/flake.py's reading of a red run: the cause of each red item, the red items and
their sections, the seed, and the replay lines, on hand-made excerpts of what the plugin and
the harness print (the messages are the real ones: harness/sim/truth/invariants.py, Job.wait,
FaultNotFired, the scenarios' expectations, pytest-timeout, the chaos section)."""

from __future__ import annotations

import pytest

from bench.flake import RedItem, classify, command, parse_seed, red_items, replay_command

# a timeline line as Timeline.format prints it; the fence reason as the rendezvous keeper words it
FENCED = ('   4.210s       1:megan-1 fenced           {"reason": "fenced: no answer from the rendezvous store '
          'at 198.18.0.1:29500 for 5.1s (its peers go on without this node after heartbeat_timeout=0.8s)"}')
WORKER_KILL = '   1.263s          harness fault            {"fault": "worker_kill", "target_node": 0, "local_rank": 0}'
PARTITION = '   2.001s          harness fault            {"fault": "partition", "target_node": 1, "peers": "store"}'
NODE_KILL = '   2.001s          harness fault            {"fault": "node_kill", "target_node": 1}'
HANG = "scenario flapping_node: job eb23922c58f4 did not finish within 90s; nodes [0] still running"


@pytest.mark.parametrize("text", [
    # the overlap invariant: counted as false liveness even where a node was killed
    "elastic cluster teardown: 1 invariant(s) violated:\n"
    "  - round 2 started while 1:megan-1 rank 2 (pid 4242) of round 1 was still alive\n"
    f"timeline:\n{NODE_KILL}",
    # a node fenced itself while only workers were killed; the job then hung
    f"{HANG}\n{WORKER_KILL}\n{FENCED}",
    # the survivors dropped a live node ("lost <label>"), seen in an agent's log line
    f"scenario worker_sigkill: world sizes [4, 2], expected [4, 4]\n{WORKER_KILL}\n"
    "INFO harness.agent: [default] the membership changed (lost megan-1); restarting with the new world",
    "harness.rendezvous._api.RendezvousClosedError: rendezvous 'job-3' is closed",
])
def test_a_live_node_taken_for_dead_is_false_liveness(text: str) -> None:
    assert classify(text) == "false-liveness"


@pytest.mark.parametrize("text", [
    f"{HANG}\n{PARTITION}\n{FENCED}",  # fenced because the test cut it off: the job's answer
    f"{HANG}\n{WORKER_KILL}",
    "Failed: Timeout (>130.0s) from pytest-timeout.",
    "E   TimeoutError: nodes did not reach HEALTHY within 30s",
    "scenario x: job 1a2b stalled: no event from any node or worker for 20.5s (since 3.1s; ...): the worker "
    "hang_worker stopped (node 0, local rank 1) is reaped by nothing",
])
def test_what_did_not_finish_in_time_is_a_hang(text: str) -> None:
    assert classify(text) == "hang"


@pytest.mark.parametrize("text", [
    # the waits asked for the workers of a node the scheduler's thread had just added; the
    # chaos section below it names faults that never fired (a timing word)
    "E       harness.errors.ConfigError: node=2 is not a node of this timeline (nodes: [0, 1])\n"
    "not fired (the job ended first, or it could not be applied):\n  NodeRemove(node=2) never fired",
    "E   AttributeError: 'NoneType' object has no attribute 'pid'",
])
def test_a_python_error_of_the_harness_is_harness(text: str) -> None:
    assert classify(text) == "harness"


@pytest.mark.parametrize("text", [
    "elastic cluster teardown: 1 invariant(s) violated:\n"
    "  - round 1: nodes ran with different restart counts [0, 1]; the count is the job's, one per round\n"
    f"timeline:\n{WORKER_KILL}",
    # a cut-off node that did not fence: "lost the store" is not a lost node
    "harness.sim.truth.invariants.InvariantViolation: 1 invariant(s) violated:\n"
    "  - node 1 lost the store but its worker pid 77 exited never (bound 8.80s): it did not fence itself\n"
    f"timeline:\n{PARTITION}",
])
def test_other_broken_invariants_are_invariant(text: str) -> None:
    assert classify(text) == "invariant"


@pytest.mark.parametrize("text", [
    "scenario timing_probe: worker_kill: training resumed after 2.11s > 1.5s",
    "scenario node_failure: final state SUCCEEDED; world sizes [2, 2], expected [2, 1]",
    "scenario scale_up_join: 1 scheduled fault(s) never fired before the job ended: NodeAdd() never fired: "
    "the job ended first (wait(allow_unfired=True), or [expect] allow_unfired = true in a scenario, if that is "
    "expected)",
    "E       AssertionError: expected 4, got 3",
    # the goodput line's "lost 1.5 s to 2 fault(s)" names no node
    "scenario straggler: goodput 0.27 (1.0 s of 3.8 s trained); lost 1.5 s to 2 fault(s): detection 0.0 s "
    "< min_goodput 0.5",
])
def test_missed_time_and_size_expectations_are_timing(text: str) -> None:
    assert classify(text) == "timing"


@pytest.mark.parametrize("text", [
    "E       assert 3 == 4",
    "elastic cluster teardown: still alive after close(): worker pid 99 of node 0",
    "scenario restarts_exhausted: final state SUCCEEDED, expected FAILED",
    "[gw1] node down: Not properly terminated\nworker 'gw1' crashed while running 'tests/x.py::test_y'",
])
def test_the_rest_is_other(text: str) -> None:
    assert classify(text) == "other"


OUTPUT = """\
============================= test session starts ==============================
elastic: chaos=on seed=2090461579 faults=kill_worker shrink=8 start_method=zygote timeout=120s network=netns
2 workers [4 items]
.FFE                                                                     [100%]
==================================== ERRORS ====================================
_________________________ ERROR at teardown of test_y __________________________
E   elastic cluster teardown: 1 invariant(s) violated:
E     - round 1 started while 0:megan-0 rank 0 (pid 1) of round 0 was still alive
=================================== FAILURES ===================================
____________________________ scenario: timing_probe ____________________________
[gw0] linux -- Python 3.11.7 /work/main/.venv/bin/python
scenario timing_probe: worker_kill: training resumed after 2.11s > 0.001s
-------------------------------- elastic chaos ---------------------------------
reproduce with:
  pytest 'scenarios/timing_probe.toml::timing_probe' --elastic-chaos --elastic-seed=2090461579
____________________________________ test_y ____________________________________
E   AssertionError: a pytester run's output follows
----------------------------- Captured stdout call -----------------------------
============================= test session starts ==============================
elastic: chaos=on seed=7 faults=kill_worker shrink=8 start_method=zygote timeout=120s network=netns
_____________________________ scenario: inner _____________________________
job 1 did not finish within 3s; nodes [0] still running
=========================== short test summary info ============================
FAILED scenarios/inner.toml::inner - job 1 did not finish...
=============================== elastic summary ================================
chaos seed: 2090461579 (replay with --elastic-chaos --elastic-seed=2090461579)
=========================== short test summary info ============================
ERROR tests/x.py::test_y - elastic cluster teardown: 1 invariant(s) violated:...
FAILED scenarios/timing_probe.toml::timing_probe - scenario timing_probe: wor...
FAILED tests/x.py::test_y - AssertionError: a pytester run's output follows
==================== 2 failed, 1 passed, 1 error in 7.20s =====================
"""


def test_red_items_are_read_from_the_outer_summary_with_their_sections() -> None:
    items = {i.nodeid: i for i in red_items(OUTPUT)}
    assert list(items) == ["tests/x.py::test_y", "scenarios/timing_probe.toml::timing_probe"]
    probe, y = items["scenarios/timing_probe.toml::timing_probe"], items["tests/x.py::test_y"]
    assert probe.cause == "timing"
    assert probe.replay == ("pytest 'scenarios/timing_probe.toml::timing_probe' --elastic-chaos "
                            "--elastic-seed=2090461579")
    # one item for its teardown error and its failure; the pytester run's hang is cut off
    assert "was still alive" in y.text and "a pytester run's output follows" in y.text
    assert "did not finish" not in y.text
    assert y.cause == "false-liveness" and y.replay is None


def test_the_seed_is_the_sessions_own() -> None:
    assert parse_seed(OUTPUT) == 2090461579
    assert parse_seed("elastic: chaos=off start_method=zygote timeout=120s network=netns") is None


def test_a_collection_error_and_a_missing_section_still_give_items() -> None:
    output = ("==================================== ERRORS ====================================\n"
              "_______________________ ERROR collecting tests/unit/test_x.py _______________________\n"
              "E   ImportError: cannot import name 'gone'\n"
              "=========================== short test summary info ============================\n"
              "ERROR tests/unit/test_x.py - ImportError: cannot import name 'gone'\n"
              "FAILED tests/unit/test_z.py::test_w - AssertionError: expected 1, got 2\n")
    items = red_items(output)
    assert [(i.nodeid, i.cause) for i in items] == [("tests/unit/test_x.py", "other"),
                                                    ("tests/unit/test_z.py::test_w", "timing")]
    assert "ImportError" in items[0].text


def test_a_red_item_keeps_its_defaults() -> None:
    assert RedItem("(whole run)", "killed after 5 s", cause="hang").replay is None


def test_paths_in_the_extra_args_replace_scenarios_and_replay_carries_the_seed() -> None:
    assert "scenarios" in command(False, ["-k", "tests"])  # a -k value, not a path
    assert "scenarios" not in command(False, ["scenarios/single_node"])
    assert command(True, [])[3:] == ["-n", "2", "-rfE", "-p", "no:cacheprovider"]
    assert replay_command(5, False, ["-k", "scale_down"]) == \
        "python -m pytest scenarios --elastic-chaos --elastic-faults=all -n 2 -k scale_down --elastic-seed=5"


def test_a_red_runs_log_never_overwrites_an_earlier_benchs(tmp_path):
    """Two benches of one run each, into one --logs dir: both logs are kept."""
    from bench.flake import Run, keep_log

    first = keep_log(Run(1, 1, 10.0, "first"), tmp_path, ["pytest"])
    second = keep_log(Run(1, 1, 12.0, "second"), tmp_path, ["pytest"])
    assert first != second
    assert first.read_text().endswith("first") and second.read_text().endswith("second")


def test_a_suite_run_keeps_the_system_temp_root_and_a_main_job_run_gets_a_short_dir_under_it():
    """A TMPDIR two levels down pushed the suite's AF_UNIX socket paths past 108 bytes."""
    import os
    import shutil

    from bench.flake import SYSTEM_TMP, run_tmpdir, runs_tests

    assert run_tmpdir(1, suite=True) is None
    # tests under tests/ (the host tests' sockets) get the suite's treatment, scenarios not
    assert runs_tests(False, ["tests/hosts", "-k", "cgroup"]) and runs_tests(True, [])
    assert not runs_tests(False, ["scenarios/network"]) and not runs_tests(False, ["-k", "tests"])
    path = run_tmpdir(12, suite=False)
    assert path is not None
    try:
        assert os.path.dirname(path) == SYSTEM_TMP and os.path.basename(path).startswith("fl12-")
    finally:
        shutil.rmtree(path)

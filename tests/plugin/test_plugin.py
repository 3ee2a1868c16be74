"""The plugin end to end, as a user sees it (pytester, in subprocesses)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import SCRIPTS, printed_schedule
from tests.plugin.sessions import runpytest_side_by_side

STEPPER = str(SCRIPTS / "stepper.py")


def test_plugin_import_is_light():
    """The plugin loads the error root (``harness.errors``) and nothing else of the engine."""
    code = ("import sys, pytest_elastic.plugin; print(sorted(m for m in sys.modules "
            "if m in ('torch', 'harness') or m.startswith(('torch.', 'harness.'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['harness', 'harness.errors']"


#: what runs the jobs: ``pytest --help`` must load none of it (the plugin's schema reads leaves)
ENGINE = ("torch", "harness.agent", "harness.rendezvous", "harness.procs", "harness.timer", "harness.launch",
          "harness.run", "harness.sim.cluster", "harness.sim.job", "harness.sim.nodes", "harness.sim.faults")


def test_pytest_help_loads_no_engine_module(tmp_path):
    """``pytest --help``, with the plugin registered by its entry point (its options list the
    schema's fault kinds, so ``pytest_addoption`` loads ``harness.sim.schema``), loads the
    schema and the leaves it reads (``harness.settings``, ``harness.states``), never the
    agent, the rendezvous, process control, a cluster or torch. Read from ``-X importtime``
    (every module the interpreter imported), run where no conftest is."""
    out = subprocess.run([sys.executable, "-X", "importtime", "-m", "pytest", "--help"], cwd=tmp_path,
                         capture_output=True, text=True, check=True)
    assert "--elastic-chaos" in out.stdout  # the plugin was loaded
    loaded = {line.rsplit("|", 1)[1].strip() for line in out.stderr.splitlines() if line.startswith("import time:")}
    assert sorted(m for m in loaded if m in ENGINE or m.startswith(tuple(f"{e}." for e in ENGINE))) == []
    assert sorted(m for m in loaded if m == "harness" or m.startswith("harness.")) == [
        "harness", "harness.errors", "harness.settings", "harness.sim", "harness.sim.checks", "harness.sim.schema",
        "harness.states"]


def test_marker_is_registered_with_its_signature(pytester):
    from harness.sim.schema import marker_signature

    result = pytester.runpytest_subprocess("--markers")
    result.stdout.fnmatch_lines(["@pytest.mark.elastic(nnodes='1', nproc_per_node=1, max_restarts=3, "
                                 "rdzv_backend='c10d'*): run the test's jobs*"])
    result.stdout.fnmatch_lines([f"@pytest.mark.{marker_signature()}: *"])  # every keyword, from the schema


def test_header_shows_resolved_settings(pytester, monkeypatch):
    monkeypatch.setenv("PYTEST_ELASTIC_TIMEOUT", "33")
    pytester.makeini("[pytest]\nelastic_start_method = spawn\nelastic_timeout = 44\n")
    result = pytester.runpytest_subprocess("--elastic-chaos", "--elastic-seed=7", "--co")
    result.stdout.fnmatch_lines(
        ["elastic: chaos=on seed=7 faults=kill_worker shrink=8 start_method=spawn timeout=33s network=*"])
    result = pytester.runpytest_subprocess("--elastic-timeout=5", "--co")
    result.stdout.fnmatch_lines(["elastic: chaos=off start_method=spawn timeout=5s network=*"])
    from harness.sim.net import resolve_mode  # the header says what "auto" gives here

    assert f"network={resolve_mode('auto')}" in result.stdout.str()


def test_bad_settings_are_usage_errors(pytester):
    result = pytester.runpytest_subprocess("--elastic-faults=kill_worker,meteor")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*unknown fault kind(s) [[]'meteor'[]]; choose from kill_worker, "
                                 "hang_worker, *scale*"])
    result = pytester.runpytest_subprocess('--elastic-schedule=[[{"kind": "add_node", "node": 1}]]')
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--elastic-schedule=*is not valid: job 0 fault 0: "
                                 "kind='add_node' takes no key(s) [[]'node'[]]; its keys: kind, after_healthy*"])


def test_schedule_with_every_trigger_form_is_accepted(pytester):
    """What a shrunk failure prints (chained faults, world-size triggers) replays."""
    schedule = ('[[{"kind":"remove_node","node":1,"at_step":8},{"kind":"add_node","on_world_size":1,'
                '"after_previous":true},{"kind":"hang_worker","node":2,"on_state":"HEALTHY","state_node":2,'
                '"after_previous":true},{"kind":"kill_worker","sig":15,"after_healthy":0.5}]]')
    result = pytester.runpytest_subprocess(f"--elastic-schedule={schedule}", "--elastic-seed=3", "--co")
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED
    result.stdout.fnmatch_lines(["elastic: chaos=on seed=3 * schedule=given *"])


def test_unknown_marker_keyword_names_test_and_keyword(pytester):
    pytester.makepyfile("""
        import pytest
        @pytest.mark.elastic(nnodes=1, nprocs=2)
        def test_x(elastic_cluster):
            pass
        @pytest.mark.elastic(nproc_per_node=0)
        def test_y(elastic_cluster):
            pass
    """)
    result = pytester.runpytest_subprocess()
    result.assert_outcomes(errors=2)  # raised while setting up the fixture
    result.stdout.fnmatch_lines([
        "*test_x*unknown keyword(s) [[]'nprocs'[]]*",
        "*test_y*@pytest.mark.elastic(nproc_per_node=0) is not valid*",
    ])


def test_fixture_runs_a_job_and_records_properties(pytester):
    pytester.makepyfile(f"""
        import pytest
        from harness import WorkerState
        from harness.faults import WorkerKill, OnState

        @pytest.mark.elastic(nnodes=1, nproc_per_node=2, max_restarts=1)
        def test_job(elastic_cluster, record_property):
            job = elastic_cluster.launch({STEPPER!r}, "30", "0.02")
            job.inject(WorkerKill(local_rank=1), OnState(WorkerState.HEALTHY))
            assert job.wait(timeout=60).state == WorkerState.SUCCEEDED
    """)
    result = pytester.runpytest_subprocess("--junitxml=out.xml")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*elastic summary*", "*faults injected: 1, recovered: 1*",
                                 "recovery latency: median * ms*"])
    xml = (pytester.path / "out.xml").read_text()
    assert 'name="elastic_fault_count" value="1"' in xml and 'name="elastic_restarts" value="1"' in xml


def test_sessions_in_one_process_keep_their_own_state(pytester):
    """Session state lives in each session's stash, not in module globals: two sessions run
    one after the other in one process (pytester in-process, as an IDE or a plugin's own
    tests run them) each summarise only their own elastic tests."""
    pytester.makepyfile(f"""
        import pytest
        @pytest.mark.elastic(nnodes=1, nproc_per_node=1)
        def test_job(elastic_cluster):
            elastic_cluster.launch({STEPPER!r}, "2", "0.01").wait(timeout=60)
    """)
    for _ in range(2):
        result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
        result.assert_outcomes(passed=1)
        result.stdout.fnmatch_lines(["elastic tests: 1 (0 failed)*"])


def test_failing_elastic_test_shows_the_timeline_chart(pytester):
    pytester.makepyfile(f"""
        import pytest
        @pytest.mark.elastic(nnodes=1, nproc_per_node=2, max_restarts=0)
        def test_job(elastic_cluster):
            job = elastic_cluster.launch({STEPPER!r}, "3", "0.01")
            job.wait(timeout=60)
            assert False, "user assertion"
    """)
    result = pytester.runpytest_subprocess()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*elastic timeline (job 0*", "*|*i*=*+*|", "legend: *"])


CHAOS_TEST = f"""
import pytest
from harness import WorkerState

@pytest.mark.elastic(nnodes=1, nproc_per_node=2, max_restarts=3)
def test_survives(elastic_cluster):
    job = elastic_cluster.launch({STEPPER!r}, "50", "0.03")
    assert job.wait(timeout=90).state == WorkerState.SUCCEEDED
    print("HISTORY", [e.describe() for e in job.chaos_schedule])

@pytest.mark.elastic(nnodes=1, nproc_per_node=2, max_restarts=1)
def test_too_fragile(elastic_cluster):
    job = elastic_cluster.launch({STEPPER!r}, "50", "0.03")
    job.wait(timeout=90)
    assert job.timeline.faults() == [], "a fault happened"
"""


def test_chaos_same_seed_same_history_and_repro_line(pytester, monkeypatch):
    pytester.makepyfile(CHAOS_TEST)
    monkeypatch.setenv("PYTEST_ELASTIC_SHRINK_BUDGET", "0")  # shrinking: tests/plugin/test_shrink.py
    first, second, other = runpytest_side_by_side(  # side by side: their jobs mostly wait
        pytester, ["--elastic-chaos", "--elastic-seed=11"],
        ["--elastic-chaos", "--elastic-seed=11", "-p", "xdist", "-n", "2"], ["--elastic-chaos", "--elastic-seed=12"])
    first.assert_outcomes(passed=1, failed=1)
    second.assert_outcomes(passed=1, failed=1)
    assert printed_schedule(first) and printed_schedule(first) == printed_schedule(second) != printed_schedule(other)
    first.stdout.fnmatch_lines([
        "*elastic chaos*", "fault schedule:", "  WorkerKill(*",
        "reproduce with:", "  pytest '*test_too_fragile' --elastic-chaos --elastic-seed=11",
    ])


def test_scenario_files_are_collected_and_run(pytester):
    scen = pytester.mkdir("scenarios")
    (scen / "ok.toml").write_text(f"""
[job]
script = {STEPPER!r}
args = ["20", "0.02"]
nnodes = "1"
nproc_per_node = 2
max_restarts = 1
steps = 20

[[fault]]
kind = "kill_worker"
exit_code = 2
at_step = 6
rank = 0

[expect]
state = "SUCCEEDED"
restarts = 1
world_sizes = [2, 2]
""")
    (scen / "wrong.toml").write_text(f"""
[job]
script = {STEPPER!r}
args = ["5", "0.01"]
[expect]
restarts = 3
""")
    (scen / "broken.toml").write_text("[job\n")
    (scen / "typo.toml").write_text("[job]\nscript='x.py'\nnproc=2\n")
    result = pytester.runpytest_subprocess("scenarios", "--continue-on-collection-errors")
    result.assert_outcomes(passed=1, failed=1, errors=2)
    for line in ("*scenario wrong: 0 restart(s), expected 3*", "*broken.toml: not valid TOML*",
                 "*typo.toml: [[]job[]] has unknown key(s) [[]'nproc'[]]*"):
        result.stdout.fnmatch_lines([line])


def test_a_scenario_fault_that_never_fires_fails_it_unless_allowed(pytester):
    scen = pytester.mkdir("scenarios")
    body = f"""
[job]
script = {STEPPER!r}
args = ["4", "0.01"]
nnodes = "1"

[[fault]]
kind = "kill_worker"
at_step = 50
rank = 0
"""
    (scen / "unfired.toml").write_text(body)
    (scen / "allowed.toml").write_text(body + "\n[expect]\nallow_unfired = true\n")
    (scen / "nowhere.toml").write_text(body.replace("rank = 0", "rank = 0\nnode = 3"))
    result = pytester.runpytest_subprocess("scenarios", "-p", "no:randomly")
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines([
        "*scenario nowhere: [[][[]fault[]][]] node=3 names no node of this job: its nodes are 0..0 (nnodes=1:1)*",
        "*scenario unfired: 1 scheduled fault(s) never fired before the job ended: WorkerKill(*) @ "
        "AtStep(step=50, rank=0) never fired: rank 0 reported steps up to 3 only, none >= 50*",
    ])


def test_a_scenario_in_old_spelling_runs_and_warns_once(pytester):
    scen = pytester.mkdir("scenarios")
    (scen / "old.toml").write_text(f"""
[job]
script = {STEPPER!r}
args = ["4", "0.01"]

[[fault]]
kind = "worker_crash"
after = 0.1

[expect]
allow_unfired = true
""")
    result = pytester.runpytest_subprocess("scenarios", "--co", "-p", "no:randomly")
    assert result.ret == pytest.ExitCode.OK
    text = result.stdout.str()
    assert text.count("fault kind 'worker_crash' is deprecated: use 'kill_worker'") == 1, text
    assert text.count("fault spec key 'after' is deprecated: use 'after_healthy'") == 1, text

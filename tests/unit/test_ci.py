"""What CI shows of a session (``pytest_elastic._ci``): annotations, the step summary, the
twin's verdict, the one-line cause; and the ``--lf`` memory (``pytest_elastic._lastfailed``)."""

from __future__ import annotations

import pytest

from pytest_elastic._ci import (
    error_annotations,
    escape_data,
    escape_property,
    github_wanted,
    one_line_cause,
    step_summary,
    twin_verdict,
    write_step_summary,
)
from pytest_elastic._lastfailed import Replay, replay_settings
from pytest_elastic._settings import Settings


def test_github_output_follows_the_flag_then_the_env_then_github_actions():
    assert github_wanted(True, {})
    assert not github_wanted(None, {})
    assert github_wanted(None, {"GITHUB_ACTIONS": "true"})
    assert not github_wanted(None, {"GITHUB_ACTIONS": "true", "PYTEST_ELASTIC_GITHUB": "false"})
    assert github_wanted(None, {"PYTEST_ELASTIC_GITHUB": "1"})
    assert github_wanted(True, {"PYTEST_ELASTIC_GITHUB": "false"})  # the command line wins


def test_workflow_command_escaping():
    assert escape_data("50% done\r\nnext") == "50%25 done%0D%0Anext"
    assert escape_property("a.py::test_x, y") == "a.py%3A%3Atest_x%2C y"


class JobHung(TimeoutError):
    pass


def test_the_cause_is_one_line_named_by_its_type_unless_the_message_says_it():
    assert one_line_cause(JobHung("node 1 rank 3 never exited\n  stack...")) == \
        "JobHung: node 1 rank 3 never exited"
    assert one_line_cause(AssertionError("rank 1 was hit\nassert [...]")) == "AssertionError: rank 1 was hit"
    failed = pytest.fail.Exception("job 0: diverged from the fault-free twin at rank 0, step 3: ...\n  hint")
    assert one_line_cause(failed) == "job 0: diverged from the fault-free twin at rank 0, step 3: ..."
    assert one_line_cause(RuntimeError()) == "RuntimeError"
    assert len(one_line_cause(ValueError("x" * 5000))) == 400


def test_twin_verdict_from_each_jobs_last_golden_event():
    same = {"diverged": False, "first": None}
    at = {"diverged": True, "first": [1, 3, 0.5, 0.25]}
    digest = {"diverged": True, "first": None}
    assert twin_verdict([]) == "not compared"
    assert twin_verdict([[]]) == "not compared"
    assert twin_verdict([[same]]) == "same"
    assert twin_verdict([[same, at]]) == "diverged at rank 1 step 3"
    assert twin_verdict([[digest]]) == "diverged: final state differs"
    assert twin_verdict([[same], [same]]) == "same"
    assert twin_verdict([[same], [at]]) == "job 0: same; job 1: diverged at rank 1 step 3"


STATS = [
    {"elastic_test": "t.py::test_ok", "elastic_outcome": "passed", "elastic_fault_count": 2,
     "elastic_resume_latencies": [0.1, 0.3], "elastic_productive_s": 3.0, "elastic_wall_s": 4.0,
     "elastic_twin": "same", "elastic_where": "t.py:4", "elastic_replay": "pytest 't.py::test_ok'"},
    {"elastic_test": "t.py::test_bad", "elastic_outcome": "failed", "elastic_fault_count": 1,
     "elastic_resume_latencies": [0.2], "elastic_productive_s": 1.0, "elastic_wall_s": 4.0,
     "elastic_twin": "diverged at rank 0 step 3", "elastic_where": "t.py:9",
     "elastic_cause": "job 0: diverged | at 100%", "elastic_replay": "pytest 't.py::test_bad' --elastic-chaos"},
    {"elastic_test": "scenarios/x.toml::x", "elastic_outcome": "failed", "elastic_where": "scenarios/x.toml:17"},
]


def test_one_error_annotation_per_failed_test_at_its_place():
    assert error_annotations(STATS) == [
        "::error file=t.py,line=9,title=elastic%3A t.py%3A%3Atest_bad::job 0: diverged | at 100%25",
        "::error file=scenarios/x.toml,line=17,title=elastic%3A scenarios/x.toml%3A%3Ax::"
        "failed (see the test's log)",
    ]


def test_step_summary_has_the_figures_the_divergences_and_each_failures_replay(tmp_path):
    text = step_summary(STATS)
    assert "| 3 | 2 | 3 | 200 ms | 300 ms | 0.50 | 2 | 1 |" in text
    assert "| `t.py::test_bad` | diverged at rank 0 step 3 | failed |" in text
    assert "**Failed:** `t.py::test_bad`: job 0: diverged \\| at 100%" in text
    assert "```\npytest 't.py::test_bad' --elastic-chaos\n```" in text
    path = tmp_path / "summary.md"
    path.write_text("earlier step\n")
    assert write_step_summary(STATS, {"GITHUB_STEP_SUMMARY": str(path)}) == str(path)
    assert path.read_text() == "earlier step\n" + text  # appended, as GitHub wants
    assert write_step_summary(STATS, {}) is None


def test_a_replay_entry_is_validated_and_runs_chaos_with_its_schedule_unshrunk():
    schedule = '[[{"kind":"kill_worker","local_rank":1,"after_healthy":0.3}]]'
    entry = Replay.from_json({"seed": 11, "faults": "kill_worker", "overload": False, "schedule": schedule})
    assert entry is not None
    settings = replay_settings(Settings(seed=5, shrink_budget=8), entry)
    assert (settings.chaos, settings.seed, settings.seed_given, settings.schedule, settings.shrink_budget) == \
        (True, 11, True, schedule, 0)
    for bad in (None, [], {"seed": "x"}, {"seed": 1, "faults": "", "overload": False, "schedule": "not json"},
                {"seed": 1, "faults": "", "overload": False, "schedule": '[[{"kind":"nope"}]]'}):
        assert Replay.from_json(bad) is None

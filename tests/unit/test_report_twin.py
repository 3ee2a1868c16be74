"""The twin section's view model from hand-made step events: the real oracle
(``harness.sim.truth.golden``) makes the ``golden`` event, the report reads it back; no browser."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET

import pytest

from harness.sim.truth.golden import HINT, RESHARD_RTOL, compare, event_fields, record_of
from pytest_elastic.report.twin import NOT_COMPARED, Resume, combine_verdicts, twin_summary, twin_view
from pytest_elastic.report.twin_svg import render_twin


def loss(rank: int, step: int) -> float:
    return 1.0 / (step + 2) + rank * 0.01


def steps(ranks, first, last, attempt, pid0, t0, off=None, digest=None):
    """Step events of one attempt: ``off(rank, step)`` added to the right loss."""
    out = []
    for step in range(first, last + 1):
        for rank in ranks:
            e = {"kind": "step", "mono": t0 + step * 0.1 + rank * 0.01, "node": 0, "pid": pid0 + rank,
                 "run_id": "r", "rank": rank, "step": step, "attempt": attempt, "restart_count": attempt,
                 "loss": loss(rank, step) + (off(rank, step) if off else 0.0)}
            if digest and step == last:
                e["digest"] = digest(rank)
            out.append(e)
    return out


def golden(run_steps, twin_steps, run_sizes=(2, 2), twin_sizes=(2,), **kwargs):
    """The ``golden`` event ``Job.compare_golden`` writes, through JSON as the event stream has it."""
    run, twin = record_of(run_steps, run_sizes), record_of(twin_steps, twin_sizes)
    diff = compare(run, twin, **kwargs)
    fields = event_fields(diff, run, twin)
    return diff, json.loads(json.dumps({"kind": "golden", "mono": 99.0, "node": "harness", "cached": False,
                                        **fields}))


TWIN = steps([0, 1], 0, 9, 0, 500, 0.0, digest=lambda r: "a" * 64)
#: attempt 0 reached step 5; the crash; attempt 1 resumed from the step-4 checkpoint and redid 4, 5
CLEAN = steps([0, 1], 0, 5, 0, 10, 0.0) + steps([0, 1], 4, 9, 1, 20, 5.0, digest=lambda r: "a" * 64)


def diverging(off_from: int = 6):
    bad = steps([0, 1], 4, 9, 1, 20, 5.0, off=lambda r, s: 1e-3 if (r, s) >= (0, off_from) and r == 0 else 0.0,
                digest=lambda r: "b" * 64 if r == 0 else "a" * 64)
    return steps([0, 1], 0, 5, 0, 10, 0.0) + bad


def test_the_event_keeps_its_old_fields_and_adds_what_the_page_draws():
    diff, event = golden(diverging(), TWIN)
    assert {"diverged", "first", "cached", "steps_compared", "rtol", "note"} <= set(event)  # as it always had
    assert event["diverged"] and event["first"][:2] == [0, 6] and event["steps_compared"] == diff.steps_compared
    assert (event["attempt"], event["resumed_at"], event["world_size_changed"]) == (1, 4, False)
    assert event["twin_losses_total"] == len(event["twin_losses"]) == 20
    assert event["digests"] == {"run": {"0": "b" * 64, "1": "a" * 64}, "twin": {"0": "a" * 64, "1": "a" * 64}}
    assert event["world_sizes"] == {"run": [2, 2], "twin": [2]}


def test_the_twins_losses_are_thinned_to_the_cap_and_keep_the_divergence():
    long_twin = steps([0, 1, 2], 0, 4999, 0, 500, 0.0)
    run = steps([0, 1, 2], 0, 4999, 0, 10, 0.0, off=lambda r, s: 1.0 if (r, s) == (2, 4321) else 0.0)
    run_record, twin_record = record_of(run, [3]), record_of(long_twin, [3])
    diff = compare(run_record, twin_record)
    fields = event_fields(diff, run_record, twin_record, cap=100)
    kept = {(r, s) for r, s, _ in fields["twin_losses"]}
    assert len(kept) <= 101 and (2, 4321) in kept and fields["twin_losses_total"] == 15000
    assert {r for r, _ in kept} == {0, 1, 2}  # each rank keeps its share
    assert len(json.dumps(event_fields(diff, run_record, twin_record))) < 200_000  # the default cap: one line


def test_a_diverging_run_marks_its_first_step_resumes_redone_steps_and_differences():
    diff, event = golden(diverging(), TWIN)
    view = twin_view([*diverging(), event])
    assert view is not None and view.diverged and view.verdict == "diverged at rank 0 step 6"
    first = view.first
    assert first is not None and (first.rank, first.step) == (0, 6) and first.expected == loss(0, 6)
    assert first.got == pytest.approx(loss(0, 6) + 1e-3) and first.rel_diff == pytest.approx(1e-3 / loss(0, 6))
    assert "rank 0, step 6" in view.headline and "relative difference" in view.headline
    assert view.tolerance == "bitwise" and view.hint == HINT
    rank0, rank1 = view.ranks
    assert [a.attempt for a in rank0.attempts] == [0, 1] and [a.first_step for a in rank0.attempts] == [0, 4]
    assert rank0.resumes == [Resume(step=4, index=1, restart_count=1, redone_to=5)]
    assert rank0.differs == [6, 7, 8, 9] and rank1.differs == [] and rank1.first is None
    assert rank0.first == first and len(rank0.twin) == 10
    assert [(d.rank, d.verdict) for d in view.digests] == [(0, "differ"), (1, "equal")]
    passed = twin_view([*diverging(), event], test_passed=True)  # a test that passed expected it
    assert not view.expected and passed is not None and passed.expected


def test_a_clean_run_says_it_is_the_same_as_its_twin():
    diff, event = golden(CLEAN, TWIN)
    assert not diff.diverged
    view = twin_view([*CLEAN, event], test_passed=True)
    assert view is not None and not view.diverged and not view.expected and view.verdict == "same"
    assert view.headline == "same as its fault-free twin: 20 (rank, step) losses compared, bitwise"
    assert all(r.differs == [] for r in view.ranks) and [d.verdict for d in view.digests] == ["equal", "equal"]


def test_a_changed_world_size_is_compared_with_rtol_and_says_why():
    # world 2 -> 1 after step 5: rank 1 is gone, rank 0 goes on with sums in another order
    shrunk = steps([0, 1], 0, 5, 0, 10, 0.0) + steps([0], 4, 9, 0, 30, 5.0, off=lambda r, s: loss(r, s) * 1e-7,
                                                       digest=lambda r: "c" * 64)
    diff, event = golden(shrunk, TWIN, run_sizes=(2, 1))
    view = twin_view([*shrunk, event])
    assert view is not None and not view.diverged and diff.world_size_changed
    assert view.headline.endswith(f"losses compared, with rtol={RESHARD_RTOL:g}") and view.tolerance == "rtol=0.0001"
    assert "world size changed" in view.why
    assert view.digests[0].verdict.startswith("not compared: the world size changed")
    assert view.digests[1].verdict == "only the twin has one"
    assert view.ranks[0].resumes == [Resume(step=4, index=1, restart_count=0, redone_to=5)]  # a new process, same count


def test_a_job_without_a_twin_has_no_view_and_an_old_event_still_gives_the_verdict():
    assert twin_view(CLEAN) is None
    assert twin_summary(None) == {"verdict": NOT_COMPARED, "diverged": None}
    old = {"kind": "golden", "diverged": True, "first": [1, 3, 0.5, 0.25], "cached": True, "steps_compared": 7,
           "rtol": 0.0, "note": ""}
    view = twin_view([*CLEAN, old])
    assert view is not None and view.verdict == "diverged at rank 1 step 3" and view.twin_total == 0
    assert view.first is not None and view.first.rel_diff == 1.0 and view.cached
    assert all(r.twin == [] and r.attempts for r in view.ranks)  # the run's own curves still drawn
    assert "older harness" in render_twin(view)


def test_the_divergent_rank_is_drawn_whatever_the_cap_on_ranks():
    ranks = list(range(10))
    twin = steps(ranks, 0, 3, 0, 500, 0.0)
    run = steps(ranks, 0, 3, 0, 10, 0.0, off=lambda r, s: 0.5 if (r, s) == (9, 2) else 0.0)
    _, event = golden(run, twin, run_sizes=(10,), twin_sizes=(10,))
    view = twin_view([*run, event], max_ranks=4)
    assert view is not None and [r.rank for r in view.ranks] == [0, 1, 2, 9] and view.hidden_ranks == [3, 4, 5, 6, 7, 8]
    assert view.ranks[-1].first is not None and "6 more rank(s) not drawn" in render_twin(view)


def _svgs(section: str) -> dict[str, ET.Element]:
    charts = re.finditer(r'<svg xmlns="[^"]*" class="twin-chart".*?</svg>', section, re.S)
    return {e.get("id", ""): e for e in (ET.fromstring(m.group(0)) for m in charts)}


def _cls(root: ET.Element, cls: str) -> list[ET.Element]:
    return [e for e in root.iter() if cls in (e.get("class") or "").split()]


def test_the_section_draws_both_curves_the_resume_and_the_divergence_as_valid_svg():
    _, event = golden(diverging(), TWIN)
    view = twin_view([*diverging(), event], test_passed=True)
    assert view is not None
    section = render_twin(view)
    svgs = _svgs(section)  # XML-parsed: a malformed drawing fails here
    assert set(svgs) == {"twin-rank-0", "twin-rank-1"}
    rank0 = svgs["twin-rank-0"]
    (mark,) = _cls(rank0, "divergence")
    assert (mark.get("data-rank"), mark.get("data-step")) == ("0", "6")
    assert _cls(mark, "got") and _cls(mark, "expected")
    label = "".join(_cls(mark, "divergence-label")[0].itertext())
    assert "step 6" in label and "rel. diff" in label
    assert len(_cls(rank0, "twin-curve")) == 1
    curves = [(c.get("data-attempt"), c.get("data-restart")) for c in _cls(rank0, "run-curve")]
    assert curves == [("0", "0"), ("1", "1")]
    (resume,) = _cls(rank0, "resume")
    assert resume.get("data-step") == "4" and _cls(resume, "redone")
    assert _cls(rank0, "differs") and not _cls(svgs["twin-rank-1"], "divergence")
    assert "caught as expected" in section and "hint: " in section and "tolerance: bitwise" in section


def test_a_tests_verdict_is_its_first_divergent_jobs_else_same_else_not_compared():
    same = {"verdict": "same", "diverged": False}
    bad = {"verdict": "diverged at rank 1 step 4", "diverged": True, "expected": True}
    assert combine_verdicts([]) == {"verdict": NOT_COMPARED, "diverged": None, "order": 0}
    assert combine_verdicts([{"verdict": NOT_COMPARED, "diverged": None}, same])["verdict"] == "same"
    assert combine_verdicts([same, bad]) == {"verdict": "diverged at rank 1 step 4 (job 1), as expected",
                                             "diverged": True, "order": 2}

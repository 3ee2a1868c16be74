"""The fault-free twin's oracle on hand-made step events: it must be able to fail."""

from __future__ import annotations

from harness.sim.truth.golden import RESHARD_RTOL, GoldenRecord, compare, record_of


def steps(losses, rank=0, attempt=0, start=0, digest=None):
    events = [{"kind": "step", "rank": rank, "step": start + i, "loss": v, "attempt": attempt}
              for i, v in enumerate(losses)]
    if digest:
        events[-1]["digest"] = digest
    return events


TWIN = record_of([*steps([1.0, 0.8, 0.6, 0.5, 0.4], rank=0, digest="a" * 64),
                  *steps([1.0, 0.8, 0.6, 0.5, 0.4], rank=1, digest="a" * 64)], [2])


def test_a_resume_that_redid_steps_right_is_the_same():
    # attempt 0 got to step 3, crashed; attempt 1 resumed at step 2 (its checkpoint) and redid 2, 3
    run = record_of([*steps([1.0, 0.8, 0.6, 0.55], rank=0), *steps([1.0, 0.8, 0.6, 0.55], rank=1),
                     *steps([0.6, 0.5, 0.4], rank=0, attempt=1, start=2, digest="a" * 64),
                     *steps([0.6, 0.5, 0.4], rank=1, attempt=1, start=2, digest="a" * 64)], [2, 2])
    diff = compare(run, TWIN)
    assert not diff.diverged and diff.first is None
    assert diff.steps_compared == 10 and diff.digests_compared == 2 and diff.rtol == 0.0
    assert "same as the fault-free twin: 10 (rank, step) losses and 2 final digests" in diff.explain()


def test_one_ulp_off_is_a_divergence_and_says_where_and_which_resume():
    off = 0.5 + 2 ** -53
    run = record_of([*steps([1.0, 0.8]), *steps([1.0, 0.8], rank=1),
                     *steps([0.6, off, 0.4], attempt=1, start=2), *steps([0.6, 0.5, 0.4], rank=1, attempt=1, start=2)],
                    [2, 2])
    diff = compare(run, TWIN)
    assert diff.diverged and diff.first == (0, 3, off, 0.5)
    assert (diff.attempt, diff.resumed_at) == (1, 2)
    text = diff.explain()
    assert "rank 0, step 3" in text and "attempt 1, which resumed at step 2" in text and "hint:" in text
    assert not compare(run, TWIN, rtol=1e-9).diverged


def test_a_missing_step_and_a_different_final_state_diverge():
    run = record_of([*steps([1.0, 0.8, 0.6, 0.5]), *steps([1.0, 0.8, 0.6, 0.5, 0.4], rank=1)], [2])
    assert compare(run, TWIN).first == (0, 4, None, 0.4)
    same_losses = record_of([*steps([1.0, 0.8, 0.6, 0.5, 0.4], digest="b" * 64),
                             *steps([1.0, 0.8, 0.6, 0.5, 0.4], rank=1, digest="a" * 64)], [2])
    diff = compare(same_losses, TWIN)
    assert diff.diverged and diff.first is None and diff.digest_mismatch == (0, "b" * 64, "a" * 64)
    assert "final state differs" in diff.explain()


def test_a_scale_down_is_compared_with_a_tolerance_and_says_so():
    # world 2 -> 1 after step 2: rank 1 is gone, rank 0 goes on with sums in another order
    run = record_of([*steps([1.0, 0.8, 0.6]), *steps([1.0, 0.8, 0.6], rank=1),
                     *steps([0.6, 0.5 * (1 + 1e-7), 0.4], attempt=1, start=2, digest="c" * 64)], [2, 1])
    diff = compare(run, TWIN)
    assert not diff.diverged and diff.world_size_changed and diff.rtol == RESHARD_RTOL
    assert diff.digests_compared == 0 and "world size changed ([2, 1])" in diff.note
    assert compare(run, TWIN, rtol=1e-9).diverged
    assert compare(run, TWIN, rtol=0.0).diverged and compare(run, TWIN, rtol=0.0).rtol == 0.0  # given: as given


def test_no_losses_cannot_pass():
    diff = compare(record_of([{"kind": "step", "rank": 0, "step": 0}]), GoldenRecord({}))
    assert diff.diverged and "does the script call harness.report_step(step, loss=...)" in diff.note


def test_a_record_round_trips_through_json():
    assert GoldenRecord.from_json(TWIN.to_json()) == TWIN

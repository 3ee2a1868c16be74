"""Why a trigger never fired, as ``Job.wait`` says it: the reason must fit what the job did."""

from __future__ import annotations

import time
from types import SimpleNamespace

from harness.events import EventWriter
from harness.faults import AtStep
from harness.sim.truth.timeline import Timeline


def test_a_step_trigger_armed_after_its_step_says_so(tmp_path):
    """A heal chained to a straggler that fired late (after step 49 of 50) was reported as
    'rank 0 reported no step >= 30' of a job that did all 50: it was armed too late."""
    path = tmp_path / "events.jsonl"
    writer = EventWriter(str(path), 0, "run")
    try:
        for step in range(50):
            writer.emit("step", step=step, rank=0)
        job = SimpleNamespace(timeline=Timeline(str(path)))
        armed_at = time.monotonic() + 1.0
        assert AtStep(step=30, rank=0).never_met(job, armed_at) == (
            "rank 0 reached step 30 before this trigger was armed (the fault before it fired late, after step "
            "49), and reported no step after")
        # it reported steps, just none since the trigger was armed: no hint at report_step
        assert AtStep(step=60, rank=0).never_met(job, armed_at) == (
            "rank 0 reported no step after this trigger was armed (its last, step 49, came before)")
        assert AtStep(step=60, rank=1).never_met(job, armed_at) == (
            "rank 1 reported no step >= 60 — does the script call harness.report_step?")
    finally:
        writer.close()

"""Training truth end to end: a real DCP trainer, a real crash, a real fault-free twin.

The oracle must be able to fail: the same crash with a trainer that forgets its optimizer
state on resume finishes SUCCEEDED with a plausible loss, and only the twin shows it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import Cluster, WorkerState
from harness.faults import AtStep, WorkerKill

pytest.importorskip("numpy", reason="torch.distributed.checkpoint needs numpy (the test extra installs it)")

TRAINER = str(Path(__file__).resolve().parents[2] / "scenarios" / "training" / "train.py")
ARGS = ("--steps", "10", "--ckpt-every", "3", "--ckpt-dir", "{shared}/ckpt")


@pytest.fixture(scope="module")
def twin(tmp_path_factory, warm_pool):
    """One fault-free run, cached under the key its faulted siblings' twins have: the tests
    then pay for one twin, and the first test proves compare_golden reuses it."""
    import json

    from harness.sim.truth.twin import job_record, twin_key

    cache = tmp_path_factory.mktemp("golden")
    with Cluster(pool=warm_pool, nnodes=1, nproc_per_node=2, max_restarts=1, golden=True) as cluster:
        job = cluster.launch(TRAINER, *ARGS)
        assert job.wait(timeout=180).state == WorkerState.SUCCEEDED
        record = job_record(job)
        (cache / f"{twin_key(job)}.json").write_text(json.dumps(record.to_json()))
    return str(cache), record


def _crashed_run(cluster: Cluster, *extra: str):
    job = cluster.launch(TRAINER, *ARGS, *extra)
    job.inject(WorkerKill(node=0, local_rank=1), AtStep(step=7, rank=1))  # after the step-6 checkpoint
    result = job.wait(timeout=180)
    assert result.state == WorkerState.SUCCEEDED
    return job


@pytest.mark.timeout(300)
def test_a_right_resume_is_its_fault_free_twin_and_says_what_the_fault_cost(twin, warm_pool):
    cache, _ = twin
    with Cluster(pool=warm_pool, nnodes=1, nproc_per_node=2, max_restarts=1, golden=True) as cluster:
        job = _crashed_run(cluster)
        assert job.shared_dir.startswith(job.directory) and (Path(job.shared_dir) / "ckpt" / "latest").exists()
        diff = job.compare_golden(cache_dir=cache)
        assert [e["cached"] for e in job.timeline.events("golden")] == [True]  # the fixture's twin
        assert not diff.diverged, diff.explain()
        assert diff.rtol == 0.0 and diff.steps_compared == 20 and diff.digests_compared == 2
        [fault] = job.timeline.faults()
        assert fault.resume_latency is not None and fault.resume_latency > 0
        assert set(fault.lost) == {"detection", "recovery", "startup", "wasted"}
        assert sum(fault.lost[k] for k in ("detection", "recovery", "startup")) == pytest.approx(fault.resume_latency)
        assert fault.lost["wasted"] > 0  # step 6 was redone from the step-6 checkpoint
        redone = [e for e in job.timeline.steps(rank=0) if e["step"] == 6]
        assert [e["attempt"] for e in redone] == [0, 1] and all("round" in e for e in redone)
        g = job.goodput()
        assert 0 < g.ratio < 1 and g.faults == 1 and g.wall_s == pytest.approx(g.productive_s + sum(g.badput.values()))


@pytest.mark.timeout(300)
def test_a_resume_that_forgets_the_optimizer_is_caught(twin, warm_pool):
    from harness.sim.truth.golden import compare
    from harness.sim.truth.twin import job_record

    _, record = twin  # the twin of a --forget run is the plain run: forgetting matters only on resume
    with Cluster(pool=warm_pool, nnodes=1, nproc_per_node=2, max_restarts=1, golden=True) as cluster:
        job = _crashed_run(cluster, "--forget", "optimizer")
        diff = compare(job_record(job), record)
        assert diff.diverged and diff.first is not None
        rank, step, got, expected = diff.first
        assert step == 7 and got != expected  # the first step after the resume that used Adam's moments
        assert diff.attempt == 1 and diff.resumed_at == 6
        assert "optimizer" in diff.explain()

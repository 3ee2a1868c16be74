"""``@pytest.mark.elastic(golden=True)`` and ``--elastic-project`` end to end, as a user runs them."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("numpy", reason="torch.distributed.checkpoint needs numpy (the test extra installs it)")

TRAINER = str(Path(__file__).resolve().parents[2] / "scenarios" / "training" / "train.py")

TESTS = f'''
import pytest
from harness import WorkerState
from harness.faults import AtStep, WorkerKill

def _run(cluster, *extra):
    job = cluster.launch({TRAINER!r}, "--steps", "8", "--ckpt-every", "3", "--ckpt-dir", "{{shared}}/ckpt", *extra)
    job.inject(WorkerKill(node=0, local_rank=1), AtStep(step=4, rank=1))
    assert job.wait(timeout=120).state == WorkerState.SUCCEEDED

@pytest.mark.elastic(nnodes=1, nproc_per_node=2, max_restarts=1, golden=True)
def test_right(elastic_cluster):
    _run(elastic_cluster)

@pytest.mark.elastic(nnodes=1, nproc_per_node=2, max_restarts=1, golden=True)
def test_forgets_rng(elastic_cluster):
    _run(elastic_cluster, "--forget", "rng")
'''


@pytest.mark.timeout(400)
def test_golden_marker_fails_the_run_that_diverges_and_projects_the_session(pytester):
    pytester.makepyfile(test_train=TESTS)
    result = pytester.runpytest_subprocess("-p", "no:randomly", "--elastic-project=nodes=1024,mtbf=meta-rsc")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([
        "*_ test_forgets_rng _*",
        "job 0: diverged from the fault-free twin at rank *, step 3: loss * (twin: *), rtol=0*",
        "*reported by attempt 1, which resumed at step 3*",
        "*hint: *the RNG*",
    ])
    result.stdout.fnmatch_lines(["elastic tests: 2 (1 failed)*", "training resumed latency: median * ms*",
                                 "goodput 0.* trained); lost *",
                                 "projected: at 1024 nodes (MTBF 1.00 h, restart *checkpoint *): effective training "
                                 "time ratio 0.* (Young/Daly: * s)"])
    # the twins were cached in pytest's cache dir: a second session runs none
    assert len(list(pytester.path.glob(".pytest_cache/d/elastic-golden/*.json"))) == 2

"""The job in the README's report screenshot (``docs/report.png``): a real chaos run.

    pytest docs/report_demo.py --elastic-chaos --elastic-seed=11 --elastic-report=report
    chromium --headless --no-sandbox --window-size=1400,940 --screenshot=docs/report.png \\
        report/docs_report_demo.py_test_training_under_chaos.job0.html

Chaos adds seeded worker crashes at the start; the test adds a worker crash, a lost node
and a lost agent at later steps so the picture has something at every scale.
"""

from pathlib import Path

import pytest

from harness import WorkerState
from harness.faults import AgentKill, AtStep, NodeKill, WorkerKill

STEPPER = str(Path(__file__).resolve().parent.parent / "tests" / "scripts" / "stepper.py")


@pytest.mark.elastic(nnodes="2:4", nproc_per_node=2, max_restarts=4)
def test_training_under_chaos(elastic_cluster):
    job = elastic_cluster.launch(STEPPER, "300", "0.03")
    job.inject(WorkerKill(node=1, local_rank=0), AtStep(step=90, rank=0))
    job.inject(NodeKill(node=3), AtStep(step=160, rank=0))
    job.inject(AgentKill(node=2), AtStep(step=230, rank=0))
    assert job.wait(timeout=120).state == WorkerState.SUCCEEDED

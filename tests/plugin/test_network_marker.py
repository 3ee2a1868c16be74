"""Network faults under pytest: a test that needs network namespaces where they cannot be
made is skipped with the reason, not failed; where they can, the fault really applies."""

from __future__ import annotations

from tests.conftest import SCRIPTS

STEPPER = str(SCRIPTS / "stepper.py")

TESTS = f"""
import pytest
from harness import WorkerState

@pytest.mark.elastic(nnodes=2, nproc_per_node=1, network="loopback")
def test_partition_in_loopback(elastic_cluster):
    job = elastic_cluster.launch({STEPPER!r}, "3", "0.01")
    job.partition(node=1, peers="store")

@pytest.mark.elastic(nnodes=1, nproc_per_node=1, network="loopback")
def test_plain_errors_still_fail(elastic_cluster):
    raise ValueError("not a network problem")
"""


def test_network_fault_in_loopback_mode_is_a_skip_naming_what_is_missing(pytester):
    pytester.makepyfile(TESTS)
    result = pytester.runpytest_subprocess("-rs")
    result.assert_outcomes(skipped=1, failed=1)
    result.stdout.fnmatch_lines(["*SKIPPED*has no partition fault: it needs network=?netns?*"])

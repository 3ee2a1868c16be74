"""The runtime under partition, through the harness (real namespaces, real agents): a node
cut off from the store fences itself while the others go on without it, and rejoins when
healed; symmetric and one-way cuts end the same way."""

from __future__ import annotations

import pytest

from harness import Cluster, WorkerState
from tests.conftest import SCRIPTS

STEPPER = str(SCRIPTS / "stepper.py")


def _wait_world(job, size: int, since: int) -> None:
    job.bus.wait_until(lambda: len(job.timeline.world_sizes()) > since
                       and job.timeline.world_sizes()[-1] == size, 60)
    assert job.timeline.world_sizes()[-1] == size, job.timeline.format()


@pytest.mark.parametrize("direction", ["both", "in", "out"])
def test_a_node_cut_off_from_the_store_fences_and_rejoins(needs_netns, direction, warm_pool):
    with Cluster(pool=warm_pool, nnodes="1:2", nproc_per_node=1, max_restarts=0, network="netns") as cluster:
        job = cluster.launch(STEPPER, "100000", "0.05")
        job.wait_for_state(WorkerState.HEALTHY, timeout=60)
        rounds = len(job.timeline.world_sizes())
        job.partition(node=1, peers="store", direction=direction)
        _wait_world(job, 1, rounds)  # node 0 goes on alone
        job.bus.wait_until(lambda: bool(job.timeline.events("fenced", node=1)), 30)
        assert job.timeline.events("fenced", node=1), job.timeline.format()
        assert not job.timeline.events("fenced", node=0)
        rounds = len(job.timeline.world_sizes())
        job.heal(node=1)
        _wait_world(job, 2, rounds)  # node 1 is back: a scale up, no restart used
        assert job.timeline.events("unfenced", node=1)
        assert max(job.timeline.restart_counts().values()) == 0
        # the invariants (no split brain, the cut-off node stopped its workers in time) are
        # checked when the cluster closes

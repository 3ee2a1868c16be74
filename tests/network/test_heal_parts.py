"""``job.heal()`` is the one call that ends every lasting fault: it asks each part in
``job.lasting`` (the network, resources and storage parts) to end its faults and
records one ``heal`` event naming all that ended (real namespaces, real agents)."""

from __future__ import annotations

from harness import Cluster, WorkerState
from harness.sim.faults.target import Ended
from tests.conftest import SCRIPTS


class _LastingStandIn:
    """A part whose fault lasts until healed, with detail for the heal event (as
    ``job.storage``'s): it remembers the heals asked of it."""

    def __init__(self) -> None:
        self.asked: list[int | None] = []

    def end_lasting(self, node: int | None) -> Ended:
        self.asked.append(node)
        return Ended(["disk_full"], {"stand_in": {"node7": ["disk_full"]}})

    def open_faults(self) -> dict[int, list[str]]:
        return {}


def test_heal_ends_the_faults_of_every_lasting_part_in_one_event(needs_netns, warm_pool):
    with Cluster(pool=warm_pool, nnodes="1:2", nproc_per_node=1, max_restarts=0, network="netns") as cluster:
        job = cluster.launch(str(SCRIPTS / "sleeper.py"))
        job.wait_for_state(WorkerState.HEALTHY, timeout=60)
        stand_in = _LastingStandIn()
        job.lasting.append(stand_in)
        job.partition(node=1, peers=[0])
        assert job.network.open_faults() == {1: ["partition"]}
        job.heal(node=1)
        assert stand_in.asked == [1]
        assert job.network.open_faults() == {}
        heals = job.timeline.events("heal")
        assert [(h.get("target_node"), h["healed"]) for h in heals] == [(1, ["disk_full", "partition/packet_loss"])]
        assert heals[0]["stand_in"] == {"node7": ["disk_full"]}

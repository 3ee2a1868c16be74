"""GPU slicing for simulated nodes, with an injected device count (no GPU needed):
disjoint ``CUDA_VISIBLE_DEVICES`` slices per node, NCCL only when every worker has a
device of its own, detection without importing torch."""

from __future__ import annotations

import os
import stat

import pytest

from harness import Cluster, WorkerState
from harness.errors import ConfigError
from harness.faults import NodeKill, OnState
from harness.sim.nodes.gpus import GpuPlan, detect_gpus
from tests.conftest import SCRIPTS


def visible_devices() -> str | None:
    """A worker entrypoint: what CUDA would see."""
    return os.environ.get("CUDA_VISIBLE_DEVICES")


def _slots(plan: GpuPlan) -> list[tuple[str, ...]]:
    return [plan.slot(i) for i in range(plan.max_nodes)]


@pytest.mark.parametrize("count, nodes, nproc, slots, backend", [
    (8, 2, 2, [("0", "1"), ("2", "3")], "nccl"),           # spare devices stay unused
    (4, 2, 2, [("0", "1"), ("2", "3")], "nccl"),           # one device per worker
    (3, 2, 2, [("0",), ("1",)], "gloo"),                   # disjoint, workers share one
    (4, 4, 1, [("0",), ("1",), ("2",), ("3",)], "nccl"),
    (2, 3, 1, [("0",), ("1",), ("0",)], "gloo"),           # fewer devices than nodes: shared
    (0, 2, 2, [(), ()], "gloo"),                           # no GPU
])
def test_slices_and_backend(count, nodes, nproc, slots, backend):
    plan = GpuPlan.resolve(count, nodes, nproc)
    assert _slots(plan) == slots
    assert plan.backend == backend
    if count >= nodes:  # disjoint whenever every node can have a device of its own
        used = [d for s in slots for d in s]
        assert len(used) == len(set(used))


def test_ids_are_sliced_as_given():
    plan = GpuPlan.resolve(["3", "5", "7", "9"], 2, 2)
    assert _slots(plan) == [("3", "5"), ("7", "9")] and plan.backend == "nccl"
    with pytest.raises(IndexError, match="slot 2 is not in 0..1"):
        plan.slot(2)


@pytest.mark.parametrize("bad", [-1, True, "4", 2.0])
def test_bad_gpu_counts_are_config_errors(bad):
    with pytest.raises(ConfigError, match="gpus="):
        GpuPlan.resolve(bad, 2, 1)


def test_detect_from_cuda_visible_devices_as_cuda_reads_it(tmp_path):
    assert detect_gpus({"CUDA_VISIBLE_DEVICES": "2,0"}) == ("2", "0")
    assert detect_gpus({"CUDA_VISIBLE_DEVICES": "0,1,-1,3"}) == ("0", "1")  # cut at invalid
    assert detect_gpus({"CUDA_VISIBLE_DEVICES": ""}) == ()
    assert detect_gpus({"CUDA_VISIBLE_DEVICES": "GPU-aaaa,GPU-bbbb"}) == ("GPU-aaaa", "GPU-bbbb")


def test_detect_from_the_driver_then_nvidia_smi(tmp_path, monkeypatch):
    proc = tmp_path / "gpus"
    proc.mkdir()
    for bus in ("0000:01:00.0", "0000:02:00.0", "0000:03:00.0"):
        (proc / bus).mkdir()
    assert detect_gpus({}, proc_dir=str(proc), smi=None) == ("0", "1", "2")
    missing = str(tmp_path / "no-driver")
    assert detect_gpus({}, proc_dir=missing, smi=None) == ()
    smi = tmp_path / "bin" / "fake-smi"
    smi.parent.mkdir()
    smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 (UUID: GPU-1)'\n"
                   "echo 'GPU 1: NVIDIA H100 (UUID: GPU-2)'\n")
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{smi.parent}{os.pathsep}{os.environ['PATH']}")
    assert detect_gpus({}, proc_dir=missing, smi="fake-smi") == ("0", "1")
    assert detect_gpus({}, proc_dir=missing, smi="no-such-smi") == ()


def test_cluster_detects_without_torch_and_honours_its_env(warm_pool):
    cluster = Cluster(pool=warm_pool, nnodes=2, nproc_per_node=1, env={"CUDA_VISIBLE_DEVICES": "4,6"})
    try:
        assert cluster.gpus_for(0) == ("4",) and cluster.gpus_for(1) == ("6",)
        assert cluster.backend == "nccl"
    finally:
        cluster.close()


def test_nodes_get_disjoint_slices_in_their_workers_env(warm_pool):
    with Cluster(pool=warm_pool, nnodes=2, nproc_per_node=2, gpus=4, max_restarts=0) as cluster:
        assert cluster.backend == "nccl"
        assert [cluster.gpus_for(i) for i in (0, 1)] == [("0", "1"), ("2", "3")]
        job = cluster.launch(visible_devices)
        result = job.wait(timeout=60)
        assert result.state == WorkerState.SUCCEEDED, job.timeline.format()
        assert [job.gpus_for(i) for i in (0, 1)] == [("0", "1"), ("2", "3")]
        # group ranks follow the rendezvous join order; the slice follows the node
        slices = {i: ",".join(job.gpus_for(i)) for i in (0, 1)}
        expected = {s["rank"]: slices[s["node"]] for s in job.timeline.events("worker_start")}
        assert sorted(expected) == [0, 1, 2, 3]
        assert result.return_values == expected


def test_a_node_joining_after_a_loss_takes_the_freed_slice(warm_pool):
    with Cluster(pool=warm_pool, nnodes="1:2", nproc_per_node=1, gpus=2, max_restarts=0) as cluster:
        job = cluster.launch(str(SCRIPTS / "sleeper.py"))
        job.inject(NodeKill(node=0), OnState(WorkerState.HEALTHY))
        job.nodes[0].popen.wait(30)
        assert job.add_node() == 2
        assert [job.gpus_for(i) for i in (0, 1, 2)] == [("0",), ("1",), ("0",)]
        assert [f["fault"] for f in job.timeline.faults()] == ["kill_node", "add_node"]


def test_without_gpus_nothing_is_set(warm_pool):
    with Cluster(pool=warm_pool, nnodes=2, nproc_per_node=1, gpus=0, env={"CUDA_VISIBLE_DEVICES": "x"}) as cluster:
        # an explicit gpus=0 wins over what the env names; workers keep the env as given
        assert cluster.backend == "gloo" and cluster.gpus_for(0) == ()
        result = cluster.launch(visible_devices).wait(timeout=60)
        assert result.return_values == {0: "x", 1: "x"}

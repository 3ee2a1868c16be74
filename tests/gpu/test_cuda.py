"""Real GPUs: what only a machine with CUDA can show. Skipped where no GPU is found
(``harness.sim.nodes.gpus.detect_gpus``, which reads the driver, not torch); run on the
device machine with ``python -m pytest tests/gpu``.

What the injected-count tests of ``tests/harness/test_gpu.py`` cannot prove:

* ``--nproc-per-node=gpu`` counts the devices as torchrun does, and NCCL works in our
  workers, also after a restart (torchrun beside ours, one run each, compared);
* a simulated node given its own slice runs NCCL on it, and the worker forked from the
  zygote (torch imported there, CUDA never initialised) can initialise CUDA at all: a
  fork after CUDA's initialisation fails in the child ("Cannot re-initialize CUDA in
  forked subprocess");
* nodes that must share a device fall back to gloo and still train on the GPU, and the
  job survives a node's loss with the survivor's GPU work intact.
"""

from __future__ import annotations

import re

import pytest

from harness import Cluster, WorkerState
from harness.faults import NodeKill, OnState
from harness.sim.nodes.gpus import detect_gpus
from tests.conftest import SCRIPTS
from tests.differential.test_torchrun_parity import PROBE, assert_same_workers, run_both

GPUS = detect_gpus()
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not GPUS, reason="needs a GPU (none in CUDA_VISIBLE_DEVICES, the "
                                                  "NVIDIA driver's list or nvidia-smi -L)")]
CUDA_STEPPER = str(SCRIPTS / "cuda_stepper.py")
CUDA_LINE = re.compile(r"CUDA rank=(\d+) world=(\d+) device='([^']*)' visible=(\S+) sum=(\S+) attempt=(\d+)")


def _cuda_lines(text: str) -> list[tuple[str, ...]]:
    return sorted(CUDA_LINE.findall(text))


def test_nproc_gpu_with_nccl_and_a_restart_matches_torchrun(tmp_path):
    torch_run, ours = run_both(
        tmp_path, ["--standalone", "--nproc-per-node=gpu", "--max-restarts=1"],
        [str(PROBE), "--fail-rank=0", "--fail-attempts=1", "--allreduce", "--nccl"])
    assert (torch_run.returncode, ours.returncode) == (0, 0), f"{torch_run.describe()}\n{ours.describe()}"
    nproc = len(GPUS)
    assert torch_run.attempts() == ours.attempts() == {0: list(range(nproc)), 1: list(range(nproc))}
    expected_sum = float(nproc * (nproc + 1) // 2)
    assert ours.sums == torch_run.sums
    assert {key: (r["world"], r["sum"]) for key, r in ours.sums.items()} == {
        (1, r): (nproc, expected_sum) for r in range(nproc)}
    assert_same_workers(torch_run, ours)


def test_a_node_with_its_own_gpu_runs_nccl_and_restarts_a_crashed_worker(capfd):
    with Cluster(nnodes=1, nproc_per_node=1, max_restarts=1) as cluster:
        assert cluster.backend == "nccl" and cluster.gpus_for(0) == GPUS[:1]
        job = cluster.launch(CUDA_STEPPER, "40", "0.02", "nccl")
        job.wait_for_state(WorkerState.HEALTHY, timeout=60)
        job.kill_worker(node=0, local_rank=0)
        result = job.wait(timeout=120)
        assert result.state == WorkerState.SUCCEEDED, job.timeline.format()
        assert job.timeline.restart_counts()[0] == 1
    [(rank, world, _name, visible, total, attempt)] = _cuda_lines(capfd.readouterr().out)
    assert (rank, world, visible, total, attempt) == ("0", "1", GPUS[0], "64", "1")


def test_nodes_sharing_a_gpu_use_gloo_and_survive_a_node_loss(capfd):
    with Cluster(nnodes="1:2", nproc_per_node=1, gpus=1, max_restarts=2) as cluster:
        assert cluster.backend == "gloo" and cluster.gpus_for(0) == cluster.gpus_for(1) == ("0",)
        job = cluster.launch(CUDA_STEPPER, "60", "0.05", "gloo")
        job.inject(NodeKill(node=1), OnState(WorkerState.HEALTHY))
        job.nodes[1].popen.wait(60)
        job.wait_for_recovery(timeout=60)
        result = job.wait(timeout=120)
        assert result.state == WorkerState.SUCCEEDED, job.timeline.format()
        assert [f["fault"] for f in job.timeline.faults()] == ["kill_node"]
        assert job.timeline.world_sizes() == [2, 1]
    lines = _cuda_lines(capfd.readouterr().out)
    assert [(rank, world, visible, total) for rank, world, _n, visible, total, _a in lines] == [
        ("0", "1", "0", "64")]

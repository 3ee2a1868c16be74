"""``{backend}`` in a job's args: the cluster's process-group backend, per job, in the
worker's argv (``harness.sim.nodes.start._command``), beside ``{shared}`` and ``{tmp}``. No GPU needed:
the device count is injected where the test needs one (``gpus=``), as ``test_gpu.py`` does."""

from __future__ import annotations

import json
import os

import pytest

from harness import Cluster, WorkerState
from harness.sim.nodes.gpus import detect_gpus
from tests.conftest import SCRIPTS

ENV_DUMP = str(SCRIPTS / "env_dump.py")


def _argvs(text: str) -> list[list[str]]:
    return [json.loads(line[len("ENV "):])["argv"] for line in text.splitlines() if line.startswith("ENV ")]


@pytest.mark.parametrize("gpus, nnodes, backend", [
    (1, 2, "gloo"),     # two nodes share one device: NCCL would refuse
    (2, 2, "nccl"),     # a device per worker
])
def test_backend_is_expanded_in_the_workers_argv(capfd, gpus, nnodes, backend, warm_pool):
    with Cluster(pool=warm_pool, nnodes=nnodes, nproc_per_node=1, gpus=gpus) as cluster:
        assert cluster.backend == backend
        job = cluster.launch(ENV_DUMP, "{backend}", "--backend={backend}", "{shared}/ckpt", "{tmp}")
        assert job.wait(timeout=60).state == WorkerState.SUCCEEDED, job.timeline.format()
        shared, scratch = job.shared_dir, job.storage.scratch_dir
        assert os.path.isdir(scratch) and not scratch.startswith(job.storage.mount.mountpoint)  # no fault reaches it
        assert job.args[-1] == "{tmp}"  # as written: the twin's key, and the twin fills in its own
        other = cluster.launch(ENV_DUMP, "{tmp}")  # every job its own (a twin's is not the run's)
        assert other.wait(timeout=60).state == WorkerState.SUCCEEDED, other.timeline.format()
        assert other.storage.scratch_dir != scratch
    argvs = _argvs(capfd.readouterr().out)
    assert argvs[:nnodes] == [[backend, f"--backend={backend}", f"{shared}/ckpt", scratch]] * nnodes
    assert argvs[nnodes:] == [[other.storage.scratch_dir]] * nnodes


@pytest.mark.skipif(bool(detect_gpus()), reason="this machine has a GPU: its backend may be nccl")
def test_backend_is_gloo_on_a_machine_without_a_gpu(capfd, warm_pool):
    with Cluster(pool=warm_pool, nnodes=1, nproc_per_node=1) as cluster:
        job = cluster.launch(ENV_DUMP, "--backend", "{backend}")
        assert job.wait(timeout=60).state == WorkerState.SUCCEEDED, job.timeline.format()
    assert _argvs(capfd.readouterr().out) == [["--backend", "gloo"]]

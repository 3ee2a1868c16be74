"""The DCP trainer of ``scenarios/training`` on a real GPU, judged by its fault-free twin.

Each test runs a training scenario's job as its ``.toml`` says (shape, args, faults), with
``--device cuda`` added, and compares it with its twin (``Job.compare_golden``: the same args,
on the same GPUs, with no faults). The scenarios pass ``--backend {backend}``: with one GPU,
nodes that share it run gloo over CUDA tensors; with a GPU per worker, NCCL. Proven here,
beyond the CPU runs of ``tests/harness/test_golden.py`` and ``scenarios/training``:

* a worker crash and a resume from the DCP checkpoint on cuda are bit for bit the twin
  (model, optimizer, LR scheduler on the device; the data's RNG and permutation on the CPU);
* a node loss with a scale-down (a checkpoint of two ranks loaded by one, resharded) and a
  scale-up are the twin within the tolerance a changed world size takes;
* a resume that forgets its optimizer state on cuda still succeeds, and the twin catches it;
* a worker with a GPU of its own runs NCCL (``{backend}``), and resumes bit for bit from a
  DCP checkpoint or from a ``torch.save`` file loaded onto the device;
* FSDP2 on a cuda mesh resumes bit for bit too.

Skipped where no GPU is found, as ``tests/gpu/test_cuda.py``; run on the device machine
with ``python -m pytest tests/gpu``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from harness import Cluster, WorkerState
from harness.faults import AtStep, WorkerKill
from harness.sim.faults import from_spec
from harness.sim.nodes.gpus import detect_gpus

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

GPUS = detect_gpus()
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not GPUS, reason="needs a GPU (none in CUDA_VISIBLE_DEVICES, the "
                                                  "NVIDIA driver's list or nvidia-smi -L)")]
pytest.importorskip("numpy", reason="torch.distributed.checkpoint needs numpy (the test extra installs it)")

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios" / "training"


def _summaries(text: str) -> list[dict[str, Any]]:
    """The trainer's last line, one per run (rank 0): steps, world size, device, backend."""
    return [json.loads(line) for line in text.splitlines() if line.startswith('{"steps"')]


def _run_scenario(name: str, *extra: str) -> tuple[Any, Any, dict[str, Any], str]:
    """Scenario ``name``'s job on cuda, its faults fired, compared with its twin: the job, the
    diff, the scenario's ``[expect]`` and the backend its args got."""
    spec = tomllib.loads((SCENARIOS / f"{name}.toml").read_text())
    job_spec = dict(spec["job"])
    timeout = float(job_spec.pop("timeout"))
    job_spec.pop("steps", None)
    script, args, nodes = str(SCENARIOS / job_spec.pop("script")), job_spec.pop("args"), job_spec.pop("nodes", None)
    assert "{backend}" in args
    with Cluster(**job_spec, golden=True) as cluster:
        job = cluster.launch(script, *args, "--device", "cuda", *extra, nodes=nodes)
        job.schedule([from_spec(f) for f in spec["fault"]])
        result = job.wait(timeout=timeout)
        assert result.state == WorkerState.SUCCEEDED, job.timeline.format()
        diff = job.compare_golden(timeout=timeout)
        return job, diff, spec["expect"], cluster.backend


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", ["worker_crash_resume_is_golden", "node_loss_scale_down_is_golden",
                                  "scale_up_is_golden"])
def test_a_training_scenario_on_cuda_is_its_fault_free_twin(capfd, name):
    job, diff, expect, backend = _run_scenario(name)
    assert not diff.diverged, diff.explain()
    assert diff.steps_compared > 0
    if diff.world_size_changed:  # compared within a tolerance: sums of another world size run in another order
        assert diff.rtol > 0 and diff.digests_compared == 0
    else:  # bit for bit, final states included
        assert diff.rtol == 0.0 and diff.digests_compared == job.timeline.world_sizes()[-1]
    if "world_sizes" in expect:
        assert job.timeline.world_sizes() == expect["world_sizes"]
    if "restarts" in expect:
        assert max(job.timeline.restart_counts().values()) == expect["restarts"]
    assert len(job.timeline.faults()) == expect["faults_fired"]
    runs = _summaries(capfd.readouterr().out)  # the faulted job's last round, and its twin's
    assert len(runs) == 2 and all(r["device"].startswith("cuda") and r["backend"] == backend for r in runs), runs


@pytest.mark.timeout(300)
def test_a_resume_on_cuda_that_forgets_the_optimizer_is_caught(capfd):
    job, diff, expect, backend = _run_scenario("forgets_optimizer_is_caught")
    assert expect["diverges"] and diff.diverged and diff.first is not None
    _rank, step, got, expected = diff.first
    assert got != expected and step > diff.resumed_at
    assert diff.attempt == 1 and "optimizer" in diff.explain()
    runs = _summaries(capfd.readouterr().out)
    assert runs and all(r["device"].startswith("cuda") and r["backend"] == backend for r in runs), runs
    assert any(r["forgot"] == ["optimizer"] and r["resumed_from"] for r in runs), runs


def _crash_at_step_7_and_compare(cluster: Cluster, args: tuple[str, ...], local_rank: int, digests: int) -> None:
    """The trainer on node 0, its worker ``local_rank`` (rank ``local_rank``: one node) killed at
    step 7, after the step-6 checkpoint; the job must equal its twin bit for bit."""
    job = cluster.launch(str(SCENARIOS / "train.py"), *args)
    job.inject(WorkerKill(node=0, local_rank=local_rank), AtStep(step=7, rank=local_rank))
    assert job.wait(timeout=180).state == WorkerState.SUCCEEDED, job.timeline.format()
    diff = job.compare_golden(timeout=180)
    assert not diff.diverged, diff.explain()
    assert diff.rtol == 0.0 and diff.digests_compared == digests


@pytest.mark.timeout(300)
@pytest.mark.parametrize("save", ["dcp", "safe"])
def test_a_worker_on_its_own_gpu_runs_nccl_and_resumes_as_its_twin(capfd, save):
    """One node, one worker, a GPU of its own: ``{backend}`` is nccl; the DCP checkpoint, or
    the ``torch.save`` file loaded with ``map_location`` onto the device, resumes bit for bit."""
    args = ("--steps", "10", "--ckpt-every", "3", "--ckpt-dir", "{shared}/ckpt", "--backend", "{backend}",
            "--device", "cuda", "--save", save)
    with Cluster(nnodes=1, nproc_per_node=1, max_restarts=1, golden=True) as cluster:
        assert cluster.backend == "nccl"
        _crash_at_step_7_and_compare(cluster, args, local_rank=0, digests=1)
    runs = _summaries(capfd.readouterr().out)
    assert len(runs) == 2 and all(r["device"] == "cuda:0" and r["backend"] == "nccl" for r in runs), runs
    assert sorted(r["resumed_from"] for r in runs) == ["", "ckpt.pt" if save == "safe" else "step_6"]


@pytest.mark.timeout(300)
def test_fsdp_on_a_cuda_mesh_resumes_as_its_twin(capfd):
    args = ("--steps", "10", "--ckpt-every", "3", "--ckpt-dir", "{shared}/ckpt", "--backend", "{backend}",
            "--device", "cuda", "--parallel", "fsdp")
    with Cluster(nnodes=1, nproc_per_node=2, max_restarts=1, golden=True) as cluster:
        _crash_at_step_7_and_compare(cluster, args, local_rank=1, digests=2)
    runs = _summaries(capfd.readouterr().out)
    assert len(runs) == 2 and all(r["device"].startswith("cuda") for r in runs), runs

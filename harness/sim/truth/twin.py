"""The fault-free twin: the same job, run again with nothing broken, to judge the faulted one.

``Job.compare_golden`` asks here for the twin's record (``harness.sim.truth.golden.GoldenRecord``):
from a cache when one is given and holds it, else by running the twin on a fresh cluster of
the same shape, with no faults and no chaos, sharing the caller's warm pool. The twin is a new
``Job``, so it gets its own fresh ``{shared}`` and ``{node_disk}``: it can never resume from
the faulted run's checkpoint.

The cache key is everything that changes what the script computes: the script's bytes (or a
callable's source), its args as written (placeholders unexpanded), module or script, the
nodes it starts and workers per node, the worker environment the cluster adds, the start
method, the torch and Python versions, and where it computes: the backend and each node's
GPUs (a trainer on ``--device auto`` computes on CUDA where a GPU is, and floating-point
results differ from the CPU's) and the hosts it is placed on. The cache is a directory of JSON files (the plugin
uses pytest's cache dir): a key's file is written whole, then renamed, so concurrent xdist
workers never read half a record.
"""

from __future__ import annotations

import fcntl
import hashlib
import inspect
import json
import os
import platform
from typing import TYPE_CHECKING

from harness.sim.errors import TwinError
from harness.sim.truth.golden import GoldenRecord, record_of

if TYPE_CHECKING:
    from harness.sim.truth.subject import JudgedJob, Traced

__all__ = ["TwinError", "twin_key", "twin_record", "job_record"]


def _torch_version() -> str:
    try:
        from importlib.metadata import version

        return version("torch")
    except Exception:  # no torch distribution: the key says so
        return "none"


def _entry_bytes(job: JudgedJob) -> bytes:
    entry = job.entrypoint
    if callable(entry):
        try:
            return inspect.getsource(entry).encode()
        except (OSError, TypeError):
            return f"{getattr(entry, '__module__', '?')}.{getattr(entry, '__qualname__', repr(entry))}".encode()
    if job.module:
        return entry.encode()
    with open(entry, "rb") as fp:
        return fp.read()


def twin_key(job: JudgedJob) -> str:
    """The cache key of ``job``'s twin (module doc)."""
    settings = job.cluster.config
    parts = {
        "entry": hashlib.sha256(_entry_bytes(job)).hexdigest(), "module": job.module,
        "args": [str(a) for a in job.args], "nodes": job.launched_nodes,
        "nproc_per_node": settings.nproc_per_node, "env": sorted(settings.env.items()),
        "start_method": settings.start_method, "torch": _torch_version(), "python": platform.python_version(),
        "digests": True, "backend": job.cluster.backend,
        "gpus": [list(job.cluster.gpus_for(node)) for node in range(job.launched_nodes)],
        "hosts": [host.url for host in settings.hosts or ()],
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]


def job_record(job: Traced) -> GoldenRecord:
    """What the oracle compares of a finished job: its counted losses and final digests."""
    return record_of(job.timeline.steps(), job.timeline.world_sizes())


def twin_record(job: JudgedJob, timeout: float, cache_dir: str | None) -> tuple[GoldenRecord, bool]:
    """The twin's record and whether it came from the cache.

    While one process runs a key's twin it holds the key's lock file; another that needs the
    same twin (an xdist worker judging a second scenario of the same job) waits for it and
    reads the record instead of running it again beside it: on a 2-core runner a second copy
    only halves the speed of both. The lock is ``flock``'s, so a holder that dies frees it.
    """
    if not cache_dir:
        return _run_twin(job, timeout), False
    path = os.path.join(cache_dir, f"{twin_key(job)}.json")
    cached = _cached(path)
    if cached is not None:
        return cached, True
    os.makedirs(cache_dir, exist_ok=True)
    with open(f"{path}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # held by another process only while it runs this twin
        cached = _cached(path)
        if cached is not None:
            return cached, True
        record = _run_twin(job, timeout)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as fp:
            json.dump(record.to_json(), fp)
        os.replace(tmp, path)
    return record, False


def _cached(path: str) -> GoldenRecord | None:
    """The record a finished twin left at ``path``; None when there is none (a damaged one is re-made)."""
    try:
        with open(path) as fp:
            return GoldenRecord.from_json(json.load(fp))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _run_twin(job: JudgedJob, timeout: float) -> GoldenRecord:
    from harness.states import WorkerState

    with job.cluster.fault_free_copy() as twin_cluster:
        twin = twin_cluster.launch(job.entrypoint, *job.args, nodes=job.launched_nodes, module=job.module)
        result = twin.wait(timeout=timeout)
        if result.state != WorkerState.SUCCEEDED:
            raise TwinError(f"the fault-free twin of job {job.run_id} did not succeed ({result.state.value}): "
                            f"the script fails without faults too\n{twin.timeline.format(40)}")
        return job_record(twin)

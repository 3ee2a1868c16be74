"""What a job is judged by, beyond its result: the invariants its timeline must keep
(``harness.sim.truth.invariants``) and, for training, its fault-free twin (``harness.sim.truth.twin``,
``harness.sim.truth.golden``). ``Job.invariant_problems`` and ``Job.compare_golden`` hand their
calls here; ``Cluster.close`` asks the first of every job.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from harness.errors import ElasticError
from harness.rendezvous import MAX_LEASE_FACTOR
from harness.sim.truth.invariants import JobFacts, check_timeline
from harness.states import WorkerState

if TYPE_CHECKING:
    from harness.sim.config import ClusterConfig
    from harness.sim.truth.golden import GoldenDiff
    from harness.sim.truth.subject import JudgedJob

__all__ = ["compare_golden", "fence_bound", "invariant_problems"]


def invariant_problems(job: JudgedJob, finished: bool) -> list[str]:
    """The invariants ``job`` broke so far; ``finished``: judge it as a job that ended (its
    outcome, its restarts), else only what holds while it runs."""
    settings = job.cluster.config
    facts = JobFacts(max_restarts=settings.max_restarts, nproc_per_node=settings.nproc_per_node,
                     finished=finished,
                     succeeded=(job.result().state == WorkerState.SUCCEEDED) if finished else None,
                     fence_bound=fence_bound(settings))
    return check_timeline(job.timeline, facts)


def fence_bound(settings: ClusterConfig) -> float:
    """How long a node cut off from the store may keep its workers: the longest its
    lease may grow to (``rdzv_conf``'s ``max_lease``, else 5 x its heartbeat timeout,
    c10d's 0.8 s by default: a loaded host's), the workers' stop grace, and 3 s of
    slack for a loaded machine (the invariant is about fencing, not about speed)."""
    heartbeat = float(settings.rdzv_conf.get("heartbeat_timeout", 0.8))
    lease = float(settings.rdzv_conf.get("max_lease", MAX_LEASE_FACTOR * heartbeat))
    return lease + settings.shutdown_timeout + 3.0


def compare_golden(job: JudgedJob, rtol: float | None, timeout: float, cache_dir: str | None) -> GoldenDiff:
    """``Job.compare_golden``: ``job`` (finished) against its fault-free twin, the same
    script, args and cluster shape with no faults and no chaos (``harness.sim.truth.twin``: its
    record reused from ``cache_dir``, else the cluster's ``golden_cache``, when it holds
    it). ``rtol``: default the cluster's ``golden_rtol`` (0: bitwise); final digests compare
    when the cluster was made with ``golden=True`` (the workers then digest their final
    state). The verdict goes on the timeline as a ``golden`` event, with the twin's losses
    and both runs' digests: the job page draws the comparison from it
    (``harness.sim.truth.golden.event_fields``)."""
    from harness.sim.truth.golden import compare, event_fields
    from harness.sim.truth.twin import job_record, twin_record

    if not job.finished():
        raise ElasticError(f"job {job.run_id} is still running: wait() for it before compare_golden()")
    cache = cache_dir if cache_dir is not None else job.cluster.golden_cache
    twin, cached = twin_record(job, timeout, cache)
    run = job_record(job)
    # the cluster's golden_rtol of 0.0 is its default: not given (a world-size change then gets its tolerance)
    diff = compare(run, twin, (job.cluster.config.golden_rtol or None) if rtol is None else rtol)
    job.harness_events.emit("golden", cached=cached, **event_fields(diff, run, twin))
    return diff

"""The fixture's work: build the cluster from marker + settings, close it, report.

Loaded by the first test that asks for ``elastic_cluster`` (imports the harness).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest

from pytest_elastic._settings import SettingError, Settings, validate_marker

__all__ = ["open_cluster", "add_report_sections", "ElasticRecord", "cluster_kwargs",
           "SCHEDULE_OVERRIDES", "reproduction_line", "session_pool", "close_session_pool"]

#: test id -> explicit per-job schedules for its next run (set by shrinking around a re-run)
SCHEDULE_OVERRIDES: dict[str, tuple[Any, ...]] = {}


@dataclass
class ElasticRecord:
    """What the plugin remembers about one test's elastic run."""

    cluster: Any
    settings: Settings
    chaos_seed: int | None = None
    call_failed: bool = False
    problems: list[str] = field(default_factory=list)
    #: phase -> ids of the chaos entries still pending (not fired) when its report was made
    pending_ids: dict[str, set[int]] = field(default_factory=dict)
    #: job index -> its failed ranks, read while the job's files exist (``_report_failures``)
    failures: dict[int, list[Any]] = field(default_factory=dict)


def cluster_kwargs(test_id: str, marker: Any, settings: Settings) -> dict[str, Any]:
    kwargs = dict(marker.kwargs) if marker is not None else {}
    args = tuple(marker.args) if marker is not None else ()
    validate_marker(test_id, kwargs, args)
    kwargs.pop("timeout", None)
    kwargs.setdefault("start_method", settings.start_method)
    return kwargs


def _chaos(settings: Settings, test_id: str) -> tuple[Any, int | None]:
    if not settings.chaos:
        return None, None
    from harness.sim.chaos import ChaosConfig, derive_seed, parse_fault_kinds

    seed = derive_seed(settings.seed, test_id)
    schedules = SCHEDULE_OVERRIDES.get(test_id)
    if schedules is None and settings.schedule is not None:
        from pytest_elastic._shrink import schedules_from_json

        schedules = schedules_from_json(settings.schedule)
    return ChaosConfig(seed=seed, kinds=parse_fault_kinds(settings.faults), overload=settings.overload,
                       schedules=schedules), seed


def reproduction_line(test_id: str, settings: Settings, schedule: str | None = None,
                      shrink_budget: int | None = None) -> str:
    """The command that replays this test's chaos run (``schedule``: exact JSON schedules)."""
    from harness.sim.schema import DEFAULT_CHAOS_KINDS

    line = f"pytest '{test_id}' --elastic-chaos --elastic-seed={settings.seed}"
    if settings.faults != ",".join(DEFAULT_CHAOS_KINDS):
        line += f" --elastic-faults={settings.faults}"
    if settings.overload:
        line += " --elastic-chaos-overload"
    schedule = schedule if schedule is not None else settings.schedule
    if schedule is not None:
        line += f" --elastic-schedule='{schedule}'"
    if shrink_budget is not None:
        line += f" --elastic-shrink-budget={shrink_budget}"
    return line


_POOL: Any = None


def session_pool() -> Any:
    """This test process's ``WarmPool`` (one per session, per xdist worker): every elastic
    test's cluster forks its workers from it, so only the first pays torch's import."""
    global _POOL
    if _POOL is None or _POOL.closed:
        from harness import WarmPool

        _POOL = WarmPool()
    return _POOL


def close_session_pool() -> None:
    """At session end (``pytest_unconfigure``): the pool's zygote dies with the session."""
    global _POOL
    if _POOL is not None:
        _POOL.close()
        _POOL = None


@contextmanager
def open_cluster(request: pytest.FixtureRequest) -> Iterator[Any]:
    from harness import Cluster
    from harness.sim.cluster import ClusterLeakError
    from harness.sim.invariants import InvariantViolation
    from pytest_elastic.plugin import settings_of

    settings = settings_of(request.config)
    item = request.node
    try:
        kwargs = cluster_kwargs(item.nodeid, item.get_closest_marker("elastic"), settings)
    except SettingError as e:
        pytest.fail(str(e), pytrace=False)
    if kwargs.get("network") == "netns":
        from harness.sim.net import netns_missing

        missing = netns_missing()
        if missing:
            pytest.skip(f"needs network namespaces: {'; '.join(missing)}")
    chaos, seed = _chaos(settings, item.nodeid)
    cluster = Cluster(**kwargs, chaos=chaos, pool=session_pool())
    from pytest_elastic._scenarios import golden_cache

    cluster.golden_cache = golden_cache(request.config)
    record = ElasticRecord(cluster, settings, seed)
    item._elastic_record = record
    try:
        yield cluster
    finally:
        try:
            cluster.close(check_invariants=not record.call_failed)
        except (ClusterLeakError, InvariantViolation) as e:
            record.problems.append(str(e))
            pytest.fail(f"elastic cluster teardown: {e}", pytrace=False)
        finally:
            _record_properties(item, record)


def judge_against_twins(cluster: Any) -> None:
    """``golden=True``: every finished job must compute what its fault-free twin does."""
    for i, job in enumerate(cluster.jobs):
        if job.finished():
            diff = job.compare_golden()
            if diff.diverged:
                pytest.fail(f"job {i}: {diff.explain()}", pytrace=False)


def _record_properties(item: pytest.Item, record: ElasticRecord) -> None:
    from pytest_elastic._report import job_stats, sum_by_key

    stats = [job_stats(job) for job in record.cluster.jobs]
    props = item.user_properties
    if record.chaos_seed is not None:
        props.append(("elastic_seed", record.settings.seed))
        props.append(("elastic_test_seed", record.chaos_seed))
    props.append(("elastic_jobs", len(stats)))
    props.append(("elastic_fault_count", sum(s["faults"] for s in stats)))
    props.append(("elastic_faults",
                  "; ".join(f["fault"] for job in record.cluster.jobs for f in job.timeline.faults())))
    props.append(("elastic_recovered", sum(s["recovered"] for s in stats)))
    props.append(("elastic_restarts", sum(s["restarts"] for s in stats)))
    props.append(("elastic_detection_latencies", [v for s in stats for v in s["detection"]]))
    props.append(("elastic_recovery_latencies", [v for s in stats for v in s["recovery"]]))
    props.append(("elastic_resume_latencies", [v for s in stats for v in s["resume"]]))
    productive, wall = sum(s["productive_s"] for s in stats), sum(s["wall_s"] for s in stats)
    props.append(("elastic_productive_s", productive))
    props.append(("elastic_wall_s", wall))
    props.append(("elastic_goodput", productive / wall if wall > 0 else None))
    props.append(("elastic_lost", sum_by_key(s["badput"] for s in stats)))
    props.append(("elastic_checkpoint_costs", [s["checkpoint_cost_s"] for s in stats if s["checkpoint_cost_s"]]))
    props.append(("elastic_checkpoint_intervals",
                  [s["checkpoint_interval_s"] for s in stats if s["checkpoint_interval_s"]]))
    props.append(("elastic_outcome", "failed" if record.call_failed or record.problems else "passed"))
    if record.settings.report_dir:
        _write_html(item, record)


def _replay(item: pytest.Item, record: ElasticRecord) -> str:
    """The command that runs this test again as it ran (its chaos seed included)."""
    if record.chaos_seed is not None:
        return reproduction_line(item.nodeid, record.settings)
    return f"pytest '{item.nodeid}'"


def _write_html(item: pytest.Item, record: ElasticRecord) -> None:
    """One page per job, and what the session index needs in the test's properties."""
    from harness.sim.training import rates_report
    from pytest_elastic._report import explain_job, write_html

    if item.nodeid in SCHEDULE_OVERRIDES:
        return  # a shrinking re-run: the pages show the run that failed

    directory = str(record.settings.report_dir)
    os.makedirs(directory, exist_ok=True)
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", item.nodeid)[:150]
    props = dict(p for p in item.user_properties if isinstance(p, tuple) and len(p) == 2)
    info = {"outcome": props.get("elastic_outcome"), "replay": _replay(item, record), "index": "index.html",
            "seed": record.settings.seed if record.chaos_seed is not None else None}
    pages = []
    for i, job in enumerate(record.cluster.jobs):
        pages.append(f"{safe}.job{i}.html")
        restarts = max(job.timeline.restart_counts().values(), default=0)
        write_html(os.path.join(directory, pages[-1]), f"{item.nodeid} — job {i}", job.timeline,
                   "\n".join(record.problems),
                   info={**info, "restarts": restarts, "goodput": job.goodput().summary(),
                         "step_rates": rates_report(job.timeline.events())},
                   failures=explain_job(job, record.failures.get(i)), nproc=record.cluster.nproc_per_node)
    item.user_properties.extend([("elastic_test", item.nodeid), ("elastic_pages", pages),
                                 ("elastic_replay", info["replay"])])


def add_report_sections(item: pytest.Item, report: pytest.TestReport, record: ElasticRecord) -> None:
    if report.when == "call" and report.failed:
        record.call_failed = True
    if record.chaos_seed is not None:  # what had not fired yet cannot explain this outcome
        record.pending_ids[report.when] = {id(e) for job in record.cluster.jobs for e in job.unfired_faults()}
    if report.when == "call" and (report.failed or record.settings.report_dir) and not record.failures:
        # (a scenario collected them itself, before it closed its cluster and error files)
        from pytest_elastic._report_failures import collect_failures

        record.failures = {i: collect_failures(job) for i, job in enumerate(record.cluster.jobs)}
    if not report.failed:
        return
    from pytest_elastic._report import explain_job, timeline_chart

    for i, job in enumerate(record.cluster.jobs):
        why = explain_job(job, record.failures.get(i))
        if why:
            report.sections.append((f"elastic failures (job {i}, {job.run_id})", why))
        chart = timeline_chart(job.timeline)
        if record.chaos_seed is None:  # else the chaos section below ends with it
            chart += f"\nreproduce with:\n  {_replay(item, record)}"
        report.sections.append((f"elastic timeline (job {i}, {job.run_id})", chart))
    if record.chaos_seed is not None:
        history = [entry.describe() for job in record.cluster.jobs for entry in job.chaos_schedule]
        unfired = [entry.describe() for job in record.cluster.jobs for entry in job.unfired_faults()]
        text = "\n".join(["fault schedule:", *(f"  {h}" for h in history or ["(none)"]),
                          *(["not fired (the job ended first, or it could not be applied):"]
                            + [f"  {u}" for u in unfired] if unfired else []),
                          "reproduce with:", f"  {reproduction_line(item.nodeid, record.settings)}"])
        report.sections.append(("elastic chaos", text))

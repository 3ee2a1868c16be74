"""One elastic run's life, the same for the ``elastic_cluster`` fixture and a scenario item:
build the cluster from the marker (or the scenario's ``[job]``) and the settings, remember
the run in ``item.stash``, close the cluster and check it, and report.

Loaded by the first elastic test (imports the harness).
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import pytest

from pytest_elastic._places import names_its_place
from pytest_elastic._replay import reproduction_line, rerun_line
from pytest_elastic._settings import (
    POOL_KEY,
    RECORD_KEY,
    SCHEDULE_OVERRIDE_KEY,
    ElasticRecord,
    SettingError,
    Settings,
    chaos_kinds_on_hosts,
    marker_config,
    settings_of,
)

if TYPE_CHECKING:
    from harness.hosts import HostSpec
    from harness.sim.config import ClusterConfig
    from harness.sim.faults.chaos import ChaosConfig
    from harness.sim.nodes.pool import WarmPool

__all__ = ["open_cluster", "elastic_run", "chaos_config", "item_settings", "record_properties",
           "add_report_sections", "cluster_config", "session_pool", "golden_cache", "judge_against_twins"]


def cluster_config(test_id: str, marker: Any, settings: Settings, chaos: ChaosConfig | None) -> ClusterConfig:
    """The cluster settings of a marked test: the marker's, over the session's start method
    and hosts (``--elastic-hosts``), with ``chaos``; raises SettingError (``marker_config``)."""
    kwargs = dict(marker.kwargs) if marker is not None else {}
    args = tuple(marker.args) if marker is not None else ()
    defaults: dict[str, Any] = {"start_method": settings.start_method}
    if settings.place is not None and not names_its_place(kwargs):
        defaults[settings.place.keyword] = settings.place.value
    return marker_config(test_id, kwargs, args, defaults, chaos)


def item_settings(item: pytest.Item) -> Settings:
    """The settings ``item`` runs under: the session's, or, for a chaos test that ``--lf``
    replays, its last failure's seed and schedule (``_lastfailed``)."""
    from pytest_elastic._lastfailed import replay_settings, replaying

    settings = settings_of(item.config)
    replay = replaying(item.config, item.nodeid)
    return settings if replay is None else replay_settings(settings, replay)


def chaos_config(settings: Settings, item: pytest.Item,
                 hosts: Sequence[HostSpec] | None = None) -> tuple[ChaosConfig | None, int | None]:
    """The chaos ``item``'s cluster runs under, and its seed (None, None: no chaos). The
    schedules are the shrinking re-run's, else ``--elastic-schedule``'s, else drawn: from
    the kinds ``hosts`` (where the nodes run, if not here) can carry out
    (``chaos_kinds_on_hosts``), so that a chaos run on hosts is decided by the training,
    and replays with its seed."""
    if not settings.chaos:
        return None, None
    from harness.sim.faults.chaos import ChaosConfig, derive_seed, parse_fault_kinds

    seed = derive_seed(settings.seed, item.nodeid)
    schedules = item.stash.get(SCHEDULE_OVERRIDE_KEY, None)
    if schedules is None and settings.schedule is not None:
        from pytest_elastic._replay import schedules_from_json

        schedules = schedules_from_json(settings.schedule)
    kinds = (parse_fault_kinds(settings.faults) if not hosts
             else chaos_kinds_on_hosts(settings, tuple(hosts))[0])
    return ChaosConfig(seed=seed, kinds=kinds, overload=settings.overload, schedules=schedules), seed


def session_pool(config: pytest.Config) -> WarmPool:
    """This session's ``WarmPool`` (one per session, per xdist worker): every elastic
    test's cluster forks its workers from it, so only the first pays torch's import. The
    plugin's ``pytest_unconfigure`` closes it: its zygote dies with the session."""
    pool: WarmPool | None = config.stash.get(POOL_KEY, None)
    if pool is None or pool.closed:
        from harness import WarmPool

        pool = config.stash[POOL_KEY] = WarmPool()
    return pool


def golden_cache(config: pytest.Config) -> str | None:
    """Where twins' records are kept between sessions: pytest's cache dir (None without it)."""
    cache = getattr(config, "cache", None)
    return str(cache.mkdir("elastic-golden")) if cache is not None else None


@contextmanager
def elastic_run(item: pytest.Item, config: ClusterConfig, seed: int | None) -> Iterator[ElasticRecord]:
    """The one cluster lifecycle: a cluster of ``config`` on the session's pool, remembered
    as ``item.stash[RECORD_KEY]``; on the way out it is closed (its invariants checked
    unless the test failed; a leak or a violation fails the test) and the run's figures
    become the test's properties (and pages, with ``--elastic-report``).

    A test body that raises in the block (a scenario runs inside it) marks the run failed
    and has its ranks' failures read first: their error files go with the cluster. The
    fixture's test body runs outside (pytest's report hooks mark it)."""
    from harness import Cluster
    from harness.sim.cluster import ClusterLeakError
    from harness.sim.truth.invariants import InvariantViolation

    cluster = Cluster.from_config(config, pool=session_pool(item.config))
    cluster.golden_cache = golden_cache(item.config)
    record = item.stash[RECORD_KEY] = ElasticRecord(cluster, item_settings(item), seed)
    try:
        yield record
    except BaseException:
        record.call_failed = True
        _collect_failures(record)
        raise
    finally:
        try:
            cluster.close(check_invariants=not record.call_failed)
        except (ClusterLeakError, InvariantViolation) as e:
            record.problems.append(str(e))
            pytest.fail(f"elastic cluster teardown: {e}", pytrace=False)
        finally:
            record_properties(item, record)


@contextmanager
def open_cluster(request: pytest.FixtureRequest) -> Iterator[Any]:
    """The ``elastic_cluster`` fixture's cluster: from the test's marker and the settings."""
    item = request.node
    settings = item_settings(item)
    try:
        config = cluster_config(item.nodeid, item.get_closest_marker("elastic"), settings, None)
    except SettingError as e:
        pytest.fail(str(e), pytrace=False)
    chaos, seed = chaos_config(settings, item, _placed(config))  # on hosts: the kinds they can carry out
    if chaos is not None:
        config = dataclasses.replace(config, chaos=chaos)
    from harness.sim.places import place_of

    if place_of(config).network_mode(config.network) == "netns":  # its nodes in namespaces of this machine
        from harness.sim.net import netns_missing

        missing = netns_missing()
        if missing:
            pytest.skip(f"needs network namespaces: {'; '.join(missing)}")
    with elastic_run(item, config, seed) as record:
        yield record.cluster


def _placed(config: ClusterConfig) -> tuple[HostSpec, ...] | None:
    """The hosts ``config``'s nodes run on (a Slurm allocation's stand-ins); None: here."""
    from harness.sim.places import place_of

    return place_of(config).planned_hosts()


def judge_against_twins(cluster: Any) -> None:
    """``golden=True``: every finished job must compute what its fault-free twin does."""
    for i, job in enumerate(cluster.jobs):
        if job.finished():
            diff = job.compare_golden()
            if diff.diverged:
                pytest.fail(f"job {i}: {diff.explain()}", pytrace=False)


def record_properties(item: pytest.Item, record: ElasticRecord) -> None:
    """The run's figures as the test's junit properties (``elastic_*``: the session summary
    and index read them back from the teardown report)."""
    from pytest_elastic.report.stats import job_stats, sum_by_key

    stats = [job_stats(job) for job in record.cluster.jobs]
    props = item.user_properties
    if record.chaos_seed is not None:
        props.append(("elastic_seed", record.settings.seed))
        props.append(("elastic_test_seed", record.chaos_seed))
    props.append(("elastic_jobs", len(stats)))
    hosts = [_hosts_of(job) for job in record.cluster.jobs]
    if any(hosts):
        props.append(("elastic_hosts", hosts))
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
    failed = record.call_failed or bool(record.problems)
    props.append(("elastic_outcome", "failed" if failed else "passed"))
    _record_ci_properties(item, record, failed)
    if record.settings.report_dir:
        _write_html(item, record)


def _hosts_of(job: Any) -> dict[str, str]:
    """Node (as a string: JSON's keys) -> the host it ran on, from its ``node_start`` events
    (which name the host of a node placed on one); empty where every node ran here."""
    from harness.sim.truth.timeline import HARNESS

    return {str(e["target_node"]): str(e["host"]) for e in job.timeline.events("node_start", HARNESS)
            if e.get("host") is not None}


def _record_ci_properties(item: pytest.Item, record: ElasticRecord, failed: bool) -> None:
    """What CI shows without the HTML report (JUnit properties per testcase, GitHub
    annotations, ``--lf`` replay; ``_ci``, ``_lastfailed``): the test, where its failure
    points, the twin's verdict, the line that replays it, and for a chaos run what it ran."""
    from pytest_elastic._ci import annotation_place, has_property, twin_verdict
    from pytest_elastic._replay import schedules_to_json

    props = item.user_properties
    props.append(("elastic_test", item.nodeid))
    props.append(("elastic_where", annotation_place(item)))
    props.append(("elastic_twin", twin_verdict([job.timeline.events("golden") for job in record.cluster.jobs])))
    props.append(("elastic_replay", _rerun(item, record)))
    if failed and record.problems and not has_property(props, "elastic_cause"):
        props.append(("elastic_cause", record.problems[0].strip().splitlines()[0]))
    if record.chaos_seed is not None:
        ran = schedules_to_json(tuple(tuple(job.chaos_schedule) for job in record.cluster.jobs))
        if ran is not None:
            props.append(("elastic_schedule", ran))
        props.append(("elastic_chaos_faults", record.settings.faults))
        left_out = chaos_left_out(record.cluster.jobs)
        if left_out:
            props.append(("elastic_chaos_left_out", left_out))
        props.append(("elastic_chaos_overload", record.settings.overload))


def _rerun(item: pytest.Item, record: ElasticRecord) -> str:
    return rerun_line(item.nodeid, record.settings, chaotic=record.chaos_seed is not None)


def _write_html(item: pytest.Item, record: ElasticRecord) -> None:
    """One page per job, and what the session index needs in the test's properties."""
    from harness.sim.truth.training import rates_report
    from pytest_elastic.report.failures import explain_job
    from pytest_elastic.report.page import write_html

    if SCHEDULE_OVERRIDE_KEY in item.stash:
        return  # a shrinking re-run: the pages show the run that failed

    directory = str(record.settings.report_dir)
    os.makedirs(directory, exist_ok=True)
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", item.nodeid)[:150]
    props = dict(p for p in item.user_properties if isinstance(p, tuple) and len(p) == 2)
    info = {"outcome": props.get("elastic_outcome"), "replay": _rerun(item, record), "index": "index.html",
            "seed": record.settings.seed if record.chaos_seed is not None else None}
    pages = []
    for i, job in enumerate(record.cluster.jobs):
        pages.append(f"{safe}.job{i}.html")
        restarts = max(job.timeline.restart_counts().values(), default=0)
        write_html(os.path.join(directory, pages[-1]), f"{item.nodeid} — job {i}", job.timeline,
                   "\n".join(record.problems),
                   info={**info, "restarts": restarts, "goodput": job.goodput().summary(),
                         "step_rates": rates_report(job.timeline.events()),
                         "chaos_left_out": chaos_left_out([job])},
                   failures=explain_job(job, record.failures.get(i), record.alone.get(i)),
                   nproc=record.cluster.config.nproc_per_node)
    item.user_properties.append(("elastic_pages", pages))


def _collect_failures(record: ElasticRecord) -> None:
    """What the report says of each job's failures, read now: its files (error files, result
    files, agent logs) go when its cluster closes, before the report is made."""
    from pytest_elastic.report.failures import agents_failed_alone, collect_failures

    record.failures = {i: collect_failures(job) for i, job in enumerate(record.cluster.jobs)}
    record.alone = {i: agents_failed_alone(job) for i, job in enumerate(record.cluster.jobs)}


def add_report_sections(item: pytest.Item, report: pytest.TestReport, record: ElasticRecord) -> None:
    if report.when == "call" and report.failed:
        record.call_failed = True
    if record.chaos_seed is not None:  # what had not fired yet cannot explain this outcome
        record.pending_ids[report.when] = {id(e) for job in record.cluster.jobs for e in job.unfired_faults()}
    if report.when == "call" and (report.failed or record.settings.report_dir) and not record.failures:
        # (a scenario collected them itself, before it closed its cluster and error files)
        _collect_failures(record)
    if not report.failed:
        return
    from pytest_elastic.report.chart import timeline_chart
    from pytest_elastic.report.failures import explain_job

    for i, job in enumerate(record.cluster.jobs):
        why = explain_job(job, record.failures.get(i), record.alone.get(i))
        if why:
            report.sections.append((f"elastic failures (job {i}, {job.run_id})", why))
        chart = timeline_chart(job.timeline)
        if record.chaos_seed is None:  # else the chaos section below ends with it
            chart += f"\nreproduce with:\n  {_rerun(item, record)}"
        report.sections.append((f"elastic timeline (job {i}, {job.run_id})", chart))
    if record.chaos_seed is not None:
        history = [entry.describe() for job in record.cluster.jobs for entry in job.chaos_schedule]
        unfired = [entry.describe() for job in record.cluster.jobs for entry in job.unfired_faults()]
        replayed = ["replayed from the last failure (pytest --lf): its seed and schedule, "
                    "kept in pytest's cache"] if _replayed(item) else []
        left_out = [f"  {kind}: {why}" for kind, why in chaos_left_out(record.cluster.jobs).items()]
        replayed += _overload_lines(record)
        text = "\n".join([*replayed, "fault schedule:", *(f"  {h}" for h in history or ["(none)"]),
                          *(["left out (the job cannot survive them as configured):", *left_out] if left_out else []),
                          *(["not fired (the job ended first, or it could not be applied):"]
                            + [f"  {u}" for u in unfired] if unfired else []),
                          "reproduce with:", f"  {reproduction_line(item.nodeid, record.settings)}"])
        report.sections.append(("elastic chaos", text))


def _overload_lines(record: ElasticRecord) -> list[str]:
    """Under ``--elastic-chaos-overload``, what chaos drew past the job's means, so that the
    red reads as the job's weakness: the failures past ``max_restarts``."""
    if not record.settings.overload:
        return []
    from harness.sim.schema import FAULT_KINDS

    budget = record.cluster.config.max_restarts
    lines = []
    for i, job in enumerate(record.cluster.jobs):
        failures = sum(1 for entry in job.chaos_schedule
                       if (row := FAULT_KINDS.get(entry.fault.kind)) is not None and row.failure)
        if failures > budget:
            lines.append(f"--elastic-chaos-overload: job {i}'s schedule has {failures} failure(s), past its "
                         f"max_restarts={budget}: a job that ends FAILED did what its budget allows")
    return lines or ["--elastic-chaos-overload: every kind asked for was drawn, survivable or not "
                     "(docs/chaos.md)"]


def chaos_left_out(jobs: Sequence[Any]) -> dict[str, str]:
    """Chaos kinds left out of the jobs' schedules -> why (the first job's reason for each):
    what the jobs could not survive as configured, or their machine could not carry out."""
    from harness.sim.truth.timeline import HARNESS

    left_out: dict[str, str] = {}
    for job in jobs:
        for event in job.timeline.events("chaos_schedule", HARNESS):
            for kind, why in (event.get("left_out") or {}).items():
                left_out.setdefault(str(kind), str(why))
    return left_out


def _replayed(item: pytest.Item) -> bool:
    from pytest_elastic._lastfailed import replaying

    return replaying(item.config, item.nodeid) is not None

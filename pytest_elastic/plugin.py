"""The pytest11 entry point: options, marker, fixture, chaos reporting, scenario files.

Imports neither torch nor the harness at import time (``pytest --help`` stays fast);
the engine is loaded by the first test that needs it. The top of the plugin: the hooks
here hand each job to a module below (``_settings`` at the bottom; ``_replay``, ``report``,
``_timeout``, ``_session``, ``_shrink``, ``_scenarios``), and none of those imports this one.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Generator, Iterator
from typing import TYPE_CHECKING, Any

import pytest

from pytest_elastic._settings import (
    POOL_KEY,
    RECORD_KEY,
    SETTINGS_KEY,
    STATS_KEY,
    TIMEOUT_STACKS_KEY,
    SettingError,
    resolve_settings,
    settings_of,
)

if TYPE_CHECKING:
    from pluggy import Result

_SEED_INPUT = "elastic_seed"


def pytest_addoption(parser: pytest.Parser) -> None:
    """Every setting's option and ini key, from its row (``pytest_elastic._options``)."""
    from pytest_elastic._options import OPTIONS

    group = parser.getgroup("elastic", "elastic distributed training (pytest-elastic)")
    for row in OPTIONS:
        group.addoption(row.flag, **row.addoption_kwargs())
        if row.ini_key is not None:
            parser.addini(row.ini_key, row.described(), default=None)


def _marker_signature() -> str:
    """The marker line, from ``harness.sim.schema`` (imported here, at configure time: the
    plugin's own import stays free of the harness)."""
    from harness.sim.schema import marker_signature

    return (f"{marker_signature()}: run the test's jobs on a simulated elastic cluster; the "
            "elastic_cluster fixture is built from these keywords (the same as harness.Cluster's)")


def _test_processes(config: pytest.Config) -> int:
    """How many processes run the session's tests at once: pytest-xdist's workers (its
    ``-n``, as a worker is told it and as the controller was given it), else 1."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput:
        return max(1, int(workerinput.get("workercount", 1)))
    asked = getattr(config.option, "numprocesses", None)
    if isinstance(asked, str):  # "auto" / "logical", not yet resolved by xdist
        return os.cpu_count() or 1
    return asked if isinstance(asked, int) and asked > 1 else 1


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", _marker_signature())
    workerinput = getattr(config, "workerinput", None)
    seed = workerinput.get(_SEED_INPUT) if workerinput else None
    try:
        settings = resolve_settings(config.option, config.getini, seed_from_controller=seed,
                                    processes=_test_processes(config))
    except SettingError as e:
        raise pytest.UsageError(str(e)) from None
    config.stash[SETTINGS_KEY] = settings
    from pytest_elastic._lastfailed import load_replays

    load_replays(config, settings)  # --lf: failed chaos tests replay their schedules
    stats: list[dict[str, Any]] = []
    config.stash[STATS_KEY] = stats
    config.pluginmanager.register(_StatsCollector(stats), "elastic-stats")
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(_XdistSeed(settings.seed), "elastic-xdist-seed")
    if config.pluginmanager.hasplugin("timeout"):
        from pytest_elastic._timeout import start_stack_dumps

        start_stack_dumps(config)


class _StatsCollector:
    """Keeps the ``elastic_*`` properties of every elastic test's teardown report for the
    session summary (this session's list: ``pytest_runtest_logreport`` gets no config).
    Under xdist the controller sees every worker's reports, so its summary covers them all."""

    def __init__(self, into: list[dict[str, Any]]):
        self.into = into

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "teardown":
            return
        stats = dict(p for p in report.user_properties
                     if isinstance(p, tuple) and str(p[0]).startswith("elastic_"))
        if stats:
            self.into.append(stats)


class _XdistSeed:
    """Hands the controller's seed to every xdist worker: -n changes nothing."""

    def __init__(self, seed: int):
        self.seed = seed

    def pytest_configure_node(self, node: Any) -> None:
        node.workerinput[_SEED_INPUT] = self.seed


def pytest_report_header(config: pytest.Config) -> list[str]:
    # what network="auto" (the default) gives on this machine: a probe, ~30 ms once
    from harness.sim.net import resolve_mode
    from pytest_elastic._lastfailed import replays_of
    from pytest_elastic._settings import hosts_line

    settings = settings_of(config)
    lines = [f"{settings.header()} network={resolve_mode('auto')}"]
    hosts = hosts_line(settings)
    if hosts:
        lines.append(hosts)
    replays = replays_of(config)
    if replays:
        seeds = ", ".join(sorted({str(r.seed) for r in replays.values()}))
        lines.append(f"elastic: --lf replays the last failure's chaos schedule of {len(replays)} test(s) "
                     f"(seed {seeds}; from pytest's cache; --elastic-seed or --elastic-schedule overrides)")
    return lines


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.pluginmanager.hasplugin("timeout"):
        from pytest_elastic._timeout import add_timeout_markers

        add_timeout_markers(items, settings_of(config), config)


# -- timeouts (pytest-timeout) and shrinking --------------------------------------------


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_timeout_set_timer(item: pytest.Item, settings: Any) -> Any:
    """pytest-timeout's timer, plus the stacks of the test's workers when it fires."""
    if item.get_closest_marker("elastic") is None:
        return None
    from pytest_elastic._timeout import set_timer

    return set_timer(item, settings)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    """A failing chaos test is re-run with smaller fault schedules (``_shrink``)."""
    if item.get_closest_marker("elastic") is None:
        return None
    from pytest_elastic._session import item_settings

    settings = item_settings(item)  # a --lf replay is not shrunk again
    if not settings.chaos or not settings.shrink_budget:
        return None
    from pytest_elastic._shrink import run_with_shrinking, wants_shrinking

    if not wants_shrinking(item, settings):
        return None
    return run_with_shrinking(item, nextitem, settings)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    """A test that asks for a network fault where nodes cannot be network hosts (no network
    namespaces, not root) is skipped, saying what is missing, rather than failed, as is one
    whose nodes ``--elastic-hosts`` put on hosts that cannot carry out a fault it asks for;
    a test marked ``golden=True`` that passed is then judged against its jobs' fault-free twins."""
    try:
        outcome = yield
    except Exception as e:
        errors = sys.modules.get("harness.sim.errors")  # loaded by whatever raised it
        if errors is not None and isinstance(e, errors.NetworkUnavailable):
            pytest.skip(str(e))
        if errors is not None and isinstance(e, errors.FaultRefused):
            from pytest_elastic._scenarios import hosts_from_option

            if hosts_from_option(item):
                pytest.skip(f"the nodes are on hosts ({settings_of(item.config).place_option()}), and {e}")
        raise
    record = item.stash.get(RECORD_KEY, None)
    marker = item.get_closest_marker("elastic")
    # part of the test: a divergence fails its call (a scenario judges its own: [expect])
    if record is not None and marker is not None and marker.kwargs.get("golden"):
        from pytest_elastic._session import judge_against_twins

        judge_against_twins(record.cluster)
    return outcome


def pytest_unconfigure(config: pytest.Config) -> None:
    """The session's warm pool (if a test started one) ends with the session."""
    pool = config.stash.get(POOL_KEY, None)
    if pool is not None:
        pool.close()
        del config.stash[POOL_KEY]


# -- the fixture ------------------------------------------------------------------------


@pytest.fixture
def elastic_cluster(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A ``harness.Cluster`` built from the test's ``@pytest.mark.elastic`` keywords;
    closed after the test, which fails if anything the cluster started leaked."""
    from pytest_elastic._session import open_cluster

    with open_cluster(request) as cluster:
        yield cluster


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None],
                              ) -> Generator[None, Result[pytest.TestReport], None]:
    outcome = yield
    report = outcome.get_result()
    stacks = item.stash.get(TIMEOUT_STACKS_KEY, None)
    if stacks is not None:  # pytest-timeout fired in this phase (signal method)
        from pytest_elastic._timeout import SECTION

        report.sections.append((SECTION, stacks))
        del item.stash[TIMEOUT_STACKS_KEY]
    record = item.stash.get(RECORD_KEY, None)
    if record is not None and report.failed and call.excinfo is not None:
        from pytest_elastic._ci import has_property, one_line_cause

        if not has_property(item.user_properties, "elastic_cause"):
            item.user_properties.append(("elastic_cause", one_line_cause(call.excinfo.value)))
    if record is not None and report.when in ("call", "teardown"):
        from pytest_elastic._session import add_report_sections

        add_report_sections(item, report, record)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    stats = config.stash.get(STATS_KEY, [])
    if not stats:
        return
    from pytest_elastic.report.stats import session_summary

    if not hasattr(config, "workerinput"):  # the controller sees every worker's tests
        _ci_output(terminalreporter, config, stats)

    settings = settings_of(config)
    lines = session_summary(stats, settings)
    terminalreporter.write_sep("=", "elastic summary")
    for line in lines:
        terminalreporter.write_line(line)
    if settings.report_dir and not hasattr(config, "workerinput"):  # the controller ties the pages together
        from pytest_elastic.report.index import write_index

        terminalreporter.write_line(f"elastic report: {write_index(settings.report_dir, stats, lines, settings)}")


def _ci_output(terminalreporter: Any, config: pytest.Config, stats: list[dict[str, Any]]) -> None:
    """``--lf``'s memory of failed chaos schedules, and GitHub's annotations and summary."""
    from pytest_elastic._ci import error_annotations, github_wanted, write_step_summary
    from pytest_elastic._lastfailed import remember_outcomes

    remember_outcomes(config, stats)
    if github_wanted(config.option.elastic_github):
        for line in error_annotations(stats):
            terminalreporter.write_line(line)
        path = write_step_summary(stats)
        if path:
            terminalreporter.write_line(f"elastic summary appended to {path}")


# -- scenario files ------------------------------------------------------------------------


def pytest_collect_file(file_path: Any, parent: pytest.Collector) -> Any:
    if file_path.suffix == ".toml" and "scenarios" in file_path.parts:
        from pytest_elastic._scenarios import ScenarioFile

        return ScenarioFile.from_parent(parent, path=file_path)
    return None


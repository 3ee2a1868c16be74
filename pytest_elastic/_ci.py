"""What CI shows of an elastic session: GitHub Actions annotations and the step summary.

A red CI run is read in two places before anyone opens a log: the annotations on the
pull request's diff and the job's summary page. So each failing elastic test becomes one
``::error file=…,line=…,title=…::cause`` workflow command, pointing at the test function
(or, for a scenario file, at its ``[expect]`` table: what did not hold), with the one-line
cause (``elastic_cause``: the first divergence from the twin, the hang, the invariant, the
unfired fault); and the session's figures are appended to ``$GITHUB_STEP_SUMMARY`` as a
Markdown table, with the replay line of each failure.

Everything here reads the ``elastic_*`` properties of the tests' teardown reports, which
xdist carries to the controller (the same ones JUnit XML shows per testcase), so it works
the same under ``-n``. On by default when ``GITHUB_ACTIONS=true`` (GitHub sets it);
``--elastic-github`` turns it on elsewhere, ``PYTEST_ELASTIC_GITHUB=false`` off.
"""

from __future__ import annotations

import os
import statistics
from pathlib import Path
from typing import Any

from pytest_elastic._options import option as option_row

__all__ = ["github_wanted", "has_property", "one_line_cause", "annotation_place", "twin_verdict", "error_annotations",
           "step_summary", "escape_data", "escape_property", "write_step_summary"]

#: the longest cause an annotation carries (GitHub folds long ones anyway)
MAX_CAUSE = 400


def github_wanted(option: bool | None, env: dict[str, str] | os._Environ[str] = os.environ) -> bool:
    """``--elastic-github`` given, else ``PYTEST_ELASTIC_GITHUB`` (true/false), else whether
    this runs in GitHub Actions."""
    if option:
        return True
    explicit = env.get(option_row("github").env)
    if explicit is not None:
        return explicit.strip().lower() in ("1", "true", "yes", "on")
    return env.get("GITHUB_ACTIONS") == "true"


def has_property(properties: list[Any], name: str) -> bool:
    """Whether a test's ``user_properties`` already hold ``name`` (the first cause stands)."""
    return any(isinstance(p, tuple) and p[0] == name for p in properties)


def one_line_cause(exc: BaseException) -> str:
    """The first line of what the test raised, named by its type unless the message already
    says what happened (``pytest.fail``, a failed ``assert``)."""
    text = str(exc).strip()
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    kind = type(exc).__name__
    if kind in ("Failed", "ScenarioFailure") and first:
        cause = first
    else:
        cause = f"{kind}: {first}" if first else kind
    return cause[:MAX_CAUSE]


def annotation_place(item: Any) -> str:
    """``path:line`` (relative to the rootdir, as GitHub wants it relative to the checkout)
    where a failure of ``item`` is shown: a scenario's ``[expect]`` line, else the test
    function's ``def``."""
    path, lineno, _ = item.location
    if str(path).endswith(".toml"):
        try:
            lines = Path(item.path).read_text().splitlines()
        except OSError:
            lines = []
        line = next((i + 1 for i, text in enumerate(lines) if text.strip() == "[expect]"), 1)
        return f"{path}:{line}"
    return f"{path}:{(lineno or 0) + 1}"


def twin_verdict(golden_events: list[list[dict[str, Any]]]) -> str:
    """One word or phrase per test for what the fault-free twin said, from each job's
    ``golden`` events (the last one counts; worded by ``report.stats.job_twin_verdict``): ``same``,
    ``diverged at rank R step S``, ``diverged: final state differs`` or ``not compared``;
    jobs named when several."""
    from pytest_elastic.report.stats import NOT_COMPARED, job_twin_verdict

    verdicts = [job_twin_verdict(events[-1] if events else None, detail=False) for events in golden_events]
    if not verdicts:
        return NOT_COMPARED
    if len(set(verdicts)) == 1:
        return verdicts[0]
    return "; ".join(f"job {i}: {v}" for i, v in enumerate(verdicts))


def escape_data(text: str) -> str:
    """A workflow command's message (GitHub's escaping: ``%``, CR, LF)."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    """A workflow command's property value (also ``:`` and ``,``)."""
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def error_annotations(stats: list[dict[str, Any]]) -> list[str]:
    """One ``::error`` line per failed elastic test."""
    lines = []
    for s in stats:
        if s.get("elastic_outcome") != "failed":
            continue
        place = str(s.get("elastic_where", ""))
        path, _, line = place.rpartition(":")
        if not path or not line.isdigit():
            path, line = place or "", "1"
        test = str(s.get("elastic_test", ""))
        cause = str(s.get("elastic_cause") or "failed (see the test's log)")
        location = f"file={escape_property(path)},line={line}," if path else ""
        lines.append(f"::error {location}title={escape_property('elastic: ' + test)}::{escape_data(cause)}")
    return lines


def _cell(text: Any) -> str:
    """A Markdown table cell: pipes escaped, one line."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def _ms(values: list[float], q: float) -> str:
    """The median (``q`` 0.5) or the ``q`` quantile, as the terminal summary computes them."""
    from pytest_elastic.report.stats import percentile

    if not values:
        return "-"
    return f"{(statistics.median(values) if q == 0.5 else percentile(values, q)) * 1000:.0f} ms"


def step_summary(stats: list[dict[str, Any]]) -> str:
    """The Markdown appended to ``$GITHUB_STEP_SUMMARY``: the session's figures in one table,
    then each failed test with its cause and the line that replays it."""
    failed = [s for s in stats if s.get("elastic_outcome") == "failed"]
    resume = [float(v) for s in stats for v in s.get("elastic_resume_latencies", [])]
    productive = sum(float(s.get("elastic_productive_s", 0.0)) for s in stats)
    wall = sum(float(s.get("elastic_wall_s", 0.0)) for s in stats)
    faults = sum(int(s.get("elastic_fault_count", 0)) for s in stats)
    compared = [s for s in stats if s.get("elastic_twin", "not compared") != "not compared"]
    diverged = [s for s in compared if "diverged" in str(s.get("elastic_twin"))]
    goodput = f"{productive / wall:.2f}" if wall > 0 else "-"
    out = ["### pytest-elastic", "",
           "| elastic tests | failed | faults injected | resume p50 | resume p95 | goodput "
           "| twin: compared | twin: diverged |",
           "|---|---|---|---|---|---|---|---|",
           f"| {len(stats)} | {len(failed)} | {faults} | {_ms(resume, 0.5)} | {_ms(resume, 0.95)} | {goodput} "
           f"| {len(compared)} | {len(diverged)} |", ""]
    if diverged:
        out += ["| test | twin | outcome |", "|---|---|---|"]
        out += [f"| `{_cell(s.get('elastic_test'))}` | {_cell(s.get('elastic_twin'))} | "
                f"{_cell(s.get('elastic_outcome'))} |" for s in diverged]
        out.append("")
    for s in failed:
        out += [f"**Failed:** `{_cell(s.get('elastic_test'))}`: {_cell(s.get('elastic_cause') or 'see the log')}",
                "", "```", str(s.get("elastic_replay", "")), "```", ""]
    return "\n".join(out) + "\n"


def write_step_summary(stats: list[dict[str, Any]], env: dict[str, str] | os._Environ[str] = os.environ) -> str | None:
    """Append the summary to ``$GITHUB_STEP_SUMMARY``; the path, or None when unset."""
    path = env.get("GITHUB_STEP_SUMMARY")
    if not path:
        return None
    with open(path, "a", encoding="utf-8") as fp:
        fp.write(step_summary(stats))
    return path

"""Why ranks failed, root cause first (as ``ChildFailedError``'s summary orders them).

Two sources: the job's own results while its files still exist (``ProcessFailure`` with
the error file's traceback: torch's ``@record`` or ours), else the ``result`` events in
its timeline (message, exit code, no traceback). Worker exits the job restarted after are
listed under the final failures.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Hashable
from typing import Any

from pytest_elastic.report.model import events_of

__all__ = ["collect_failures", "failures_from_events", "explain_failures", "explain_job", "LOG_TAIL_LINES",
           "TRACEBACK_LINES"]

#: lines of an error file's traceback shown per rank (its head and its innermost frames)
TRACEBACK_LINES = 12
#: lines of a node's log shown for a rank that left no error file and no traceback there
LOG_TAIL_LINES = 8
_STOPPED_BY_AGENT = (0, -15)


def _exit_text(code: Any) -> str:
    if isinstance(code, int) and code < 0:
        try:
            return f"signal {signal.Signals(-code).name} (exit code {code})"
        except ValueError:
            return f"signal {-code} (exit code {code})"
    return f"exit code {code}"


def _callstack(message: Any) -> str:
    if isinstance(message, dict):
        extra = message.get("extraInfo")
        if isinstance(extra, dict):
            return str(extra.get("py_callstack") or "")
    return ""


def collect_failures(job: Any) -> list[dict[str, Any]]:
    """The failed ranks of ``job`` from its nodes' results (call while its files exist)."""
    try:
        result = job.result()
    except Exception:  # a half-written result of a killed node: the timeline still has the rest
        return []
    found = []
    for index, run in sorted(result.run_results.items()):
        node = job.nodes.get(index)
        for rank, failure in run.failures.items():
            traceback = _callstack(failure.message)
            found.append({"node": getattr(node, "name", str(index)), "node_index": index, "rank": rank,
                          "local_rank": failure.local_rank, "pid": failure.pid, "exitcode": failure.exitcode,
                          "message": failure.summary(), "traceback": traceback,
                          "log_tail": "" if traceback else _log_tail(job, index),
                          "error_file": failure.error_file, "timestamp_ns": failure.timestamp_ns})
    return found


def _log_tail(job: Any, index: int) -> str:
    """Where a rank left no error file (a script without ``@record``: torch's summary says
    only "To enable traceback see ..."), what its node's log ends with: its workers' stderr
    is there, so an exception's traceback is too. From the log's last traceback on, else its
    last lines; read while the job's files exist."""
    try:
        text = job.agent_log(index)
    except Exception:  # a node gone with its dir: nothing to read, never a lost report
        return ""
    lines = text.rstrip("\n").splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last)")]
    return "\n".join(lines[starts[-1]:] if starts else lines[-LOG_TAIL_LINES:])


def failures_from_events(events: list[dict[str, Any]], label: Callable[[Hashable], str] = str) -> list[dict[str, Any]]:
    """The failed ranks the nodes' ``result`` events name (no tracebacks: those stay in files)."""
    found = []
    for e in events:
        result = e.get("result") if e.get("kind") == "result" else None
        if not isinstance(result, dict):
            continue
        for rank, failure in (result.get("failures") or {}).items():
            found.append({"node": label(e.get("node")), "node_index": e.get("node"), "rank": rank,
                          "local_rank": failure.get("local_rank"), "pid": failure.get("pid"),
                          "exitcode": failure.get("exitcode"), "message": failure.get("message", ""),
                          "traceback": "", "error_file": failure.get("error_file", ""),
                          "timestamp_ns": failure.get("timestamp_ns", 0)})
    return found


def _earlier(events: list[dict[str, Any]], final: list[dict[str, Any]], label: Callable[[Hashable], str]) -> list[str]:
    pids = {f.get("pid") for f in final}
    lines = []
    t0 = events[0].get("mono", 0.0) if events else 0.0
    for e in events:
        if e.get("kind") == "worker_exit" and e.get("exitcode") not in _STOPPED_BY_AGENT \
                and e.get("worker_pid") not in pids:
            lines.append(f"  {e.get('mono', t0) - t0:8.3f}s  rank {e.get('rank')} (local rank {e.get('local_rank')}) "
                         f"on node {label(e.get('node'))}: {_exit_text(e.get('exitcode'))}"
                         + (", killed by the OOM killer" if e.get("reason") == "oom" else ""))
    return lines


def _traceback_lines(text: str) -> list[str]:
    lines = text.rstrip("\n").splitlines()
    if len(lines) <= TRACEBACK_LINES:
        return lines
    head, tail = 2, TRACEBACK_LINES - 3
    return [*lines[:head], f"... ({len(lines) - head - tail} lines) ...", *lines[-tail:]]


def _one(failure: dict[str, Any]) -> list[str]:
    node = failure["node"]
    index = failure.get("node_index")
    where = f"node {node}" if index is None or str(index) == str(node) else f"node {node} (index {index})"
    message = failure.get("message") or ""
    lines = [f"rank {failure['rank']} (local rank {failure['local_rank']}) on {where}: "
             f"{_exit_text(failure['exitcode'])}, pid {failure.get('pid')}"]
    if message:
        lines.append(f"  {message}")
    lines.extend(f"    {line}" for line in _traceback_lines(failure.get("traceback") or ""))
    if failure.get("error_file") and failure.get("error_file") != "<N/A>" and not failure.get("traceback"):
        lines.append(f"    (error file {failure['error_file']} was not kept)")
    tail = failure.get("log_tail") or ""
    if tail and not failure.get("traceback"):
        lines.append("  no error file (no @record); its node's log ends:")
        lines.extend(f"    {line}" for line in _traceback_lines(tail))
    return lines


def explain_failures(final: list[dict[str, Any]], events: list[dict[str, Any]],
                     label: Callable[[Hashable], str] = str) -> str:
    """Root cause (the first failure in time) first, the other failed ranks, then the worker
    failures the job had restarted after. Empty when nothing failed."""
    earlier = _earlier(events, final, label)
    if not final and not earlier:
        return ""
    lines: list[str] = []
    if final:
        ordered = sorted(final, key=lambda f: (f.get("timestamp_ns") or 0, str(f["rank"])))
        lines.append("root cause (first observed failure):")
        lines.extend(f"  {line}" for line in _one(ordered[0]))
        if len(ordered) > 1:
            lines.append("other failed ranks:")
            for failure in ordered[1:]:
                lines.extend(f"  {line}" for line in _one(failure))
    if earlier:
        lines.append(f"worker failures the job restarted after ({len(earlier)}):")
        lines.extend(earlier[:20])
        if len(earlier) > 20:
            lines.append(f"  ... and {len(earlier) - 20} more (see the timeline)")
    return "\n".join(lines)


def explain_job(job: Any, captured: list[dict[str, Any]] | None = None, alone: str | None = None) -> str:
    """Why ``job``'s ranks failed: the ``captured`` failures (read while its files existed,
    with tracebacks) or else what its timeline's results say; then each agent that failed
    with no failed worker, with its log's end (``alone``: read while the files existed, as
    ``agents_failed_alone`` says it; None: read now)."""
    events, label = events_of(job.timeline)
    final = captured if captured else failures_from_events(events, label)
    alone = agents_failed_alone(job) if alone is None else alone
    return "\n".join(part for part in (explain_failures(final, events, label), alone) if part)


def agents_failed_alone(job: Any) -> str:
    """Nodes whose agent failed on its own, with no failed worker and no harm of the
    harness's: it ended FAILED with no rank failure, or exited non-zero with no result at
    all (a rendezvous or store error it raised: ``elastic-run: error: ...``), each with the
    end of its log: the cause is there, in no rank's error file. Empty when there is none,
    or the files are gone."""
    try:
        result = job.result()
    except Exception:  # a half-written result: the timeline says the rest
        return ""
    harmed = {e.get("target_node") for e in job.timeline.events("node_exit") if e.get("cause")}
    lines: list[str] = []
    for index in sorted(set(result.run_results) | set(getattr(result, "exit_codes", {}))):
        run, code = result.run_results.get(index), getattr(result, "exit_codes", {}).get(index)
        if index in harmed:
            continue
        if run is not None and run.is_failed() and not run.failures:
            why = "its agent failed with no failed worker"
        elif run is None and code not in (None, 0):
            why = f"its agent exited {code} with no result"
        else:
            continue
        node = job.nodes.get(index)
        lines.append(f"node {getattr(node, 'name', index)} (index {index}): {why}; its log ends:")
        lines += [f"  {line}" for line in (_log_tail(job, index) or "(empty)").splitlines()]
    return "\n".join(lines)

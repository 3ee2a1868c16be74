"""Report benchmark: building the pages of a big job, and what the report costs a test
that does not ask for it.

    python bench/report.py [--runs N] [--nodes 40] [--minutes 10] [--faults 100]

Measured:
  build    seconds to build and write one job's page (the drawn timeline, steps, tables)
           plus the session index and summary.json, from a synthetic event list of a
           40-node x 2-rank job, 10 minutes, 100 faults, one step a second per rank
           (``bench/synth.py``: the event kinds and fields agents and harness
           emit, ~60 000 events). The events are built once, outside the timing. Shown
           as CPU time (median of --runs: what the build costs) and wall time (best of
           --runs: on a shared 2-core machine a busy neighbour adds waiting for a core,
           never less). Target <= 1 s for both.
  size     the page's bytes. Target <= 2 MB.
  idle     ``pytest_elastic.report`` modules ``import pytest_elastic.plugin`` loads: none
           (a test run without ``--elastic-report`` loading none of the page, index or
           failure modules is checked end to end by tests/plugin/test_report_plugin.py).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.synth import synthetic_events  # noqa: E402
from pytest_elastic.report.index import write_index  # noqa: E402
from pytest_elastic.report.page import write_html  # noqa: E402
from pytest_elastic.report.stats import session_summary  # noqa: E402

BUILD_TARGET_S = 1.0
SIZE_TARGET_B = 2 * 1024 * 1024


class _Settings:
    chaos, seed = True, 1


def _build_once(events: list[dict], directory: str) -> tuple[float, float, int]:
    started, cpu = time.perf_counter(), time.process_time()
    page = os.path.join(directory, "job.html")
    figures = write_html(page, "bench: 40 nodes, 10 minutes, 100 faults", events, nproc=2,
                         info={"outcome": "passed", "seed": 1, "replay": "pytest bench"})
    stats = [{"elastic_test": "bench::job", "elastic_outcome": "passed", "elastic_fault_count": len(figures["faults"]),
              "elastic_faults": "; ".join(figures["faults"]), "elastic_detection_latencies": figures["detection_s"],
              "elastic_recovery_latencies": figures["recovery_s"], "elastic_pages": ["job.html"]}]
    write_index(directory, stats, session_summary(stats, _Settings()), _Settings())
    return time.perf_counter() - started, time.process_time() - cpu, os.path.getsize(page)


def _idle_modules() -> list[str]:
    code = ("import sys, pytest_elastic.plugin; "
            "print(' '.join(m for m in sys.modules if m.startswith('pytest_elastic.report')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    return out.stdout.split()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--nodes", type=int, default=40)
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--faults", type=int, default=100)
    args = parser.parse_args()
    events = synthetic_events(nodes=args.nodes, nproc=2, duration=args.minutes * 60, faults=args.faults)
    times, cpu_times, size = [], [], 0
    with tempfile.TemporaryDirectory(prefix="bench_report_") as directory:
        for _ in range(args.runs):
            seconds, cpu, size = _build_once(events, directory)
            times.append(seconds)
            cpu_times.append(cpu)
    build, cpu = min(times), statistics.median(cpu_times)
    idle = _idle_modules()
    load = os.getloadavg()[0]
    rows = [(f"build, CPU (median of {args.runs})", f"{cpu:.3f} s", f"<= {BUILD_TARGET_S:g} s", cpu <= BUILD_TARGET_S),
            (f"build, wall (best of {args.runs}; load {load:.1f})", f"{build:.3f} s", f"<= {BUILD_TARGET_S:g} s",
             build <= BUILD_TARGET_S),
            ("page size", f"{size / 1e6:.2f} MB", "<= 2 MB", size <= SIZE_TARGET_B),
            ("report modules loaded without --elastic-report", " ".join(idle) or "none", "none", not idle)]
    print(f"{len(events)} events: {args.nodes} nodes x 2 ranks, {args.minutes:g} min, {args.faults} faults; "
          f"wall {', '.join(f'{t:.3f}' for t in times)} s; CPU {', '.join(f'{t:.3f}' for t in cpu_times)} s")
    width = max(len(r[0]) for r in rows)
    for name, value, target, ok in rows:
        print(f"{name:<{width}}  {value:>12}  target {target:<8}  {'PASS' if ok else 'FAIL'}")
    return 0 if all(r[3] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

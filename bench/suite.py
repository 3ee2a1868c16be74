"""Suite bench: the bundled scenarios under ``pytest -n 2`` beside the same jobs under torchrun.

    .venv/bin/python bench/suite.py [--runs N] [-k TEXT] [--jobs 2] [--no-torchrun]

Ours: one ``python -m pytest <every scenarios/**/*.toml> -n 2 -p no:cacheprovider`` from
the repo root (what a user runs), timed from ``Popen`` to reaped: collection, the two xdist
workers, their zygotes (one torch import each), every job, its faults and expectations.

Torchrun: for each scenario, the same job run by torch's own launcher, driven the way a
torchrun-based test harness would drive it, at most ``--jobs`` (2, as ``-n 2``) at a time,
timed from the first ``Popen`` to the last job's agents reaped:

* the same script and args (``{tmp}`` a fresh dir), ``[job] env``, ``--nproc-per-node``,
  ``--max-restarts``, ``--nnodes=min:max``; one node: ``--standalone``; several: that many
  ``torchrun`` agents (``nodes``, default the maximum) with c10d rendezvous on a loopback
  port reserved for the job and a unique ``--rdzv-id`` (node 0 starts first, so it hosts
  the store, as ``store_host="node0"``). ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` (torch's
  reliable restart mode, as in every bench here). Rendezvous settings: each side its own
  defaults.
* the same faults at the same moments. Workers report steps through ``harness.report_step``
  under both launchers (``HARNESS_EVENTS``/``HARNESS_ORDERS`` are set for torchrun's
  workers too), so ``at_step`` faults fire on the same (rank, step): exit-code crashes as
  the same order file the worker obeys, the others by the bench when the step event
  appears. ``after_healthy = s`` counts from the moment every worker of the job is running (ours:
  from the first HEALTHY state). What each fault does: worker crash/hang -> that worker
  (found by its agent and ``LOCAL_RANK``) gets the signal / SIGSTOP; agent kill -> SIGKILL
  to the agent; node kill/freeze -> SIGKILL/SIGSTOP to the agent and its workers; node
  leave -> SIGTERM to the agent; node join -> one more agent; store host loss -> node 0
  killed. The bench polls every 5 ms.
* a job ends when all its agents exited; the bench then kills whatever the job left (an
  agent killed by a fault leaves its workers to torch's timeouts). A job that runs past
  its scenario's ``timeout`` is killed and counted at that time, marked in the table.

Printed: per scenario, our test's duration (pytest ``--durations``) beside torchrun's job
wall time and torchrun's outcome against the scenario's ``expect.state``; the two suite
totals, their ratio and the target (ours <= 0.25x torchrun); and, for information, the
same ratio over only the scenarios torchrun got right (sums of per-job times), since a
torchrun job that hangs is counted at its scenario's timeout. Torch's own behaviour is
not corrected: e.g. its FileTimerServer kills the agent itself after reaping a hung
worker (so the job fails), a frozen node hangs the survivors in gloo, and a late joiner
waits for a round that never comes. Progress to stderr, the tables to stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

from _common import fmt_ratio, fmt_s, isolate_tmpdir, print_table, ratio, run_process  # noqa: E402

from harness.agent import DEFAULT_MAX_RESTARTS, DEFAULT_MONITOR_INTERVAL  # noqa: E402

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

TORCHRUN = Path(sys.executable).parent / "torchrun"
TARGET_RATIO = 0.25
POLL_S = 0.005
SUITE_TIMEOUT_S = 900.0


@dataclass
class Scenario:
    path: Path
    spec: dict

    @property
    def name(self) -> str:
        return str(self.path.relative_to(ROOT / "scenarios").with_suffix(""))

    @property
    def job(self) -> dict:
        return self.spec["job"]

    @property
    def nnodes(self) -> tuple[int, int]:
        parts = str(self.job.get("nnodes", "1")).split(":")
        return int(parts[0]), int(parts[-1])


def find_scenarios(filter_text: str | None) -> list[Scenario]:
    found = []
    for path in sorted((ROOT / "scenarios").rglob("*.toml")):
        try:
            spec = tomllib.loads(path.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as e:
            print(f"skipping {path}: {e}", file=sys.stderr)
            continue
        scenario = Scenario(path, spec)
        if "job" in spec and "script" in spec["job"] and (not filter_text or filter_text in scenario.name):
            found.append(scenario)
    return found


# -- ours ---------------------------------------------------------------------------------


_DURATION = re.compile(r"^([\d.]+)s (?:setup|call|teardown)\s+scenarios/(\S+)\.toml::\S+$", re.M)


def run_ours(scenarios: list[Scenario], jobs: int, env: dict) -> tuple[float | None, str, dict[str, float]]:
    """The whole run's wall time, pytest's summary line, each scenario's test duration."""
    cmd = [sys.executable, "-m", "pytest", *[str(s.path.relative_to(ROOT)) for s in scenarios],
           "-n", str(jobs), "-p", "no:cacheprovider", "-q", "--durations=0"]
    sample = run_process(cmd, env=env, cwd=str(ROOT), timeout=SUITE_TIMEOUT_S)
    summary = next((line for line in reversed(sample.stdout.splitlines()) if " in " in line), "?")
    if not sample.ok:
        print(sample.stdout[-3000:], sample.stderr[-2000:], sep="\n", file=sys.stderr)
    durations: dict[str, float] = {}
    for seconds, name in _DURATION.findall(sample.stdout):
        durations[name] = durations.get(name, 0.0) + float(seconds)
    return (sample.wall_s if not sample.timed_out else None), summary.strip("= "), durations


# -- torchrun -----------------------------------------------------------------------------


@dataclass
class TorchrunJob:
    scenario: Scenario
    tmp: str
    env: dict
    agents: list[subprocess.Popen] = field(default_factory=list)
    seen: set[int] = field(default_factory=set)  # every descendant pid we saw (to clean up)
    fired: list[str] = field(default_factory=list)
    targeted: set[int] = field(default_factory=set)  # nodes a fault took away
    all_running_at: float | None = None

    def __post_init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="job-", dir=self.tmp)
        self.events = os.path.join(self.dir, "events.jsonl")
        self.orders = os.path.join(self.dir, "orders")
        os.makedirs(self.orders)
        open(self.events, "w").close()
        self.run_id = f"suite-{uuid.uuid4().hex[:8]}"
        self.reservation = None
        self._events_pos = 0
        self._steps: list[dict] = []

    # -- starting agents
    def command(self) -> list[str]:
        job, (low, high) = self.scenario.job, self.scenario.nnodes
        script = str((self.scenario.path.parent / job["script"]).resolve())
        scratch = tempfile.mkdtemp(prefix="scratch-", dir=self.dir)
        args = [str(a).replace("{tmp}", scratch) for a in job.get("args", [])]
        flags = [f"--nproc-per-node={job.get('nproc_per_node', 1)}",
                 f"--max-restarts={job.get('max_restarts', DEFAULT_MAX_RESTARTS)}",
                 f"--monitor-interval={job.get('monitor_interval', DEFAULT_MONITOR_INTERVAL)}"]
        if high == 1:
            flags = ["--standalone", "--nnodes=1", *flags]
        else:
            flags = [f"--nnodes={low}:{high}", "--rdzv-backend=c10d",
                     f"--rdzv-endpoint=127.0.0.1:{self.reservation.port}", f"--rdzv-id={self.run_id}",
                     *flags]
        return [str(TORCHRUN), *flags, script, *args]

    def start_agent(self) -> None:
        index = len(self.agents)
        env = {**self.env, **{k: str(v) for k, v in self.scenario.job.get("env", {}).items()},
               "HARNESS_EVENTS": self.events, "HARNESS_ORDERS": self.orders,
               "HARNESS_NODE": f"node{index}", "TMPDIR": self.dir}
        log = open(os.path.join(self.dir, f"agent{index}.log"), "wb")
        try:
            self.agents.append(subprocess.Popen(self.command(), env=env, stdout=log, stderr=subprocess.STDOUT,
                                                stdin=subprocess.DEVNULL, start_new_session=True))
        finally:
            log.close()

    # -- watching
    def workers(self, node: int) -> dict[int, int]:
        """local_rank -> pid of node ``node``'s live workers."""
        import psutil

        out = {}
        try:
            children = psutil.Process(self.agents[node].pid).children(recursive=True)
        except psutil.Error:
            return out
        for child in children:
            self.seen.add(child.pid)
            try:
                rank = child.environ().get("LOCAL_RANK")
                if rank is not None and child.status() != psutil.STATUS_ZOMBIE:
                    out[int(rank)] = child.pid
            except psutil.Error:
                continue
        return out

    def new_steps(self) -> list[dict]:
        import json

        with open(self.events) as fp:
            fp.seek(self._events_pos)
            chunk = fp.read()
        complete = chunk[:chunk.rfind("\n") + 1]
        self._events_pos += len(complete.encode())
        for line in complete.splitlines():
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                if event.get("kind") == "step":
                    self._steps.append(event)
        return self._steps

    # -- faults
    def due(self, fault: dict, now: float) -> bool:
        if "at_step" in fault:
            rank = fault.get("rank", 0)
            return any(e.get("rank") == rank and e.get("step", -1) >= fault["at_step"] for e in self._steps)
        return self.all_running_at is not None and now - self.all_running_at >= float(fault.get("after_healthy", 0))

    def fire(self, fault: dict) -> None:
        kind, node = fault["kind"], fault.get("node", 0)
        self.fired.append(kind)
        if kind in ("kill_worker", "hang_worker"):
            sig = signal.SIGSTOP if kind == "hang_worker" else int(fault.get("sig", signal.SIGKILL))
            pid = self.workers(node).get(fault.get("local_rank", 0))
            if pid is not None:
                _kill(pid, sig)
        elif kind == "kill_agent":
            self.targeted.add(node)
            _kill(self.agents[node].pid, signal.SIGKILL)
        elif kind in ("kill_node", "freeze_node", "kill_store_host"):
            node = 0 if kind == "kill_store_host" else node
            self.targeted.add(node)
            sig = signal.SIGSTOP if kind == "freeze_node" else signal.SIGKILL
            pids = self.workers(node)
            _kill(self.agents[node].pid, sig)
            for pid in pids.values():
                _kill(pid, sig)
        elif kind == "remove_node":
            self.targeted.add(node)
            _kill(self.agents[node].pid, signal.SIGTERM)
        elif kind == "add_node":
            self.start_agent()

    def cleanup(self) -> None:
        for agent in self.agents:
            self.seen.add(agent.pid)
        for pid in self.seen:
            _kill(pid, signal.SIGCONT)
            _kill(pid, signal.SIGKILL)
        for agent in self.agents:
            agent.wait()
        if self.reservation is not None:
            self.reservation.release()


def _kill(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def run_torchrun_job(scenario: Scenario, tmp: str, env: dict) -> dict:
    from harness.endpoints import PortReservation
    from harness.sim.schema import modern_spec

    job = TorchrunJob(scenario, tmp, env)
    low, high = scenario.nnodes
    faults = [modern_spec(f) for f in scenario.spec.get("fault", [])]
    pending = []
    for fault in faults:  # exit-code crashes at a step: the order the worker obeys itself
        if fault["kind"] == "kill_worker" and "exit_code" in fault and "at_step" in fault:
            with open(os.path.join(job.orders, f"{fault.get('rank', 0)}.{fault['at_step']}"), "w") as fp:
                fp.write(str(int(fault["exit_code"])))
            job.fired.append("kill_worker")
        else:
            pending.append(fault)
    count = int(scenario.job.get("nodes", high))
    expected_workers = count * int(scenario.job.get("nproc_per_node", 1))
    timeout = float(scenario.job.get("timeout", 120))
    started = time.monotonic()
    timed_out = False
    try:
        if high > 1:
            job.reservation = PortReservation("127.0.0.1")
        for _ in range(count):
            job.start_agent()
            if high > 1 and len(job.agents) == 1:
                time.sleep(0.05)  # node 0 first: it binds the endpoint and hosts the store
        if job.reservation is not None:
            job.reservation.release()
        while any(a.poll() is None for a in job.agents):
            now = time.monotonic()
            if now - started > timeout:
                timed_out = True
                break
            if pending:
                job.new_steps()
                timed = any("at_step" not in f for f in pending)
                if timed and job.all_running_at is None and \
                        sum(len(job.workers(i)) for i in range(len(job.agents))) >= expected_workers:
                    job.all_running_at = now
                for fault in [f for f in pending if job.due(f, now)]:
                    pending.remove(fault)
                    job.fire(fault)
            time.sleep(POLL_S)
        wall = time.monotonic() - started
        codes = [a.poll() for a in job.agents]
    finally:
        job.cleanup()
    # as a job: it succeeded when every node no fault took away finished with 0
    kept = [c for i, c in enumerate(codes) if i not in job.targeted]
    state = "SUCCEEDED" if kept and all(c == 0 for c in kept) and not timed_out else "FAILED"
    expected = scenario.spec.get("expect", {}).get("state")
    if os.environ.get("BENCH_SUITE_DEBUG") and expected not in (None, state):
        for i in range(len(job.agents)):
            with open(os.path.join(job.dir, f"agent{i}.log"), errors="replace") as fp:
                print(f"--- {scenario.name} agent {i} (code {codes[i]}):\n{fp.read()[-3000:]}", file=sys.stderr)
    return {"name": scenario.name, "wall": wall, "timed_out": timed_out, "state": state,
            "expected": expected, "codes": codes, "fired": job.fired, "unfired": [f["kind"] for f in pending]}


def run_torchrun(scenarios: list[Scenario], jobs: int, env: dict, tmp: str) -> tuple[float, list[dict]]:
    results: list[dict] = []
    lock = threading.Lock()

    def one(scenario: Scenario) -> None:
        result = run_torchrun_job(scenario, tmp, env)
        with lock:
            results.append(result)
            mark = " (timed out)" if result["timed_out"] else ""
            print(f"  torchrun {result['name']:<36} {fmt_s(result['wall'])}{mark} {result['state']}"
                  f" codes={result['codes']} fired={result['fired']}", file=sys.stderr)

    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        list(pool.map(one, scenarios))
    return time.monotonic() - started, sorted(results, key=lambda r: r["name"])


# -- main -----------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    isolate_tmpdir()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1, help="rounds, alternating which side goes first")
    parser.add_argument("-k", dest="filter", default=None, help="only scenarios whose name contains TEXT")
    parser.add_argument("--jobs", type=int, default=2, help="pytest -n and torchrun jobs at a time (2)")
    parser.add_argument("--no-torchrun", action="store_true", help="skip the torchrun side")
    args = parser.parse_args(argv)
    scenarios = find_scenarios(args.filter)
    if not scenarios:
        parser.error("no scenarios/**/*.toml matched")
    use_torchrun = not args.no_torchrun and TORCHRUN.exists()
    tmp = tempfile.mkdtemp(prefix="bench-suite-")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PET_", "PYTEST_", "HARNESS_")) and k != "TORCHELASTIC_ERROR_FILE"}
    env.update(TMPDIR=tmp, TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1",
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p))
    print(f"bench/suite.py: {len(scenarios)} scenarios x {args.runs} round(s), {args.jobs} at a time; "
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}", file=sys.stderr)
    ours_walls: list[float | None] = []
    theirs_walls: list[float] = []
    per_scenario: dict[str, list[dict]] = {}
    ours_each: dict[str, list[float]] = {}
    summary = ""
    try:
        for round_no in range(args.runs):
            sides = ["ours", "torchrun"] if round_no % 2 == 0 else ["torchrun", "ours"]
            for side in sides:
                if side == "ours":
                    wall, summary, durations = run_ours(scenarios, args.jobs, env)
                    ours_walls.append(wall)
                    for name, seconds in durations.items():
                        ours_each.setdefault(name, []).append(seconds)
                    print(f"  round {round_no + 1}: ours {fmt_s(wall)} ({summary})", file=sys.stderr)
                elif use_torchrun:
                    total, results = run_torchrun(scenarios, args.jobs, env, tmp)
                    theirs_walls.append(total)
                    for r in results:
                        per_scenario.setdefault(r["name"], []).append(r)
                    print(f"  round {round_no + 1}: torchrun {fmt_s(total)}", file=sys.stderr)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    import statistics

    ours = statistics.median([w for w in ours_walls if w is not None]) if any(ours_walls) else None
    theirs = statistics.median(theirs_walls) if theirs_walls else None
    rows = []
    fair_ours = fair_theirs = 0.0
    fair = 0
    for name, results in sorted(per_scenario.items()):
        wall = statistics.median(r["wall"] for r in results)
        mine = statistics.median(ours_each[name]) if ours_each.get(name) else None
        last = results[-1]
        outcome = last["state"] + (" (timed out)" if last["timed_out"] else "")
        as_expected = last["expected"] in (None, last["state"]) and not last["timed_out"]
        match = "" if as_expected else f" (expected {last['expected']})"
        if as_expected and mine is not None:
            fair, fair_ours, fair_theirs = fair + 1, fair_ours + mine, fair_theirs + wall
        rows.append([name, fmt_s(mine), fmt_s(wall), fmt_ratio(ratio(mine, wall)), outcome + match,
                     ",".join(last["fired"]) or "-"])
    print()
    if rows:
        print(f"per scenario (medians of {args.runs}; {args.jobs} jobs at a time on each side): ours = "
              "the pytest test's duration (setup+call+teardown), torchrun = the job's wall time")
        print_table(["scenario", "ours", "torchrun", "ours/torchrun", "torchrun outcome", "faults fired"], rows)
        print()
    verdict = "n/a" if ours is None or theirs is None else (
        "PASS" if ratio(ours, theirs) <= TARGET_RATIO else "FAIL")
    print(f"totals (median of {args.runs} round(s)); ours: pytest -n {args.jobs} -> {summary}; "
          f"load after: {os.getloadavg()[0]:.2f}")
    print_table(["suite", f"ours (pytest -n {args.jobs})", f"torchrun ({args.jobs} at a time)",
                 "ours/torchrun", "target", "verdict"],
                [[f"{len(scenarios)} scenarios, total wall", fmt_s(ours), fmt_s(theirs),
                  fmt_ratio(ratio(ours, theirs)), f"<= {TARGET_RATIO}x", verdict],
                 [f"the {fair} where torchrun met the expectation, sum of jobs (info)",
                  fmt_s(fair_ours if fair else None), fmt_s(fair_theirs if fair else None),
                  fmt_ratio(ratio(fair_ours, fair_theirs) if fair else None), "-", "-"]])
    return 0


if __name__ == "__main__":
    sys.exit(main())

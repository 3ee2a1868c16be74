"""Scale bench: how a simulated job's cost grows with its nodes, beside torchrun where it fits.

    .venv/bin/python bench/scale.py                      # N = 8, 16, 32, 64, 128 x 1, and 16 x 4
    .venv/bin/python bench/scale.py --sizes 8x1 32x1 --runs 3 --no-torchrun
    .venv/bin/python bench/scale.py --sizes 8x1 --jobs-in-a-row 30     # the controller's memory

Each size runs in a fresh interpreter (``--child``), so each run pays the zygote's torch
import as a user's first job does. A run is one ``harness.Cluster(nnodes="1:N")`` job of
``scripts/scale_worker.py`` (gloo init, then steps of one all_reduce each, reported with
``harness.report_step``): node N-1 is SIGKILLed (``kill_node``) at step 2, the survivors
re-form and run their steps again, and the job ends. Measured, in the child:

* **first step**: ``Cluster()`` called (before the harness is imported) to every rank's
  first step;
* **result**: to ``JobResult`` (the close after it is in *total*);
* **lost → survivors**: the fault to every survivor's first step in the smaller world;
* **change seen**: the fault to a survivor's agent deciding to re-form (its
  ``membership_change``), the median survivor's and the last's: how long the loss takes to
  reach every survivor;
* **PSS**: the controller's own (this process: the harness, its bus reader, its checkers),
  and the job's processes per node (agents, workers, the zygote and the store, summed at
  their peak, divided by N: the zygote's shared pages are counted once, proportionally),
  sampled in one more run per size whose times are not used (``--no-pss``: none): reading
  every process's ``smaps_rollup`` during a timed run slowed the job it measured;
* **events/s**: events the bus carried over the job's wall time; **store ops/round**: the
  rendezvous store's requests over the job, per rendezvous round (two rounds: formation and
  the loss);
* **CPU**: the whole run's (the child's process tree, the job's every process: a ``cpuacct``
  cgroup of its own, where cgroup v1's ``cpuacct`` is writable; else none), split into the
  agents' (the nodes' own ``node<i>/agent`` cgroups, with the share per node), the workers'
  (``node<i>/workers``; where there are no such cgroups, each worker's own at its end,
  ``scale_worker.py --stamps``, which misses the workers a fault stopped) and the rest's,
  which a second table splits by process: the controller (this process: the harness, its
  bus, its checkers), the zygote (torch's import, every worker's fork), the rendezvous store,
  the storage server and the node fork server. On 2 cores a 64- or 128-node job is
  CPU-bound: its time is at least its CPU over 2, and the workers' part is what gloo's mesh
  costs (``bench/gloo_floor.py`` measures it without a launcher).

**Where the seconds go** (the tables after the main one): for the first round (from the
start) and the recovery (from the fault), when the median and the last node or rank passed
each milestone: node started, agent up, change seen (a survivor's agent decided to re-form),
workers stopped and round formed (the timeline), worker forked (the
agent's ``worker_start``), script began, torch imported, gloo initialised and the first
``all_reduce`` returned (the worker's own stamps, ``scale_worker.py --stamps``), then the end:
the last step, ``destroy_process_group`` returned, the workers' exits, the agents' results
and the ``JobResult``. The step from
one "last" to the next is what that phase cost on the critical path.

``--no-fault``: the same job without its node loss (one round): start to ``JobResult`` of a
trivial gloo job, the figure torchrun's row is (its *total*, close included, beside ours).

``--idle S``: every rank sleeps S s after its first step (``scale_worker.py --idle``), and the
bench reads the run's ``cpuacct`` every 0.1 s: the CPU per second over the window every rank
slept is what the job costs doing nothing (the agents' monitor ticks and keep-alives, the
store, gloo's own threads), in the table with its share per node. It grows with the job
where the agents poll what grows with it.

``--gloo-lazy``: every worker, ours and torchrun's, runs with torch's
``TORCH_GLOO_LAZY_INIT=1``: gloo connects a pair of ranks when a collective first uses it,
instead of every pair at ``init_process_group`` (an ``all_reduce`` uses a rank's ring
neighbours), so the N² mesh is gone from the round.

``--monitor-interval S``: the agents' monitor interval (default: the cluster's, 0.1 s): what
the agents' own polling costs the job at a size.

``--network loopback``: every node on one loopback instead of a network host of its own (the
default where the machine can: a namespace per node on a bridge), in a network namespace of the
run's own where it can be made (``bench/gloo_floor.py``'s docstring says why): what the
simulated network costs a job at a size.

``--jobs-in-a-row K``: K such jobs one after another on one cluster (one interpreter), the
controller's PSS after each: whether it grows per job (a timeline, a checker or a bus
reader that keeps what a finished job left).

torchrun (unless ``--no-torchrun``, where N x P <= ``--torchrun-max``): N agents on loopback
with one c10d store (``--rdzv-backend=c10d``, ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``), the
same worker (its step reports are no-ops there) and no fault: launch to every agent reaped,
beside ours' *result* (which includes a node loss and its recovery, unless ``--no-fault``:
then both are the same job) and *total*. Its agents each import
torch (~220 MB), so it stops where the machine's memory does.

``--floor``: after each of our runs, torch alone at the same number of ranks
(``bench/gloo_floor.py``: N ranks forked from one torch process, gloo's mesh, one
``all_reduce``, ``destroy_process_group``, every rank reaped; no launcher, agent or
rendezvous), alternated with ours. The table gets torch's time (from its first fork: its import,
some 1 s, is in ours), and ours less it: what the
harness adds on top of gloo's N² mesh, with its own growth exponent. Where torch alone grows
faster than the job (its mesh: N(N-1)/2 connections at init, as many to close at the end),
that difference says whether what is ours does too.

The growth exponent k of t ∝ N^k is fitted over the N x 1 sizes (least squares on logs).
Progress goes to stderr, the table to stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

from _common import (  # noqa: E402
    PssPeak,
    fmt_s,
    free_port,
    median,
    own_loopback_prefix,
    print_table,
    process_tree,
    pss_kb,
    slope,
    stdout_to,
    sweep_killed_runs,
)

WORKER = str(HERE / "scripts" / "scale_worker.py")
DEFAULT_SIZES = ["8x1", "16x1", "32x1", "64x1", "128x1", "16x4"]
STEPS = 4
#: torch's switch for gloo's lazy connections (``--gloo-lazy``)
GLOO_LAZY_ENV = "TORCH_GLOO_LAZY_INIT"
KILL_AT = 2


def lose_the_last_node(job: Any, nodes: int) -> Any:
    """The run's fault: node N-1 SIGKILLed at rank 0's step ``KILL_AT``; the job's result."""
    from harness.faults import AtStep, NodeKill, ScheduledFault

    job.schedule([ScheduledFault(NodeKill(node=nodes - 1), AtStep(step=KILL_AT, rank=0))])
    return job.wait(timeout=600)


def child(nodes: int, nproc: int, fault: bool = True, monitor_interval: float | None = None,
          pss: bool = False, idle: float = 0.0, network: str = "auto") -> None:
    """One run in this fresh interpreter (with the node loss unless ``fault`` is false);
    prints one JSON line. ``pss``: sample the job's PSS (the run is then not timed: reading
    every process's ``smaps_rollup`` four times a second took 5 % of the machine's CPU at 64
    nodes, on the controller's own process)."""
    started = time.monotonic()
    from harness import Cluster, WorkerState

    stats_dir = os.environ["SCALE_STATS_DIR"]  # the parent's: it removes it, however this child ends
    stats = os.path.join(stats_dir, "served.json")
    stamps_dir = os.path.join(stats_dir, "stamps")
    os.mkdir(stamps_dir)
    os.environ["HARNESS_STORE_STATS"] = stats  # the job's store process writes what it served here
    me = os.getpid()
    sampler = PssPeak(lambda: process_tree([me]) - {me}, period=0.25)  # the job's processes, all below this one
    if pss:
        sampler.start()
    tuned = {} if monitor_interval is None else {"monitor_interval": monitor_interval}
    with Cluster(nnodes=f"1:{nodes}", nproc_per_node=nproc, max_restarts=0, network=network, **tuned) as cluster:
        with stdout_to(os.devnull):
            job = cluster.launch(WORKER, "--steps", str(STEPS), "--stamps", stamps_dir,
                                 *(["--idle", str(idle)] if idle > 0 else []))
        result = lose_the_last_node(job, nodes) if fault else job.wait(timeout=600)
        ended = time.monotonic()
        parts_cpu = cpu_by_part()  # before the cluster's close removes the nodes' cgroups
        servers_cpu = cpu_of_servers(os.getpid())
        steps = job.timeline.steps()
        rounds = job.timeline.world_sizes()
        events = job.timeline.events()
    closed = time.monotonic()
    if pss:
        sampler.stop()
    world = nodes * nproc
    firsts = [e["mono"] for e in steps if e["step"] == 1 and e.get("restart_count", 0) == 0]
    first_round = sorted(firsts)[:world]
    fault = next((e["mono"] for e in events if e["kind"] == "fault"), None)
    after = {}
    if fault is not None:
        for e in steps:
            if e["mono"] > fault and e["step"] == 1:
                after.setdefault(e["rank"], e["mono"])
    survivors = world - nproc
    lost_to_survivors = (max(after.values()) - fault) if fault is not None and len(after) >= survivors else None
    mono0 = events[0]["mono"] if events else started
    span = max(e["mono"] for e in events) - mono0 if events else 0.0
    try:
        with open(stats) as fp:
            served = json.load(fp)["served"]
    except (OSError, ValueError, KeyError):
        served = {}
    stamps = [json.loads(Path(stamps_dir, name).read_text()) for name in os.listdir(stamps_dir)]
    idles = [s["idle"] for s in stamps if "idle" in s]
    print(json.dumps({
        "store_ops": sum(served.values()), "store_ops_per_round": sum(served.values()) / max(len(rounds), 1),
        "served": served,
        "nodes": nodes, "nproc": nproc, "state": result.state.value == WorkerState.SUCCEEDED.value,
        "first_step": (max(first_round) - started) if len(first_round) == world else None,
        "result": ended - started, "total": closed - started, "lost_to_survivors": lost_to_survivors,
        "controller_pss_mb": pss_kb(me) / 1024, "job_pss_mb": sampler.peak_kb / 1024 if pss else None,
        "events": len(events), "events_per_s": len(events) / span if span else None, "rounds": rounds,
        "workers_cpu_s": sum(s["cpu"] for s in stamps if "cpu" in s),
        "agents_cgroup_cpu_s": parts_cpu.get("agent"), "workers_cgroup_cpu_s": parts_cpu.get("workers"),
        "servers_cpu_s": servers_cpu,
        # when every rank slept (``--idle``): the parent reads the job's CPU over it
        "idle_window": [max(i[0] for i in idles), min(i[1] for i in idles)] if idles else None,
        "phases": phases(events, stamps, started, fault, ended),
    }), flush=True)


def cpu_by_part() -> dict[str, float]:
    """The CPU (s) the job's agents and its workers used: the sums of the nodes' own
    ``cpuacct`` cgroups (``node<i>/agent``, ``node<i>/workers``, which the harness makes under
    the cgroup this process runs in), read once the job ended. Empty where there are none."""
    from harness.procs import cgroup_dirs

    mine = cgroup_dirs().get("cpuacct")
    if mine is None:
        return {}
    totals: dict[str, float] = {}
    for part in ("agent", "workers"):
        for path in glob.glob(os.path.join(mine, "elastic_*", "node*", part, "cpuacct.usage")):
            try:
                with open(path) as fp:
                    totals[part] = totals.get(part, 0.0) + int(fp.read()) / 1e9
            except (OSError, ValueError):
                pass
    return totals


#: the harness's own processes, by what their command line runs
SERVERS = {"zygote": "harness.procs._zygote", "rendezvous store": "harness.rendezvous.store_server",
           "storage server": "harness.sim.storage.server", "node fork server": "harness.sim.nodes.forks"}


def cpu_of_servers(me: int) -> dict[str, float]:
    """The CPU (s) this process (the controller: the harness, its bus, its checkers) and the
    job's servers below it have used so far: the zygote (torch's import and every worker's
    fork), the rendezvous store, the storage server, the node fork server (the agents are
    its children, each counted in its own cgroup instead)."""
    import psutil

    out = {"controller": sum(os.times()[:2])}
    for proc in psutil.Process(me).children():  # the servers are this process's own children
        try:
            command = " ".join(proc.cmdline())
            name = next((n for n, marker in SERVERS.items() if marker in command), None)
            if name is not None:
                times = proc.cpu_times()
                out[name] = out.get(name, 0.0) + times.user + times.system
        except psutil.Error:
            continue
    return out


#: the milestones of a round, in the order a node passes them
MILESTONES = ["node started", "agent up", "change seen", "workers stopped", "round formed", "worker forked",
              "script began", "torch imported", "gloo initialised", "first all_reduce", "last step", "group destroyed",
              "worker exited", "agent result", "job result"]


def phases(events: list[dict], stamps: list[dict], started: float, fault: float | None,
           ended: float) -> dict[str, dict]:
    """When the last node (or rank) passed each milestone, from ``started`` (the first round)
    and from the fault (the recovery): the difference of two consecutive ones is what that
    phase cost on the critical path. Worker milestones come from the worker's own stamps
    (``scale_worker.py --stamps``), the others from the timeline."""
    def when(kind: str, pick=lambda e: True) -> list[float]:
        return [e["mono"] for e in events if e["kind"] == kind and pick(e)]

    out: dict[str, dict] = {}
    for name, lo, hi in (("first round", started, fault if fault is not None else math.inf),
                         ("recovery", fault, math.inf)):
        if lo is None:
            continue
        inside = lambda t, lo=lo, hi=hi: lo <= t < hi  # noqa: E731
        marks = {
            "node started": when("node_start"),
            "agent up": when("state", lambda e: e.get("state") == "INIT" and e.get("source") != "harness"),
            "change seen": when("membership_change"),
            "workers stopped": when("state", lambda e: e.get("state") == "STOPPED" and e.get("source") != "harness"),
            "round formed": when("rendezvous"),
            "worker forked": when("worker_start"),
            "script began": [s["began"] for s in stamps if "began" in s],
            "torch imported": [s["imported"] for s in stamps if "imported" in s],
            "gloo initialised": [s["initialised"] for s in stamps if "initialised" in s],
            "first all_reduce": [s["first_reduce"] for s in stamps if "first_reduce" in s],
            "last step": when("step", lambda e: e.get("step") == STEPS),
            "group destroyed": [s["destroyed"] for s in stamps if "destroyed" in s],
            "worker exited": when("worker_exit", lambda e: e.get("exitcode") == 0),
            "agent result": when("result"),
            "job result": [ended],
        }
        row = {}
        for mark in MILESTONES:
            times = sorted(t - lo for t in marks[mark] if inside(t))
            if times:
                row[mark] = {"median": times[len(times) // 2], "last": times[-1], "count": len(times)}
        out[name] = row
    return out


def child_in_a_row(nodes: int, nproc: int, jobs: int) -> None:
    """``jobs`` jobs one after another on one cluster in this interpreter (each with its node
    loss); prints one JSON line: the controller's PSS after each (does it grow per job?)."""
    from harness import Cluster, WorkerState

    me = os.getpid()
    series, failed = [], 0
    with Cluster(nnodes=f"1:{nodes}", nproc_per_node=nproc, max_restarts=0) as cluster:
        for _ in range(jobs):
            job = cluster.launch(WORKER, "--steps", str(STEPS))
            result = lose_the_last_node(job, nodes)
            failed += result.state.value != WorkerState.SUCCEEDED.value
            series.append(pss_kb(me) / 1024)
    print(json.dumps({"nodes": nodes, "nproc": nproc, "pss_mb": series, "failed": failed}), flush=True)


def in_a_row(size: str, jobs: int, timeout: float) -> None:
    """The controller's memory over ``jobs`` jobs in a row: PSS after the first, the 10th,
    the last, and the growth per job after the first ten (least squares)."""
    nodes, nproc = (int(x) for x in size.split("x"))
    out = subprocess.run([sys.executable, __file__, "--child-in-a-row", str(nodes), str(nproc), str(jobs)],
                         capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    line = next((x for x in reversed(out.stdout.splitlines()) if x.startswith("{")), None)
    if line is None:
        print(f"{size} x {jobs} jobs: no result (rc={out.returncode}): {out.stderr.strip()[-300:]}")
        return
    run = json.loads(line)
    pss = run["pss_mb"]
    tail = list(enumerate(pss))[10:] or list(enumerate(pss))
    slope_kb = 1024 * (slope([(float(i), v) for i, v in tail]) or 0.0)
    print_table(["N x P", "jobs", "failed", "PSS after job 1", "after job 10", "after the last", "growth / job"],
                [[size, str(len(pss)), str(run["failed"]), f"{pss[0]:.1f} MB", f"{pss[min(9, len(pss) - 1)]:.1f} MB",
                  f"{pss[-1]:.1f} MB", f"{slope_kb:+.0f} KB"]])


class RunCpu:
    """A ``cpuacct`` cgroup for one child run, under the bench's own (cgroup v1's ``cpuacct``
    hierarchy): everything the child starts is counted in it (the harness makes its job's
    cgroups under the cgroup it runs in). ``usage`` in seconds, or None where the cgroup
    could not be made."""

    def __init__(self) -> None:
        from harness.procs import cgroup_dirs

        mine = cgroup_dirs().get("cpuacct")
        self.path: str | None = None
        if mine is not None:
            path = os.path.join(mine, f"scale-bench-{os.getpid()}-{time.monotonic_ns()}")
            try:
                os.mkdir(path)
                self.path = path
            except OSError:
                pass

    def enter(self) -> None:
        """In the child, before it runs (``preexec_fn``)."""
        if self.path is not None:
            with open(os.path.join(self.path, "cgroup.procs"), "w") as fp:
                fp.write(str(os.getpid()))

    def usage(self) -> float | None:
        if self.path is None:
            return None
        with open(os.path.join(self.path, "cpuacct.usage")) as fp:
            return int(fp.read()) / 1e9

    def remove(self) -> None:
        """Once the child's processes are gone (a killed child's last ones take a moment)."""
        deadline = time.monotonic() + 10
        while self.path is not None:
            try:
                os.rmdir(self.path)
                self.path = None
            except FileNotFoundError:
                self.path = None
            except OSError:
                if time.monotonic() > deadline:
                    print(f"scale: could not remove {self.path}", file=sys.stderr)
                    return
                time.sleep(0.1)


class CpuSamples:
    """The run's CPU (``RunCpu.usage``) read every 0.1 s by a thread of the bench's, with when:
    the rate over the window every rank slept (``--idle``) is what the job costs doing nothing
    (agents' monitor ticks and keep-alives, the store, gloo's own threads), per second."""

    def __init__(self, cpu: RunCpu):
        self._cpu = cpu
        self._points: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            try:
                used = self._cpu.usage()
            except OSError:  # the cgroup is being removed
                return
            if used is not None:
                self._points.append((time.monotonic(), used))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def rate(self, start: float, end: float) -> float | None:
        """CPU-s per second between the first reading past ``start`` and the last before
        ``end``, with 0.2 s kept off each edge (a rank waking late is not the job idle)."""
        inside = [p for p in self._points if start + 0.2 <= p[0] <= end - 0.2]
        if len(inside) < 2 or inside[-1][0] - inside[0][0] < 0.5:
            return None
        (t0, c0), (t1, c1) = inside[0], inside[-1]
        return (c1 - c0) / (t1 - t0)


def run_child(nodes: int, nproc: int, timeout: float, fault: bool = True,
              monitor_interval: float | None = None, pss: bool = False, idle: float = 0.0,
              network: str = "auto") -> dict:
    stats_dir = tempfile.mkdtemp(prefix="scale-")
    cpu = RunCpu()
    samples = CpuSamples(cpu) if idle > 0 else None
    try:
        # loopback: in a network namespace of the run's own, where it can be made
        prefix = own_loopback_prefix() if network == "loopback" else []
        out = subprocess.run([*prefix, sys.executable, __file__, "--child", str(nodes), str(nproc),
                              *([] if fault else ["--no-fault"]), *(["--pss"] if pss else []),
                              *([] if monitor_interval is None else ["--monitor-interval", str(monitor_interval)]),
                              *(["--idle", str(idle)] if idle > 0 else []), "--network", network],
                             capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                             env={**os.environ, "SCALE_STATS_DIR": stats_dir}, preexec_fn=cpu.enter)
        used = cpu.usage()
    except subprocess.TimeoutExpired:  # the child was SIGKILLed: what its clusters held goes now
        sweep_killed_runs("scale")
        return {"nodes": nodes, "nproc": nproc, "state": False, "error": f"no result within {timeout:g} s"}
    finally:
        if samples is not None:
            samples.stop()
        shutil.rmtree(stats_dir, ignore_errors=True)
        cpu.remove()
    for line in reversed(out.stdout.splitlines()):
        if line.startswith("{"):
            run = json.loads(line)
            window = run.get("idle_window")
            agents, workers = run.get("agents_cgroup_cpu_s"), run.get("workers_cgroup_cpu_s")
            rest = used - agents - workers if None not in (used, agents, workers) else None
            return {**run, "job_cpu_s": used, "agents_cpu_s": agents, "rest_cpu_s": rest,
                    "workers_cpu_s": run.get("workers_cpu_s") if workers is None else workers,
                    "idle_cpu_per_s": samples.rate(*window) if samples is not None and window else None}
    tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
    return {"nodes": nodes, "nproc": nproc, "state": False, "error": f"rc={out.returncode}: {tail[:200]}"}


def torchrun(nodes: int, nproc: int, timeout: float) -> dict:
    """N torchrun agents on loopback, one c10d store, the same worker with no fault: launch
    to every agent reaped (ours: *result*, the same job without its node loss)."""
    port = free_port()
    env = {**os.environ, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", "PYTHONUNBUFFERED": "1"}
    tmp = tempfile.mkdtemp(prefix="scale-torchrun-")
    env["TMPDIR"] = tmp
    started = time.monotonic()
    agents = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", f"--nnodes={nodes}",
                                f"--nproc-per-node={nproc}", "--rdzv-backend=c10d",
                                f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=scale", "--max-restarts=0",
                                WORKER, "--steps", str(STEPS)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                               start_new_session=True) for _ in range(nodes)]
    deadline = started + timeout
    while time.monotonic() < deadline and any(a.poll() is None for a in agents):
        time.sleep(0.05)
    leftovers = process_tree([a.pid for a in agents if a.poll() is None])  # a stuck job: agents and workers
    for pid in leftovers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for agent in agents:
        agent.wait()
    shutil.rmtree(tmp, ignore_errors=True)
    return {"total": time.monotonic() - started, "ok": all(a.returncode == 0 for a in agents)}


def torch_alone(ranks: int, timeout: float) -> dict:
    """``bench/gloo_floor.py`` at ``ranks`` ranks, one run in a fresh interpreter: its
    milestones (s from the first fork), or ``{"error": ...}``."""
    try:
        out = subprocess.run([sys.executable, str(HERE / "gloo_floor.py"), "--sizes", str(ranks), "--runs", "1",
                              "--json"], capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"error": f"no result within {timeout:g} s"}
    for line in reversed(out.stdout.splitlines()):
        if line.startswith("{"):
            run: dict = json.loads(line)["run"]
            return run if not run.get("failed") else {"error": f"{run['failed']:.0f} rank(s) failed"}
    tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
    return {"error": f"rc={out.returncode}: {tail[:200]}"}


def fmt_per_node(value: float | None, nodes: int, unit: str = " s", digits: int = 0) -> str:
    """A job's CPU (``unit``: " s"; the idle rate: "", per second), and its share per node in ms."""
    return "-" if value is None else f"{value:.2f}{unit} ({1000 * value / nodes:.{digits}f} ms / node)"


def exponent(points: list[tuple[int, float]]) -> float | None:
    """k of t ∝ N^k, least squares on (log N, log t)."""
    return slope([(math.log(n), math.log(t)) for n, t in points if t and t > 0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", nargs=2, type=int, metavar=("NODES", "NPROC"), help=argparse.SUPPRESS)
    parser.add_argument("--sizes", nargs="+", default=DEFAULT_SIZES, help="NODESxNPROC (default: %(default)s)")
    parser.add_argument("--runs", type=int, default=1, help="runs per size (default 1; medians)")
    parser.add_argument("--no-torchrun", action="store_true")
    parser.add_argument("--no-fault", action="store_true", help="the job without its node loss (one round)")
    parser.add_argument("--monitor-interval", type=float, default=None,
                        help="the agents' monitor interval (default: the cluster's)")
    parser.add_argument("--torchrun-max", type=int, default=32, help="largest N x P torchrun runs at (memory)")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--jobs-in-a-row", type=int, default=0, metavar="K",
                        help="instead: K jobs in a row on one cluster of the first --sizes size (the controller's PSS)")
    parser.add_argument("--child-in-a-row", nargs=3, type=int, help=argparse.SUPPRESS)
    parser.add_argument("--pss", action="store_true", help=argparse.SUPPRESS)  # a child's: sample PSS
    parser.add_argument("--no-pss", action="store_true",
                        help="skip the extra, untimed run per size that measures the job's PSS")
    parser.add_argument("--idle", type=float, default=0.0, metavar="S",
                        help="every rank sleeps S s after its first step: the job's CPU per second then "
                             "(what it costs doing nothing) in the table")
    parser.add_argument("--network", choices=["auto", "netns", "loopback"], default="auto",
                        help="the cluster's network (default: auto, each node a host of its own where it can "
                             "be): loopback runs every node on one loopback, what the simulated network costs")
    parser.add_argument("--floor", action="store_true",
                        help="after each run, torch alone at the same ranks (bench/gloo_floor.py), "
                             "and ours less it in the table")
    parser.add_argument("--gloo-lazy", action="store_true",
                        help="every worker (ours and torchrun's) connects gloo's pairs when a collective "
                             "first uses them (torch's TORCH_GLOO_LAZY_INIT=1), not all at init")
    opts = parser.parse_args()
    if opts.gloo_lazy:
        os.environ[GLOO_LAZY_ENV] = "1"  # the children inherit it, and so do their workers
    if opts.child:
        child(*opts.child, fault=not opts.no_fault, monitor_interval=opts.monitor_interval, pss=opts.pss,
              idle=opts.idle, network=opts.network)
        return
    if opts.child_in_a_row:
        child_in_a_row(*opts.child_in_a_row)
        return
    if opts.jobs_in_a_row:
        in_a_row(opts.sizes[0], opts.jobs_in_a_row, opts.timeout * opts.jobs_in_a_row)
        return
    rows, fits, phase_rows, server_rows = [], [], [], []
    floor_fits: list[tuple[int, float]] = []
    added_fits: list[tuple[int, float]] = []
    for size in opts.sizes:
        nodes, nproc = (int(x) for x in size.split("x"))
        runs, floors = [], []
        for i in range(opts.runs):
            print(f"{size}: run {i + 1}/{opts.runs} ...", file=sys.stderr, flush=True)
            run = run_child(nodes, nproc, opts.timeout, fault=not opts.no_fault,
                            monitor_interval=opts.monitor_interval, idle=opts.idle, network=opts.network)
            print(f"{size}: {json.dumps(run)}", file=sys.stderr, flush=True)
            runs.append(run)
            if opts.floor:
                floor = torch_alone(nodes * nproc, opts.timeout)
                print(f"{size}: torch alone {json.dumps(floor)}", file=sys.stderr, flush=True)
                floors.append(floor)
        good = [r for r in runs if r.get("state")]
        failed = len(runs) - len(good)
        job_pss = None
        if not opts.no_pss:
            print(f"{size}: PSS run (untimed) ...", file=sys.stderr, flush=True)
            sampled = run_child(nodes, nproc, opts.timeout, fault=not opts.no_fault,
                                monitor_interval=opts.monitor_interval, pss=True, network=opts.network)
            print(f"{size}: PSS run {json.dumps(sampled)}", file=sys.stderr, flush=True)
            job_pss = sampled.get("job_pss_mb") if sampled.get("state") else None
        if good and good[-1].get("phases"):
            phase_rows.append((size, good[-1]["phases"]))
        if good and good[-1].get("servers_cpu_s"):
            server_rows.append((size, [r["servers_cpu_s"] for r in good if r.get("servers_cpu_s")]))

        def med(key: str, good: list[dict] = good) -> float | None:
            values = [r[key] for r in good if r.get(key) is not None]
            return median(values) if values else None

        def seen(which: str, good: list[dict] = good) -> float | None:
            """The fault to a survivor's agent deciding to re-form (``which``: the median
            survivor's or the last's), the median over the runs."""
            values = [r["phases"]["recovery"]["change seen"][which] for r in good
                      if "change seen" in r.get("phases", {}).get("recovery", {})]
            return median(values) if values else None

        theirs = None
        if not opts.no_torchrun and nodes * nproc <= opts.torchrun_max:
            print(f"{size}: torchrun ...", file=sys.stderr, flush=True)
            theirs = torchrun(nodes, nproc, opts.timeout)
            print(f"{size}: torchrun {json.dumps(theirs)}", file=sys.stderr, flush=True)
        if nproc == 1 and med("result") is not None:
            fits.append((nodes, med("result")))
        reaped = [f["reaped"] for f in floors if f.get("reaped")]
        floor_s = median(reaped) if reaped else None
        result = med("result")
        added = result - floor_s if floor_s is not None and result is not None else None
        if nproc == 1 and floor_s is not None and added is not None:
            floor_fits.append((nodes, floor_s))
            added_fits.append((nodes, added))
        rows.append([size, fmt_s(med("first_step")), fmt_s(med("result")), fmt_s(med("total")),
                     fmt_s(med("lost_to_survivors")),
                     f"{fmt_s(seen('median'))} / {fmt_s(seen('last'))}",
                     f"{med('controller_pss_mb'):.0f}" if med("controller_pss_mb") else "-",
                     f"{job_pss / nodes:.0f}" if job_pss else "-",
                     f"{med('events_per_s'):.0f}" if med("events_per_s") else "-",
                     f"{med('store_ops_per_round'):.0f}" if med("store_ops_per_round") else "-",
                     fmt_s(med("job_cpu_s")), fmt_per_node(med("agents_cpu_s"), nodes), fmt_s(med("workers_cpu_s")),
                     fmt_s(med("rest_cpu_s")),
                     fmt_per_node(med("idle_cpu_per_s"), nodes, unit="", digits=1),
                     (fmt_s(theirs["total"]) + ("" if theirs["ok"] else " (failed)")) if theirs else "-",
                     *([fmt_s(floor_s), fmt_s(added)] if opts.floor else []),
                     str(failed)])
    print_table(["N x P", "first step", "result", "total", "lost → survivors", "change seen (median / last)",
                 "controller PSS MB",
                 "PSS MB / node", "events/s", "store ops / round", "job CPU", "agents' CPU",
                 "workers' CPU", "the rest's CPU",
                 "idle CPU-s / s", "torchrun total",
                 *(["torch alone", "ours less torch alone"] if opts.floor else []),
                 "failed"], rows)
    k = exponent(fits)
    print(f"\nresult time ∝ N^{k:.2f} over {[n for n, _ in fits]}" if k is not None else "")
    for what, points in (("torch alone", floor_fits), ("ours less torch alone", added_fits)):
        k = exponent(points)
        if k is not None:
            print(f"{what} ∝ N^{k:.2f} over {[n for n, _ in points]}")
    print_servers(server_rows)
    print_phases(phase_rows)


def print_servers(server_rows: list[tuple[str, list[dict[str, float]]]]) -> None:
    """Where *the rest's CPU* goes: the controller and each server (medians over the runs)."""
    if not server_rows:
        return
    names = ["controller", *SERVERS]
    rows = [[size, *(fmt_s(median([r.get(n, 0.0) for r in runs])) for n in names)] for size, runs in server_rows]
    print("\nthe rest's CPU, by process (each run's, to its JobResult):")
    print_table(["N x P", *names], rows)


def print_phases(phase_rows: list[tuple[str, dict]]) -> None:
    """Where the seconds go: for each size and round, when the last node passed each
    milestone (s from the start, or from the fault), and the step from the one before."""
    for size, phases_of in phase_rows:
        for round_name, row in phases_of.items():
            rows, before = [], 0.0
            for mark in MILESTONES:
                if mark not in row:
                    continue
                last = row[mark]["last"]
                rows.append([mark, f"{row[mark]['count']}", f"{row[mark]['median']:.2f}", f"{last:.2f}",
                             f"{last - before:+.2f}"])
                before = last
            print(f"\n{size}, {round_name} (s from the {'start' if round_name == 'first round' else 'fault'}):")
            print_table(["milestone", "passed by", "median", "last", "phase (last - previous last)"], rows)


if __name__ == "__main__":
    main()

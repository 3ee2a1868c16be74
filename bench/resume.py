"""Fault -> training resumed, ours beside torchrun, on the DCP trainer.

    .venv/bin/python bench/resume.py [--runs N] [--quick] [--no-torchrun] [--scenarios crash,node,partition]

What is timed is what a user waits for: from the fault to the first training step that a worker
of a later round reports (``harness.report_step`` events; ``CLOCK_MONOTONIC`` is one clock
for every process on the machine, so the bench reads the workers' own stamps under either
launcher). Scenarios, each on ``scenarios/training/train.py`` (DDP, gloo, DCP checkpoints):

* ``crash``: 1 node x 2 workers; local rank 1 is SIGKILLed once rank 1 reported step 6.
* ``node``: 2 nodes x 1 worker (``nnodes=1:2``); node 1 (agent and workers) is SIGKILLed at
  step 6; node 0 goes on alone.
* ``partition``: 2 nodes, node 1 cut off from the store at step 6 (ours only, network
  namespaces needed: torchrun has no fencing and hangs, see ``bench/network.py``).

Ours runs as ``harness.Cluster`` with zygote workers (the harness default) on a warm pool (a
``WarmPool`` that ran one fault-free job of the trainer first, as a test suite's session pool
has: its zygote learned and preloaded what the trainer imports, ``harness.procs._preload``),
on a cold private pool (``Cluster()`` alone: a zygote started for the job, which preloads
what the import cache kept of the trainer's imports, ``harness.procs._import_cache``; the
warm-up job fills the cache, ``HARNESS_IMPORT_CACHE=0`` measures without it), and with
``start_method="spawn"``,
and prints the four-way breakdown of each fault's lost time
(detection, recovery, startup, wasted; ``Timeline.faults()``). torchrun runs the same
trainer (``--max-restarts=3``; node loss: two agents, c10d on loopback, the bench SIGKILLs
one's process group) and reports fault -> resumed only. Medians over ``--runs``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

from _common import isolate_tmpdir, print_table  # noqa: E402

if TYPE_CHECKING:
    from harness import WarmPool

TRAINER = str(ROOT / "scenarios" / "training" / "train.py")
TORCHRUN = Path(sys.executable).parent / "torchrun"
FAULT_STEP = 6
ARGS = ["--steps", "14", "--ckpt-every", "3"]
TORCHRUN_TIMEOUT_S = 120.0
TARGET_S = 0.5  # the goal: fault -> training resumed, worker crash and node loss
#: our sides: a warm pool (the plugin's per-session pool after a first job: the zygote has
#: preloaded what the trainer imports), a cold private pool (``Cluster()`` alone), spawn
OURS = ("warm pool", "zygote", "spawn")


# -- ours --------------------------------------------------------------------------------


def ours(scenario: str, start_method: str, pool: object = None) -> dict:
    from harness import Cluster

    shape = {"crash": dict(nnodes=1, nproc_per_node=2, max_restarts=3),
             "node": dict(nnodes="1:2", nproc_per_node=1, max_restarts=3),
             "partition": dict(nnodes="1:2", nproc_per_node=1, max_restarts=3, network="netns")}[scenario]
    with Cluster(start_method=start_method, pool=pool, **shape) as cluster:
        return fault_run(cluster, scenario)


def fault_run(cluster, scenario: str, ckpt_dir: str = "{shared}/ckpt") -> dict:  # type: ignore[no-untyped-def]
    """One job of the trainer on ``cluster`` with ``scenario``'s fault at ``FAULT_STEP``:
    ``{"ok": True, "resume": fault -> resumed, "lost": the breakdown, "first_step": launch ->
    first step}`` or ``{"ok": False, "detail": the timeline's tail}``. ``bench/hosts.py``
    runs the ``node`` scenario on a cluster whose nodes are on hosts (``ckpt_dir``: a path
    every host sees, as ``{shared}`` is each host's own there)."""
    from harness import WorkerState
    from harness.faults import AtStep, NodeKill, Partition, WorkerKill

    # a partition takes a few ms to apply (nft rules): give the steps time so it lands mid-run;
    # the first step after the resume then includes one such sleep (0.1 s, in "startup")
    pace = ["--step-time", "0.1"] if scenario == "partition" else []
    launched = time.monotonic()
    job = cluster.launch(TRAINER, *ARGS, *pace, "--ckpt-dir", ckpt_dir)
    if scenario == "crash":
        job.inject(WorkerKill(node=0, local_rank=1), AtStep(step=FAULT_STEP, rank=1))
    elif scenario == "node":
        job.inject(NodeKill(node=1), AtStep(step=FAULT_STEP, rank=0))
    else:
        job.inject(Partition(node=1, peers="store"), AtStep(step=FAULT_STEP, rank=0))
    if scenario == "partition":  # heal once the survivor trained on: node 1 rejoins
        deadline = time.monotonic() + 120
        while (time.monotonic() < deadline and not job.finished()
               and not any(f.resume_latency for f in job.timeline.faults())):
            time.sleep(0.1)
        job.heal()
    result = job.wait(timeout=180)
    ok = result.state == WorkerState.SUCCEEDED
    [fault] = job.timeline.faults()[:1] or [None]
    if not ok or fault is None or fault.resume_latency is None:
        return {"ok": False, "detail": job.timeline.format(40)}
    return {"ok": True, "resume": fault.resume_latency, "lost": dict(fault.lost),
            "first_step": _first_step(job, launched)}


def _first_step(job, launched: float) -> float | None:  # type: ignore[no-untyped-def]
    """``cluster.launch()`` called -> the first training step (the workers' monotonic
    stamp): what every test pays."""
    steps = job.timeline.steps()
    return min(s["mono"] for s in steps) - launched if steps else None


def warm_up(pool: object) -> None:
    """What a test suite's earlier tests do for a later one: one fault-free job of the
    trainer on the pool, so its zygote has learned (and preloaded) what the trainer imports."""
    from harness import Cluster

    with Cluster(nnodes=1, nproc_per_node=2, pool=pool) as cluster:
        job = cluster.launch(TRAINER, "--steps", "4", "--ckpt-every", "2", "--ckpt-dir", "{shared}/ckpt")
        job.wait(timeout=180)
    time.sleep(3)  # the zygote imports what it learned while idle


# -- torchrun ----------------------------------------------------------------------------


def _steps(path: str) -> list[dict]:
    try:
        with open(path) as fp:
            return [e for e in map(json.loads, (line for line in fp if line.strip())) if e.get("kind") == "step"]
    except (OSError, ValueError):
        return []


def torchrun(scenario: str, tmp: str) -> dict:
    from harness.endpoints import PortReservation

    events = os.path.join(tmp, f"events-{uuid.uuid4().hex}.jsonl")
    ckpt = os.path.join(tmp, f"ckpt-{uuid.uuid4().hex}")
    env = {**os.environ, "HARNESS_EVENTS": events, "HARNESS_NODE": "0", "PYTHONPATH": str(ROOT),
           "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    nodes = 1 if scenario == "crash" else 2
    nproc = 2 if scenario == "crash" else 1
    logs = [open(os.path.join(tmp, f"torchrun-{uuid.uuid4().hex}-{i}.log"), "wb") for i in range(nodes)]
    procs: list[subprocess.Popen] = []
    try:
        with PortReservation("127.0.0.1") as reservation:
            common = [str(TORCHRUN), f"--nproc-per-node={nproc}", "--max-restarts=3", "--monitor-interval=0.1"]
            if nodes == 1:
                cmd = [*common, "--standalone"]
            else:
                cmd = [*common, "--nnodes=1:2", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{reservation.port}",
                       f"--rdzv-id=bench-{uuid.uuid4().hex[:8]}"]
            cmd += [TRAINER, *ARGS, "--ckpt-dir", ckpt]
            for log in logs:
                procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                              start_new_session=True))
            reservation.release()
        fault_at, old_pids = None, set()
        deadline = time.monotonic() + TORCHRUN_TIMEOUT_S
        while time.monotonic() < deadline:
            steps = _steps(events)
            if fault_at is None:
                watched = 1 if scenario == "crash" else 0
                if any(e["step"] >= FAULT_STEP and e["rank"] == watched for e in steps):
                    old_pids = {e["pid"] for e in steps}
                    if scenario == "crash":
                        os.kill(next(e["pid"] for e in steps if e["rank"] == 1), signal.SIGKILL)
                    else:
                        os.killpg(procs[1].pid, signal.SIGKILL)  # agent 1 and its workers at once
                    fault_at = time.monotonic()
            else:
                resumed = [e for e in steps if e["pid"] not in old_pids and e["mono"] > fault_at]
                if resumed:
                    return {"ok": True, "resume": min(e["mono"] for e in resumed) - fault_at}
            if all(p.poll() is not None for p in procs):
                break
            time.sleep(0.01)
        return {"ok": False, "detail": f"no resumed step within {TORCHRUN_TIMEOUT_S:g}s", "never": True}
    finally:
        for proc in procs:  # torchrun and every process below it: its workers lead sessions of their own
            try:
                below = psutil.Process(proc.pid).children(recursive=True)
            except psutil.NoSuchProcess:
                below = []
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            for child in below:
                with contextlib.suppress(psutil.NoSuchProcess):
                    child.kill()
            proc.wait()
        for log in logs:
            log.close()


# -- the table ---------------------------------------------------------------------------


def _median(samples: list[dict], key: str) -> float | None:
    values = [s[key] for s in samples if s.get("ok") and s.get(key) is not None]
    return statistics.median(values) if values else None


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def _measure(scenarios: list[str], runs: int, no_torchrun: bool, missing: Sequence[str], pool: WarmPool,
             tmp: str) -> list[list[str]]:
    """Each scenario's runs, every side in rotating order; the table's rows."""
    rows: list[list[str]] = []
    warm_up(pool)
    for scenario in scenarios:
        if scenario == "partition" and missing:
            print(f"partition: skipped ({'; '.join(missing)})", file=sys.stderr)
            continue
        samples: dict[str, list[dict]] = {side: [] for side in OURS + ("torchrun",)}
        for i in range(runs):
            sides = [*OURS] + (["torchrun"] if not no_torchrun and scenario != "partition"
                               and TORCHRUN.exists() else [])
            for side in sides[i % len(sides):] + sides[:i % len(sides)]:  # rotate the order
                sample = (torchrun(scenario, tmp) if side == "torchrun"
                          else ours(scenario, "zygote", pool) if side == "warm pool"
                          else ours(scenario, side))
                samples[side].append(sample)
                print(f"{scenario} {side} run {i}: "
                      f"{_fmt(sample.get('resume')) if sample['ok'] else 'FAILED ' + sample['detail'][-300:]}",
                      file=sys.stderr)
        theirs = _median(samples["torchrun"], "resume")
        never = bool(samples["torchrun"]) and all(s.get("never") for s in samples["torchrun"])
        for side in OURS:
            mine = _median(samples[side], "resume")
            lost = {k: statistics.median([s["lost"][k] for s in samples[side] if s.get("ok")] or [0.0])
                    for k in ("detection", "recovery", "startup", "wasted")}
            ratio = f"{mine / theirs:.3f}" if mine is not None and theirs else "-"
            verdict = ("PASS" if mine is not None and mine <= TARGET_S else "FAIL") if scenario != "partition" else "-"
            rows.append([f"{scenario} ({side})", _fmt(mine),
                         "hangs (no fencing)" if scenario == "partition"
                         else f"> {TORCHRUN_TIMEOUT_S:g} s (never)" if never else _fmt(theirs), ratio,
                         " / ".join(f"{lost[k]:.2f}" for k in ("detection", "recovery", "startup", "wasted")),
                         _fmt(_median(samples[side], "first_step")), f"<= {TARGET_S} s", verdict])
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="1 run each")
    parser.add_argument("--no-torchrun", action="store_true")
    parser.add_argument("--scenarios", default="crash,node,partition")
    args = parser.parse_args(argv)
    # SIGTERM (a driver's kill, timeout(1), CI's cancel) ends it as Ctrl-C does, through every
    # finally: torchrun's agents ignore SIGTERM, and the default action left them running
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    runs = 1 if args.quick else args.runs
    scenarios = [s for s in args.scenarios.split(",") if s]
    tmp = isolate_tmpdir()
    from harness.sim.net import netns_missing

    missing = netns_missing()
    from harness import WarmPool
    from harness.procs._import_cache import import_cache_dir

    cache = import_cache_dir(os.environ)  # what the cold private pool's zygote preloads from
    pool = WarmPool()
    try:
        rows = _measure(scenarios, runs, args.no_torchrun, missing, pool, tmp)
    finally:
        pool.close()
    print(f"fault -> training resumed, median of {runs}; lost = detection / recovery / startup / wasted (s); "
          f"first step = launch -> first training step; import cache: {cache or 'off'}")
    print_table(["scenario (ours)", "ours", "torchrun", "ours/torchrun", "lost (ours)", "first step",
                 "target", "verdict"], rows)
    with contextlib.suppress(OSError):
        tempfile.tempdir = None
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: every process it started is gone by now
        print("bench/resume.py: interrupted", file=sys.stderr)
        sys.exit(130)

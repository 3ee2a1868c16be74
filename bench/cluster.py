"""Cluster bench: ``harness.Cluster`` beside a torchrun-based equivalent in one run.

    .venv/bin/python bench/cluster.py [--runs N] [--quick] [--no-torchrun] [--nodes N]

Rows (targets for this 2-core machine):

(1)  2 nodes x 2 workers, one worker SIGKILLed once every rank is ready (gloo init + one
     all_reduce), the job recovers and ends: start (``Cluster()``) to ``JobResult``, in a
     fresh process each time, so the zygote's one torch import is included. <= 2.5 s.
(1') the same job as the second one in a process (the warm zygote: no torch import).
(1t) torchrun: two ``torchrun --nnodes=2 --nproc-per-node=2 --rdzv-backend=c10d`` agents
     on loopback (``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``, ``--max-restarts=1``), the same
     worker killed the same way: first Popen to both agents reaped. Expected >= 7 s.
(2)  N nodes x 1 worker (default 32), gloo init + one all_reduce + destroy, start to
     ``JobResult`` in a fresh process. <= 10 s.
(3)  total PSS of that job at its peak: the sum of each process's PSS (psutil)
     over the zygote, the store server, every agent and every worker, sampled every 50 ms
     while the job runs, in a separate run (sampling costs CPU, so it is not timed).
     <= 4 GiB. torchrun is not run at this size: its reference is printed (~13 GB RSS:
     211 MB per agent and per worker).
(4)  trigger latency (the event bus): a 4 x 1 job trains (gloo all_reduce and
     ``report_step`` every ~14 ms); faults scheduled ``AtStep(step=s, rank=0)`` for a dozen
     steps run a probe ``apply`` that notes the time: the delay from the worker stamping
     its step event to the fault being applied in the harness. Median <= 5 ms.
(5)  the harness process's CPU (all its threads: the bus reader, ``Job.wait``) while a
     4 x 1 job with no faults trains the same way, from every node HEALTHY to the
     ``JobResult``: CPU seconds / wall seconds. <= 1 % of one core. Rows 4 and 5 run in a
     fresh process each; the machine's other load makes both noisy.

Ours and torchrun alternate round by round; the table shows medians, ratios, PASS/FAIL.
Progress and failures go to stderr, the table to stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

from _common import (  # noqa: E402
    PssPeak,
    fmt_ratio,
    fmt_s,
    isolate_tmpdir,
    median,
    print_table,
    process_tree,
    pss_kb,
    ratio,
    stdout_to,
)

WORKER = str(HERE / "scripts" / "cluster_worker.py")
TRIVIAL = str(HERE / "scripts" / "trivial.py")
TRAIN = str(HERE / "scripts" / "train_steps.py")
TORCHRUN = Path(sys.executable).parent / "torchrun"
JOB_TIMEOUT_S = 120.0
TARGET_2X2_S = 2.5
TORCHRUN_EXPECTED_S = 7.0
TARGET_BIG_S = 10.0
TARGET_PSS_GIB = 4.0
TORCHRUN_MB_PER_PROCESS = 211
TARGET_TRIGGER_MS = 5.0
TARGET_CPU_PCT = 1.0
#: a step period that is no multiple of a polling period (10 ms polling once looked like
#: 1 ms latency at a 20 ms period: the two timers stayed in phase)
BUS_STEPS, BUS_DELAY_S, BUS_PROBES = 200, 0.0137, 12
READY = re.compile(r"BENCH ready rank=(\d+) attempt=\d+ restarted=(\d) pid=(\d+) value=(\S+)")


# -- ours -------------------------------------------------------------------------------


def _restarted_ok(text: str, world: int) -> bool:
    """Every rank of the restarted group all-reduced to the right sum."""
    ranks = {int(r): v for r, again, _, v in READY.findall(text) if again == "1"}
    expected = f"{world * (world + 1) // 2:g}"
    return sorted(ranks) == list(range(world)) and set(ranks.values()) == {expected}


#: the warm column's pool, shared by every in-process 2x2 run (created in main)
WARM_POOL = None


def ours_2x2(tmp: str) -> dict:
    """One 2x2 job with a worker kill, in this process; the time to its JobResult (with
    ``WARM_POOL`` set: workers forked from that already-warm pool)."""
    from harness import Cluster, WorkerState

    flag = os.path.join(tmp, f"killed-{uuid.uuid4().hex}")
    out = os.path.join(tmp, f"out-{uuid.uuid4().hex}")
    started = time.monotonic()
    with Cluster(nnodes=2, nproc_per_node=2, max_restarts=1, env={"BENCH_KILLED": flag},
                 pool=WARM_POOL) as cluster:
        with stdout_to(out):
            job = cluster.launch(WORKER)
        deadline = started + JOB_TIMEOUT_S
        while {e["rank"] for e in job.timeline.steps()} != {0, 1, 2, 3}:
            if time.monotonic() > deadline:
                raise TimeoutError(f"workers never all ready\n{job.timeline.format()}")
            time.sleep(0.005)
        open(flag, "w").close()
        job.kill_worker(node=1, local_rank=1)
        result = job.wait(timeout=JOB_TIMEOUT_S)
        wall = time.monotonic() - started
        fired = [f["fault"] for f in job.timeline.faults()]
    with open(out) as fp:
        text = fp.read()
    ok = result.state == WorkerState.SUCCEEDED and fired == ["kill_worker"] and _restarted_ok(text, 4)
    return {"wall": wall, "ok": ok, "detail": "" if ok else f"{result.state} {fired}\n{text[-800:]}"}


def job_processes(job) -> set[int]:
    """The job's processes: its agents, the zygote, the store server and all below them."""
    roots = [n.pid for n in job.nodes.values()]
    if job.cluster.pool.pid is not None:
        roots.append(job.cluster.pool.pid)
    if getattr(job.store, "pid", None):
        roots.append(job.store.pid)
    return process_tree(roots)


def ours_big(tmp: str, nodes: int, sample_pss: bool) -> dict:
    """An N x 1 trivial gloo job in this process: time to JobResult, or its peak PSS."""
    from harness import Cluster, WorkerState

    out = os.path.join(tmp, f"out-{uuid.uuid4().hex}")
    started = time.monotonic()
    sampler = None
    with Cluster(nnodes=nodes, nproc_per_node=1, max_restarts=0) as cluster:
        with stdout_to(out):
            job = cluster.launch(TRIVIAL)
        if sample_pss:
            sampler = PssPeak(lambda: job_processes(job))
            sampler.start()
        result = job.wait(timeout=JOB_TIMEOUT_S)
        wall = time.monotonic() - started
        if sampler:
            sampler.stop()
    with open(out) as fp:
        lines = len(re.findall(r"^BENCH last rank=", fp.read(), re.M))
    ok = result.state == WorkerState.SUCCEEDED and lines == nodes
    sample = {"wall": wall, "ok": ok, "detail": "" if ok else f"{result.state}, {lines} workers done"}
    if sampler:
        sample.update(pss_mb=sampler.peak_kb / 1024, procs=sampler.peak_procs,
                      samples=sampler.samples, harness_pss_mb=pss_kb(os.getpid()) / 1024)
    return sample


def _probe_fault():
    """A fault whose ``apply`` only notes when it ran (the harness side of row 4)."""
    from dataclasses import dataclass
    from typing import ClassVar

    from harness.sim.faults import Fault

    applied: list[tuple[int, float]] = []

    @dataclass(frozen=True)
    class Probe(Fault):
        kind: ClassVar[str] = "probe"
        step: int = 0

        def apply(self, job) -> None:
            applied.append((self.step, time.monotonic()))

    return Probe, applied


def _wakes() -> int:
    """Voluntary context switches of every thread of this process so far: how often the
    harness went to sleep and was woken (a polling loop shows here, whatever the load)."""
    total = 0
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError), open(f"/proc/self/task/{tid}/status") as fp:
            for line in fp:
                if line.startswith("voluntary_ctxt_switches:"):
                    total += int(line.split()[1])
    return total


def ours_bus(tmp: str, probes: bool) -> dict:
    """A 4 x 1 training job: the trigger latency of probe faults (``probes``), or the
    harness process's CPU while it trains (no faults)."""
    from harness import Cluster, WorkerState
    from harness.faults import AtStep, ScheduledFault

    out = os.path.join(tmp, f"out-{uuid.uuid4().hex}")
    with Cluster(nnodes=4, nproc_per_node=1, max_restarts=0) as cluster:
        with stdout_to(out):
            job = cluster.launch(TRAIN, str(BUS_STEPS), str(BUS_DELAY_S))
        if probes:
            Probe, applied = _probe_fault()
            steps = [20 + 10 * i for i in range(BUS_PROBES)]
            job.schedule([ScheduledFault(Probe(step=s), AtStep(step=s, rank=0)) for s in steps])
        job.wait_for_state(WorkerState.HEALTHY, timeout=JOB_TIMEOUT_S)
        cpu0, wall0, wakes0 = time.process_time(), time.monotonic(), _wakes()
        result = job.wait(timeout=JOB_TIMEOUT_S)
        cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
        sample: dict = {"ok": result.state == WorkerState.SUCCEEDED, "detail": str(result.state),
                        "wakes_per_s": (_wakes() - wakes0) / wall}
        if probes:
            stamped = {e["step"]: e["mono"] for e in reversed(job.timeline.steps(0))}
            sample["latencies_ms"] = [(at - stamped[s]) * 1000 for s, at in applied if s in stamped]
            sample["ok"] = sample["ok"] and len(sample["latencies_ms"]) == BUS_PROBES
            sample["detail"] += f", {len(applied)}/{BUS_PROBES} probes applied"
        else:
            sample.update(cpu_s=cpu, wall=wall, cpu_pct=100 * cpu / wall)
    return sample


def child(kind: str, tmp: str, nodes: int) -> int:
    """``--child``: one job in this fresh process; prints ``RESULT <json>``."""
    if kind == "2x2":
        sample = ours_2x2(tmp)
    elif kind in ("trigger", "cpu"):
        sample = ours_bus(tmp, probes=(kind == "trigger"))
    else:
        sample = ours_big(tmp, nodes, sample_pss=(kind == "pss"))
    print("RESULT " + json.dumps(sample), flush=True)
    return 0


def run_child(kind: str, tmp: str, nodes: int, env: dict) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", kind, "--tmp", tmp,
           "--nodes", str(nodes)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env,
                              timeout=JOB_TIMEOUT_S + 30, cwd=str(ROOT))
    except subprocess.TimeoutExpired:
        return {"wall": None, "ok": False, "detail": "timed out"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        return {"wall": None, "ok": False, "detail": f"rc={proc.returncode}\n{proc.stderr[-1500:]}"}
    return json.loads(lines[-1][len("RESULT "):])


# -- torchrun -----------------------------------------------------------------------------


def torchrun_2x2(tmp: str, env: dict) -> dict:
    """The same job under two torchrun agents with c10d rendezvous on loopback."""
    from harness.endpoints import PortReservation

    flag = os.path.join(tmp, f"killed-{uuid.uuid4().hex}")
    outs = [os.path.join(tmp, f"torchrun-{uuid.uuid4().hex}-{i}") for i in (0, 1)]
    with PortReservation("127.0.0.1") as reservation:  # the first agent to bind hosts the store
        port = reservation.port
        cmd = [str(TORCHRUN), "--nnodes=2", "--nproc-per-node=2", "--rdzv-backend=c10d",
               f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id=bench-{uuid.uuid4().hex[:8]}",
               "--max-restarts=1", WORKER]
        full_env = {**env, "BENCH_KILLED": flag, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
        started = time.monotonic()
        procs = []
        for path in outs:
            with open(path, "wb") as fp:
                procs.append(subprocess.Popen(cmd, stdout=fp, stderr=subprocess.STDOUT,
                                              env=full_env, start_new_session=True))
        reservation.release()
    killed = False
    deadline = started + JOB_TIMEOUT_S
    try:
        while any(p.poll() is None for p in procs):
            if time.monotonic() > deadline:
                raise TimeoutError
            if not killed:
                ready = {int(r): int(pid) for r, again, pid, _ in READY.findall(_read(outs))
                         if again == "0"}
                if len(ready) == 4:
                    open(flag, "w").close()
                    os.kill(ready[3], signal.SIGKILL)
                    killed = True
            time.sleep(0.005)
        wall = time.monotonic() - started
    except TimeoutError:
        wall = None
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = _read(outs)
    ok = wall is not None and killed and all(p.returncode == 0 for p in procs) and _restarted_ok(text, 4)
    return {"wall": wall if ok else None, "ok": ok,
            "detail": "" if ok else f"rc={[p.returncode for p in procs]}\n{text[-1500:]}"}


def _read(paths: list[str]) -> str:
    parts = []
    for path in paths:
        with open(path, errors="replace") as fp:
            parts.append(fp.read())
    return "\n".join(parts)


# -- the table ----------------------------------------------------------------------------


def _verdict(value: float | None, limit: float, at_most: bool = True) -> str:
    if value is None:
        return "n/a"
    return "PASS" if (value <= limit if at_most else value >= limit) else "FAIL"


def _walls(samples: list[dict]) -> tuple[float | None, str]:
    good = [s["wall"] for s in samples if s["ok"]]
    failed = len(samples) - len(good)
    return median(good), (f" ({failed} failed)" if failed else "")


def main(argv: list[str] | None = None) -> int:
    isolate_tmpdir()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=None, help="rounds of row 1 (default 5)")
    parser.add_argument("--quick", action="store_true", help="2 rounds; one run each of rows 2-3")
    parser.add_argument("--no-torchrun", action="store_true", help="skip the torchrun side")
    parser.add_argument("--nodes", type=int, default=32, help="nodes of rows 2-3 (default 32)")
    parser.add_argument("--child", choices=["2x2", "big", "pss", "trigger", "cpu"], help=argparse.SUPPRESS)
    parser.add_argument("--tmp", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(args.child, args.tmp, args.nodes)
    runs = args.runs or (2 if args.quick else 5)
    big_runs = 1 if args.quick else 3
    if runs < 1 or args.nodes < 2:
        parser.error(f"runs={runs} must be >= 1 and nodes={args.nodes} >= 2")
    use_torchrun = not args.no_torchrun and TORCHRUN.exists()

    tmp = tempfile.mkdtemp(prefix="bench-cluster-")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PET_") and k != "TORCHELASTIC_ERROR_FILE"}
    env["TMPDIR"] = tmp
    os.environ["TMPDIR"] = tmp  # the in-process (warm) jobs' temp trees land there too
    tempfile.tempdir = tmp
    print(f"bench/cluster.py: {runs} rounds of the 2x2 kill job (cold, warm"
          f"{', torchrun' if use_torchrun else ''}), {big_runs}+1 runs of {args.nodes}x1; "
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}", file=sys.stderr)
    samples: dict[str, list[dict]] = {"cold": [], "warm": [], "torchrun": [], "big": [], "pss": [],
                                      "trigger": [], "cpu": []}
    global WARM_POOL
    from harness import WarmPool

    WARM_POOL = WarmPool()
    try:
        ours_2x2(tmp)  # warm up the shared pool for the warm column
        sides = ["cold", "warm"] + (["torchrun"] if use_torchrun else [])
        for round_no in range(runs):
            shift = round_no % len(sides)
            for side in sides[shift:] + sides[:shift]:
                if side == "cold":
                    sample = run_child("2x2", tmp, args.nodes, env)
                elif side == "warm":
                    sample = ours_2x2(tmp)
                else:
                    sample = torchrun_2x2(tmp, env)
                samples[side].append(sample)
                print(f"  round {round_no + 1}/{runs} {side:<8} {fmt_s(sample['wall'])} "
                      f"{'ok' if sample['ok'] else 'FAILED ' + sample['detail']}", file=sys.stderr)
        for i in range(big_runs):
            sample = run_child("big", tmp, args.nodes, env)
            samples["big"].append(sample)
            print(f"  {args.nodes}x1 run {i + 1}/{big_runs} {fmt_s(sample['wall'])} "
                  f"{'ok' if sample['ok'] else 'FAILED ' + sample['detail']}", file=sys.stderr)
        pss = run_child("pss", tmp, args.nodes, env)
        samples["pss"].append(pss)
        print(f"  {args.nodes}x1 PSS run: {pss.get('pss_mb', 0):.0f} MB over {pss.get('procs')} "
              f"processes ({pss.get('samples')} samples) "
              f"{'ok' if pss['ok'] else 'FAILED ' + pss['detail']}", file=sys.stderr)
        for kind in ("trigger", "cpu"):
            for i in range(big_runs):
                sample = run_child(kind, tmp, args.nodes, env)
                samples[kind].append(sample)
                shown = (f"{median(sample.get('latencies_ms') or [0]):.2f} ms median"
                         if kind == "trigger" else f"{sample.get('cpu_pct', 0):.2f} % CPU")
                shown += f", {sample.get('wakes_per_s', 0):.0f} wakes/s"
                print(f"  4x1 {kind} run {i + 1}/{big_runs}: {shown} "
                      f"{'ok' if sample['ok'] else 'FAILED ' + sample['detail']}", file=sys.stderr)
    finally:
        WARM_POOL.close()
        leftovers = [n for n in os.listdir(tmp) if n.startswith("elastic_")]
        shutil.rmtree(tmp, ignore_errors=True)

    cold, cold_note = _walls(samples["cold"])
    warm, warm_note = _walls(samples["warm"])
    theirs, theirs_note = _walls(samples["torchrun"]) if use_torchrun else (None, " (skipped)")
    big, big_note = _walls(samples["big"])
    pss_gib = pss.get("pss_mb", 0) / 1024 if pss["ok"] else None
    torchrun_ref_gb = 2 * args.nodes * TORCHRUN_MB_PER_PROCESS / 1000
    latencies = [v for s in samples["trigger"] if s["ok"] for v in s["latencies_ms"]]
    trigger_ms = median(latencies) if latencies else None
    cpu_pct = median([s["cpu_pct"] for s in samples["cpu"] if s["ok"]]) if any(
        s["ok"] for s in samples["cpu"]) else None
    wakes = {kind: median([s.get("wakes_per_s") for s in samples[kind] if s["ok"]]) for kind in ("trigger", "cpu")}
    rows = [
        ["(1) 2x2, 1 worker kill + recovery: start -> JobResult (cold)", fmt_s(cold) + cold_note,
         fmt_s(theirs) + theirs_note, fmt_ratio(ratio(cold, theirs)), f"<= {TARGET_2X2_S} s",
         _verdict(cold, TARGET_2X2_S)],
        ["(1') same, second job in the process (warm zygote)", fmt_s(warm) + warm_note,
         fmt_s(theirs) + theirs_note, fmt_ratio(ratio(warm, theirs)), f"<= {TARGET_2X2_S} s",
         _verdict(warm, TARGET_2X2_S)],
        ["(1t) torchrun equivalent (expected >= 7 s)", "-", fmt_s(theirs) + theirs_note, "-",
         f">= {TORCHRUN_EXPECTED_S} s (info)", _verdict(theirs, TORCHRUN_EXPECTED_S, at_most=False)],
        [f"(2) {args.nodes}x1 trivial gloo job: start -> JobResult (cold)", fmt_s(big) + big_note,
         "not run", "-", f"<= {TARGET_BIG_S} s", _verdict(big, TARGET_BIG_S)],
        [f"(3) {args.nodes}x1 total PSS, peak ({pss.get('procs', '?')} processes)",
         "n/a" if pss_gib is None else f"{pss_gib:.2f} GiB",
         f"~{torchrun_ref_gb:.1f} GB RSS (reference)", "-", f"<= {TARGET_PSS_GIB} GiB",
         _verdict(pss_gib, TARGET_PSS_GIB)],
        [f"(4) trigger latency: step event in a worker -> fault applied (median of {len(latencies)})",
         "n/a" if trigger_ms is None else f"{trigger_ms:.2f} ms"
         + (f" (max {max(latencies):.1f}; {wakes['trigger'] or 0:.0f} wakes/s)" if latencies else ""), "-", "-",
         f"<= {TARGET_TRIGGER_MS:g} ms", _verdict(trigger_ms, TARGET_TRIGGER_MS)],
        ["(5) harness process CPU while a 4x1 job trains", "n/a" if cpu_pct is None else
         f"{cpu_pct:.2f} % ({wakes['cpu'] or 0:.0f} wakes/s)",
         "-", "-", f"<= {TARGET_CPU_PCT:g} % of a core", _verdict(cpu_pct, TARGET_CPU_PCT)],
    ]
    print()
    print(f"medians of {runs} rounds (row 2: {big_runs} runs); torchrun with "
          f"TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1; load after: {os.getloadavg()[0]:.2f}")
    print_table(["metric", "ours", "torchrun", "ours/torchrun", "target", "verdict"], rows)
    if pss["ok"]:
        print(f"(3): the harness process itself (not counted) had {pss['harness_pss_mb']:.0f} MB "
              f"PSS; torchrun reference: {TORCHRUN_MB_PER_PROCESS} MB x {2 * args.nodes} "
              f"agents+workers")
    if leftovers:
        print(f"ours left temp dirs behind: {leftovers}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

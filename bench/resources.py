"""Resource bench: what a straggler does to step time, ours beside torchrun under the same
cgroup.

    python bench/resources.py [--quick] [--rounds N] [--cpu 0.2] [--steps 40] [--work 1000]

Each launcher runs the same 2-node training job (``scenarios/scripts/train.py --work N``:
gloo DDP, N single-thread 64x64 matrix products a step) as two agents on loopback with c10d
rendezvous, 1 worker a node: ``elastic-run`` (ours, spawn) and ``torchrun``
(``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``). Each agent starts inside a cgroup of its own
that the bench makes (``harness.sim.resources``: the cgroups ``job.slow_node`` writes), so its
worker, its child, is in it too. Per launcher, alternating, each round:

  baseline   no quota;
  straggler  node 1's cgroup held to ``--cpu`` CPUs (a CFS quota, as ``job.slow_node``) from
             the start.

The figure is the mean interval between two consecutive steps of one worker (both ranks,
the first 3 steps left out: DDP's warm-up), from the step events ``harness.report_step``
writes (``HARNESS_EVENTS``: the same file format under either launcher); the mean, not the
median: a quota lets a few steps through a period at full speed and then stops the next one
for the rest of it, so only the mean says what the step rate is. A job counts when both ranks
reported every step (torchrun's two agents sometimes fail at the very end: the store's host
left while the other still read the round). Rows: median step time without and with the straggler (medians over
the rounds) and the slowdown (straggler / baseline) per launcher; then the ratio ours/torchrun
of the step time with the straggler: held to the same quota the job should step at the same
pace under either launcher (target 0.8x..1.25x: the slow rank's compute sets it, the launcher
is not on the step path), and of the slowdowns (information: on a shared machine each
baseline moves with the load, the quota-bound step time much less).
Needs cgroups the bench may write (root, v1 cpu/cpuacct/memory or v2); prints why and exits 2
otherwise. Every agent is ended by its session, every cgroup removed.
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
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._common import fmt_ratio, isolate_tmpdir, print_table, ratio  # noqa: E402

TRAIN = str(ROOT / "scenarios" / "scripts" / "train.py")
JOB_TIMEOUT_S = 300.0
WARMUP = 3  # steps left out of the figure: DDP's first iterations build its buckets
LAUNCHERS = ("ours", "torchrun")


def launcher_cmd(kind: str, port: int, run_id: str) -> list[str]:
    common = ["--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d",
              f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id={run_id}", "--max-restarts=0"]
    module = "harness.run" if kind == "ours" else "torch.distributed.run"
    return [sys.executable, "-m", module, *common]


def run_job(kind: str, cpu: float | None, steps: int, work: int, tmp: str) -> list[float] | str:
    """One 2-node job; the step intervals of its workers, or why it failed."""
    from harness.net import PortReservation
    from harness.sim.resources import JobCgroup, probe
    from harness.sim.truth.training import step_times

    support = probe()
    assert not isinstance(support, str)
    cgroup = JobCgroup(support, f"bench{uuid.uuid4().hex[:8]}")
    nodes = [cgroup.node(0), cgroup.node(1)]
    if cpu is not None:
        nodes[1].set_cpu(cpu)
    events = os.path.join(tmp, f"events-{uuid.uuid4().hex}.jsonl")
    logs = [os.path.join(tmp, f"{kind}-{uuid.uuid4().hex}-{i}.log") for i in (0, 1)]
    env = {**os.environ, "HARNESS_EVENTS": events, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
           "OMP_NUM_THREADS": "1"}
    procs: list[subprocess.Popen[bytes]] = []
    try:
        with PortReservation("127.0.0.1") as reservation:  # the first agent to bind hosts the store
            cmd = [*launcher_cmd(kind, reservation.port, f"bench-{uuid.uuid4().hex[:8]}"), TRAIN,
                   "--steps", str(steps), "--work", str(work)]
            reservation.release()
            for node, log in zip(nodes, logs, strict=True):
                with open(log, "wb") as fp:
                    procs.append(subprocess.Popen(
                        cmd, stdout=fp, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                        preexec_fn=lambda node=node: node.add(os.getpid())))  # type: ignore[misc]
        deadline = time.monotonic() + JOB_TIMEOUT_S
        for proc in procs:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        return "timed out"
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        left = cgroup.remove()
        if left:
            print(f"cgroups: {left}", file=sys.stderr)
    with open(events) as fp:
        seen = [e for e in map(json.loads, fp) if e.get("kind") == "step"]
    # every step of both ranks is what counts: torchrun's agents sometimes fail at the very end
    # (the store's host agent left while the other still read the round: RendezvousConnectionError)
    if sorted(e["step"] for e in seen) != sorted(list(range(steps)) * 2):
        return f"rc={[p.returncode for p in procs]}: " + "".join(Path(log).read_text()[-800:] for log in logs)
    if any(p.returncode != 0 for p in procs):
        print(f"{kind}: every step done, but exit codes {[p.returncode for p in procs]}", file=sys.stderr)
    return step_times([e for e in seen if e["step"] >= WARMUP])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 round, 30 steps")
    parser.add_argument("--rounds", type=int, default=None, help="rounds (default 3; --quick 1)")
    parser.add_argument("--cpu", type=float, default=0.2, help="the straggler's CPU quota, in CPUs")
    parser.add_argument("--steps", type=int, default=None, help="training steps a job (default 40)")
    parser.add_argument("--work", type=int, default=1000,
                        help="matrix products a step (default 1000: ~25 ms of CPU, more than a 0.2 quota's period)")
    args = parser.parse_args()
    rounds = args.rounds or (1 if args.quick else 3)
    steps = args.steps or (30 if args.quick else 40)

    from harness.sim.resources import probe

    support = probe()
    if isinstance(support, str):
        print(f"bench/resources.py needs {support}", file=sys.stderr)
        return 2
    tmp = isolate_tmpdir()
    samples: dict[tuple[str, str], list[float]] = {}
    for r in range(rounds):
        order = LAUNCHERS if r % 2 == 0 else LAUNCHERS[::-1]
        for kind in order:
            for case, cpu in (("baseline", None), ("straggler", args.cpu)):
                got = run_job(kind, cpu, steps, args.work, tempfile.mkdtemp(dir=tmp))
                if isinstance(got, str):
                    print(f"round {r}: {kind} {case} failed: {got}", file=sys.stderr)
                    continue
                mean = statistics.fmean(got)
                samples.setdefault((kind, case), []).append(mean)
                print(f"round {r}: {kind:8} {case:9} mean step {mean * 1000:7.1f} ms "
                      f"({len(got)} intervals)", file=sys.stderr)

    def med(kind: str, case: str) -> float | None:
        found = samples.get((kind, case))
        return statistics.median(found) if found else None

    slowdown = {kind: ratio(med(kind, "straggler"), med(kind, "baseline")) for kind in LAUNCHERS}
    rows = []
    for kind in LAUNCHERS:
        base, slow = med(kind, "baseline"), med(kind, "straggler")
        rows.append([kind, "n/a" if base is None else f"{base * 1000:.1f} ms",
                     "n/a" if slow is None else f"{slow * 1000:.1f} ms", fmt_ratio(slowdown[kind])])
    print(f"straggler: node 1 of 2 held to cpu={args.cpu} (CFS quota on its cgroup); {steps} steps, "
          f"--work {args.work}; medians over {rounds} round(s)")
    print_table(["launcher", "step time", f"step time, straggler (cpu={args.cpu})", "slowdown"], rows)
    slowed = ratio(med("ours", "straggler"), med("torchrun", "straggler"))
    verdict = "n/a" if slowed is None else ("PASS" if 0.8 <= slowed <= 1.25 else "FAIL")
    print(f"step time with the straggler, ours/torchrun: {fmt_ratio(slowed)} (target 0.8x..1.25x: {verdict})")
    print(f"slowdown ratio ours/torchrun: {fmt_ratio(ratio(slowdown['ours'], slowdown['torchrun']))} "
          "(information: each baseline moves with the machine's load)")
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())

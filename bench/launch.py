"""Launcher bench: ``elastic-run`` beside torch's ``torchrun`` in one run, alternating.

    .venv/bin/python bench/launch.py [--runs N] [--quick] [--restarts N] [--no-zygote]
    .venv/bin/python bench/launch.py --abort-soak N

Every round runs each scenario once under each launcher, in an order that rotates from
round to round, so background load hits both alike; the table shows medians over the
rounds that succeeded, ours/torchrun ratios, the target and PASS/FAIL. See bench/README.md
for what each row measures.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    RunSample,
    fmt_mb,
    fmt_ratio,
    fmt_s,
    free_port,
    isolate_tmpdir,
    median,
    print_table,
    ratio,
    run_process,
    timestamps,
)

SCRIPTS = Path(__file__).resolve().parent / "scripts"
BIN = Path(sys.executable).parent
RUN_TIMEOUT_S = 120.0


def _command(console_script: str, module: str) -> list[str]:
    """The installed console script next to this interpreter, else ``python -m module``."""
    path = BIN / console_script
    return [str(path)] if path.exists() else [sys.executable, "-m", module]


LAUNCHERS = {
    "ours": _command("elastic-run", "harness.run"),
    "zygote": [*_command("elastic-run", "harness.run"), "--start-method=zygote"],
    "torchrun": _command("torchrun", "torch.distributed.run"),
}

SCENARIOS = {  # name -> (launcher flags, script); all single node, 2 workers
    "trivial": (["--standalone", "--nproc-per-node=2"], "trivial.py"),
    "noop": (["--standalone", "--nproc-per-node=2"], "noop.py"),
    "crash": (["--standalone", "--nproc-per-node=2", "--max-restarts=1"], "crash_once.py"),
    "crash_hard": (["--standalone", "--nproc-per-node=2", "--max-restarts=1"], "crash_once.py",
                   "--hard"),
}


class Bench:
    def __init__(self, tmp_root: str):
        self.tmp_root = tmp_root
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith("PET_") and k != "TORCHELASTIC_ERROR_FILE"}
        # torch's reliable restart mode (its default shares the agent store across attempts
        # and fails most restarts, pytorch#135712); ours ignores the variable.
        self.env.update(TMPDIR=tmp_root, TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")

    def run(self, launcher: str, scenario: str) -> RunSample:
        flags, script, *script_args = SCENARIOS[scenario]
        return run_process([*LAUNCHERS[launcher], *flags, str(SCRIPTS / script), *script_args],
                           env=self.env,
                           timeout=RUN_TIMEOUT_S, watch_rss=True)


# -- the abort soak ---------------------------------------------------------------------

NO_DESTROY = Path(__file__).resolve().parents[1] / "tests" / "scripts" / "no_destroy.py"
ABORTED = re.compile(r"exitcode\s*:\s*-6\b|SIGABRT")


def abort_soak(runs: int) -> int:
    """``runs`` runs of PyTorch's no-destroy launcher test under each launcher, alternating.

    Exactly as torch's launcher tests run it (``--run-path``, 4 workers, a master port),
    in torchrun's default store mode. A run *aborts* when a worker died of SIGABRT (torch's
    exit race, see tests/scripts/no_destroy.py); the bar is torchrun's abort rate.
    """
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PET_") and k != "TORCHELASTIC_ERROR_FILE"}
    tally = {name: [0, 0, 0] for name in ("ours", "torchrun")}  # aborted, other failure, runs
    print(f"abort soak: {runs} runs x {list(tally)}; {os.cpu_count()} CPUs, "
          f"load {os.getloadavg()[0]:.2f}", file=sys.stderr)
    for i in range(runs):
        for name in (["ours", "torchrun"] if i % 2 == 0 else ["torchrun", "ours"]):
            cmd = [*LAUNCHERS[name], "--run-path", "--nnodes=1", "--nproc-per-node=4",
                   "--master-addr=localhost", f"--master-port={free_port()}",
                   "--monitor-interval=1", str(NO_DESTROY), "--init-method=env://"]
            sample = run_process(cmd, env=env, timeout=RUN_TIMEOUT_S)
            counts = tally[name]
            counts[2] += 1
            output = sample.stdout + sample.stderr
            status = "ok"
            if not sample.ok:
                aborted = bool(ABORTED.search(output))
                counts[0 if aborted else 1] += 1
                status = "ABORTED" if aborted else f"FAILED rc={sample.returncode}"
                if not aborted:
                    print(output[-1500:], file=sys.stderr)
            print(f"  run {i + 1}/{runs} {name:<8} {sample.wall_s:6.2f} s {status}", file=sys.stderr)
    rate = {name: aborted / total for name, (aborted, _, total) in tally.items()}
    rows = [[name, f"{aborted}/{total}", f"{rate[name]:.1%}", str(other)]
            for name, (aborted, other, total) in tally.items()]
    verdict = "PASS" if rate["ours"] <= rate["torchrun"] and tally["ours"][1] == 0 else "FAIL"
    print(f"\nabort soak, {runs} runs each (load after: {os.getloadavg()[0]:.2f}); "
          f"ours/torchrun abort rate: {fmt_ratio(ratio(rate['ours'], rate['torchrun']))} "
          f"(bar: torchrun's rate) {verdict}")
    print_table(["launcher", "aborted/runs", "rate", "other failures"], rows)
    return 0


# -- what each sample yields ------------------------------------------------------------


def crash_to_restarted(sample: RunSample) -> float | None:
    """Worker's crash line -> the last restarted worker's first line (all running again)."""
    crash = timestamps(sample.stdout, "crash")
    restarted = timestamps(sample.stdout, "first", attempt="1")
    if not sample.ok or len(crash) != 1 or len(restarted) != 2:
        return None
    return max(restarted) - crash[0]


def last_line_to_exit(sample: RunSample) -> float | None:
    """The last worker's last line (its final action) -> the launcher reaped."""
    last = timestamps(sample.stdout, "last")
    if not sample.ok or len(last) != 2:
        return None
    return sample.end_ts - max(last)


def restart_succeeded(sample: RunSample) -> bool:
    """rc 0, one crash, and the restarted group's all_reduce gave 1 + 2 on both ranks."""
    sums = [line for line in sample.stdout.splitlines() if line.startswith("BENCH sum ")]
    return (sample.ok and len(timestamps(sample.stdout, "crash")) == 1
            and sorted(sums) == [f"BENCH sum rank={r} attempt=1 value=3" for r in (0, 1)])


# -- the table --------------------------------------------------------------------------


def _verdict(value: float | None, limit: float | None) -> str:
    if limit is None:
        return "-"
    if value is None:
        return "n/a"
    return "PASS" if value <= limit else "FAIL"


def _count(samples: list[RunSample], metric) -> str:
    good = sum(metric(s) is not None for s in samples)
    return "" if good == len(samples) else f" ({len(samples) - good} failed)"


def build_rows(samples: dict[str, dict[str, list[RunSample]]], launchers: list[str],
               reliability: tuple[int, int]) -> list[list[str]]:
    rows = []

    def add(label: str, scenario: str, metric, fmt, target: str, limit: float | None,
            relative: bool):
        values = {name: median([metric(s) for s in samples[scenario][name]]) for name in launchers}
        cells = {name: fmt(values[name]) + _count(samples[scenario][name], metric)
                 for name in launchers}
        row = [label, cells["ours"], cells.get("zygote", "n/a"), cells["torchrun"]]
        ratios = {name: ratio(values.get(name), values["torchrun"]) for name in ("ours", "zygote")}
        row += [fmt_ratio(ratios["ours"]), fmt_ratio(ratios["zygote"]), target]
        for name in ("ours", "zygote"):
            row.append(_verdict(ratios[name] if relative else values.get(name), limit))
        rows.append(row)

    def wall(sample: RunSample) -> float | None:
        return sample.wall_s if sample.ok else None

    def rss(sample: RunSample) -> float | None:
        return sample.peak_rss_mb if sample.ok else None

    add("(1) wall, --standalone --nproc-per-node=2 trivial gloo", "trivial", wall, fmt_s,
        "<= 0.5x", 0.5, True)
    add("(2) wall, launcher alone (no-torch workers)", "noop", wall, fmt_s, "<= 0.15x", 0.15, True)
    add("(3) crash line -> restarted workers' first line", "crash", crash_to_restarted, fmt_s,
        "<= 0.25x", 0.25, True)
    add("(3') same, crash by os._exit (launcher's share)", "crash_hard", crash_to_restarted, fmt_s,
        "<= 0.25x", 0.25, True)
    add("(4) last worker line -> agent exit (no-torch workers)", "noop", last_line_to_exit, fmt_s,
        "<= 0.100 s", 0.100, False)
    add("(4') same, trivial gloo workers (info)", "trivial", last_line_to_exit, fmt_s, "-", None,
        False)
    add("(5) agent peak RSS (VmHWM), trivial run", "trivial", rss, fmt_mb, "<= 60 MB", 60.0, False)
    ok, total = reliability
    rows.append(["(6) crash+restart runs of ours that succeeded", f"{ok}/{total}", "-", "-", "-", "-",
                 f"{total}/{total}", "PASS" if total and ok == total else "FAIL", "-"])
    return rows


def main(argv: list[str] | None = None) -> int:
    isolate_tmpdir()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=None, help="rounds per scenario (default 5)")
    parser.add_argument("--quick", action="store_true",
                        help="3 rounds, and 5 reliability runs unless --restarts is given")
    parser.add_argument("--restarts", type=int, default=None,
                        help="crash-and-restart runs of ours for row 6 (default 20)")
    parser.add_argument("--no-zygote", action="store_true", help="skip --start-method=zygote")
    parser.add_argument("--abort-soak", type=int, default=None, metavar="N",
                        help="only this: N runs of the no-destroy script per launcher, abort counts")
    args = parser.parse_args(argv)
    if args.abort_soak is not None:
        if args.abort_soak < 1:
            parser.error(f"--abort-soak {args.abort_soak} must be >= 1")
        return abort_soak(args.abort_soak)
    runs = args.runs or (3 if args.quick else 5)
    restarts = args.restarts if args.restarts is not None else (5 if args.quick else 20)
    if runs < 1 or restarts < 0:
        parser.error(f"runs={runs} must be >= 1 and restarts={restarts} >= 0")

    tmp_root = tempfile.mkdtemp(prefix="bench-launch-")
    try:
        bench = Bench(tmp_root)
        launchers = ["ours", "zygote", "torchrun"]
        if args.no_zygote:
            launchers.remove("zygote")
        else:
            probe = bench.run("zygote", "noop")
            if not probe.ok:
                print(f"zygote: n/a (rc={probe.returncode}: {probe.stderr.strip()[-300:]})",
                      file=sys.stderr)
                launchers.remove("zygote")
        print(f"bench/launch.py: {runs} rounds x {len(SCENARIOS)} scenarios x {launchers}, "
              f"{restarts} reliability runs; {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}",
              file=sys.stderr)
        samples = {s: {name: [] for name in launchers} for s in SCENARIOS}
        for round_no in range(runs):
            for scenario in SCENARIOS:
                shift = round_no % len(launchers)
                for name in launchers[shift:] + launchers[:shift]:
                    sample = bench.run(name, scenario)
                    samples[scenario][name].append(sample)
                    status = "ok" if sample.ok else f"FAILED rc={sample.returncode}"
                    print(f"  round {round_no + 1}/{runs} {scenario:<7} {name:<8} "
                          f"{sample.wall_s:6.3f} s {status}", file=sys.stderr)
                    if not sample.ok:
                        print(sample.stderr[-1500:], file=sys.stderr)
        ok = 0
        for i in range(restarts):
            sample = bench.run("ours", "crash")
            if restart_succeeded(sample):
                ok += 1
            else:
                print(f"  reliability run {i + 1}: FAILED rc={sample.returncode}\n"
                      f"{sample.stdout[-800:]}\n{sample.stderr[-1500:]}", file=sys.stderr)
        if restarts:
            print(f"  reliability: {ok}/{restarts} crash-and-restart runs of ours succeeded",
                  file=sys.stderr)
        leftovers = [n for n in os.listdir(tmp_root) if n.startswith("elastic_")]
        rows = build_rows(samples, launchers, (ok, restarts))
    finally:
        shutil.rmtree(tmp_root, ignore_errors=True)
    print()
    print(f"medians of {runs} rounds (ours/zygote = elastic-run, spawn/zygote start method; "
          f"torchrun with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1); load after: "
          f"{os.getloadavg()[0]:.2f}")
    print_table(["metric", "ours", "zygote", "torchrun", "ours/torchrun", "zygote/torchrun",
                 "target", "ours", "zygote"], rows)
    if leftovers:
        print(f"ours left temp dirs behind: {leftovers}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Multi-node rendezvous benchmark: ours (``python -m harness.run``) beside torchrun, one run.

    python bench/rendezvous.py [--runs 3] [--nodes 2,4,8,16,32] [--slow-torchrun]

Every agent is a real process on loopback. Measured:
  c1   2 agents x 1 worker (gloo init + all_reduce, bench/scripts/trivial.py), c10d: wall
  h1   one agent alone in a ``1:2`` job: launch -> its worker's first line (both sides with
       ``--rdzv-conf=last_call_timeout=1``: the default first-round last call is torch's 30 s,
       which ours keeps so that staggered starts form one world)
  d4   ``1:2`` job, SIGKILL one node (agent + worker): kill -> survivor's worker running
       with WORLD_SIZE=1 (workers here import nothing, so this is the agents' part)
  h3   a second agent joins a running ``1:2`` job: its launch -> both workers running at 2
       (the first agent's round closed after ``last_call_timeout=1``, as in h1)
  N    N agents x 1 worker (no torch in the worker): launch -> every agent's round complete
torchrun's d4 takes 45 s, so it runs only with ``--slow-torchrun``; otherwise the table
shows the reference figure from torchrun-baseline.md, marked "(ref)".
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import isolate_tmpdir  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
TORCHRUN = str(Path(PY).parent / "torchrun")
TRIVIAL = str(ROOT / "bench" / "scripts" / "trivial.py")

WAITER = """\
import os, sys, time

world = int(os.environ["WORLD_SIZE"])
print(f"START world={world} rank={os.environ['RANK']}", flush=True)
finish = int(sys.argv[1])
deadline = time.monotonic() + 60
while world != finish and time.monotonic() < deadline:
    time.sleep(0.05)
"""


_HELD: list = []


def free_port() -> int:
    """A port kept out of everyone else's reach for the bench's lifetime (a reservation the
    agents' stores can still bind: see harness/_net.py). A probe-then-close port could be
    taken by a concurrent process before the agents bind it; that failed a run once."""
    from harness.endpoints import PortReservation

    reservation = PortReservation("127.0.0.1")
    _HELD.append(reservation)
    return reservation.port


class Agent:
    """One launcher process; remembers when each output line arrived (monotonic)."""

    def __init__(self, launcher: str, args: list[str], env: dict | None = None):
        cmd = [TORCHRUN] if launcher == "torchrun" else [PY, "-m", "harness.run"]
        full = {**os.environ, "LOGLEVEL": "INFO", "PYTHONUNBUFFERED": "1", **(env or {})}
        self.started = time.monotonic()
        self.proc = subprocess.Popen(cmd + args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env=full, cwd=ROOT, start_new_session=True)
        self.lines: list[tuple[float, str]] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line.rstrip()))

    def first(self, pattern: str, after: float = 0.0, timeout: float = 120) -> float:
        deadline = time.monotonic() + timeout
        rx = re.compile(pattern)
        while time.monotonic() < deadline:
            for t, line in list(self.lines):
                if t >= after and rx.search(line):
                    return t
            time.sleep(0.005)
        raise RuntimeError(f"no {pattern!r} within {timeout}s:\n" + "\n".join(l for _, l in self.lines[-20:]))

    def kill_node(self) -> None:
        import psutil

        try:
            procs = [psutil.Process(self.proc.pid)]
            procs += procs[0].children(recursive=True)
        except psutil.NoSuchProcess:
            return
        for p in procs:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass

    def stop(self, timeout: float = 90) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill_node()
            return self.proc.wait(10)


#: a lone agent's first round closes after 1 s instead of the default 30 s (h1, h3)
LAST_CALL_1S = "--rdzv-conf=last_call_timeout=1"


def c10d(port: int, nnodes: str, run_id: str, *extra: str) -> list[str]:
    return [f"--nnodes={nnodes}", "--nproc-per-node=1", "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id={run_id}", *extra]


def two_node_wall(launcher: str) -> float:
    port, rid = free_port(), f"c1{time.monotonic_ns()}"
    t0 = time.monotonic()
    agents = [Agent(launcher, c10d(port, "2", rid) + [TRIVIAL]) for _ in range(2)]
    rcs = [a.stop() for a in agents]
    if rcs != [0, 0]:
        tails = "\n".join("\n".join(line for _, line in a.lines[-12:]) for a in agents)
        raise RuntimeError(f"{launcher} c1 failed: {rcs}\n{tails}")
    return time.monotonic() - t0


def alone_in_one_to_two(launcher: str, waiter: str) -> float:
    port, rid = free_port(), f"h1{time.monotonic_ns()}"
    agent = Agent(launcher, c10d(port, "1:2", rid, LAST_CALL_1S) + [waiter, "1"])
    t = agent.first(r"START world=1") - agent.started
    agent.stop()
    return t


def node_kill(launcher: str, waiter: str) -> float:
    port, rid = free_port(), f"d4{time.monotonic_ns()}"
    env = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    a = Agent(launcher, c10d(port, "1:2", rid, "--max-restarts=3") + [waiter, "1"], env)
    b = Agent(launcher, c10d(port, "1:2", rid, "--max-restarts=3") + [waiter, "1"], env)
    a.first("START world=2"), b.first("START world=2")
    host, victim = (a, b) if any("hosting" in l for _, l in a.lines) or launcher == "torchrun" else (b, a)
    killed = time.monotonic()
    victim.kill_node()
    victim.proc.wait(10)
    t = host.first("START world=1", after=killed, timeout=120) - killed
    host.stop()
    return t


def node_join(launcher: str, waiter: str) -> float:
    port, rid = free_port(), f"h3{time.monotonic_ns()}"
    env = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    a = Agent(launcher, c10d(port, "1:2", rid, LAST_CALL_1S) + [waiter, "2"], env)
    a.first("START world=1")
    b = Agent(launcher, c10d(port, "1:2", rid, LAST_CALL_1S) + [waiter, "2"], env)
    t = max(a.first("START world=2"), b.first("START world=2")) - b.started
    a.stop(), b.stop()
    return t


def many_nodes(n: int, waiter: str) -> tuple[float, float]:
    port, rid = free_port(), f"n{n}_{time.monotonic_ns()}"
    t0 = time.monotonic()
    agents = [Agent("ours", c10d(port, str(n), rid) + [waiter, str(n)]) for _ in range(n)]
    done = max(a.first(r"round 0 complete") for a in agents) - t0
    rcs = [a.stop() for a in agents]
    if any(rcs):
        raise RuntimeError(f"{n} nodes: exit codes {rcs}")
    return done, time.monotonic() - t0


def med(xs: list[float]) -> str:
    return f"{statistics.median(xs):6.2f} s" + (f" [{min(xs):.2f}-{max(xs):.2f}]" if len(xs) > 1 else "")


def main() -> int:
    isolate_tmpdir()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--nodes", default="2,4,8,16,32")
    parser.add_argument("--slow-torchrun", action="store_true",
                        help="also run torchrun's d4 case (45 s)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench_rdzv_") as tmp:
        waiter = os.path.join(tmp, "waiter.py")
        Path(waiter).write_text(WAITER)
        rows = []
        ours = [two_node_wall("ours") for _ in range(args.runs)]
        theirs = [two_node_wall("torchrun") for _ in range(args.runs)]
        rows.append(("c1 2 agents x 1 worker, wall", med(ours), med(theirs),
                     statistics.median(ours) / statistics.median(theirs), "<= 0.45"))
        ours = [alone_in_one_to_two("ours", waiter) for _ in range(args.runs)]
        theirs = [alone_in_one_to_two("torchrun", waiter) for _ in range(max(1, args.runs // 2))]
        rows.append(("h1 alone in 1:2 (last call 1 s) -> worker starts", med(ours), med(theirs),
                     statistics.median(ours) / statistics.median(theirs), ""))
        ours = [node_kill("ours", waiter) for _ in range(args.runs)]
        theirs = [node_kill("torchrun", waiter)] if args.slow_torchrun else [45.04]
        rows.append(("d4 SIGKILL node -> survivor at world 1", med(ours),
                     med(theirs) + ("" if args.slow_torchrun else " (ref)"),
                     statistics.median(ours) / statistics.median(theirs), "<= 2 s"))
        ours = [node_join("ours", waiter) for _ in range(args.runs)]
        theirs = [node_join("torchrun", waiter) for _ in range(max(1, args.runs // 2))]
        rows.append(("h3 join -> both at world 2 (torch: sharing off)", med(ours), med(theirs),
                     statistics.median(ours) / statistics.median(theirs), "<= 2 s"))
        print(f"\n{'measurement':48} {'ours':>22} {'torchrun':>28} {'ratio':>6}  target")
        for name, a, b, ratio, target in rows:
            print(f"{name:48} {a:>22} {b:>28} {ratio:6.2f}  {target}")
        print(f"\n{'nodes':>5} {'rendezvous (launch -> all rounds complete)':>44} {'wall':>8} {'per node':>9}")
        for n in [int(x) for x in args.nodes.split(",")]:
            rdzv, wall = many_nodes(n, waiter)
            print(f"{n:5d} {rdzv:42.2f} s {wall:7.2f} s {rdzv / n:8.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

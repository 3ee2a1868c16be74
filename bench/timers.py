"""Expiration-timer benchmark: our timer servers beside torch's, in one run.

    python bench/timers.py [--quick] [--samples N] [--seed S]

Measured, ours and torch's side by side:
  latency   deadline -> worker death: a worker acquires a timer with a known wall-clock
            deadline (spread at random over 0.3-1.3 s so no server's polling window lines
            up with it) and hangs; the bench sees it die through its process sentinel.
            FileTimerServer at max_interval=10 (default) and 0.1 (what torch's agent uses);
            LocalTimerServer at 1.0 (torch's default 60 s would take a minute per sample:
            the default row shows torch's reference figure, baseline e1, marked "ref").
  stop()    LocalTimerServer.stop() duration (torch joins its thread for max_interval).
  rate      acquire+release pairs per second from one client process, for 1-2 s.
Latency workers are identical small processes (spawned, no torch import) using our
client, which speaks torch's wire format: only the servers differ, and the time a killed
process takes to exit stays small. The rate runs use each side's own client (ours -> ours,
torch's -> torch's), since there the client's cost is the point. Torch's FileTimerServer
SIGKILLs its own process after every reap (baseline e8), so each of its samples runs in a
server process of its own; ours run in this process.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing as mp
import multiprocessing.connection as mpc
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import isolate_tmpdir  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness import timer as ours  # noqa: E402

SPAWN = mp.get_context("spawn")  # latency workers: small fresh interpreters, quick to die
FORK = mp.get_context("fork")  # rate workers: the client's cost only, torch already loaded
REF_TORCH_LOCAL_DEFAULT = 59.57  # baseline e1: LocalTimerServer, max_interval=60
REF_TORCH_LOCAL_STOP_DEFAULT = 60.00  # baseline e2

TORCH_FILE_SERVER = """\
import sys, time
from torch.distributed.elastic.timer import FileTimerServer

server = FileTimerServer(sys.argv[1], "bench", max_interval=float(sys.argv[2]))
server.start()
print("ready", flush=True)
time.sleep(600)
"""


def _torch_timer():
    import torch.distributed.elastic.timer as torch_timer

    return torch_timer


# ----------------------------------------------------------------------------------------
# worker side (forked)


def _make_client(impl: str, transport: tuple[str, Any]):
    kind, where = transport
    lib = ours if impl == "ours" else _torch_timer()
    return lib.FileTimerClient(where) if kind == "file" else lib.LocalTimerClient(where)


def _hang_worker(transport: tuple[str, Any], conn) -> None:
    client = _make_client("ours", transport)
    conn.send("ready")
    deadline = conn.recv()  # sent once every worker is up: no deadline passes at start-up
    client.acquire("bench", deadline)
    conn.send("acquired")
    time.sleep(300)


def _rate_worker(impl: str, transport: tuple[str, Any], seconds: float, use_expires: bool,
                 conn) -> None:
    client = _make_client(impl, transport)
    lib = ours if impl == "ours" else _torch_timer()
    lib.configure(client)
    pairs = errors = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            if use_expires:
                with lib.expires(after=60):  # default scope: the caller's file and line
                    pass
            else:
                client.acquire("bench", time.time() + 60)
                client.release("bench")
            pairs += 1
        except Exception:  # torch's client raises when its server's pipe is full
            errors += 1
            time.sleep(0.001)
    if transport[0] == "local":  # put() only buffers: count until it reached the server
        transport[1].close()
        transport[1].join_thread()
    conn.send((pairs / (time.monotonic() - end + seconds), errors))
    conn.close()


# ----------------------------------------------------------------------------------------
# bench side


def _percentile(values: list[float], pct: float) -> float:
    """Nearest-rank percentile (p99 of a handful of samples is their maximum)."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * pct // 100))
    return ordered[int(rank) - 1]


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _start_hangers(transports: list[tuple[str, Any]], rng: random.Random):
    """Start one hanging worker per transport; once all are up, give each a deadline
    0.3-1.3 s ahead; return [(process, deadline)] after every worker acquired."""
    started = []
    for transport in transports:
        parent, child = SPAWN.Pipe()
        proc = SPAWN.Process(target=_hang_worker, args=(transport, child), daemon=True)
        proc.start()
        child.close()
        started.append((proc, parent))
    for proc, conn in started:
        if not conn.poll(60) or conn.recv() != "ready":
            raise RuntimeError(f"worker {proc.pid} did not start within 60 s")
    now = time.time()
    procs = []
    for proc, conn in started:
        deadline = now + 0.3 + rng.random()
        conn.send(deadline)
        procs.append((proc, conn, deadline))
    for proc, conn, _ in procs:
        if not conn.poll(10) or conn.recv() != "acquired":
            raise RuntimeError(f"worker {proc.pid} did not acquire its timer")
        conn.close()
    return procs


def _await_deaths(procs, limit: float) -> tuple[list[float], int]:
    """Latencies (death - deadline) of the workers that died within ``limit`` seconds."""
    pending = {proc.sentinel: (proc, deadline) for proc, _, deadline in procs}
    latencies: list[float] = []
    end = time.monotonic() + limit
    while pending and time.monotonic() < end:
        for sentinel in mpc.wait(list(pending), timeout=end - time.monotonic()):
            died = time.time()
            proc, deadline = pending.pop(sentinel)
            latencies.append(died - deadline)
    survivors = len(pending)
    for proc, _, _ in procs:
        if proc.is_alive():
            proc.kill()
        proc.join()
    return latencies, survivors


def latency_ours(kind: str, max_interval: float, n: int, rng: random.Random) -> tuple[list[float], int]:
    if kind == "file":
        server = ours.FileTimerServer(None, "bench", max_interval=max_interval)
        transport: tuple[str, Any] = ("file", server.file_path)
    else:
        q = SPAWN.Queue()
        server = ours.LocalTimerServer(q, max_interval=max_interval)
        transport = ("local", q)
    server.start()
    try:
        procs = _start_hangers([transport] * n, rng)
        return _await_deaths(procs, limit=10)
    finally:
        server.stop()
        if kind == "local":
            q.close()
            q.join_thread()


def latency_torch_file(max_interval: float, n: int, rng: random.Random,
                       tmp: str) -> tuple[list[float], int]:
    """One torch server process per sample (it kills itself after reaping), all at once."""
    servers, paths = [], []
    try:
        for i in range(n):
            path = os.path.join(tmp, f"torch-{max_interval}-{i}.fifo")
            servers.append(subprocess.Popen([sys.executable, "-c", TORCH_FILE_SERVER, path,
                                             str(max_interval)], stdout=subprocess.PIPE,
                                            stderr=subprocess.DEVNULL, text=True))
            paths.append(path)
        for server in servers:
            if server.stdout.readline().strip() != "ready":
                raise RuntimeError("torch's FileTimerServer did not start")
        procs = _start_hangers([("file", p) for p in paths], rng)
        return _await_deaths(procs, limit=max_interval * 2 + 10)
    finally:
        for server in servers:
            if server.poll() is None:
                server.kill()
            server.wait()
            server.stdout.close()


def latency_torch_local(max_interval: float, n: int, rng: random.Random) -> tuple[list[float], int, float]:
    q = SPAWN.Queue()
    server = _torch_timer().LocalTimerServer(q, max_interval=max_interval)
    server.start()
    try:
        procs = _start_hangers([("local", q)] * n, rng)
        result = _await_deaths(procs, limit=max_interval * 2 + 10)
    finally:
        started = time.monotonic()
        server.stop()
        stop_s = time.monotonic() - started
        q.close()
        q.join_thread()
    return (*result, stop_s)


def stop_duration_ours(max_interval: float) -> float:
    q = FORK.Queue()
    server = ours.LocalTimerServer(q, max_interval=max_interval)
    server.start()
    time.sleep(0.05)  # let the thread block in its wait
    started = time.monotonic()
    server.stop()
    elapsed = time.monotonic() - started
    q.close()
    q.join_thread()
    return elapsed


def rate(impl: str, kind: str, seconds: float, use_expires: bool = False) -> tuple[float, int]:
    """acquire+release pairs/s of one client process against a server in this process."""
    lib = ours if impl == "ours" else _torch_timer()
    q = None
    if kind == "file":
        if impl == "ours":
            server = lib.FileTimerServer(None, "bench", max_interval=10)
            path = server.file_path
        else:
            tmp = tempfile.mkdtemp(prefix="elastic_bench_")
            path = os.path.join(tmp, "rate.fifo")
            server = lib.FileTimerServer(path, "bench", max_interval=0.1)  # the agent's value
        transport: tuple[str, Any] = ("file", path)
    else:
        q = FORK.Queue()
        server = lib.LocalTimerServer(q, max_interval=0.1 if impl == "torch" else 60)
        transport = ("local", q)
    server.start()
    parent, child = FORK.Pipe(duplex=False)
    proc = FORK.Process(target=_rate_worker, args=(impl, transport, seconds, use_expires, child),
                       daemon=True)
    proc.start()
    child.close()
    try:
        if not parent.poll(seconds + 30):
            raise RuntimeError("rate worker did not report")
        result = parent.recv()
    finally:
        if proc.is_alive():
            proc.join(10)
        if proc.is_alive():
            proc.kill()
        proc.join()
        parent.close()
        server.stop()
        if kind == "file" and impl == "torch":
            shutil.rmtree(os.path.dirname(path), ignore_errors=True)
        if q is not None:
            q.close()
            q.join_thread()
    return result


# ----------------------------------------------------------------------------------------
# report


def _ms(values: list[float] | float | None, pct: float | None = None) -> str:
    if values is None or values == []:
        return "n/a"
    if isinstance(values, float):
        return f"{values * 1000:.1f}"
    value = _median(values) if pct is None else _percentile(values, pct)
    return f"{value * 1000:.1f}"


def _table(headers: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]
    print("| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in rows:
        print("| " + " | ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=False)) + " |")


def _speedup(ours_s: list[float], torch_s: list[float] | float) -> str:
    if not ours_s or not torch_s:
        return "n/a"
    theirs = torch_s if isinstance(torch_s, float) else _median(torch_s)
    return f"{theirs / max(_median(ours_s), 1e-6):.0f}x"


def main(argv: list[str] | None = None) -> int:
    isolate_tmpdir()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="5 samples, 1 s rate runs (~45 s)")
    parser.add_argument("--samples", type=int, default=None, help="samples per latency row")
    parser.add_argument("--seed", type=int, default=None, help="seed of the deadline spread")
    args = parser.parse_args(argv)
    n = args.samples or (5 if args.quick else 12)
    rate_s = 1.0 if args.quick else 2.0
    seed = args.seed if args.seed is not None else random.randrange(1 << 16)
    rng = random.Random(seed)
    logging.basicConfig(level=logging.ERROR)

    import torch

    print(f"bench/timers.py: torch {torch.__version__}, Python {platform.python_version()}, "
          f"{os.cpu_count()} CPUs, {n} samples per row, seed {seed} (--seed {seed} replays "
          "the deadline spread)\n")
    started = time.monotonic()
    tmp = tempfile.mkdtemp(prefix="elastic_bench_")
    rows, notes = [], []
    try:
        def add(label: str, ours_run: tuple[list[float], int], torch_run, ref: bool = False):
            o, o_missed = ours_run
            if ref:
                t, t_missed, t_med, t_p99 = torch_run, 0, f"{torch_run * 1000:.0f} (ref)", "(not run)"
            else:
                t, t_missed = torch_run[0], torch_run[1]
                t_med, t_p99 = _ms(t), _ms(t, 99)
            rows.append([label, _ms(o), _ms(o, 99), t_med, t_p99, _speedup(o, t)])
            if o_missed or t_missed:
                notes.append(f"{label}: workers not reaped within the limit: ours {o_missed}, "
                             f"torch {t_missed}")

        add("FileTimerServer max_interval=10 (default)", latency_ours("file", 10, n, rng),
            latency_torch_file(10, n, rng, tmp))
        add("FileTimerServer max_interval=0.1", latency_ours("file", 0.1, n, rng),
            latency_torch_file(0.1, n, rng, tmp))
        add("LocalTimerServer max_interval=60 (default)", latency_ours("local", 60, n, rng),
            REF_TORCH_LOCAL_DEFAULT, ref=True)
        *torch_local, torch_stop_1 = latency_torch_local(1.0, n, rng)
        add("LocalTimerServer max_interval=1.0", latency_ours("local", 1.0, n, rng),
            tuple(torch_local))

        print("deadline -> worker death, ms (lower is better)")
        _table(["server", "ours median", "ours p99", "torch median", "torch p99",
                "torch/ours"], rows)
        for note in notes:
            print(f"  note: {note}")

        print("\nLocalTimerServer.stop() duration, ms")
        stop_rows = [
            ["max_interval=60 (default)", _ms(stop_duration_ours(60)),
             f"{REF_TORCH_LOCAL_STOP_DEFAULT * 1000:.0f} (ref)"],
            ["max_interval=1.0", _ms(stop_duration_ours(1.0)), _ms(torch_stop_1)],
        ]
        _table(["server", "ours", "torch"], stop_rows)

        print(f"\nacquire+release pairs/s, one client process, {rate_s:.0f} s each "
              "(higher is better)")
        rate_rows = []
        for label, kind, use_expires in [("FileTimer client.acquire/release", "file", False),
                                         ("FileTimer `with expires(after=60)`", "file", True),
                                         ("LocalTimer client.acquire/release", "local", False)]:
            o_rate, o_err = rate("ours", kind, rate_s, use_expires)
            t_rate, t_err = rate("torch", kind, rate_s, use_expires)
            rate_rows.append([label, f"{o_rate:,.0f}", f"{t_rate:,.0f}",
                              f"{o_rate / t_rate:.2f}x" if t_rate else "n/a",
                              f"{o_err} / {t_err}"])
        _table(["client", "ours", "torch", "ours/torch", "errors ours / torch"], rate_rows)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"\nnotes: torch's LocalTimerServer at its default max_interval=60 is late by "
          f"~{REF_TORCH_LOCAL_DEFAULT:.1f} s and stop() takes {REF_TORCH_LOCAL_STOP_DEFAULT:.0f} s "
          "(torchrun-baseline.md e1/e2, not re-run); torch's FileTimerServer killed its own "
          "process after every reap, so each torch sample had a server process of its own.")
    print(f"total {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

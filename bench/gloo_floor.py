"""torch alone under a simulated job's start: N ranks' gloo process group on this machine with
torch's own store, and no launcher, agent or harness at all.

    .venv/bin/python bench/gloo_floor.py                 # N = 8, 32, 64, 128
    .venv/bin/python bench/gloo_floor.py --sizes 128 --runs 3 --store torch

One interpreter imports torch, starts a store in a process of its own and waits until it
listens, then forks N ranks (fork: no rank imports anything); each makes
a store client, ``init_process_group("gloo")`` (every pair of ranks connects: N(N-1)/2
connections), one ``all_reduce``, ``destroy_process_group`` and exits. Measured: the last
fork, the last rank initialised, the last ``all_reduce`` returned, the last rank destroyed,
every rank reaped (s from the first fork), and the CPU the ranks used (beside ``bench/scale.py``'s
workers' CPU: what gloo's mesh costs with no launcher around it). It is the torch side of ``bench/scale.py``'s
sizes where torchrun cannot run (128 agents each importing torch do not fit in this
machine's memory): the worker-forked-to-gloo-initialised part of a round, done by torch
alone.

``--store ours`` (the default): the store a simulated job's workers use (the agent's, the
harness's pure-Python ``StoreServer``, here ``python -m harness.rendezvous.store_server``):
then this is the floor under a simulated job's round, every part of it but the launcher's
(agents, rendezvous, the zygote's requests, the events). ``--store torch``: torch's own
``TCPStore`` server: a comparison, not a floor under ours.

Where it can (as root, with ``unshare``), the bench runs in a network namespace of its own
with only a loopback, as a simulated node's workers do. Why: each torch store client looks
up the name of the address it connected to (``getnameinfo`` of ``::ffff:127.0.0.1``, which
``/etc/hosts`` does not hold, so it goes to this machine's resolver), and a resolver that
drops some of 64 or more lookups at once holds those ranks 5 s (the resolver's timeout)
before they reach the store: a step of 5 s from 64 ranks on that is the machine's DNS, not
torch or gloo. A simulated node's workers cannot reach the resolver, and are answered at
once. ``--host-network``: stay on this machine's loopback (and measure its resolver too).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _common import free_port, median, own_loopback_prefix, print_table  # noqa: E402


def _store(port: int, kind: str) -> subprocess.Popen[bytes]:
    """A store (``kind``: ours or torch's), serving in a process of its own until killed."""
    if kind == "torch":
        code = ("import time, torch.distributed as d\n"
                f"s = d.TCPStore('127.0.0.1', {port}, 1, True, wait_for_workers=False)\n"
                "time.sleep(3600)\n")
        argv = [sys.executable, "-c", code]
    else:
        argv = [sys.executable, "-m", "harness.rendezvous.store_server", "--host", "127.0.0.1", "--port", str(port)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("HARNESS_RDZV_SECRET")}
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return proc
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit("torch's TCPStore did not listen within 60 s")


def one_run(ranks: int, store_kind: str = "ours") -> dict[str, float]:
    """Fork ``ranks`` ranks of one gloo group; when the last passed each milestone."""
    import torch
    import torch.distributed as dist

    port = free_port()
    store = _store(port, store_kind)
    stamps = tempfile.mkdtemp(prefix="gloo-floor-")
    try:
        began = time.monotonic()
        before = os.times()
        pids = []
        for rank in range(ranks):
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    client = dist.TCPStore("127.0.0.1", port, ranks, False)
                    dist.init_process_group("gloo", store=client, rank=rank, world_size=ranks)
                    initialised = time.monotonic()
                    value = torch.ones(1)
                    dist.all_reduce(value)
                    reduced = time.monotonic()
                    dist.destroy_process_group()
                    Path(stamps, str(rank)).write_text(f"{initialised} {reduced} {time.monotonic()}")
                    code = 0
                finally:
                    os._exit(code)
            pids.append(pid)
        forked = time.monotonic()
        failed = sum(os.waitpid(pid, 0)[1] != 0 for pid in pids)
        reaped = time.monotonic()
        after = os.times()  # the ranks' CPU: they are reaped, the store is not yet
        ranks_cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
        rows = [[float(x) for x in Path(stamps, name).read_text().split()] for name in os.listdir(stamps)]
    finally:
        store.kill()
        store.wait()
        for name in os.listdir(stamps):
            os.unlink(os.path.join(stamps, name))
        os.rmdir(stamps)
    if failed or len(rows) != ranks:
        return {"failed": float(failed or ranks - len(rows))}
    return {"forked": forked - began, "initialised": max(r[0] for r in rows) - began,
            "reduced": max(r[1] for r in rows) - began, "destroyed": max(r[2] for r in rows) - began,
            "reaped": reaped - began, "ranks_cpu": ranks_cpu, "failed": 0.0}


#: set in the re-executed bench: it already runs in a network namespace of its own
_IN_OWN_NETWORK_ENV = "GLOO_FLOOR_IN_OWN_NETWORK"


def _reexec_in_own_network() -> None:
    """Run the rest of the bench in a new network namespace with its loopback up (the
    module docstring says why); where that cannot be done, say so and stay."""
    if os.environ.get(_IN_OWN_NETWORK_ENV):
        return
    prefix = own_loopback_prefix()
    if not prefix:
        print("gloo_floor: not root or no unshare/ip: on this machine's loopback (its resolver counts)",
              file=sys.stderr, flush=True)
        return
    os.execve(prefix[0], [*prefix, sys.executable, *sys.argv], {**os.environ, _IN_OWN_NETWORK_ENV: "1"})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", type=int, default=[8, 32, 64, 128])
    parser.add_argument("--runs", type=int, default=2, help="runs per size (default 2; medians)")
    parser.add_argument("--store", choices=["ours", "torch"], default="ours",
                        help="the ranks' store: the harness's (default), or torch's TCPStore")
    parser.add_argument("--host-network", action="store_true",
                        help="run on this machine's loopback, not in a network namespace of its own")
    parser.add_argument("--json", action="store_true",
                        help="each run as one JSON line on stdout ({ranks, run}), no table (bench/scale.py --floor)")
    opts = parser.parse_args()
    if not opts.host_network:
        _reexec_in_own_network()
    rows = []
    for ranks in opts.sizes:
        runs = [one_run(ranks, opts.store) for _ in range(opts.runs)]
        if opts.json:
            for run in runs:
                print(json.dumps({"ranks": ranks, "run": run}), flush=True)
            continue
        good = [r for r in runs if not r["failed"]]

        def med(key: str, good: list[dict[str, float]] = good) -> str:
            return f"{median([r[key] for r in good]):.2f} s" if good else "-"

        rows.append([str(ranks), med("forked"), med("initialised"), med("reduced"), med("destroyed"), med("reaped"),
                     med("ranks_cpu"), str(len(runs) - len(good))])
        print(f"{ranks} ranks: {runs}", file=sys.stderr, flush=True)
    if not opts.json:
        print_table(["ranks", "last forked", "last initialised", "last all_reduce", "last destroyed", "all reaped",
                     "ranks' CPU", "failed"], rows)


if __name__ == "__main__":
    main()

"""Network benchmark (first rows): what namespaced nodes and network faults cost.

    python bench/network.py [--rounds N] [--nodes 1,4,16]

Rows (medians over the rounds; targets from issue 10):
  setup / node     Network(n, "netns") built, divided by n (switch, store and n nodes:
                   namespaces, veths on the bridge, addresses), beside Network(n, "loopback")
                   which builds nothing. Target <= 50 ms a node (judged for n > 1: with one
                   node the fixed switch + store, ~60-90 ms of kernel work, dominate).
                   "marginal" is the cost of one more node: (build(max n) - build(min n)) /
                   (max n - min n). Most of it is the kernel's (netns add ~15 ms, veths).
  close            Network.close() for the largest n (every namespace removed).
  start in a node  a process started with preexec_fn=net.enter(i) minus one started without
                   (/bin/true, 20 each): the price of starting inside a node's namespace. A
                   preexec_fn forces a full fork of the parent (a torch-sized parent: ~25 ms),
                   so an nsenter --net=<namespace_path(i)> wrapper is measured beside it.
  partition        call -> packets dropped: node 0 sends a numbered UDP datagram to node 1
                   every ~0.2 ms, stamped with time.monotonic() at send; partition(1, [0])
                   is called at t0; the row is (send stamp of the last datagram node 1 got)
                   - t0, i.e. how long after the call began packets still got through (an
                   upper bound on the time to take effect; <= 0 means at once). The call's
                   own duration is shown beside it. Target <= 10 ms.
  heal             heal(1) at t0 -> (send stamp of the first datagram delivered after it) - t0.
  loss / bandwidth the call's duration (information).
The store-partition and heal rows beside torchrun come once the network is wired into the
Cluster. Needs root, ip/tc/nft; prints why and exits 2 otherwise.
"""

from __future__ import annotations

import argparse
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import median, print_table  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.sim.net import Network, netns_missing  # noqa: E402

SETUP_TARGET_S = 0.050
PARTITION_TARGET_S = 0.010
SEND_EVERY_S = 0.0002


def fmt_ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 1000:.1f} ms"


def verdict(value: float | None, target: float) -> str:
    return "n/a" if value is None else ("PASS" if value <= target else "FAIL")


def socket_in(enter, kind: int) -> socket.socket:
    """A socket made by a thread that joined the namespace (setns is per thread)."""
    box: list[socket.socket] = []

    def make() -> None:
        if enter is not None:
            enter()
        box.append(socket.socket(socket.AF_INET, kind))

    thread = threading.Thread(target=make)
    thread.start()
    thread.join()
    return box[0]


def time_build(n: int, mode: str) -> tuple[float, Network]:
    t0 = time.monotonic()
    net = Network(n, mode)
    return time.monotonic() - t0, net


def bench_setup(sizes: list[int], rounds: int) -> tuple[dict, dict, list[float]]:
    netns: dict[int, list[float]] = {n: [] for n in sizes}
    loop: dict[int, list[float]] = {n: [] for n in sizes}
    closes: list[float] = []
    for _ in range(rounds):
        for n in sizes:
            for mode, into in (("netns", netns), ("loopback", loop)):
                built, net = time_build(n, mode)
                into[n].append(built)
                t0 = time.monotonic()
                net.close()
                if mode == "netns" and n == max(sizes):
                    closes.append(time.monotonic() - t0)
    return netns, loop, closes


def bench_enter(net: Network, samples: int = 20) -> tuple[float, float | None]:
    """Extra cost of starting /bin/true in node 0: by ``preexec_fn=enter(0)`` (forces a full
    fork of this process) and by an ``nsenter --net=PATH`` wrapper (vfork + one more exec;
    None without nsenter)."""
    def start(argv: list[str], preexec=None) -> float:
        t0 = time.monotonic()
        subprocess.run(argv, preexec_fn=preexec, check=True)
        return time.monotonic() - t0

    inside, outside, wrapped = [], [], []
    nsenter = shutil.which("nsenter")
    for _ in range(samples):
        inside.append(start(["/bin/true"], net.enter(0)))
        outside.append(start(["/bin/true"]))
        if nsenter:
            wrapped.append(start([nsenter, f"--net={net.namespace_path(0)}", "/bin/true"]))
    base = statistics.median(outside)
    return statistics.median(inside) - base, (statistics.median(wrapped) - base) if wrapped else None


class Stream:
    """Node 0 -> node 1 numbered datagrams, each carrying its send time; arrivals recorded."""

    def __init__(self, net: Network):
        self.rx = socket_in(net.enter(1), socket.SOCK_DGRAM)
        self.rx.bind((net.address(1), 0))
        self.rx.settimeout(0.1)
        self.tx = socket_in(net.enter(0), socket.SOCK_DGRAM)
        self.tx.connect(self.rx.getsockname())
        self.arrivals: list[float] = []  # send stamps of delivered datagrams, in order
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._send), threading.Thread(target=self._recv)]
        for t in self.threads:
            t.start()

    def _send(self) -> None:
        while not self.stop.is_set():
            self.tx.send(repr(time.monotonic()).encode())
            time.sleep(SEND_EVERY_S)

    def _recv(self) -> None:
        while not self.stop.is_set():
            try:
                self.arrivals.append(float(self.rx.recv(64)))
            except TimeoutError:
                pass

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join()
        self.tx.close()
        self.rx.close()


def bench_faults(net: Network, rounds: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"partition": [], "partition call": [], "heal": [],
                                   "heal call": [], "loss call": [], "bandwidth call": []}
    stream = Stream(net)
    try:
        time.sleep(0.3)  # ARP resolved, stream flowing
        for _ in range(rounds):
            t0 = time.monotonic()
            net.partition(1, peers=[0])
            out["partition call"].append(time.monotonic() - t0)
            time.sleep(0.3)  # stragglers in flight land
            before = [s for s in stream.arrivals if s >= t0 - 1.0]
            out["partition"].append((max(before) - t0) if before else 0.0)
            t0 = time.monotonic()
            net.heal(1)
            out["heal call"].append(time.monotonic() - t0)
            time.sleep(0.3)
            after = [s for s in stream.arrivals if s >= t0]
            if after:
                out["heal"].append(min(after) - t0)
            t0 = time.monotonic()
            net.packet_loss(1, 0.05)
            out["loss call"].append(time.monotonic() - t0)
            t0 = time.monotonic()
            net.bandwidth(1, "10mbit")
            out["bandwidth call"].append(time.monotonic() - t0)
            net.heal(1)
            time.sleep(0.1)
    finally:
        stream.close()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--nodes", default="1,4,16", help="network sizes to build (comma list)")
    args = parser.parse_args()
    missing = netns_missing()
    if missing:
        print(f"bench/network.py: network namespaces unavailable: needs {'; '.join(missing)}",
              file=sys.stderr)
        return 2
    sizes = sorted({int(n) for n in args.nodes.split(",")})
    print(f"# network bench: {args.rounds} rounds, sizes {sizes}", file=sys.stderr)
    netns, loop, closes = bench_setup(sizes, args.rounds)
    with Network(2, "netns") as net:
        enter_cost, nsenter_cost = bench_enter(net)
        faults = bench_faults(net, args.rounds)

    rows = []
    for n in sizes:  # with one node the switch and store dominate: shown, not judged
        per_node = median([t / n for t in netns[n]])
        judged = n > 1 and len(sizes) > 1
        rows.append([f"setup / node (n={n}, total {fmt_ms(median(netns[n]))})", fmt_ms(per_node),
                     fmt_ms(median([t / n for t in loop[n]])), "<= 50 ms" if judged else "-",
                     verdict(per_node, SETUP_TARGET_S) if judged else "-"])
    if len(sizes) > 1:
        lo, hi = sizes[0], sizes[-1]
        marginal = (median(netns[hi]) - median(netns[lo])) / (hi - lo)  # type: ignore[operator]
        rows.append([f"setup, marginal node ({lo}->{hi})", fmt_ms(marginal), "-", "<= 50 ms",
                     verdict(marginal, SETUP_TARGET_S)])
    rows.append([f"close (n={sizes[-1]})", fmt_ms(median(closes)), "-", "-", "-"])
    rows.append(["start in a node: preexec_fn=enter(i), extra", fmt_ms(enter_cost), "-", "-", "-"])
    rows.append(["start in a node: nsenter --net wrapper, extra", fmt_ms(nsenter_cost), "-", "-", "-"])
    partition = median(faults["partition"])
    rows.append(["partition: call -> packets dropped", fmt_ms(partition),
                 f"call {fmt_ms(median(faults['partition call']))}", "<= 10 ms",
                 verdict(max(partition or 0.0, median(faults["partition call"]) or 0.0),
                         PARTITION_TARGET_S)])
    rows.append(["heal: call -> packets flow", fmt_ms(median(faults["heal"])),
                 f"call {fmt_ms(median(faults['heal call']))}", "-", "-"])
    rows.append(["packet_loss(5 %) call", fmt_ms(median(faults["loss call"])), "-", "-", "-"])
    rows.append(["bandwidth(10mbit) call", fmt_ms(median(faults["bandwidth call"])), "-", "-", "-"])
    print_table(["row", "netns", "loopback / note", "target", "verdict"], rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Network benchmark: what namespaced nodes and network faults cost, and what a store
partition does to our runtime and to torchrun, side by side.

    python bench/network.py [--quick] [--rounds N] [--nodes 1,4,16] [--limit S]
                            [--peers store,all] [--runtimes ours,zygote,torchrun] [--verbose]

Network rows (medians over the rounds; the targets):
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

Side-by-side rows (one trial per --peers kind, each in a fresh Network(3)): three runtimes
run at once in the same three node namespaces, 1 worker a node (scripts/net_train.py: one
gloo all_reduce and one timestamped line a step), so one partition hits all of them at the
same instant under the same load:
  ours (spawn)   elastic-run at its defaults; ours (zygote): --start-method=zygote;
  torchrun       python -m torch.distributed.run, TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1.
All: --nnodes=1:3 --rdzv-backend=c10d --rdzv-conf=is_host=false --local-addr=<node address>
--max-restarts=3, GLOO_SOCKET_IFNAME=eth0. Each runtime has its own store in the store
namespace (ours: harness.rendezvous.store_server; torchrun: torch's TCPStore in a process of
its own, scripts/torch_store.py), so "cut off from the store" means the same to both and no
agent hosts the store. Agents start under `nsenter --net=PATH` (the bench has reader threads;
a preexec_fn in a threaded parent is unsafe and forces a full fork; --enter preexec to compare).
Once every node stepped in the full world:
  (3) partition(2, peers) -> the first step of a smaller world (the survivors train again).
  (4) heal(2) -> the first step at full size by a worker that did not exist before the
      partition (node 2 back in the world).
Each waits up to --limit s (25; --quick 15), else "hung at <limit> s". Times are worker
time.time() stamps minus the NetworkChange's time.time() (taken once the kernel has the
rules). Target <= 2 s for ours, judged for both start methods (a resume that did not come
within the limit is FAIL). Information: how long after the partition the old world still
stepped, and how many steps node 2 made after the smaller world's first (split brain).
Needs root, ip/tc/nft, nsenter; prints why and exits 2 otherwise. Every process it started
is ended by pid, every namespace removed, its private TMPDIR deleted.
"""

from __future__ import annotations

import argparse
import os
import queue
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import fmt_ratio, isolate_tmpdir, median, print_table, ratio  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.sim.net import Network, names, netns_missing  # noqa: E402

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



# -- side by side: store partition and heal under real agents (rows 3-4) -----------------

SCRIPTS = Path(__file__).resolve().parent / "scripts"
RESUME_TARGET_S = 2.0
NODES = 3  # x 1 worker; node 2 is the one cut off
#: elastic-run at its defaults (spawn), elastic-run --start-method=zygote, torchrun
RUNTIMES = ("ours", "zygote", "torchrun")
NSENTER = shutil.which("nsenter")


@dataclass
class Step:
    node: int
    world: int
    pid: int
    ts: float  # time.time() in the worker, just after its all_reduce returned


class Proc:
    """One process the bench started (store or agent), its stdout read line by line."""

    def __init__(self, argv: list[str], env: dict[str, str], log: list[str],
                 preexec: Callable[[], None] | None = None):
        self.popen = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True, start_new_session=True,
                                      preexec_fn=preexec)
        self.lines: queue.Queue[str] = queue.Queue()
        self.log = log
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.popen.stdout:  # type: ignore[union-attr]
            self.lines.put(line)
            self.log.append(line)

    def tree(self) -> list[int]:
        """This process and every live descendant (workers, a zygote and its children),
        read from /proc before anything is killed: all of them are the bench's to end."""
        pids, todo = [], [self.popen.pid]
        while todo:
            pid = todo.pop()
            pids.append(pid)
            for task in Path(f"/proc/{pid}/task").glob("*/children"):
                try:
                    todo += [int(c) for c in task.read_text().split()]
                except OSError:
                    pass
        return pids

    def stop(self, grace: float) -> None:
        """SIGTERM this process alone (an agent stops its own workers, a store exits), then
        SIGKILL whatever of its tree is still alive after ``grace`` s, by pid."""
        pids = self.tree()
        try:
            self.popen.terminate()
            self.popen.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
        for pid in dict.fromkeys(pids + (self.tree() if self.popen.poll() is None else [])):
            if _alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        self.popen.wait()
        if self.popen.stdin:
            self.popen.stdin.close()
        self.reader.join(timeout=5)


def become_subreaper() -> None:
    """Orphans of the bench's processes (a worker whose agent died first) are re-parented
    to the bench rather than to init, so ``reap_orphans`` can still end them by pid."""
    import ctypes

    PR_SET_CHILD_SUBREAPER = 36
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def reap_orphans() -> None:
    """SIGKILL and reap every process still a child of the bench (after Proc.stop, only
    orphans the bench inherited as subreaper can be left)."""
    while True:
        children = [int(c) for t in Path(f"/proc/{os.getpid()}/task").glob("*/children")
                    for c in t.read_text().split()]
        if not children:
            return
        for pid in children:
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def spawn_in(net: Network, host: int | None, argv: list[str], env: dict[str, str],
             log: list[str], how: str) -> Proc:
    """Start ``argv`` in node ``host``'s namespace (None: the store's). ``how="nsenter"``:
    ``nsenter --net=PATH argv``, the child joins by itself (the default: this bench has
    reader threads running, and a ``preexec_fn`` in a threaded parent is unsafe, besides
    the full fork it forces); ``"preexec"``: ``preexec_fn=enter(i)``."""
    if how == "preexec":
        return Proc(argv, env, log, net.enter_store() if host is None else net.enter(host))
    name = net.store_namespace if host is None else net.namespace(host)
    return Proc([NSENTER or "nsenter", f"--net={names.NETNS_DIR}/{name}", *argv], env, log)


@dataclass
class Outcome:
    """What one runtime did in one situation (seconds from the fault call's return)."""

    runtime: str
    peers: str
    started: bool = True
    shrink: float | None = None  # partition -> first step of a smaller world
    regrow: float | None = None  # heal -> first step at full size by a worker new since the fault
    old_world_last: float | None = None  # partition -> last step at full size (old world)
    split_brain: int = 0  # node 2's steps after the survivors' smaller world stepped
    note: str = ""


class SideBySide:
    """One runtime's 3 agents in 3 node namespaces, their store in the store namespace."""

    def __init__(self, net: Network, runtime: str, how: str):
        self.net, self.runtime, self.how = net, runtime, how
        self.log: list[str] = []  # every line its processes wrote (shown with --verbose)
        self.error: str | None = None  # why it could not start
        self.procs: list[Proc] = []
        self.steps: list[Step] = []
        self._lock = threading.Lock()

    def env(self, node: int | None) -> dict[str, str]:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "GLOO_SOCKET_IFNAME": "eth0",
               "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", "BENCH_NODE": str(node)}
        env.pop("TORCHELASTIC_ERROR_FILE", None)
        return env

    def start(self) -> None:
        net, py = self.net, sys.executable
        if self.runtime in RUNTIMES[:2]:
            store = [py, "-m", "harness.rendezvous.store_server", "--host", net.store_address, "--port", "0"]
            launcher = [py, "-m", "harness.run"]
            if self.runtime == "zygote":
                launcher.append("--start-method=zygote")
        else:
            store = [py, str(SCRIPTS / "torch_store.py"), net.store_address]
            launcher = [py, "-m", "torch.distributed.run"]
        proc = spawn_in(net, None, store, self.env(None), self.log, self.how)
        self.procs.append(proc)
        line = ""
        while not line.startswith("PORT "):  # torch may warn on the same stream first
            try:
                line = proc.lines.get(timeout=60)
            except queue.Empty:
                raise RuntimeError(f"{self.runtime}'s store did not start in 60 s") from None
        endpoint = f"{net.store_address}:{int(line.split()[1])}"
        for node in range(NODES):
            argv = [*launcher, f"--nnodes=1:{NODES}", "--nproc-per-node=1", "--max-restarts=3",
                    "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", "--rdzv-id=bench",
                    "--rdzv-conf=is_host=false", f"--local-addr={net.address(node)}",
                    str(SCRIPTS / "net_train.py")]
            agent = spawn_in(net, node, argv, self.env(node), self.log, self.how)
            threading.Thread(target=self._collect, args=(agent,), daemon=True).start()
            self.procs.append(agent)

    def _collect(self, proc: Proc) -> None:
        while proc.reader.is_alive() or not proc.lines.empty():  # orphaned workers too
            try:
                line = proc.lines.get(timeout=0.2)
            except queue.Empty:
                continue
            parts = line.split()
            if parts[:2] != ["BENCH", "step"]:
                continue
            f = dict(p.split("=", 1) for p in parts[2:] if "=" in p)
            try:
                step = Step(int(f["node"]), int(f["world"]), int(f["pid"]), float(f["ts"]))
            except (KeyError, ValueError):  # a torn line (a worker killed mid-write)
                continue
            with self._lock:
                self.steps.append(step)

    def ready(self) -> bool:
        """Every node stepped in the full world, and a few steps since (gloo warm)."""
        with self._lock:
            return len({s.node for s in self.steps if s.world == NODES}) == NODES and \
                len(self.steps) >= 5 * NODES

    def first_after(self, pred: Callable[[Step], bool]) -> Step | None:
        with self._lock:
            hits = [s for s in self.steps if pred(s)]
        return min(hits, key=lambda s: s.ts) if hits else None

    def close(self) -> None:
        for proc in reversed(self.procs):  # agents first (they stop their workers), store last
            proc.stop(grace=3.0)


def wait_all(conds: list[Callable[[], bool]], limit: float) -> None:
    """Poll until every ``cond()`` is true or ``limit`` s passed."""
    deadline = time.monotonic() + limit
    while not all(c() for c in conds) and time.monotonic() < deadline:
        time.sleep(0.05)


def trial(net: Network, groups: list[SideBySide], peers: str, limit: float,
          startup_limit: float) -> list[Outcome]:
    """Every runtime at once in the same namespaces: one partition of node 2 hits all of
    them at the same instant, under the same load; then one heal."""
    outs = [Outcome(g.runtime, peers) for g in groups]
    wait_all([g.ready for g in groups if g.error is None], startup_limit)
    live: list[tuple[SideBySide, Outcome]] = []
    for g, out in zip(groups, outs, strict=True):
        if g.error is None and g.ready():
            live.append((g, out))
        else:
            out.started, out.note = False, g.error or f"no full world within {startup_limit:.0f} s"
    if not live:
        return outs
    with_pids = {id(g): {s.pid for s in g.steps} for g, _ in live}
    t_part = net.partition(NODES - 1, peers=peers).at

    def smaller(s: Step) -> bool:
        return s.ts > t_part and s.world < NODES

    def seen(g: SideBySide, pred: Callable[[Step], bool]) -> Callable[[], bool]:
        return lambda: g.first_after(pred) is not None

    wait_all([seen(g, smaller) for g, _ in live], limit)
    in_time = {id(g): g.first_after(smaller) for g, _ in live}  # what the limit allowed
    t_heal = net.heal(NODES - 1).at

    def back(g: SideBySide) -> Callable[[Step], bool]:
        return lambda s: s.ts > t_heal and s.world == NODES and s.pid not in with_pids[id(g)]

    wait_all([seen(g, back(g)) for g, _ in live], limit)
    for g, out in live:
        late = g.first_after(smaller)
        shrunk = in_time[id(g)]
        if shrunk is None and late is not None:
            out.note = f"smaller world {late.ts - t_heal:.1f} s after the heal"
        with g._lock:
            old = [s.ts for s in g.steps if t_part < s.ts and s.world == NODES
                   and s.pid in with_pids[id(g)]]
            if shrunk:
                out.shrink = shrunk.ts - t_part
                out.split_brain = sum(1 for s in g.steps if s.node == NODES - 1 and s.ts > shrunk.ts
                                      and s.pid in with_pids[id(g)])
        out.old_world_last = (max(old) - t_part) if old else None
        regrown = g.first_after(back(g))
        out.regrow = regrown.ts - t_heal if regrown else None
        if shrunk is None and old and max(old) > t_heal - 1.0:
            out.note = "no new round: the old world kept training through the partition"
    return outs


def side_by_side(runtimes: list[str], peers: str, limit: float, startup_limit: float, how: str,
                 verbose: bool) -> list[Outcome]:
    """One trial: a fresh 3-node network, every runtime started in it, node 2 partitioned
    from ``peers`` then healed; everything the trial started is gone when it returns."""
    try:
        with Network(NODES, "netns") as net:
            groups = [SideBySide(net, r, how) for r in runtimes]
            try:
                for g in groups:
                    try:
                        g.start()
                    except (OSError, RuntimeError) as e:  # shown in the table; the others go on
                        g.error = f"{type(e).__name__}: {e}"
                return trial(net, groups, peers, limit, startup_limit)
            finally:
                for g in groups:
                    g.close()
                    if verbose:
                        shown = [line for line in g.log if not line.startswith("BENCH step")]
                        print(f"# --- {g.runtime}, peers={peers}: {len(g.log) - len(shown)} step "
                              f"lines; the rest:\n{''.join(shown)}", file=sys.stderr)
    finally:
        reap_orphans()


def fmt_resume(value: float | None, limit: float, note: str = "") -> str:
    if value is not None:
        return f"{value:.2f} s"
    return f"hung at {limit:.0f} s" + (f" ({note})" if note else "")


def side_rows(results: dict[str, list[Outcome]], limit: float) -> list[list[str]]:
    """Rows 3 and 4 per partition kind: each runtime, ours/torchrun, target, verdicts."""
    rows = []
    for peers, outs in results.items():
        by = {o.runtime: o for o in outs}
        for label, attr in ((f"(3) partition(2, peers={peers!r}) -> survivors train again", "shrink"),
                            ("(4) heal -> node 2 back at full size", "regrow")):
            cells, verdicts = [], []
            for r in RUNTIMES:
                o = by.get(r)
                if o is None:
                    cells.append("-")
                    continue
                value = getattr(o, attr)
                note = o.note if r == "torchrun" and attr == "regrow" else ""
                cells.append(fmt_resume(value, limit, note) if o.started else f"not started ({o.note})")
                if r != "torchrun":  # not resumed within the limit: FAIL
                    verdicts.append(f"{r} {verdict(limit if value is None else value, RESUME_TARGET_S)}")
            ours, theirs = by.get("ours"), by.get("torchrun")
            rel = "-"
            if ours and theirs and getattr(ours, attr) is not None:
                t = getattr(theirs, attr)
                rel = fmt_ratio(ratio(getattr(ours, attr), t)) if t is not None else \
                    f"< {getattr(ours, attr) / limit:.2f}x"
            rows.append([label, *cells, rel, "<= 2 s", ", ".join(verdicts) or "-"])
        info = []
        for r in RUNTIMES:
            o = by.get(r)
            if o is None or not o.started:
                info.append("-")
                continue
            last = "none" if o.old_world_last is None else f"{o.old_world_last:.2f} s"
            info.append(f"{last}; {o.split_brain} split")
        rows.append(["    old world's last step after the partition; node 2 steps after the "
                     "new round", *info, "-", "-", "-"])
    return rows



def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=None, help="rounds of the first rows (5; --quick 2)")
    parser.add_argument("--nodes", default=None, help="network sizes to build (1,4,16; --quick 1,4)")
    parser.add_argument("--quick", action="store_true", help="fewer rounds, shorter limit (~2.5 min)")
    parser.add_argument("--limit", type=float, default=None,
                        help="seconds to wait for each recovery before saying hung (25; --quick 15)")
    parser.add_argument("--peers", default="store,all", help="partitions to run: store, all or both")
    parser.add_argument("--runtimes", default=",".join(RUNTIMES), help="subset of " + ",".join(RUNTIMES))
    parser.add_argument("--enter", choices=("nsenter", "preexec"), default="nsenter" if NSENTER else "preexec",
                        help="how an agent or store is started in its namespace")
    parser.add_argument("--startup-limit", type=float, default=120.0,
                        help="seconds for every runtime's full world to step before a trial gives up")
    parser.add_argument("--no-side", action="store_true", help="only the network rows (no agents)")
    parser.add_argument("--verbose", action="store_true", help="print the agents' output to stderr")
    args = parser.parse_args()
    rounds = args.rounds or (2 if args.quick else 5)
    limit = args.limit or (15.0 if args.quick else 25.0)
    nodes = args.nodes or ("1,4" if args.quick else "1,4,16")
    runtimes = [r for r in args.runtimes.split(",") if r]
    peers_kinds = [p for p in args.peers.split(",") if p]
    if not set(runtimes) <= set(RUNTIMES) or not set(peers_kinds) <= {"store", "all"}:
        parser.error(f"--runtimes must name some of {RUNTIMES}, --peers some of store,all")
    missing = netns_missing()
    if missing:
        print(f"bench/network.py: network namespaces unavailable: needs {'; '.join(missing)}",
              file=sys.stderr)
        return 2
    isolate_tmpdir()  # torchrun's torchelastic_* dirs, the zygotes' sockets: removed at exit
    become_subreaper()
    started = time.monotonic()
    sizes = sorted({int(n) for n in nodes.split(",")})
    print(f"# network bench: {rounds} rounds, sizes {sizes}", file=sys.stderr)
    netns, loop, closes = bench_setup(sizes, rounds)
    with Network(2, "netns") as net:
        enter_cost, nsenter_cost = bench_enter(net)
        faults = bench_faults(net, rounds)
    results: dict[str, list[Outcome]] = {}
    if not args.no_side:
        for peers in peers_kinds:
            print(f"# side by side: {', '.join(runtimes)} x {NODES} nodes, partition peers={peers!r}, "
                  f"limit {limit:.0f} s, started by {args.enter}", file=sys.stderr)
            results[peers] = side_by_side(runtimes, peers, limit, args.startup_limit, args.enter,
                                          args.verbose)

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
    if results:
        print()
        print_table(["row (3 nodes x 1 worker)", "ours (spawn)", "ours (zygote)", "torchrun",
                     "ours/torchrun", "target", "verdict"], side_rows(results, limit))
    print(f"# bench took {time.monotonic() - started:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

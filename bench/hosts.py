"""SSH hosts benchmark: one multiplexed OpenSSH connection vs a fresh connection per command,
and asyncssh beside them when it is importable; then what a node on a
host costs beyond commands: the clock offset's error bound, an event's
latency from the host's file to the controller, and how long a lost controller's things
last on the host; last, a training job with its nodes on two hosts beside the same job here.

    python bench/hosts.py [--runs 20] [--no-host-rc] [--no-strategies] [--no-jobs] [--job-runs 5]
    python bench/hosts.py --jobs [--job-runs 5]                 # the job table alone
    PYTHONPATH=/path/to/asyncssh-lib python bench/hosts.py     # adds the asyncssh column

The project's rule is that a bench compares ours against torchrun. torchrun has no SSH
hosts (it starts one node per machine and leaves getting there to the user), so there is
nothing of torch's to compare with: this bench compares the SSH strategies the host layer
could use: the measure by which the choice of one was made.

The hosts are real sshd servers on this machine (``tests/hosts/sshd.py``: one per network
namespace, key auth), so the link has no latency worth the name: on a real network a fresh
connection also pays its handshake's round trips (TCP, version, key exchange, auth, session:
about 6-8 RTTs against the multiplexed channel's 2), and the gap grows with the RTT.

Rows (medians of ``--runs`` runs, the strategies alternating so both see the same load):
  transport only   the ssh command line ``SshHost.ssh_argv("true")`` (what ``run`` uses, no
                   supervisor): the cost of the connection strategy itself. asyncssh: one
                   connection, ``conn.run("true")`` a channel per command.
  SshHost.run      ``run(["true"])`` as a user gets it: the remote supervisor (the host's
                   python, ``-I -S``) that ties the command to the connection's lifetime.
  open             ``SshHost.open()``: handshake, the lease (interpreter, version, work dir).
Each table is run twice: with the hosts' root ``~/.bashrc`` emptied (the transport alone),
and with this machine's own (bash sources it for every command sshd runs; here it runs
``pyenv init``), which a real host's rc file adds to every command whatever the strategy.

The last table (hosts' ``~/.bashrc`` emptied):
  clock offset     ``measure_offset(host)`` (8 pings over the lease) ``--runs`` times: the
                   error bound it proves, and the offset itself (0 here: one kernel's clocks).
  relay latency    ``EventWriter`` on the host appends ``--runs`` x 5 events, 10 ms apart,
                   poking the relay; latency = our monotonic clock on arrival minus the
                   event's ``mono`` moved onto ours (the offset's bound is ~0.05 ms of it).
  SIGKILLed        a controller (a process with a command and an event relay on the host)
  controller       is SIGKILLed; from the kill to the last of its processes on the host gone
                   (the lease, the supervisors, the command, the relay: watched from the
                   host over a connection of its own, times moved onto ours), 5 runs.
  frozen           the same controller SIGSTOPped, lost_after=2 s: its link stays open, the
  controller       host notices the silence; from the freeze to the last process gone, 3 runs.

The job table: ``bench/resume.py``'s node-loss run (``fault_run``:
``scenarios/training/train.py``, DDP on gloo with DCP checkpoints, ``NodeKill(node=1)`` at
step 6 of rank 0) on 2 nodes x 2 workers, ``Cluster(nnodes="1:2", nproc_per_node=2)`` at its
defaults, once with the nodes on two ``SshdLab`` hosts (round robin: node i on host i; their
python the checkout's, ``checkout_python``) and once here, alternating, ``--job-runs`` each:
  launch -> first   ``cluster.launch()`` to the first step event (``resume._first_step``);
  step              a host's events are moved onto our clock by its relay
  fault -> resume   the kill (on its host: the agent's tree SIGKILLed there) to the first
                    step of the re-formed world (``Timeline.faults()``' ``resume_latency``)
Medians, hosts/local and the goal: hosts <= 1.5x local. The checkpoints go to a bench dir
every host sees (a host's ``{shared}`` is its own).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import fmt_ratio, fmt_s, isolate_tmpdir, median, print_table, ratio, stdout_to  # noqa: E402
from resume import fault_run  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.hosts import EventRelay, HostSpec, SshHost, measure_offset  # noqa: E402
from harness.sim.places.hosts import nodes as remote  # noqa: E402
from tests.hosts.observe import end_controller, start_controller, watch_host  # noqa: E402
from tests.hosts.sshd import SshdLab, checkout_python, sshd_missing  # noqa: E402

#: a node's writer on the host: N events, INTERVAL s apart, each poking the relay
WRITER = """
import sys, time
from harness.events import EventWriter
path, wake, n, interval = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
writer = EventWriter(path, 0, "bench", wake=wake)
for i in range(n):
    writer.emit("step", seq=i)
    time.sleep(interval)
writer.close()
"""
LOST_AFTER_S = 2.0
#: the goal: a job with its nodes on hosts takes at most this many times the same job here
JOB_GOAL = 1.5


def fmt_ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 1000:.1f} ms"


def timed(fn: Callable[[], object]) -> float:
    started = time.monotonic()
    fn()
    return time.monotonic() - started


def run_quiet(argv: list[str]) -> None:
    subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, check=True)


def asyncssh_times(lab: SshdLab, runs: int) -> tuple[list[float], float] | None:
    """(per-command times, connect time) of asyncssh, or None when it is not importable.
    Its event loop runs in a thread that joined the client namespace (setns is per thread,
    and the sockets a thread makes live in its namespace)."""
    try:
        import asyncssh  # type: ignore[import-not-found]
    except ImportError:
        return None
    spec = lab.spec(0)

    async def measure() -> tuple[list[float], float]:
        started = time.monotonic()
        async with asyncssh.connect(spec.address, port=spec.port, username=spec.user, client_keys=[spec.key],
                                    known_hosts=spec.known_hosts, agent_path=None) as conn:
            connect = time.monotonic() - started
            times = []
            for _ in range(runs):
                started = time.monotonic()
                await conn.run("true", check=True)
                times.append(time.monotonic() - started)
        return times, connect

    return lab.net.call_in_store(lambda: asyncio.run(measure()))


def table(runs: int, clean_rc: bool) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-hosts-") as root, SshdLab(Path(root), 1, clean_rc) as lab:
        lab.start(0)
        opens: dict[bool, list[float]] = {True: [], False: []}
        hosts: dict[bool, SshHost] = {}
        for _ in range(3):  # open is measured on its own, three times each
            for multiplex in (True, False):
                host = lab.ssh_host(lab.spec(0), multiplex=multiplex)
                opens[multiplex].append(timed(host.open))
                host.close()
        try:
            for multiplex in (True, False):
                hosts[multiplex] = lab.ssh_host(lab.spec(0), multiplex=multiplex).open()
            raw = {m: hosts[m].ssh_argv(shlex.join(["true"])) for m in hosts}
            transport: dict[bool, list[float]] = {True: [], False: []}
            supervised: dict[bool, list[float]] = {True: [], False: []}
            for _ in range(runs):
                for multiplex in (True, False):
                    transport[multiplex].append(timed(lambda m=multiplex: run_quiet(raw[m])))
                    supervised[multiplex].append(timed(lambda m=multiplex: hosts[m].run(["true"])))
        finally:
            for host in hosts.values():
                host.close()
        other = asyncssh_times(lab, runs)
    rc = "emptied ~/.bashrc" if clean_rc else "this machine's ~/.bashrc"
    print(f"\n{runs} runs each, hosts with {rc}; load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cpus")
    rows = []
    for name, samples, theirs in (("transport only (ssh ... true)", transport, other[0] if other else None),
                                  ("SshHost.run(['true'])", supervised, None),
                                  ("open (connect + lease)", opens, None)):
        mux, fresh = median(samples[True]), median(samples[False])
        extra = ([fmt_ms(median(theirs)) if theirs else ("-" if other else "not installed")])
        rows.append([name, fmt_ms(mux), fmt_ms(fresh), fmt_ratio(ratio(fresh, mux)), *extra])
    if other:
        rows[2][-1] = fmt_ms(other[1]) + " (connect)"
    print_table(["", "ControlMaster", "fresh connection", "fresh / ControlMaster", "asyncssh"], rows)


def relay_latencies(host: SshHost, events: int) -> list[float]:
    """Seconds from each event's writing on the host to its arrival here (see the doc)."""
    offset = measure_offset(host)
    arrived: list[float] = []
    with EventRelay(host, f"{host.work_dir}/events.jsonl",
                    lambda event: arrived.append(time.monotonic() - event["mono"]), offset=offset) as relay:
        host.run([host.spec.python, "-c", WRITER, relay.path, relay.wake_path, str(events), "0.01"], timeout=120)
        deadline = time.monotonic() + 30
        while len(arrived) < events and time.monotonic() < deadline:
            time.sleep(0.05)
    return arrived


def cleanup_after(lab: SshdLab, freeze: bool) -> float | None:
    """Seconds from a controller's SIGKILL (or SIGSTOP) to its last process gone on the host
    (the lease keeping no events files: keep_missed=0, else its keep is the figure)."""
    controller, seen = start_controller(lab, lost_after=LOST_AFTER_S if freeze else None, keep_missed=0.0)
    try:
        with lab.ssh_host(lab.spec(0)) as observer:
            watch = watch_host(observer, seen["work_dir"], [seen["lease"], seen["sleeper"]], 60)
            started = time.monotonic()
            if freeze:
                controller.send_signal(signal.SIGSTOP)
            else:
                end_controller(controller)
            gone = watch.result(70)
    finally:
        end_controller(controller)
    last = gone.last_gone()
    if gone.left or gone.work_dir_left or last is None:
        print(f"  left on the host: processes {gone.left}, work dir {gone.work_dir_left}", file=sys.stderr)
        return None
    return last - started


def fmt_fine(value: float | None) -> str:
    """Microseconds below a millisecond, else as ``fmt_ms``."""
    return fmt_ms(value) if value is None or value >= 0.001 else f"{value * 1e6:.0f} us"


def fmt_spread(values: list[float]) -> str:
    return f"{fmt_fine(median(values))} (max {fmt_fine(max(values))})" if values else "n/a"


def node_table(runs: int) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-hosts-") as root, SshdLab(Path(root), 1) as lab:
        lab.start(0)
        with lab.ssh_host(lab.spec(0)) as host:
            offsets = [measure_offset(host) for _ in range(runs)]
            latencies = relay_latencies(host, runs * 5)
        kills = [cleanup_after(lab, freeze=False) for _ in range(5)]
        freezes = [cleanup_after(lab, freeze=True) for _ in range(3)]
    print(f"\nclock, events, cleanup; load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cpus")
    rows = [
        ["clock offset: error bound (8 pings)", fmt_spread([o.error_bound_s for o in offsets])],
        ["clock offset: |offset| (one kernel: 0)", fmt_spread([abs(o.mono_offset_s) for o in offsets])],
        ["clock offset: shortest round trip", fmt_spread([o.rtt_s for o in offsets])],
        [f"relay latency ({len(latencies)} of {runs * 5} events)", fmt_spread(latencies)],
        ["SIGKILLed controller: all gone on the host", fmt_spread([k for k in kills if k is not None])],
        [f"frozen controller (lost_after={LOST_AFTER_S:g} s): all gone",
         fmt_spread([f for f in freezes if f is not None])],
    ]
    print_table(["", "median (max)"], rows)


def job_run(hosts: list[HostSpec] | None, where: Path) -> dict:
    """One run of ``bench/resume.py``'s node loss on 2 nodes x 2 workers, on ``hosts`` or here
    (the workers' lines, which local ones write to our stdout, dropped on either side)."""
    from harness import Cluster

    ckpt = tempfile.mkdtemp(prefix="ckpt-", dir=where)
    with stdout_to(os.devnull), Cluster(nnodes="1:2", nproc_per_node=2, max_restarts=3, hosts=hosts) as cluster:
        return {**fault_run(cluster, "node", ckpt_dir=ckpt), "network": cluster.network,
                "start_method": cluster.config.start_method}


def describe(sample: dict) -> str:
    """A job run in one progress line: its two figures and the lost time's breakdown (s)."""
    if not sample["ok"]:
        return "FAILED " + sample["detail"][-300:]
    lost = ", ".join(f"{k} {v:.2f}" for k, v in sample["lost"].items())
    return f"first step {fmt_s(sample['first_step'])}, resume {fmt_s(sample['resume'])} ({lost})"


def job_table(runs: int) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-hosts-") as root, SshdLab(Path(root), 2) as lab:
        lab.start(0)
        lab.start(1, port=2222)
        python = str(checkout_python(Path(root) / "host-python"))
        hosts = [lab.spec(0, python=python), lab.spec(1, python=python)]
        samples: dict[str, list[dict]] = {"local": [], "hosts": []}
        saved, remote.connector = remote.connector, lab.ssh_host  # the client runs in the lab's namespace
        try:
            for i in range(runs):
                for side in ("local", "hosts") if i % 2 == 0 else ("hosts", "local"):
                    sample = job_run(hosts if side == "hosts" else None, Path(root))
                    samples[side].append(sample)
                    print(f"job {side} run {i}: {describe(sample)}", file=sys.stderr)
        finally:
            remote.connector = saved
    print(f"\n2 nodes x 2 workers (nnodes=1:2), kill_node(1) at step 6, median of {runs} runs each "
          f"(failed: local {sum(not s['ok'] for s in samples['local'])}, "
          f"hosts {sum(not s['ok'] for s in samples['hosts'])}); local nodes: {samples['local'][0]['network']}, "
          f"workers: {samples['local'][0]['start_method']}; load average {os.getloadavg()[0]:.2f} "
          f"on {os.cpu_count()} cpus")
    rows = []
    for name, key in (("launch -> first step", "first_step"), ("fault -> resume (kill_node 1)", "resume")):
        here, there = ([s[key] for s in samples[side] if s["ok"]] for side in ("local", "hosts"))
        times = ratio(median(there), median(here))
        verdict = "n/a" if times is None else "PASS" if times <= JOB_GOAL else "FAIL"
        rows.append([name, fmt_s(median(here)), fmt_s(median(there)), fmt_ratio(times), f"<= {JOB_GOAL}x", verdict])
    print_table(["", "local", "2 hosts", "hosts / local", "target", "verdict"], rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="commands per strategy (20)")
    parser.add_argument("--no-host-rc", action="store_true", help="skip the table with this machine's ~/.bashrc")
    parser.add_argument("--no-strategies", action="store_true", help="skip the SSH strategy tables")
    parser.add_argument("--jobs", action="store_true", help="only the job table (local beside hosts)")
    parser.add_argument("--no-jobs", action="store_true", help="skip the job table")
    parser.add_argument("--job-runs", type=int, default=5, help="runs of the job per side (5)")
    args = parser.parse_args()
    why = sshd_missing()
    if why:
        print(f"bench/hosts.py: real sshd hosts unavailable: {why}", file=sys.stderr)
        return 2
    isolate_tmpdir()
    if not args.jobs:
        if not args.no_strategies:
            table(args.runs, clean_rc=True)
            if not args.no_host_rc:
                table(args.runs, clean_rc=False)
        node_table(args.runs)
    if not args.no_jobs:
        job_table(args.job_runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())

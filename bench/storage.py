"""What the harness's filesystem costs, and how fast its storage faults land.

(1) **FUSE overhead**: a 100 MB ``torch.save`` + ``fsync`` through a job's filesystem (the
    ``harness.sim.storage`` FUSE mount, mfusepy over libfuse 3, 1 MiB write requests, written
    direct and copied by libfuse: ``harness.sim.storage.fast_path``) beside
    the same save straight to its backing directory on the same disk, alternating, each
    round into a fresh file. Target: FUSE/direct <= 1.5x (medians).
(2) **fault apply latency**: a thread writes 4 KiB and fsyncs in a loop through a running
    job's shared filesystem; ``job.disk_full()`` is called and the time from the call to the
    first ENOSPC the writer sees is measured (then ``job.heal()``, and again). Target:
    median <= 10 ms.
(3) **launch cost**: what the job's filesystem adds to a warm 1x1 job, launch to close
    (its server stands by in the pool, started when the previous cluster closed), with
    and without a pause between clusters, FUSE and ``HARNESS_FUSE=0`` alternating.
(4) **the straggler**, ours beside torchrun under the same cgroup: ``bench/resources.py``
    (its own bench, with its own flags), run from here with ``--straggler-rounds N``
    (0: skipped), its table printed as it prints it.

    .venv/bin/python bench/storage.py [--rounds 7] [--size-mb 100] [--faults 20] [--launches 9] [--straggler-rounds 1]

Prints a table per part and PASS/FAIL against its target; exits 0 (the numbers are the
result), 2 when FUSE is not available here (it says what is missing).
"""

from __future__ import annotations

import argparse
import errno
import os
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import isolate_tmpdir, stdout_to  # noqa: E402


def _cpu(pid: int) -> float:
    """CPU seconds (user + system) a process has used so far."""
    with open(f"/proc/{pid}/stat", "rb") as fp:
        fields = fp.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _save(path: str, tensor: object, server: int | None) -> tuple[float, float]:
    """Wall seconds of one save + fsync, and the CPU seconds it cost (this process's, and
    the filesystem server's when there is one)."""
    import torch

    cpu0 = time.process_time() + (_cpu(server) if server else 0.0)
    start = time.monotonic()
    with open(path, "wb") as fp:
        torch.save(tensor, fp)
        fp.flush()
        os.fsync(fp.fileno())
    wall = time.monotonic() - start
    return wall, time.process_time() + (_cpu(server) if server else 0.0) - cpu0


def overhead(rounds: int, size_mb: int) -> tuple[float, float]:
    import torch

    from harness.sim.storage.mount import StorageMount

    tensor = torch.randn(size_mb * 1024 * 1024 // 4)
    with tempfile.TemporaryDirectory(prefix="bench_storage_") as directory:
        mount = StorageMount(directory, None, "bench")
        try:
            mount.wait_mounted()
            os.makedirs(os.path.join(mount.backing, "shared"))
            fuse_dir = os.path.join(mount.mountpoint, "shared")
            direct_dir = os.path.join(directory, "direct")
            os.makedirs(direct_dir)
            times: dict[str, list[float]] = {"fuse": [], "direct": []}
            cpus: dict[str, list[float]] = {"fuse": [], "direct": []}
            server = mount.server_pid
            for i in range(rounds):
                order = ("fuse", "direct") if i % 2 == 0 else ("direct", "fuse")
                for which in order:
                    target = fuse_dir if which == "fuse" else direct_dir
                    path = os.path.join(target, f"ckpt_{i}.pt")
                    wall, cpu = _save(path, tensor, server if which == "fuse" else None)
                    times[which].append(wall)
                    cpus[which].append(cpu)
                    os.unlink(path)
                print(f"  round {i + 1}: fuse {times['fuse'][-1]:.3f}s direct {times['direct'][-1]:.3f}s",
                      file=sys.stderr)
            stats = mount.call("stats")
        finally:
            mount.close()
    fuse, direct = statistics.median(times["fuse"]), statistics.median(times["direct"])
    fuse_cpu, direct_cpu = statistics.median(cpus["fuse"]), statistics.median(cpus["direct"])
    ratio = fuse / direct
    load = os.getloadavg()[0]
    print(f"\n(1) {size_mb} MB torch.save + fsync, median of {rounds} (load average {load:.1f} on "
          f"{os.cpu_count()} cores)")
    print("| path | wall s | MB/s | CPU s (saver + fs server) |")
    print("|---|---|---|---|")
    print(f"| harness FUSE | {fuse:.3f} | {size_mb / fuse:.0f} | {fuse_cpu:.3f} |")
    print(f"| direct (same disk) | {direct:.3f} | {size_mb / direct:.0f} | {direct_cpu:.3f} |")
    print(f"ratio FUSE/direct: wall {ratio:.2f}x (target <= 1.5x: {'PASS' if ratio <= 1.5 else 'FAIL'}), "
          f"CPU {fuse_cpu / direct_cpu:.2f}x; {stats['writes']} write requests, the largest "
          f"{stats['largest_write'] // 1024} KiB")
    return fuse, direct


def _write_until_enospc(path: str, first: list[float], seen: threading.Event) -> None:
    """4 KiB writes and fsyncs until one fails with ENOSPC; its time into ``first``."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        while True:
            try:
                os.write(fd, b"x" * 4096)
                os.fsync(fd)
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
                first.append(time.monotonic())
                seen.set()
                return
    finally:
        os.close(fd)


def apply_latency(faults: int) -> list[float]:
    from harness import Cluster

    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "sleep_forever.py")
    latencies: list[float] = []
    with Cluster(nnodes=1, check_invariants=False) as cluster:
        job = cluster.launch(script)
        path = os.path.join(job.shared_dir, "probe")
        for _ in range(faults):
            seen = threading.Event()
            first: list[float] = []
            thread = threading.Thread(target=_write_until_enospc, args=(path, first, seen), daemon=True)
            thread.start()
            time.sleep(0.05)  # writing at full speed
            start = time.monotonic()
            job.disk_full()
            seen.wait(10)
            thread.join(10)
            latencies.append(first[0] - start if first else float("inf"))
            job.heal()
        job.kill_node(0)
    ms = sorted(x * 1000 for x in latencies)
    median = statistics.median(ms)
    print(f"\n(2) job.disk_full() -> first ENOSPC seen by a writer, {faults} faults")
    print("| median ms | p90 ms | max ms |")
    print("|---|---|---|")
    print(f"| {median:.2f} | {ms[int(0.9 * (len(ms) - 1))]:.2f} | {ms[-1]:.2f} |")
    print(f"target median <= 10 ms: {'PASS' if median <= 10 else 'FAIL'}")
    return latencies


def _launch(pool: object, script: str, fuse: bool) -> float:
    """Seconds from ``Cluster()`` to its closed end, for a 1x1 job of ``script``."""
    from harness import Cluster

    os.environ["HARNESS_FUSE"] = "1" if fuse else "0"
    start = time.monotonic()
    with Cluster(nnodes=1, nproc_per_node=1, pool=pool, check_invariants=False) as cluster:
        with stdout_to(os.devnull):  # the workers' lines
            job = cluster.launch(script)
        job.wait()
    return time.monotonic() - start


def launch_cost(rounds: int) -> dict[str, float]:
    """What the job's filesystem adds to a job on a warm pool: its server stands by in the
    pool (``harness.sim.storage.standby``), started when the previous cluster closed."""
    from harness import WarmPool

    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "trivial.py")
    costs: dict[str, float] = {}
    print(f"\n(3) what the filesystem adds to a warm 1x1 launch-to-close (gloo init + all_reduce), "
          f"median of {rounds}, FUSE and plain alternating")
    print("| between clusters | with FUSE s | plain s | FUSE adds ms |")
    print("|---|---|---|---|")
    with WarmPool() as pool:
        _launch(pool, script, True)  # the pool's zygote, node server and first standby
        for pause in (0.3, 0.0):
            times: dict[bool, list[float]] = {True: [], False: []}
            for i in range(rounds):
                for fuse in ((True, False) if i % 2 == 0 else (False, True)):
                    time.sleep(pause)
                    times[fuse].append(_launch(pool, script, fuse))
            with_fuse, plain = statistics.median(times[True]), statistics.median(times[False])
            costs[f"pause {pause}"] = with_fuse - plain
            label = f"a {pause * 1000:.0f} ms pause (a test's setup)" if pause else "back to back"
            print(f"| {label} | {with_fuse:.3f} | {plain:.3f} | {(with_fuse - plain) * 1000:.0f} |")
    os.environ.pop("HARNESS_FUSE", None)
    return costs


def straggler(rounds: int) -> None:
    """Part (4): ``bench/resources.py`` (the straggler beside torchrun), as it prints it."""
    import subprocess

    print(f"\n(4) a straggler's step time, ours beside torchrun (bench/resources.py --rounds {rounds})",
          flush=True)
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "resources.py")
    subprocess.run([sys.executable, script, "--rounds", str(rounds)], check=False, stderr=subprocess.DEVNULL)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--size-mb", type=int, default=100)
    parser.add_argument("--faults", type=int, default=20)
    parser.add_argument("--launches", type=int, default=9)
    parser.add_argument("--straggler-rounds", type=int, default=1)
    args = parser.parse_args()
    isolate_tmpdir()  # its clusters' temp trees, as every bench here keeps them
    from harness.sim.storage.mount import fuse_missing

    missing = fuse_missing()
    if missing is not None:
        print(f"bench/storage.py: needs FUSE; missing {missing}", file=sys.stderr)
        return 2
    overhead(args.rounds, args.size_mb)
    apply_latency(args.faults)
    launch_cost(args.launches)
    if args.straggler_rounds > 0:
        straggler(args.straggler_rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Shared bench helpers: run a process and time it, watch its peak RSS, a process tree's peak
PSS, medians, ratios, tables.

Standard library only (psutil where a tree or a PSS is read, imported there). Conventions
for every bench in this folder:
  * wall times are ``time.monotonic()`` around ``Popen`` ... reaped;
  * cross-process instants (a worker's line vs the launcher's exit) are ``time.time()``:
    workers print ``BENCH <tag> ... ts=<time.time()>`` and ``timestamps()`` reads them back;
  * ours and torchrun run alternately in the same bench run and are compared by ratio.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

__all__ = ["RunSample", "run_process", "timestamps", "median", "ratio", "fmt_s", "fmt_ratio",
           "fmt_mb", "print_table", "process_tree", "pss_kb", "PssPeak"]

RSS_POLL_S = 0.005


@dataclass
class RunSample:
    """One finished (or killed) process."""

    returncode: int
    wall_s: float  # monotonic, from just before Popen to reaped
    end_ts: float  # time.time() when it was reaped
    peak_rss_mb: float | None  # its VmHWM, last value read before it exited (watch_rss only)
    stdout: str
    stderr: str
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


class _HwmWatcher(threading.Thread):
    """Reads ``VmHWM`` (peak resident set) of one pid until it exits.

    VmHWM only grows, so the last value read before the process turned into a zombie (a
    zombie has no memory map and no VmHWM line) is its peak up to within ``RSS_POLL_S``.
    Reading /proc does not stop the process and costs far less than the poll period. (Read
    by hand: psutil offers the current RSS, not this kernel-kept peak.)
    """

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self._path = f"/proc/{pid}/status"
        self._done = threading.Event()
        self.peak_kb: int | None = None

    def run(self) -> None:
        while not self._done.is_set():
            try:
                with open(self._path) as f:
                    status = f.read()
            except OSError:
                return
            match = re.search(r"^VmHWM:\s+(\d+) kB", status, re.M)
            if not match:  # zombie: exited, not reaped yet
                return
            self.peak_kb = int(match[1])
            self._done.wait(RSS_POLL_S)

    def stop(self) -> None:
        self._done.set()
        self.join()


def run_process(cmd: Sequence[str], *, env: dict[str, str] | None = None, cwd: str | None = None,
                timeout: float = 120.0, watch_rss: bool = False) -> RunSample:
    """Run ``cmd`` to the end in its own session, capturing output; time it.

    On timeout the whole session (the launcher and its workers) is SIGKILLed and the sample
    is marked ``timed_out``.
    """
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        started = time.monotonic()
        proc = subprocess.Popen(list(cmd), stdout=out, stderr=err, env=env, cwd=cwd,
                                start_new_session=True)
        watcher = _HwmWatcher(proc.pid) if watch_rss else None
        if watcher:
            watcher.start()
        timed_out = False
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        wall, end_ts = time.monotonic() - started, time.time()
        if timed_out:
            try:  # its workers, if they outlived it
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if watcher:
            watcher.stop()
        out.seek(0)
        err.seek(0)
        peak = watcher.peak_kb / 1024 if watcher and watcher.peak_kb else None
        return RunSample(proc.returncode, wall, end_ts, peak, out.read(), err.read(), timed_out)


def timestamps(text: str, tag: str, **fields: str) -> list[float]:
    """``ts`` of every ``BENCH <tag> k=v ... ts=<float>`` line whose fields match ``fields``."""
    result = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 2 or parts[0] != "BENCH" or parts[1] != tag:
            continue
        values = dict(p.split("=", 1) for p in parts[2:] if "=" in p)
        if all(values.get(k) == v for k, v in fields.items()) and "ts" in values:
            result.append(float(values["ts"]))
    return result


def median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def ratio(ours: float | None, theirs: float | None) -> float | None:
    if ours is None or not theirs:
        return None
    return ours / theirs


def fmt_s(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f} s"


def fmt_mb(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f} MB"


def fmt_ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def print_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """A Markdown table, columns padded so it also reads well in a terminal."""
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=False)) + " |"

    print(line(headers))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in rows:
        print(line(row))


def isolate_tmpdir() -> str:
    """Point TMPDIR (this process's and every child's) at a private dir removed at exit:
    torchrun leaks a ``torchelastic_*`` dir per run, and an agent the bench SIGKILLs cannot
    remove its own, so a bench would otherwise litter the shared temp dir."""
    import atexit
    import shutil
    import tempfile

    path = tempfile.mkdtemp(prefix="bench-tmp-")
    os.environ["TMPDIR"] = path
    tempfile.tempdir = path
    atexit.register(shutil.rmtree, path, True)
    return path


@contextlib.contextmanager
def stdout_to(path: str) -> Iterator[None]:
    """Point fd 1 at ``path`` while node agents are spawned (workers write there)."""
    sys.stdout.flush()
    saved = os.dup(1)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.dup2(fd, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
        os.close(fd)


def own_loopback_prefix() -> list[str]:
    """The argv prefix that runs a command in a new network namespace with only its loopback
    up (``unshare --net``, as root): its processes reach each other over a loopback no other
    process uses, and a torch store client's lookup of the name of ``127.0.0.1`` is answered
    at once, not by this machine's resolver (``bench/gloo_floor.py`` says why that matters
    from 64 ranks on). Empty where it cannot be done (not root, no ``unshare`` or ``ip``)."""
    import shutil

    unshare, ip = shutil.which("unshare"), shutil.which("ip")
    if os.geteuid() != 0 or unshare is None or ip is None:
        return []
    return [unshare, "--net", "sh", "-c", f"{ip} link set lo up && exec \"$@\"", "sh"]


def free_port() -> int:
    """A loopback port nothing listens on now (probed, then closed: fine for one run's store)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def slope(points: Sequence[tuple[float, float]]) -> float | None:
    """The least-squares slope of ``points`` (x, y); None with fewer than two distinct x."""
    if len(points) < 2:
        return None
    mx = sum(x for x, _ in points) / len(points)
    my = sum(y for _, y in points) / len(points)
    den = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / den if den else None


def sweep_killed_runs(said_by: str) -> None:
    """Remove the network namespaces and cgroups of the project's whose owner process is dead
    (a run the bench killed before its clusters closed), each said on stderr as ``said_by``."""
    sys.path.insert(0, str(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    from harness.sim.net.names import sweep_dead_owners as sweep_namespaces
    from harness.sim.resources.cgroups import sweep_dead_owners as sweep_cgroups

    for what, sweep in (("network namespace", sweep_namespaces), ("cgroup", sweep_cgroups)):
        for name in sweep():
            print(f"{said_by}: removed the killed run's {what} {name}", file=sys.stderr)


def process_tree(roots: Sequence[int]) -> set[int]:
    """``roots`` and all their descendants that are still alive."""
    import psutil

    found: set[int] = set()
    for pid in roots:
        try:
            root = psutil.Process(pid)
            found.add(pid)
            found.update(child.pid for child in root.children(recursive=True))
        except psutil.NoSuchProcess:
            continue
    return found


def pss_kb(pid: int) -> int:
    """Proportional set size in KiB (psutil reads /proc/<pid>/smaps_rollup); 0 if gone."""
    import psutil

    try:
        return int(psutil.Process(pid).memory_full_info().pss // 1024)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return 0


class PssPeak(threading.Thread):
    """Sums PSS over the processes ``pids()`` names every ``period`` s; keeps the peak (and
    how many processes it was over) and counts its samples."""

    def __init__(self, pids: Callable[[], set[int]], period: float = 0.05):
        super().__init__(daemon=True)
        self._pids, self._period = pids, period
        self._done = threading.Event()
        self.peak_kb, self.peak_procs, self.samples = 0, 0, 0

    def run(self) -> None:
        while not self._done.is_set():
            pids = self._pids()
            total = sum(pss_kb(p) for p in pids)
            self.samples += 1
            if total > self.peak_kb:
                self.peak_kb, self.peak_procs = total, len(pids)
            self._done.wait(self._period)

    def stop(self) -> None:
        self._done.set()
        self.join()

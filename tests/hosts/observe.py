"""Watching, from the host's side and over a connection of its own, what a controller left
on a host: ``watch_host(observer, work_dir, pids)``; and the controller to watch, a process
of its own to kill or freeze: ``start_controller(lab, lost_after, keep_missed)``. Used by the tests and
``bench/hosts.py`` (no pytest here).

It runs a small Python program on the host (through ``observer``, an ``SshHost`` opened
apart from the controller's), which takes as the controller's everything the host runs on
its behalf: the ``pids`` given (the lease, a command's pid it printed) and every process
whose command line names ``work_dir`` (each command's supervisor: ``run GRACE WORK_DIR
...``) with all their descendants. It holds a pidfd on each (so a reused pid is never
mistaken for one of them), says which it watches, then records the host's monotonic
time at which each exits, waiting on the pidfds (no polling), and finally whether
``work_dir`` still exists. ``Watch.result()`` has those times moved onto our clock with the
observer's measured offset.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

import psutil

from harness.hosts import ClockOffset, HostSpec, RemoteProcess, SshHost, measure_offset
from tests.hosts.sshd import SshdLab

__all__ = ["Watch", "Gone", "watch_host", "start_controller", "end_controller", "left_on", "processes_naming"]

_WATCHER = r"""
import json, os, select, sys, time

work_dir, given, timeout = sys.argv[1], json.loads(sys.argv[2]), float(sys.argv[3])
table = {}
for entry in os.listdir("/proc"):
    if entry.isdigit():
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                named = work_dir.encode() in f.read().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue
        table[int(entry)] = (ppid, named)
mine, pid = set(), os.getpid()
while pid in table:
    mine.add(pid)
    pid = table[pid][0]
found = {pid for pid, (_, named) in table.items() if named} - mine
while True:
    more = {pid for pid, (ppid, _) in table.items() if ppid in found} - found - mine
    if not more:
        break
    found |= more
watched = {}
for pid in found | set(given):
    try:
        watched[os.pidfd_open(pid)] = pid
    except OSError:
        pass
print(json.dumps({"watching": sorted(watched.values())}), flush=True)
poller, gone = select.poll(), {}
for fd in watched:
    poller.register(fd, select.POLLIN)
deadline = time.monotonic() + timeout
while len(gone) < len(watched) and time.monotonic() < deadline:
    for fd, _ in poller.poll(max(1, int((deadline - time.monotonic()) * 1000))):
        gone[watched[fd]] = time.monotonic()
        poller.unregister(fd)
print(json.dumps({"gone": gone, "left": sorted(set(watched.values()) - set(gone)),
                  "work_dir_left": os.path.exists(work_dir)}), flush=True)
"""


@dataclass(frozen=True)
class Gone:
    watched: list[int]
    gone_at: dict[int, float]  # pid -> when it exited, on our monotonic clock
    left: list[int]  # still running at the watch's end
    work_dir_left: bool
    offset: ClockOffset  # the observer's: what moved the host's times onto ours

    def last_gone(self) -> float | None:
        return max(self.gone_at.values()) if self.gone_at else None


class Watch:
    def __init__(self, observer: SshHost, proc: RemoteProcess, offset: ClockOffset, watched: list[int]):
        self.observer, self.proc, self.offset, self.watched = observer, proc, offset, watched

    def result(self, timeout: float) -> Gone:
        """What the watch saw (it ends by its own timeout; ``timeout`` bounds our wait)."""
        out, err = self.proc.communicate(timeout)
        assert self.proc.returncode == 0 and out.count("\n") == 1, (out, err)
        seen = json.loads(out)
        gone = {int(pid): self.offset.local_mono(at) for pid, at in seen["gone"].items()}
        return Gone(self.watched, gone, seen["left"], seen["work_dir_left"], self.offset)


def watch_host(observer: SshHost, work_dir: str, pids: list[int], timeout: float) -> Watch:
    """Start watching (see the module doc); returns once the watched processes are held."""
    offset = measure_offset(observer)
    proc = observer.start([observer.spec.python, "-c", _WATCHER, work_dir, json.dumps(pids), repr(timeout)])
    assert proc.stdout is not None
    first = proc.stdout.readline()
    if not first:
        _, err = proc.communicate(10)
        raise AssertionError(f"the watcher did not start: {err}")
    return Watch(observer, proc, offset, json.loads(first)["watching"])


#: a controller: a host opened, an event relay and a command running there, what it started
#: printed as one JSON line; then it waits to be killed or frozen
CONTROLLER = """
import json, sys, time
from harness.hosts import EventRelay, HostSpec, SshHost
fields, ssh_command, lost_after, keep = (json.loads(arg) for arg in sys.argv[1:5])
ssh = SshHost(HostSpec(**fields), ssh_command=ssh_command, ssh_config="none", lost_after=lost_after,
              keep_missed=keep).open()
relay = EventRelay(ssh, ssh.work_dir + "/node0/events.jsonl", lambda event: None)
proc = ssh.start(["sh", "-c", "echo $$; exec sleep 1000"])
print(json.dumps({"sleeper": int(proc.stdout.readline()), "pids": ssh.pids(), "work_dir": ssh.work_dir,
                  "control_dir": ssh.control_dir, "lease": ssh.info.lease_pid, "relay": relay.remote_pid}),
      flush=True)
time.sleep(1000)
"""


def start_controller(lab: SshdLab, lost_after: float | None,
                     keep_missed: float = 1.0) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    """A controller process with a command and an event relay running on host 0; its host
    keeps the events files ``keep_missed`` s once it lost it (``SshHost``; 20 s by default)."""
    spec = lab.spec(0)
    fields = {name: getattr(spec, name) for name in ("address", "user", "port", "key", "python", "known_hosts")}
    controller = subprocess.Popen([sys.executable, "-c", CONTROLLER, json.dumps(fields),
                                   json.dumps(list(lab.ssh_command)), json.dumps(lost_after),
                                   json.dumps(keep_missed)],
                                  stdout=subprocess.PIPE, text=True)
    assert controller.stdout is not None
    return controller, json.loads(controller.stdout.readline())


def end_controller(controller: subprocess.Popen[str]) -> None:
    controller.kill()
    controller.wait()
    if controller.stdout is not None:
        controller.stdout.close()


def processes_naming(text: str) -> list[int]:
    """The processes whose command line or environment names ``text`` (the lab's hosts share
    this machine's /proc: a host's processes are seen from here), this one aside."""
    found = []
    for proc in psutil.process_iter():
        try:
            words = " ".join(proc.cmdline()) + " " + " ".join(proc.environ().values())
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        if text in words and proc.pid != os.getpid():
            found.append(proc.pid)
    return found


#: run on a host: what of a job's is left there (a process whose command line or
#: environment names one of the given dirs, or the dirs themselves), this watcher and its
#: ancestors (its supervisor names the dirs too) aside, and any process that carries this
#: program (the lab's hosts share this machine's /proc: the observer's own ssh client)
_LEFT = r"""
# pe-left-watch
import json, os, sys
dirs = [d.encode() for d in json.loads(sys.argv[1])]
mine, pid = set(), os.getpid()
while pid > 1:
    mine.add(pid)
    with open(f"/proc/{pid}/stat", "rb") as f:
        pid = int(f.read().rsplit(b")", 1)[1].split()[1])
procs = []
for entry in os.listdir("/proc"):
    if entry.isdigit() and int(entry) not in mine:
        for name in ("cmdline", "environ"):
            try:
                with open(f"/proc/{entry}/{name}", "rb") as f:
                    data = f.read()
            except OSError:
                continue
            if name == "cmdline" and b"# pe-left-watch" in data:
                break
            if any(d in data for d in dirs):
                procs.append(int(entry))
                break
print(json.dumps({"procs": procs, "dirs": [d.decode() for d in dirs if os.path.exists(d)]}))
"""


def left_on(lab: SshdLab, spec: HostSpec, dirs: list[str]) -> dict[str, list]:
    """What is left on ``spec`` of ``dirs``, seen over a fresh connection of its own."""
    with lab.ssh_host(spec) as observer:
        out = observer.run([spec.python, "-c", _LEFT, json.dumps(dirs)]).stdout
    return json.loads(out)

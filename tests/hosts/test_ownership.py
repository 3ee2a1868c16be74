"""Ownership across machines: what a controller starts on a host goes
when the controller goes, however it goes, and the host notices by itself.

First the host-side pieces on this machine, no SSH (``_remote.py`` run locally, as the
host runs it): a supervisor refuses to start once its lease has ended, ends its command
when the lease ends though its own channel stays open, the lease removes the work dir only
after the commands are gone (even one that writes there while it dies), and a lease that
hears nothing for ``lost_after`` seconds ends by itself.

Then real sshd hosts, watched from the host's side over a connection of their own
(``observe.py``): a controller SIGKILLed, and a controller frozen (SIGSTOP, its link
silent but open), each with a command and an event relay running: no process of theirs
and no work dir remains within the bound.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from harness.hosts._ssh import _remote_source
from tests.conftest import survivors
from tests.hosts.observe import end_controller, start_controller, watch_host
from tests.hosts.sshd import SshdLab

#: how long the host may take to end what a lost controller left running (one round trip and
#: the supervisor's SIGTERM; measured: ~10 ms idle, bench/hosts.py; a starved runner is slow)
GONE_WITHIN_S = 15.0
#: the frozen controller's lost_after in these tests (the default is 30 s)
LOST_AFTER_S = 2.0


# -- the host side, on this machine ------------------------------------------------------

class LocalLease:
    """``_remote.py lease`` run here, its stdin ours: what the master's session runs."""

    def __init__(self, base: Path, lost_after: float = 0.0, keep: float = 0.0):
        self.proc = subprocess.Popen([sys.executable, "-c", _remote_source(), "lease", repr(lost_after), repr(keep),
                                      str(base)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert self.proc.stdout is not None
        self.report = json.loads(self.proc.stdout.readline())
        self.work_dir: str = self.report["work_dir"]

    def end(self) -> tuple[int, str]:
        """Close its stdin (EOF); its status and stderr."""
        if self.proc.stdin is not None and self.proc.stdin.closed:
            self.proc.stdin = None  # closed by the test already: communicate() would flush it
        _, err = self.proc.communicate(timeout=GONE_WITHIN_S)
        return self.proc.returncode, err.decode()


def remote(*args: str) -> str:
    """``_remote.py ARGS...`` here, to its end: its stdout."""
    return subprocess.run([sys.executable, "-I", "-S", "-c", _remote_source(), *args], capture_output=True,
                          check=True, timeout=GONE_WITHIN_S, text=True).stdout


def supervise(work_dir: str, *argv: str, grace: float = 5.0) -> subprocess.Popen[bytes]:
    """``_remote.py run`` here, as ``SshHost.start`` runs it on a host; its stdin stays open."""
    return subprocess.Popen([sys.executable, "-I", "-S", "-c", _remote_source(), "run", repr(grace), work_dir, *argv],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def reap(proc: subprocess.Popen[bytes]) -> None:
    proc.kill()
    proc.wait()
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()


def test_a_command_is_not_started_without_a_lease(tmp_path: Path):
    proc = supervise(str(tmp_path), "touch", str(tmp_path / "ran"))
    _, err = proc.communicate(timeout=GONE_WITHIN_S)
    assert proc.returncode == 127
    assert err.decode() == f"not started on this host: the connection's lease of {tmp_path} has ended\n"
    assert not (tmp_path / "ran").exists()


def test_the_lease_ending_ends_the_commands(tmp_path: Path):
    """The supervisor's own stdin stays open (its channel is fine): the lease's end alone
    ends the command (SIGTERM to its group), then the work dir goes."""
    lease = LocalLease(tmp_path)
    proc = supervise(lease.work_dir, "sh", "-c", "echo $$; exec sleep 1000")
    try:
        assert proc.stdout is not None
        sleeper = int(proc.stdout.readline())
        assert lease.end() == (0, "")
        assert proc.wait(GONE_WITHIN_S) == 128 + signal.SIGTERM
        assert survivors([sleeper], GONE_WITHIN_S) == []
        assert os.listdir(tmp_path) == []
    finally:
        reap(proc)


def test_the_work_dir_goes_after_the_commands(tmp_path: Path):
    """A command that writes into the work dir as it dies (its SIGTERM trap, 0.3 s late),
    its channel and the lease's closed at once (a controller gone): the lease waits for
    the command before it removes the dir, so nothing is left. (Removing it at once, as
    before, left the trap's dir behind.)"""
    lease = LocalLease(tmp_path)
    trap = 'trap \'sleep 0.3; mkdir -p "$0/late" && echo late > "$0/late/file"; exit 0\' TERM; echo ready; ' \
           'while :; do sleep 0.05; done'
    proc = supervise(lease.work_dir, "sh", "-c", trap, lease.work_dir)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        assert proc.stdout.readline() == b"ready\n"
        proc.stdin.close()
        assert lease.end() == (0, "")
        assert proc.wait(GONE_WITHIN_S) == 0
        assert os.listdir(tmp_path) == []
    finally:
        reap(proc)


def _files(root: str) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, files in os.walk(root) for f in files)


def test_a_lost_connections_lease_keeps_only_the_events_until_released(tmp_path: Path):
    """EOF without ``bye`` (a connection lost, or a controller killed): the command ends at
    once and everything but the nodes' events files goes (the secret too); they are kept,
    the dir marked, until the controller, connected again, has read them and releases it
    (``kept``/``release``); then the dir goes. A ``bye`` first (``close()``) removes all at
    once; a keep that runs out removes it by itself."""
    lease = LocalLease(tmp_path, keep=60)
    work = Path(lease.work_dir)
    (work / "node0").mkdir()
    (work / "node0" / "events.jsonl").write_text('{"kind": "a"}\n{"kind": "b"}\n')
    (work / "node0" / "rdzv.secret").write_text("s3cret")
    proc = supervise(lease.work_dir, "sh", "-c", "echo $$; exec sleep 1000")
    try:
        assert proc.stdout is not None and proc.stdin is not None
        sleeper = int(proc.stdout.readline())
        lease.proc.stdin.close()  # type: ignore[union-attr]
        assert remote("kept", lease.work_dir, str(GONE_WITHIN_S)) == "kept\n"
        assert survivors([sleeper], GONE_WITHIN_S) == []  # what ran there has ended first
        assert _files(lease.work_dir) == [".kept", "node0/events.jsonl"]
        assert lease.proc.poll() is None
        remote("release", lease.work_dir)
        assert lease.end() == (0, "")
        assert os.listdir(tmp_path) == [] and remote("kept", lease.work_dir, "1") == "gone\n"
    finally:
        reap(proc)
    said_bye = LocalLease(tmp_path, keep=60)
    assert said_bye.proc.stdin is not None
    said_bye.proc.stdin.write(b"bye\n")
    assert said_bye.end() == (0, "") and os.listdir(tmp_path) == []
    ran_out = LocalLease(tmp_path, keep=0.5)
    assert ran_out.end() == (0, "") and os.listdir(tmp_path) == []


def test_a_kept_dir_whose_lease_was_killed_outright_is_removed_by_the_next_lease(tmp_path: Path):
    """A lease keeping its events is SIGKILLed (the host's OOM killer, say): it cannot
    remove its dir. Its mark names it (pid and start time), so the next lease on the host
    sees that process gone and removes the dir before it reports; its own stays, and so
    does the dir of a lease still keeping its events."""
    lease, keeping = LocalLease(tmp_path, keep=60), LocalLease(tmp_path, keep=60)
    for each in (lease, keeping):
        (Path(each.work_dir) / "node0").mkdir()
        (Path(each.work_dir) / "node0" / "events.jsonl").write_text('{"kind": "a"}\n')
        each.proc.stdin.close()  # type: ignore[union-attr]
        assert remote("kept", each.work_dir, str(GONE_WITHIN_S)) == "kept\n"
    lease.proc.kill()
    assert lease.end()[0] == -signal.SIGKILL
    assert os.path.isdir(lease.work_dir)  # left behind
    after = LocalLease(tmp_path)
    assert sorted(os.listdir(tmp_path)) == sorted(os.path.basename(w) for w in (keeping.work_dir, after.work_dir))
    remote("release", keeping.work_dir)
    assert keeping.end() == (0, "") and after.end() == (0, "") and os.listdir(tmp_path) == []


def test_a_silent_controller_is_lost(tmp_path: Path):
    """Heartbeats keep the lease; silence past lost_after ends it, with one line saying so."""
    lease = LocalLease(tmp_path, lost_after=0.5)
    assert lease.proc.stdin is not None
    started = silent = time.monotonic()
    while silent - started < 1.5:  # three times lost_after, kept alive
        time.sleep(0.1)
        lease.proc.stdin.write(b"beat\n")
        lease.proc.stdin.flush()
        silent = time.monotonic()
    assert lease.proc.poll() is None
    assert lease.proc.wait(GONE_WITHIN_S) == 0
    assert 0.5 <= time.monotonic() - silent < GONE_WITHIN_S
    code, err = lease.end()
    assert err.startswith("lease: the controller was silent for ")
    assert err.endswith(" s (lost after 0.5 s): ending this connection's commands\n") and err.count("\n") == 1
    assert os.listdir(tmp_path) == []


# -- real hosts, watched from the host's side ----------------------------------------------

def test_a_killed_controller_leaves_nothing_behind(lab: SshdLab):
    """SIGKILL: no close(), no finalizer. The kernel closes the controller's fds, so every
    ssh client's stdin (the lifeline) and the master's reach EOF: the supervisors end the
    command and the relay at once, the lease removes the work dir after them and the
    nodes' events files after its ``keep_missed`` (1 s here: no controller comes back for
    them), the clients and the master exit, and the master removes its socket. Seen from the host, over a connection
    of its own; only the empty control dir stays here, for the next SshHost to sweep."""
    lab.start(0)
    controller, seen = start_controller(lab, lost_after=None)
    try:
        host_side = [p.pid for p in lab.remote_processes(0)]
        with lab.ssh_host(lab.spec(0)) as observer:
            watch = watch_host(observer, seen["work_dir"], [seen["lease"], seen["sleeper"]], GONE_WITHIN_S)
            assert {seen["lease"], seen["sleeper"], seen["relay"]} <= set(watch.watched)
            assert len(watch.watched) == 5  # and the two supervisors (the command's, the relay's)
            killed_at = time.monotonic()
            end_controller(controller)
            gone = watch.result(GONE_WITHIN_S + 10)
    finally:
        end_controller(controller)
    assert gone.left == [] and not gone.work_dir_left
    last = gone.last_gone()
    assert last is not None and last - killed_at < GONE_WITHIN_S
    assert survivors([*seen["pids"], *host_side], GONE_WITHIN_S) == []  # and on this side
    assert not os.path.exists(os.path.join(seen["control_dir"], "m"))  # no socket (the dir may be swept
    # already: any SshHost opened on this machine, another test's too, sweeps dead owners' dirs)
    with lab.ssh_host(lab.spec(0)):
        assert not os.path.exists(seen["control_dir"])  # swept: its owner is dead


def test_a_frozen_controller_is_lost_and_leaves_nothing_behind(lab: SshdLab):
    """SIGSTOP: the controller's fds stay open, its link too, but its heartbeat stops. The
    host's lease notices the silence after lost_after and ends everything as above."""
    lab.start(0)
    controller, seen = start_controller(lab, lost_after=LOST_AFTER_S)
    try:
        with lab.ssh_host(lab.spec(0)) as observer:
            watch = watch_host(observer, seen["work_dir"], [seen["lease"], seen["sleeper"]],
                               LOST_AFTER_S * 4 + GONE_WITHIN_S)
            frozen_at = time.monotonic()
            controller.send_signal(signal.SIGSTOP)
            gone = watch.result(LOST_AFTER_S * 4 + GONE_WITHIN_S + 10)
            assert gone.left == [] and not gone.work_dir_left
            last = gone.last_gone()
            # silent since the last heartbeat, up to lost_after / 4 before the freeze
            assert last is not None and LOST_AFTER_S * 3 / 4 <= last - frozen_at < LOST_AFTER_S * 4 + GONE_WITHIN_S
            assert psutil.Process(controller.pid).status() == psutil.STATUS_STOPPED  # still frozen
    finally:
        end_controller(controller)
    assert survivors(seen["pids"], GONE_WITHIN_S) == []

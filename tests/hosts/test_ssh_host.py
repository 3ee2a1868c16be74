"""``SshHost`` against real OpenSSH servers (``sshd.py``): one connection per host runs
commands; BatchMode, host keys and the interpreter check fail as one clear line; closing
and a dropped connection leave nothing on either side (a controller killed outright or
frozen: ``test_ownership.py``).

Every wait on a process's death is bounded (``survivors``), never a sleep.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from harness.errors import ConfigError
from harness.hosts import (
    HostAuthError,
    HostCommandError,
    HostError,
    HostKeyError,
    HostPythonError,
    HostTimeout,
    HostUnreachable,
    controller_version,
)
from tests.conftest import survivors
from tests.hosts.sshd import SshdHost, SshdLab, keygen, sshd_missing

#: how long the host may take to end what a lost controller or connection left running
#: (one round trip, the supervisor's SIGTERM; a starved 2-core runner is slow, not stuck)
GONE_WITHIN_S = 15.0


def one_line(error: BaseException) -> str:
    text = str(error)
    assert "\n" not in text, text
    return text


def remote_pid(proc) -> int:
    """The pid a remote ``sh -c 'echo $$; exec ...'`` printed first (hosts share our pids)."""
    return int(proc.stdout.readline())


def our_ssh_processes() -> list[psutil.Process]:
    return [p for p in psutil.Process().children(recursive=True) if p.name() == "ssh"]


def test_without_root_the_lab_says_why(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert sshd_missing() == "needs root (sshd in network namespaces)"


def test_runs_commands_on_two_hosts(lab: SshdLab, two_hosts: list[SshdHost]):
    with contextlib.ExitStack() as stack:
        conns = [stack.enter_context(lab.ssh_host(lab.spec(host.index))) for host in two_hosts]
        for host, ssh in zip(two_hosts, conns, strict=True):
            where = ssh.run(["ip", "-brief", "-4", "addr", "show", "dev", "eth0"]).stdout
            assert host.address in where  # the command ran in that host's namespace
            echo = ssh.run(["printf", "%s\n", "a b", "$HOME", "'; echo injected", "*"])
            assert echo.stdout.splitlines() == ["a b", "$HOME", "'; echo injected", "*"]
            assert ssh.run(["test", "-d", ssh.work_dir]).returncode == 0  # the lease keeps it
            assert len(ssh.pids()) == 1, "one connection: the master, nothing else between commands"
        assert conns[0].work_dir != conns[1].work_dir


def test_a_failing_command_says_which_host_and_what(lab: SshdLab, two_hosts: list[SshdHost]):
    with lab.ssh_host(lab.spec(1)) as ssh:
        with pytest.raises(HostCommandError) as caught:
            ssh.run(["sh", "-c", "echo nope >&2; exit 3"])
        assert caught.value.returncode == 3
        assert one_line(caught.value) == f"host {ssh.spec.label}: sh -c 'echo nope >&2; exit 3' exited 3: nope"
        assert ssh.run(["false"], check=False).returncode == 1
        assert ssh.run(["no-such-program-here"], check=False).returncode == 127


def test_a_command_past_its_timeout_is_ended(lab: SshdLab):
    lab.start(0)
    with lab.ssh_host(lab.spec(0)) as ssh:
        pid_file = f"{ssh.work_dir}/pid"
        with pytest.raises(HostTimeout) as caught:
            ssh.run(["sh", "-c", 'echo $$ > "$0"; exec sleep 1000', pid_file], timeout=1.0)
        assert one_line(caught.value).startswith(f"host {ssh.spec.label}: sh -c ")
        assert one_line(caught.value).endswith(" did not finish within 1 s")
        assert len(ssh.pids()) == 1  # only the master: the command's client was reaped
        sleeper = int(Path(pid_file).read_text())  # the host's files are this machine's
    assert survivors([sleeper], GONE_WITHIN_S) == []


def test_a_commands_first_line_comes_as_it_is_written_and_silence_is_bounded(lab: SshdLab):
    """``first_line``: the line a command says it is ready with, while it goes on running;
    "" for one that stays silent past the timeout, and for one that ended saying nothing."""
    lab.start(0)
    with lab.ssh_host(lab.spec(0)) as ssh:
        ready = ssh.start(["sh", "-c", "echo ready; exec sleep 1000"])
        assert ready.first_line(30) == "ready\n" and ready.poll() is None
        silent = ssh.start(["sleep", "1000"])
        started = time.monotonic()
        assert silent.first_line(0.5) == "" and time.monotonic() - started >= 0.5
        mute = ssh.start(["true"])
        assert mute.first_line(30) == ""
        for proc in (ready, silent, mute):
            proc.close()


def test_no_server_and_a_missing_key_are_one_line(lab: SshdLab, tmp_path: Path):
    with pytest.raises(HostUnreachable) as caught:  # a namespace, but no sshd in it
        lab.ssh_host(lab.spec(0)).open()
    assert one_line(caught.value) == "host root@198.18.1.1:22: connecting: ssh failed: " \
        "ssh: connect to host 198.18.1.1 port 22: Connection refused"
    with pytest.raises(ConfigError, match=r"^key='.*nope' is not a file on this machine \(from host root@"):
        lab.ssh_host(lab.spec(0, key=str(tmp_path / "nope"))).open()


def test_batchmode_never_waits_for_a_password(lab: SshdLab):
    """A host that only takes passwords is refused at once with one line, not a prompt
    (a prompt would hang until the test's timeout: raising HostAuthError proves it did not)."""
    lab.start(0, password_only=True)
    with pytest.raises(HostAuthError) as caught:
        lab.ssh_host(lab.spec(0)).open()
    message = one_line(caught.value)
    assert message.startswith("host root@198.18.1.1:22: connecting: authentication refused")
    assert "BatchMode=yes" in message and "Permission denied" in message


def test_a_changed_host_key_is_refused(lab: SshdLab, tmp_path: Path):
    host = lab.start(0, known=False)
    stranger = keygen(tmp_path / "other_host_key")
    lab.known_hosts.write_text(host.known_hosts_line(key=stranger))
    for tofu in (False, True):  # trust on first use never covers a changed key
        with pytest.raises(HostKeyError) as caught:
            lab.ssh_host(lab.spec(0, trust_on_first_use=tofu)).open()
        message = one_line(caught.value)
        assert "its host key is not the one known_hosts=" in message
        assert f"ssh-keygen -R '198.18.1.1' -f {lab.known_hosts}" in message


def test_an_unknown_host_key_is_refused_unless_trusted_on_first_use(lab: SshdLab):
    host = lab.start(1, port=2222, known=False)
    with pytest.raises(HostKeyError) as caught:
        lab.ssh_host(lab.spec(1)).open()
    assert "no host key for it in known_hosts=" in one_line(caught.value)
    assert "trust_on_first_use=true" in str(caught.value)

    with lab.ssh_host(lab.spec(1, trust_on_first_use=True)) as ssh:
        assert ssh.run(["true"]).returncode == 0
    recorded = lab.known_hosts.read_text()
    assert "[198.18.1.2]:2222" in recorded
    assert recorded.split()[1:3] == host.known_hosts_line().split()[1:3]
    with lab.ssh_host(lab.spec(1)) as ssh:  # strict again: the key is known now
        assert ssh.run(["true"]).returncode == 0


def test_the_version_check_passes_with_the_same_install(lab: SshdLab):
    lab.start(0)
    with lab.ssh_host(lab.spec(0)) as ssh:
        assert ssh.info is not None
        assert ssh.info.pytest_elastic == controller_version()
        assert ssh.info.executable == sys.executable


def bare_python() -> str:
    """A system interpreter without pytest-elastic (skips when there is none)."""
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.path.exists(candidate) and os.path.realpath(candidate) != os.path.realpath(sys.executable):
            probe = subprocess.run([candidate, "-c", "import importlib.metadata as m; m.version('pytest-elastic')"],
                                   cwd="/", capture_output=True)
            if probe.returncode != 0:
                return candidate
    pytest.skip("no interpreter without pytest-elastic on this machine")


def test_the_version_check_names_the_host_and_the_fix(lab: SshdLab):
    lab.start(0)
    python = bare_python()
    with pytest.raises(HostPythonError) as caught:
        lab.ssh_host(lab.spec(0, python=python)).open()
    message = one_line(caught.value)
    assert message.startswith(f"host root@198.18.1.1:22: python={python!r}")
    assert f"has no pytest-elastic; install pytest-elastic=={controller_version()} there" in message

    with pytest.raises(HostPythonError) as caught:
        lab.ssh_host(lab.spec(0, python="/no/such/python")).open()
    assert "python='/no/such/python' could not run there (exit 127:" in one_line(caught.value)

    with lab.ssh_host(lab.spec(0, python=python), check_version=False) as ssh:  # commands need no package
        assert ssh.run(["true"]).returncode == 0


def test_a_missing_work_dir_base_is_named(lab: SshdLab):
    lab.start(0)
    with pytest.raises(Exception, match=r"^host root@198.18.1.1:22: work_dir='/no/such/base' does not exist$"):
        lab.ssh_host(lab.spec(0, work_dir="/no/such/base")).open()


def test_signals_reach_the_remote_group(lab: SshdLab):
    lab.start(0)
    with lab.ssh_host(lab.spec(0)) as ssh:
        proc = ssh.start(["sh", "-c", "echo $$; exec sleep 1000"])
        remote_pid(proc)
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(GONE_WITHIN_S) == 128 + signal.SIGKILL

        proc = ssh.start(["sh", "-c", "sleep 1000 & echo $!; wait"])  # a child in the background
        background = remote_pid(proc)
        assert proc.terminate() == 128 + signal.SIGTERM
        assert survivors([background], GONE_WITHIN_S) == []


def test_a_tree_signal_reaches_processes_that_left_the_group(lab: SshdLab):
    """``signal_tree``: every process below the command, a child in a session of its own
    too (an agent's workers lead their own groups), which the group signal misses."""
    lab.start(0)
    spec = lab.spec(0)
    leave = "import os, time; os.setsid(); print(os.getpid(), flush=True); time.sleep(1000)"
    with lab.ssh_host(spec) as ssh:
        proc = ssh.start(["sh", "-c", '"$0" -c "$1" & wait', spec.python, leave])
        apart = remote_pid(proc)
        assert os.getsid(apart) == apart  # not in the command's group: `signal N` misses it
        proc.signal_tree(signal.SIGKILL)
        assert survivors([apart], GONE_WITHIN_S) == []
        proc.wait(GONE_WITHIN_S)  # the shell too (killed, or done waiting: the child went first)


def test_one_pid_is_signalled_only_if_it_is_below_the_command(lab: SshdLab):
    """``signal_pid``, the safety rule of faults on hosts (kill only what you started): a
    process below the command, in a session of its own, is signalled there; pid 1, the
    lease, the supervisor and the command's own process are refused in one line and
    nothing is signalled (the command and the connection carry on); an ended one is gone,
    and a command that ends while it is asked says so at once. ``await_stopped`` hears
    from the supervisor once SIGSTOP reached the command."""
    lab.start(0)
    spec = lab.spec(0)
    # ``apart`` is in a session of its own, and its parent never reaps it: once killed it
    # stays a zombie, still below the command, that kill(2) still "signals"
    leave = ("import os, time; pid = os.fork(); pid or (os.setsid(), time.sleep(1000)); "
             "print(pid, flush=True); time.sleep(1000)")
    with lab.ssh_host(spec) as ssh:
        proc = ssh.start(["sh", "-c", 'echo $$; "$0" -c "$1" & wait', spec.python, leave])
        shell, apart = remote_pid(proc), remote_pid(proc)
        supervisor = psutil.Process(shell).ppid()
        assert ssh.info is not None and ssh.info.lease_pid is not None
        for pid, sig in ((1, 0), (ssh.info.lease_pid, signal.SIGKILL), (supervisor, signal.SIGKILL),
                         (shell, signal.SIGKILL)):  # pid 1 only ever gets signal 0 (no signal)
            with pytest.raises(HostError) as info:
                proc.signal_pid(pid, sig)
            assert one_line(info.value) == (
                f"host {spec.label}: signal {sig} to pid {pid} refused: pid {pid} is not a process below the "
                f"command (pid {shell}) on this host: only those are signalled; nothing was signalled")
        assert all(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE  # NoSuchProcess if gone
                   for pid in (ssh.info.lease_pid, supervisor, shell, apart))
        ssh.ping()  # the lease still answers
        assert proc.signal_pid(apart, signal.SIGKILL) is True
        assert survivors([apart], GONE_WITHIN_S) == []
        assert psutil.Process(apart).status() == psutil.STATUS_ZOMBIE
        assert proc.signal_pid(apart, signal.SIGKILL) is False  # ended: nothing to signal
        with pytest.raises(ValueError, match="pid=0 must be a process id"):
            proc.signal_pid(0, signal.SIGKILL)
        proc = ssh.start(["sleep", "0.5"])  # asked while it ends: an answer, or gone, never the timeout
        asked = 0
        while True:
            asked += 1
            started = time.monotonic()
            try:
                if proc.signal_pid(1, 0, timeout=GONE_WITHIN_S) is False:
                    break
            except HostTimeout:
                raise
            except HostError as e:
                assert "refused: pid 1 is not a process below the command" in str(e)
            assert time.monotonic() - started < GONE_WITHIN_S / 3
        assert asked > 1
        proc = ssh.start(["sleep", "1000"])
        proc.send_signal(signal.SIGSTOP)
        assert proc.await_stopped(GONE_WITHIN_S) == "stopped"
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(GONE_WITHIN_S) == 128 + signal.SIGKILL
        assert proc.await_stopped(1) == "exited"


def test_put_writes_a_private_file_without_a_command_line(lab: SshdLab):
    """``put``: the bytes travel on the channel's stdin into a new 0600 file in the work
    dir; an existing file is never overwritten, a path out of the work dir is refused."""
    lab.start(0)
    with lab.ssh_host(lab.spec(0)) as ssh:
        path = ssh.put("node0/rdzv.secret", b"s3cret\n")
        assert path == f"{ssh.work_dir}/node0/rdzv.secret"
        assert ssh.run(["stat", "-c", "%a", path]).stdout == "600\n"
        assert ssh.run(["stat", "-c", "%a", os.path.dirname(path)]).stdout.strip() in ("700", "755")
        assert ssh.run(["cat", path]).stdout == "s3cret\n"
        with pytest.raises(HostCommandError) as info:
            ssh.put("node0/rdzv.secret", b"other")
        assert one_line(info.value).endswith(f"writing {path} exited 1: cannot write {path}: File exists")
        assert ssh.run(["cat", path]).stdout == "s3cret\n"
        for bad in ("../x", "/etc/x", "a//b", "a/./b"):
            with pytest.raises(ValueError, match="must be a plain relative path inside the work dir"):
                ssh.put(bad, b"")


def test_a_remote_forward_reaches_a_unix_socket_here(lab: SshdLab):
    """``forward_remote``: a port on the host's loopback, picked there, whose connections
    come back over the connection to a Unix socket here (how a job's hosts reach its store)."""
    import shutil
    import socket
    import tempfile
    import threading

    lab.start(0)
    short = tempfile.mkdtemp(prefix="fw")  # pytest's tmp_path under xdist passes a socket path's 107 bytes
    path = os.path.join(short, "here.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)

    def answer() -> None:
        conn, _ = server.accept()
        with conn:
            conn.sendall(b"hello from here: " + conn.recv(64))

    threading.Thread(target=answer, daemon=True).start()
    spec = lab.spec(0)
    probe = ("import socket, sys; s = socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=10); "
             "s.sendall(b'host'); print(s.recv(64).decode())")
    try:
        with lab.ssh_host(spec) as ssh:
            port = ssh.forward_remote(path)
            assert 0 < port < 65536
            assert ssh.run([spec.python, "-c", probe, str(port)]).stdout == "hello from here: host\n"
    finally:
        server.close()
        shutil.rmtree(short, ignore_errors=True)


def test_close_leaves_nothing(lab: SshdLab, two_hosts: list[SshdHost]):
    ssh = lab.ssh_host(lab.spec(0)).open()
    proc = ssh.start(["sh", "-c", "echo $$; exec sleep 1000"])
    sleeper = remote_pid(proc)
    ssh.run(["true"])
    assert proc.poll() is None and psutil.Process(sleeper).status() != psutil.STATUS_ZOMBIE  # runs until let go
    local = ssh.pids()
    control_dir, work_dir = ssh.control_dir, ssh.work_dir
    assert control_dir is not None and os.path.exists(os.path.join(control_dir, "m"))
    assert len(local) == 2  # the master and the sleeper's client
    host_side = [p.pid for p in lab.remote_processes(0)]  # sshd's sessions, the lease, the supervisor
    ssh.close()
    assert survivors([sleeper, *local, *host_side], GONE_WITHIN_S) == []
    assert our_ssh_processes() == []
    assert not os.path.exists(control_dir) and not os.path.exists(work_dir)
    assert "closed" in repr(ssh) and "exited" in repr(proc)


def test_commands_past_max_sessions_go_on_another_connection(lab: SshdLab):
    """sshd allows 3 sessions a connection (MaxSessions 3): the lease and 2 commands on the
    first, the next 2 on a second connection (its own session the 3rd there), the 5th on a
    third. All run at once; close() ends every connection and leaves nothing."""
    lab.start(0, max_sessions=3)
    ssh = lab.ssh_host(lab.spec(0, max_sessions=3)).open()
    procs = [ssh.start(["sh", "-c", "echo $$; exec sleep 1000"]) for _ in range(5)]
    sleepers = [remote_pid(proc) for proc in procs]
    assert [proc.connection for proc in procs] == [0, 0, 1, 1, 2]
    assert all(proc.poll() is None for proc in procs)
    assert ssh.run(["echo", "six"]).stdout == "six\n"  # one more, on the third connection
    control_dir = ssh.control_dir
    assert control_dir is not None and sorted(os.listdir(control_dir)) == [
        "m", "m1", "m2", "master.log", "master.log.1", "master.log.2"]
    local = ssh.pids()
    assert len(local) == 3 + 5  # three connections, five clients
    host_side = [p.pid for p in lab.remote_processes(0)]
    ssh.close()
    assert survivors([*sleepers, *local, *host_side], GONE_WITHIN_S) == []
    assert our_ssh_processes() == []
    assert not os.path.exists(control_dir)


def test_a_host_allowing_fewer_sessions_than_max_sessions_says_which_field(lab: SshdLab):
    lab.start(0, max_sessions=2)
    with lab.ssh_host(lab.spec(0)) as ssh:  # max_sessions: 10, the default
        remote_pid(ssh.start(["sh", "-c", "echo $$; exec sleep 1000"]))  # the lease's and this: 2 sessions
        with pytest.raises(HostError) as caught:
            ssh.run(["true"])
    assert str(caught.value) == (
        f"host {ssh.spec.label}: running true: its sshd refused one more session on the connection (MaxSessions): "
        "the hosts file's max_sessions=10 is more than the host's sshd MaxSessions; set it to that")


def test_a_forgotten_host_is_closed_by_the_garbage_collector(lab: SshdLab):
    lab.start(0)
    ssh = lab.ssh_host(lab.spec(0)).open()
    sleeper = remote_pid(ssh.start(["sh", "-c", "echo $$; exec sleep 1000"]))
    local, control_dir = ssh.pids(), ssh.control_dir
    del ssh
    gc.collect()
    assert survivors([sleeper, *local], GONE_WITHIN_S) == []
    assert control_dir is not None and not os.path.exists(control_dir)


def test_a_dropped_connection_ends_the_remote_commands(lab: SshdLab):
    """The host's side of the connection dies: the supervisor's stdin closes, the command
    goes, the lease keeps the events files for its keep_missed (1 s here), and the next
    command says the connection is closed."""
    lab.start(0)
    with lab.ssh_host(lab.spec(0), keep_missed=1.0) as ssh:
        proc = ssh.start(["sh", "-c", "echo $$; exec sleep 1000"])
        sleeper = remote_pid(proc)
        work_dir = ssh.work_dir
        host_side = [p.pid for p in lab.remote_processes(0)]  # before they are orphaned
        for session in lab.sessions(0):
            session.kill()
        assert survivors([sleeper, *host_side], GONE_WITHIN_S) == []  # the lease too: it removed the work dir
        assert not os.path.exists(work_dir)
        assert survivors(ssh.pids()[:1], GONE_WITHIN_S) == []  # the master noticed
        with pytest.raises(HostUnreachable, match="the connection is closed"):
            ssh.run(["true"])


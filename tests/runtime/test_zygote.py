"""--start-method=zygote: workers forked from a warm interpreter."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import psutil
import pytest

from harness.procs._zygote_client import Zygote, ZygoteServerProcess, python_target
from tests.conftest import SCRIPTS, run_elastic, survivors


def test_python_target_parsing():
    py = sys.executable
    assert python_target([py, "-u", "a.py", "x"]) == ("a.py", ["x"], False)
    assert python_target([py, "-u", "-m", "pkg.mod", "y"]) == ("pkg.mod", ["y"], True)
    assert python_target(["sh", "-c", "x"]) is None
    assert python_target([py, "-X", "dev", "a.py"]) is None


def test_env_argv_and_exit_codes_match_spawn():
    for method in ("spawn", "zygote"):
        out = run_elastic("--standalone", f"--start-method={method}", "--nproc-per-node=2",
                          str(SCRIPTS / "env_dump.py"), "a", "--b")
        assert out.returncode == 0, out.stderr
        lines = sorted(l for l in out.stdout.splitlines() if l.startswith("ENV "))
        assert len(lines) == 2 and all('"argv": ["a", "--b"]' in l for l in lines)


def test_gloo_and_restart_reuse_the_zygote():
    out = run_elastic("--standalone", "--start-method=zygote", "--nproc-per-node=2", "--max-restarts=2",
                      str(SCRIPTS / "crash_once.py"))
    assert out.returncode == 0, out.stderr
    assert sorted(re.findall(r"SUM rank=(\d) attempt=1 value=2", out.stdout)) == ["0", "1"]


def test_failure_report_and_module(tmp_path):
    (tmp_path / "boom.py").write_text("import sys\nprint('argv0', sys.argv[0])\nraise SystemExit(4)\n")
    out = run_elastic("--standalone", "--start-method=zygote", "-m", "boom", cwd=str(tmp_path))
    assert out.returncode == 1
    assert "exitcode  : 4" in out.stderr
    assert f"argv0 {tmp_path / 'boom.py'}" in out.stdout


def test_uncaught_exception_prints_traceback_and_exits_1(tmp_path):
    script = tmp_path / "exc.py"
    script.write_text("raise KeyError('zz')\n")
    out = run_elastic("--standalone", "--start-method=zygote", str(script))
    assert out.returncode == 1
    assert "KeyError: 'zz'" in out.stderr and "exitcode  : 1" in out.stderr


def test_omp_threads_applied_after_fork(tmp_path):
    script = tmp_path / "threads.py"
    # one write(2) a line: the two workers share the agent's stdout, unbuffered, and print()'s
    # several writes interleaved under load ('THREADSTHREADS 1\n 1\n', a full suite's run)
    script.write_text("import os, torch\nos.write(1, f'THREADS {torch.get_num_threads()}\\n'.encode())\n")
    out = run_elastic("--standalone", "--start-method=zygote", "--nproc-per-node=2", str(script),
                      env={"OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("THREADS 1") == 2


def _read_pids(stream, count):
    pids = []
    while len(pids) < count:
        line = stream.readline()
        assert line, "agent ended early"
        match = re.match(r"PID (\d+)", line)
        if match:
            pids.append(int(match.group(1)))
    return pids


def test_shared_zygote_kills_only_the_dead_agents_workers(tmp_path):
    server = ZygoteServerProcess()
    try:
        server.wait_ready()
        env = {**os.environ, "HARNESS_ZYGOTE": server.path, "TMPDIR": str(tmp_path)}
        cmd = [sys.executable, "-m", "harness.run", "--standalone", "--start-method=zygote",
               "--nproc-per-node=2", str(SCRIPTS / "sleeper.py")]
        a = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
        b = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
        pids_a, pids_b = _read_pids(a.stdout, 2), _read_pids(b.stdout, 2)
        for pid in pids_a + pids_b:  # forked by the zygote, not by the agents
            assert psutil.Process(pid).ppid() == server.process.pid
        a.kill()
        a.wait()
        assert not survivors(pids_a, timeout=5)
        assert all(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids_b)
        b.terminate()
        assert b.wait(20) == 1
        assert not survivors(pids_b, timeout=5)
    finally:
        for proc in (a, b):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.stdout.close()
        server.close()


def test_agents_may_ask_a_zygote_that_listens_but_still_imports_torch(tmp_path):
    """The zygote listens before its torch import: an agent that connects then is served
    once the import is done (this is what lets node agents start without waiting for it)."""
    server = ZygoteServerProcess()
    try:
        server.wait_listening()
        env = {**os.environ, "HARNESS_ZYGOTE": server.path, "TMPDIR": str(tmp_path)}
        out = subprocess.run([sys.executable, "-m", "harness.run", "--standalone", "--start-method=zygote",
                              "--nproc-per-node=2", "--max-restarts=2", str(SCRIPTS / "crash_once.py")],
                             capture_output=True, text=True, env=env, timeout=120)
        assert out.returncode == 0, out.stderr
        assert sorted(re.findall(r"SUM rank=(\d) attempt=1 value=2", out.stdout)) == ["0", "1"]
        server.wait_ready()  # and it did finish its import meanwhile
    finally:
        server.close()


def test_zygote_dies_with_its_starter(tmp_path):
    """A private zygote (and so its workers) go away when the agent is SIGKILLed."""
    agent = subprocess.Popen(
        [sys.executable, "-m", "harness.run", "--standalone", "--start-method=zygote", "--nproc-per-node=2",
         str(SCRIPTS / "sleeper.py")],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "TMPDIR": str(tmp_path)})
    pids = _read_pids(agent.stdout, 2)
    zygote_pid = psutil.Process(pids[0]).ppid()
    agent.kill()
    agent.wait()
    agent.stdout.close()
    assert not survivors([*pids, zygote_pid], timeout=5)


def test_a_client_that_vanishes_or_talks_garbage_does_not_kill_the_zygote(tmp_path):
    """An agent SIGTERMed right after asking for a worker used to crash the shared zygote
    (BrokenPipeError on the reply), taking every other node's workers with it."""

    from harness.procs._zygote import make_socket, send_message

    server = ZygoteServerProcess()
    try:
        server.wait_ready()
        script = tmp_path / "hello.py"
        script.write_text("import os\nos.write(1, b'HELLO\\n')\n")
        for _ in range(3):
            rude = make_socket()
            rude.connect(server.path)
            with open(os.devnull, "wb") as null:
                fd = null.fileno()
                send_message(rude, {"op": "spawn", "id": 1, "target": str(script), "args": [],
                                    "module": False, "env": dict(os.environ), "cwd": str(tmp_path),
                                    "sys_path": []}, [fd, fd, fd])
            rude.close()  # gone before the zygote replies
            garbage = make_socket()
            garbage.connect(server.path)
            send_message(garbage, {"op": "spawn"})  # no id, no target
            garbage.close()
        zygote = Zygote(server.path)
        out = tmp_path / "out.txt"
        with open(out, "wb") as sink:
            proc = zygote.start_worker(0, [sys.executable, "-u", str(script)], dict(os.environ), sink, None)
        import select
        select.select([proc.fileno()], [], [], 30)
        assert proc.poll() == 0 and out.read_bytes() == b"HELLO\n"
        proc.release()
        zygote.close()
        assert server.process.poll() is None
    finally:
        server.close()


_NETNS_WORKER = """\
import os, socket, sys
ino = os.stat("/proc/self/ns/net").st_ino
names = sorted(name for _, name in socket.if_nameindex())
probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
try:
    probe.bind((sys.argv[1], 0))
    bound = "yes"
except OSError:
    bound = "no"
# one write(2) for the whole line: both workers share the agent's stdout, and print() under
# python -u (the workers' mode here as under torchrun) writes the text and its newline apart
os.write(1, f"WORKER ppid={os.getppid()} ino={ino} ifaces={','.join(names)} bound={bound}\\n".encode())
"""


def test_a_shared_zygote_forks_workers_into_their_agents_network_namespace(tmp_path):
    """An agent in another network namespace reaches the shared zygote (a socket path, not
    an abstract name, which would not cross namespaces) and gets workers that live in the
    agent's namespace, not the zygote's: they see its interface and own its address."""
    from harness.sim.net import Network, netns_missing

    if netns_missing():
        pytest.skip(f"needs {'; '.join(netns_missing())}")
    script = tmp_path / "where.py"
    script.write_text(_NETNS_WORKER)
    server = ZygoteServerProcess()
    net = Network(1, "netns")
    try:
        server.wait_ready()
        out = subprocess.run(
            [sys.executable, "-m", "harness.run", "--standalone", "--start-method=zygote",
             "--nproc-per-node=2", str(script), net.address(0)],
            capture_output=True, text=True, timeout=90, preexec_fn=net.enter(0),
            env={**os.environ, "HARNESS_ZYGOTE": server.path, "TMPDIR": str(tmp_path)})
        assert out.returncode == 0, out.stderr
        lines = [line for line in out.stdout.splitlines() if line.startswith("WORKER")]
        ino = os.stat(net.namespace_path(0)).st_ino
        assert ino != os.stat("/proc/self/ns/net").st_ino
        expected = f"WORKER ppid={server.process.pid} ino={ino} ifaces=eth0,lo bound=yes"
        assert lines == [expected, expected], out.stdout
    finally:
        net.close()
        server.close()


def test_a_worker_uses_its_own_tmpdir_whatever_its_zygote_chose(tmp_path):
    """A forked worker's ``tempfile`` starts from its own ``TMPDIR``: the zygote's module
    state is inherited, and a temp dir it had chosen (an import that asked) was used by
    every worker it forked, off the node's disk where storage faults reach them."""
    script = tmp_path / "where.py"
    script.write_text("import tempfile\nprint('TEMP', tempfile.gettempdir())\n")
    mine = tmp_path / "mine"
    mine.mkdir()
    code = ("import sys, tempfile; tempfile.tempdir = '/the-zygotes-choice'; "
            "from harness.procs._zygote import run_as_main; "
            f"sys.exit(run_as_main({{'cwd': {str(tmp_path)!r}, 'env': {{'TMPDIR': {str(mine)!r}}}, "
            f"'target': {str(script)!r}, 'args': [], 'module': False, 'sys_path': sys.path}}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert f"TEMP {mine}" in out.stdout.splitlines()


def test_a_zygote_has_a_temp_dir_of_its_own_removed_with_it():
    """What the zygote's imports make in its temp dir goes when it closes."""
    zygote = ZygoteServerProcess()
    try:
        environ = psutil.Process(zygote.process.pid).environ()
        assert environ["TMPDIR"] == zygote.tmpdir and os.path.isdir(zygote.tmpdir)
        os.mkdir(os.path.join(zygote.tmpdir, "torchinductor_someone"))
    finally:
        zygote.close()
    assert not os.path.exists(zygote.tmpdir)


def test_a_zygote_worker_collects_only_what_it_made_not_torchs_heap(tmp_path):
    """What the zygote imported is frozen before the fork: a worker's full collection does
    not walk torch's objects (~120 ms and ~20 MB of copied pages when it did), and still
    frees the worker's own garbage, with the collector on as in a fresh interpreter."""
    script = tmp_path / "heap.py"
    script.write_text(textwrap.dedent("""
        import gc, os, torch
        a, b = [], []
        a.append(b); b.append(a)
        del a, b
        freed = gc.collect()
        os.write(1, f"HEAP enabled={gc.isenabled()} frozen={gc.get_freeze_count()} "
                    f"tracked={len(gc.get_objects())} freed={freed}\\n".encode())
    """))
    out = run_elastic("--standalone", "--start-method=zygote", str(script))
    assert out.returncode == 0, out.stderr
    found = re.search(r"HEAP enabled=(\w+) frozen=(\d+) tracked=(\d+) freed=(\d+)", out.stdout)
    assert found, out.stdout
    enabled, frozen, tracked, freed = found[1], int(found[2]), int(found[3]), int(found[4])
    assert enabled == "True" and freed >= 2
    assert frozen > 100_000 and tracked < frozen // 4, (frozen, tracked)  # torch's heap: frozen

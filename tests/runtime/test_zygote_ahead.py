"""A zygote shared by many nodes runs ahead of them; the workers it forks do not, and a
simulated node's worker is in its node's cgroup before any of its code runs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid

import pytest

from harness.procs._zygote_client import Zygote, ZygoteServerProcess
from harness.sim.resources.cgroups import CgroupSupport, JobCgroup, probe

#: the worker says, first thing, its nice value and its cpu cgroup
WORKER = ("import os\n"
          "cpu = [l for l in open('/proc/self/cgroup').read().splitlines() if ':cpu' in l]\n"
          "print('NICE', os.getpriority(os.PRIO_PROCESS, 0), 'CGROUP', cpu, flush=True)\n")


def _read(path: str) -> str:
    with open(path) as fp:
        return fp.read()


def _nice(pid: int) -> int:
    return int(_read(f"/proc/{pid}/stat").rsplit(")", 1)[1].split()[16])


def _group_nice(pid: int) -> int:
    return int(_read(f"/proc/{pid}/autogroup").split()[-1])


def _may_raise() -> bool:
    try:
        os.setpriority(os.PRIO_PROCESS, 0, os.getpriority(os.PRIO_PROCESS, 0))
        return os.geteuid() == 0
    except OSError:
        return False


def _run(zygote: Zygote, script: str, env: dict[str, str], out_path: str) -> str:
    with open(out_path, "w") as out:
        proc = zygote.start_worker(0, [sys.executable, "-u", script], env, out, out)
        assert zygote.exit_code(proc.pid, timeout=60) == 0
    return _read(out_path)


def _in_a_session_of_its_own(code: str, prefix: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    """``code`` run by a fresh interpreter (after ``prefix``) in a session of its own: its own
    scheduling group, as a server the harness starts; it must succeed."""
    out = subprocess.run([*(prefix or []), sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, start_new_session=True)
    assert out.returncode == 0, out.stderr
    return out


needs_root = pytest.mark.skipif(not _may_raise(), reason="raising a priority needs root (CAP_SYS_NICE)")


@needs_root
def test_a_shared_zygote_runs_ahead_and_its_workers_do_not(tmp_path):
    support = probe()
    if not isinstance(support, CgroupSupport) or support.version != 1:
        pytest.skip(f"needs cgroup v1 to place a worker: {support}")
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    job = JobCgroup(support, uuid.uuid4().hex[:8])
    server = ZygoteServerProcess(ahead=True)
    zygote = Zygote(server.path)
    try:
        server.wait_ready()
        pid = server.process.pid
        assert _nice(pid) == -10
        has_groups = os.path.exists(f"/proc/{pid}/autogroup")
        if has_groups:
            assert _group_nice(pid) == -10
        node = job.node(0)
        placed_env = {**os.environ, "HARNESS_WORKER_CGROUP": os.pathsep.join(node.worker_procs_files()),
                      "HARNESS_WORKER_NICE": "10", "TMPDIR": str(tmp_path)}
        # nobody but the worker itself moves it: this client does not place what it starts
        said = _run(zygote, str(script), placed_env, str(tmp_path / "placed.out"))
        assert "NICE 10 " in said, said
        assert os.path.basename(os.path.dirname(node.worker_procs_files()[0])) in said, said
        if has_groups:
            assert _group_nice(pid) == -10  # its workers left the session's group: it stays ahead
        plain_env = {k: v for k, v in placed_env.items() if not k.startswith("HARNESS_WORKER")}
        said = _run(zygote, str(script), plain_env, str(tmp_path / "plain.out"))
        assert "NICE 0 " in said, said
        if has_groups:  # a worker that stays in the session's group must not run ahead with it
            assert _group_nice(pid) == 0
        assert _nice(pid) == -10
    finally:
        zygote.close()
        server.close()
        job.remove()


def test_a_private_zygote_does_not_run_ahead(tmp_path):
    server = ZygoteServerProcess()
    try:
        server.wait_ready()
        assert _nice(server.process.pid) == os.getpriority(os.PRIO_PROCESS, 0)
    finally:
        server.close()


@needs_root
def test_without_cap_sys_nice_nothing_is_raised():
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("needs setpriv (util-linux) to drop CAP_SYS_NICE")
    code = ("import os; from harness.procs import run_ahead\n"
            "before = os.getpriority(os.PRIO_PROCESS, 0)\n"
            "group = open('/proc/self/autogroup').read() if os.path.exists('/proc/self/autogroup') else ''\n"
            "ahead = run_ahead()\n"
            "after = open('/proc/self/autogroup').read() if group else ''\n"
            "print(ahead.nice, ahead.group_nice, os.getpriority(os.PRIO_PROCESS, 0) == before, after == group)\n")
    out = _in_a_session_of_its_own(code, [setpriv, "--inh-caps=-sys_nice", "--bounding-set=-sys_nice"])
    assert out.stdout.split() == ["None", "None", "True", "True"]


@needs_root
def test_a_child_is_born_at_the_servers_own_priority_and_the_server_stays_ahead():
    code = ("import os; from harness.procs import run_ahead\n"
            "before = os.getpriority(os.PRIO_PROCESS, 0)\n"
            "ahead = run_ahead(5)\n"
            "raised = os.getpriority(os.PRIO_PROCESS, 0)\n"
            "ahead.before_fork()\n"
            "pid = os.fork()\n"
            "if pid == 0:\n"
            "    os._exit(0 if os.getpriority(os.PRIO_PROCESS, 0) == before else 1)\n"
            "ahead.after_fork()\n"
            "_, status = os.waitpid(pid, 0)\n"
            "print(raised - before, os.waitstatus_to_exitcode(status), os.getpriority(os.PRIO_PROCESS, 0) - before)\n")
    out = _in_a_session_of_its_own(code)
    assert out.stdout.split() == ["-5", "0", "-5"]


@needs_root
def test_a_server_steps_back_for_work_no_node_waits_for_and_up_again():
    """The zygote's imports between jobs run in a thread it starts stepped back: behind the
    next job's nodes, not ahead of them."""
    code = ("import os, threading; from harness.procs import run_ahead\n"
            "def group():\n"
            "    path = '/proc/self/autogroup'\n"
            "    return open(path).read().split()[-1] if os.path.exists(path) else '-'\n"
            "before, group_before = os.getpriority(os.PRIO_PROCESS, 0), group()\n"
            "ahead = run_ahead(5)\n"
            "raised = (os.getpriority(os.PRIO_PROCESS, 0), group())\n"
            "ahead.step_back()\n"
            "seen = []\n"
            "t = threading.Thread(target=lambda: seen.append(os.getpriority(os.PRIO_PROCESS, 0)))\n"
            "t.start(); t.join()\n"
            "back = (os.getpriority(os.PRIO_PROCESS, 0), group())\n"
            "ahead.step_up()\n"
            "print(before, group_before, *raised, seen[0], *back, os.getpriority(os.PRIO_PROCESS, 0), group())\n")
    out = _in_a_session_of_its_own(code)
    before, group, raised, raised_group, thread, back, back_group, up, up_group = out.stdout.split()
    assert int(raised) == int(before) - 5 and int(thread) == int(before) and int(back) == int(before)
    assert int(up) == int(raised)
    if group != "-":
        assert int(raised_group) == int(group) - 5 and int(back_group) == int(group)
        assert int(up_group) == int(raised_group)

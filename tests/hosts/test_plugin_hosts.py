"""The plugin's door to hosts, ``--elastic-hosts=FILE``.

End to end as a user runs it: a hosts file for two real sshd hosts (``SshdLab``), and
``python -m pytest ... --elastic-hosts=hosts.toml`` in a subprocess whose network namespace
is the lab's client namespace, so that plain ``ssh`` reaches the hosts (nothing else of
the run is told about the lab). The hosts' interpreter is this one with this checkout
first on its path (a shell wrapper), as in ``test_placement_job.py``.

Checked from what the user gets (the JUnit XML, ``--elastic-report``'s summary.json, the
header) and from the hosts (nothing of the run left there, nor here): the bundled
``node_failure`` scenario passes with its nodes on the two hosts; the bundled scenarios a
host cannot run are skipped saying why (a partition; a store on node 0); a marked test's
nodes go to the hosts too, and a fault it asks for that they cannot carry out skips it;
a marker's own ``hosts=None`` keeps its nodes here; a chaos run draws only kinds the
hosts can carry out (the default, kill_worker, among them), goes green, and draws the
same schedule again with the same seed.
The usage errors (a missing file, a bad port, chaos kinds the hosts cannot do) need no
hosts and run anywhere.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator, Sequence
from pathlib import Path

import psutil
import pytest

from harness.sim.resources import CgroupSupport, probe
from harness.sim.storage.mount import fuse_missing
from tests.conftest import unused_plugin_args
from tests.hosts.sshd import SshdLab

#: each run starts a pytest session whose jobs put agents and workers on two hosts of this
#: (loaded, 2-core) machine
pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ROOT / "scenarios"
STEPPER = ROOT / "tests" / "scripts" / "stepper.py"
TRAIN = SCENARIOS / "scripts" / "train.py"
_RUN_TIMEOUT_S = 200

#: a job of two nodes (1:2) with no fault of its own and one restart: chaos kills a worker
#: on its host (the default kind, which hosts carry out)
CHAOS_SCENARIO = f"""
description = "Chaos on hosts: whichever worker the seed kills, the job restarts, finishes and loses no step."

[job]
script = {json.dumps(str(TRAIN))}
args = ["--steps", "40", "--step-time", "0.05", "--ckpt-dir", "{{tmp}}"]
nnodes = "1:2"
nproc_per_node = 1
max_restarts = 1
steps = 40
timeout = 120

[expect]
state = "SUCCEEDED"
no_lost_steps = true
"""

#: marked tests: one whose nodes --elastic-hosts puts on a host, and which then asks for a
#: fault the host cannot carry out; one whose own hosts=None keeps them here
MARKED_TESTS = f"""
import pytest
from harness import WorkerState


@pytest.mark.elastic(nnodes=1, start_method="spawn")
def test_on_a_host_then_a_fault_it_cannot_do(elastic_cluster):
    job = elastic_cluster.launch({str(STEPPER)!r}, "5", "0.01")
    assert job.wait(timeout=90).state == WorkerState.SUCCEEDED
    job.partition(0)  # refused on a host without netns: the test is skipped, saying why


@pytest.mark.elastic(nnodes=1, start_method="spawn", hosts=None)
def test_own_hosts_none_runs_here(elastic_cluster):
    job = elastic_cluster.launch({str(STEPPER)!r}, "3", "0.01")
    assert job.wait(timeout=90).state == WorkerState.SUCCEEDED
"""


def _hosts_file(lab: SshdLab, tmp_path: Path, work: Path, capabilities: Sequence[str] = (),
                name: str = "hosts.toml", shared_dir: Path | None = None, exclusive: bool = True) -> Path:
    """``name`` (hosts.toml) for the lab's two hosts (ports 22 and 2222), relative paths as a
    user writes them; the hosts' work dirs under ``work``; both with ``capabilities``,
    ``exclusive`` and ``shared_dir`` (the lab's hosts share this machine's files; by default
    ``tmp_path``/nfs: a scenario's ``{tmp}``, its checkpoints, is there when its nodes are on
    both hosts)."""
    if shared_dir is None:
        shared_dir = tmp_path / "nfs"
        shared_dir.mkdir(exist_ok=True)
    python = tmp_path / "host-python"
    python.write_text(f"#!/bin/sh\nPYTHONPATH={shlex.quote(str(ROOT))}${{PYTHONPATH:+:$PYTHONPATH}}\n"
                      f"export PYTHONPATH\nexec {shlex.quote(sys.executable)} \"$@\"\n")
    python.chmod(0o755)
    path = tmp_path / name
    path.write_text(f"""
[defaults]
user = "root"
key = "{lab.user_key.name}"
known_hosts = "{lab.known_hosts.name}"
python = {json.dumps(str(python))}
work_dir = {json.dumps(str(work))}
capabilities = {json.dumps(list(capabilities))}
shared_dir = {json.dumps(str(shared_dir))}
exclusive = {json.dumps(exclusive)}

[[host]]
address = "{lab.hosts[0].address}"

[[host]]
address = "{lab.hosts[1].address}"
port = {lab.hosts[1].port}
""")
    return path


@pytest.fixture
def work() -> Iterator[Path]:
    """The hosts' work_dir: a short path (a node's event relay binds a Unix socket below
    it, and a socket's path must fit in 107 bytes, which pytest's tmp_path may not leave),
    right under /tmp: under xdist the test's TMPDIR is already two private dirs deep
    (the controller's and its worker's), too deep to leave room."""
    path = Path(tempfile.mkdtemp(prefix="pe-hw-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def hosts_toml(lab: SshdLab, tmp_path: Path, work: Path) -> Path:
    lab.start(0)
    lab.start(1, port=2222)
    return _hosts_file(lab, tmp_path, work)


def _pytest_on_hosts(lab: SshdLab, tmp_path: Path, work: Path, *args: str,
                     rootdir: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """``python -m pytest ARGS`` with the repository's configuration, run in the lab's
    client namespace (where plain ``ssh`` reaches the hosts); then nothing of it may be
    left on the hosts or here."""
    (out,) = _pytests_on_hosts(lab, tmp_path, work, args, rootdir=rootdir)
    return out


def _pytests_on_hosts(lab: SshdLab, tmp_path: Path, work: Path, *runs: Sequence[str],
                      rootdir: Path = ROOT) -> list[subprocess.CompletedProcess[str]]:
    """``_pytest_on_hosts`` for several sessions at once, side by side: their jobs mostly
    wait (on leases, on the hosts' connections), and one after another a 2-core runner
    sat idle through each wait in turn."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    env.pop("PYTEST_ADDOPTS", None)
    namespace = list(lab.ssh_command[:-1])  # nsenter --net=<the lab's client namespace>
    sessions = []
    for index, args in enumerate(runs):
        outs = [tmp_path / f"session-{index}.{name}" for name in ("out", "err")]
        cmd = [*namespace, sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"),
               "--rootdir", str(rootdir), "-p", "no:cacheprovider", *unused_plugin_args(), *args]
        with outs[0].open("w") as stdout, outs[1].open("w") as stderr:
            sessions.append((cmd, outs, subprocess.Popen(cmd, cwd=tmp_path, env=env, stdin=subprocess.DEVNULL,
                                                        stdout=stdout, stderr=stderr, text=True)))
    deadline = time.monotonic() + _RUN_TIMEOUT_S
    try:
        for _, _, proc in sessions:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    finally:
        for _, _, proc in sessions:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    _assert_nothing_left(lab, tmp_path, work)
    return [subprocess.CompletedProcess(cmd, proc.returncode, outs[0].read_text(), outs[1].read_text())
            for cmd, outs, proc in sessions]


def _assert_nothing_left(lab: SshdLab, tmp_path: Path, work: Path) -> None:
    """No session on either host's sshd, no process here or there (the hosts' processes are
    this machine's) whose command line or environment names this test's dir, the lab's
    sshd listeners aside, and no work dir left under the hosts' ``work_dir`` or job dir in
    their ``shared_dir``."""
    listeners = {host.process.pid for host in lab.hosts.values()}
    mine = {os.getpid(), *(p.pid for p in psutil.Process().parents())}
    needles = (str(tmp_path), str(work))
    deadline = time.monotonic() + 15
    while True:
        sessions = [p for i in lab.hosts for p in lab.remote_processes(i)]
        named = []
        for proc in psutil.process_iter():
            if proc.pid in listeners or proc.pid in mine:
                continue
            try:
                text = " ".join(proc.cmdline()) + " " + " ".join(f"{k}={v}" for k, v in proc.environ().items())
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
            if any(needle in text for needle in needles):
                named.append(proc)
        dirs = sorted(p.name for p in work.iterdir())
        dirs += sorted(p.name for p in (tmp_path / "nfs").glob("*"))  # the jobs' dirs in the shared one
        if not sessions and not named and not dirs:
            return
        if time.monotonic() > deadline:  # an sshd session ends just after its client: allow it that
            pytest.fail(f"left after the run: host sessions {sessions}, processes {named}, work dirs {dirs}")
        time.sleep(0.2)


def _junit(path: Path) -> dict[str, dict[str, object]]:
    """test name -> its outcome ("passed", "skipped", "failed"), skip message and properties."""
    cases = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        skipped = case.find("skipped")
        failed = case.find("failure") is not None or case.find("error") is not None
        outcome = "failed" if failed else "skipped" if skipped is not None else "passed"
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        cases[str(case.get("name"))] = {"outcome": outcome, "message": skipped.get("message") if skipped is not None
                                        else None, "props": props}
    return cases


def _summary_rows(report: Path) -> dict[str, dict[str, object]]:
    rows = json.loads((report / "summary.json").read_text())["results"]
    return {row["test"].rsplit("::", 1)[-1]: row for row in rows}


def test_scenarios_and_marked_tests_run_on_the_hosts(lab, hosts_toml, tmp_path, work):
    """The bundled node_failure scenario passes with node 0 on host 0 and node 1 on host 1;
    the bundled scenarios the hosts cannot run are skipped in one line each; a marked
    test's node goes to host 0, and the fault it then asks for skips it; one whose marker
    says hosts=None runs here. (The bundled network scenarios on hosts that list netns:
    the slow tests below.)"""
    marked = tmp_path / "test_marked.py"
    marked.write_text(MARKED_TESTS)
    report = tmp_path / "report"
    out = _pytest_on_hosts(lab, tmp_path, work, f"--elastic-hosts={hosts_toml.name}", f"--elastic-report={report}",
                           "--junitxml=run.xml", str(SCENARIOS / "multi_node" / "node_failure.toml"),
                           str(SCENARIOS / "network" / "store_partition_shrink_heal_grow.toml"), str(marked))
    assert out.returncode == 0, out.stdout + out.stderr
    labels = [f"root@{lab.hosts[0].address}:22", f"root@{lab.hosts[1].address}:2222"]
    assert f"elastic: nodes on 2 host(s) of hosts.toml: {labels[0]}, {labels[1]}" in out.stdout
    cases = _junit(tmp_path / "run.xml")
    assert {name: case["outcome"] for name, case in cases.items()} == {
        "node_failure": "passed", "store_partition_shrink_heal_grow": "skipped",
        "test_on_a_host_then_a_fault_it_cannot_do": "skipped", "test_own_hosts_none_runs_here": "passed"}
    assert cases["store_partition_shrink_heal_grow"]["message"] == (
        f"the nodes are on hosts, and [[fault]] kind='partition' is refused: host {labels[1]} cannot do it: it "
        "needs netns, which the host's capabilities (none) do not list; add 'netns' to its capabilities (its "
        "hosts or Slurm file's) if the host has it, or place the node elsewhere")
    refused = str(cases["test_on_a_host_then_a_fault_it_cannot_do"]["message"])
    assert refused.startswith("the nodes are on hosts (--elastic-hosts), and fault='Partition(node=0, ")
    assert f"is refused: host {labels[0]} cannot do it: it needs netns" in refused
    rows = _summary_rows(report)  # where each job's nodes ran (their node_start events)
    assert rows["node_failure"]["hosts"] == [{"0": labels[0], "1": labels[1]}]
    assert rows["node_failure"]["outcome"] == "passed" and rows["node_failure"]["faults"] == 1
    assert rows["test_on_a_host_then_a_fault_it_cannot_do"]["hosts"] == [{"0": labels[0]}]
    assert rows["test_own_hosts_none_runs_here"]["hosts"] is None
    assert "--elastic-hosts=hosts.toml" in str(rows["node_failure"]["replay"])


#: the bundled network scenarios (each ~8 s here): every one in the slow run; the default
#: run takes asymmetric_store_partition, beside test_scenarios_and_marked_tests_run_on_the_hosts
_NETWORK_SCENARIOS = ("asymmetric_store_partition", "flapping_link", "packet_loss_during_training",
                      "peer_partition_guarded_by_step_timer", "peer_partition_unguarded",
                      "store_partition_shrink_heal_grow")


@pytest.mark.slow
def test_the_bundled_network_scenarios_run_on_hosts_that_allow_network_faults(lab, tmp_path, work):
    """``pytest scenarios/network/... --elastic-hosts=FILE`` on hosts whose capabilities list
    netns: the partitions (from everyone, from the store one way, from a peer) and the
    packet loss are carried out by nftables on the hosts, the scenarios' expectations hold
    unchanged, and nothing is left on either host after (the hosts' tables included)."""
    lab.start(0)
    lab.start(1, port=2222)
    hosts = _hosts_file(lab, tmp_path, work, capabilities=["netns"])
    out = _pytest_on_hosts(lab, tmp_path, work, f"--elastic-hosts={hosts.name}", "--junitxml=run.xml",
                           *(str(SCENARIOS / "network" / f"{name}.toml") for name in _NETWORK_SCENARIOS))
    cases = _junit(tmp_path / "run.xml")
    assert {name: case["outcome"] for name, case in cases.items()} == dict.fromkeys(_NETWORK_SCENARIOS, "passed"), \
        out.stdout + out.stderr
    _assert_no_table(lab)


@pytest.mark.slow
def test_the_bundled_resource_scenarios_run_on_hosts_that_allow_cgroups(lab, tmp_path, work):
    """``pytest scenarios/resources --elastic-hosts=FILE`` on hosts whose capabilities list
    cgroups: the straggler's CPU quota and the OOM kill are the hosts' cgroups, the
    scenarios' expectations hold unchanged (what a cgroup on a host leaves is
    ``test_host_cgroups``' to check)."""
    if not isinstance(probe(), CgroupSupport):
        pytest.skip(f"needs {probe()}")
    lab.start(0)
    lab.start(1, port=2222)
    hosts = _hosts_file(lab, tmp_path, work, capabilities=["cgroups"])
    out = _pytest_on_hosts(lab, tmp_path, work, f"--elastic-hosts={hosts.name}", "--junitxml=run.xml",
                           str(SCENARIOS / "resources"))
    cases = _junit(tmp_path / "run.xml")
    assert {name: case["outcome"] for name, case in cases.items()} == {"oom": "passed", "straggler": "passed"}, \
        out.stdout + out.stderr


#: the bundled scenarios whose nodes, on two hosts, resume from each other's checkpoints in
#: {shared}, those with an exact (rank, step) exit order (one file in the hosts' shared dir),
#: and store_host_loss (node 0's agent hosts the store on its host; its loss fails the other)
_SHARED_SCENARIOS = {"worker_crash_resume_is_golden": "training", "node_loss_scale_down_is_golden": "training",
                     "scale_up_is_golden": "training", "worker_crash_all_nodes": "multi_node",
                     "worker_crash_resume": "single_node", "restarts_exhausted": "single_node",
                     "store_host_loss": "multi_node"}


@pytest.mark.slow
def test_the_bundled_checkpoint_scenarios_run_on_hosts_that_share_a_filesystem(lab, tmp_path, work):
    """Without a ``shared_dir`` they are skipped on two hosts (one node's checkpoint is not
    the other's; an exit order is not one file); with one the hosts share, they run
    unchanged and pass, the twin included, and the shared dir is left empty."""
    lab.start(0)
    lab.start(1, port=2222)
    shared = tmp_path / "nfs"
    shared.mkdir()
    hosts = _hosts_file(lab, tmp_path, work, shared_dir=shared)
    out = _pytest_on_hosts(lab, tmp_path, work, f"--elastic-hosts={hosts.name}", "--junitxml=run.xml",
                           *(str(SCENARIOS / part / f"{name}.toml") for name, part in _SHARED_SCENARIOS.items()))
    cases = _junit(tmp_path / "run.xml")
    assert {name: case["outcome"] for name, case in cases.items()} == dict.fromkeys(_SHARED_SCENARIOS, "passed"), \
        out.stdout + out.stderr
    assert list(shared.iterdir()) == []


_STORAGE_SCENARIOS = ("dcp_metadata_window_is_safe", "disk_full_during_save_then_healed",
                      "naive_save_lost_on_node_crash", "safe_save_survives_node_crash")


@pytest.mark.slow
def test_the_bundled_storage_scenarios_run_on_fuse_hosts_that_share_a_filesystem(lab, tmp_path, work):
    """``pytest scenarios/storage --elastic-hosts=FILE`` on hosts that list fuse and name one
    ``shared_dir``: the checkpoints' disk full, the unsynced save a node crash takes back,
    the DCP save held at its ``.metadata`` rename, each carried out by the nodes' servers on
    their hosts, the scenarios' expectations unchanged; the shared dir left empty."""
    if fuse_missing() is not None:
        pytest.skip(f"needs FUSE: missing {fuse_missing()}")
    lab.start(0)
    lab.start(1, port=2222)
    shared = tmp_path / "nfs"
    shared.mkdir()
    hosts = _hosts_file(lab, tmp_path, work, capabilities=["fuse"], shared_dir=shared)
    out = _pytest_on_hosts(lab, tmp_path, work, f"--elastic-hosts={hosts.name}", "--junitxml=run.xml",
                           *(str(SCENARIOS / "storage" / f"{name}.toml") for name in _STORAGE_SCENARIOS))
    cases = _junit(tmp_path / "run.xml")
    assert {name: case["outcome"] for name, case in cases.items()} == dict.fromkeys(_STORAGE_SCENARIOS, "passed"), \
        out.stdout + out.stderr
    assert list(shared.iterdir()) == []


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_every_bundled_scenario_runs_on_hosts_that_allow_every_fault(lab, tmp_path, work, monkeypatch):
    """``pytest scenarios --elastic-hosts=FILE`` on two hosts whose capabilities list netns,
    cgroups and fuse and that name one ``shared_dir``: every bundled scenario runs there
    unchanged and passes (none skipped), and no table nor shared dir is left (~5 min here)."""
    if fuse_missing() is not None or not isinstance(probe(), CgroupSupport):
        pytest.skip(f"needs FUSE and cgroups: {fuse_missing() or probe()}")
    monkeypatch.setattr(sys.modules[__name__], "_RUN_TIMEOUT_S", 1400)
    lab.start(0)
    lab.start(1, port=2222)
    shared = tmp_path / "nfs"
    shared.mkdir()
    hosts = _hosts_file(lab, tmp_path, work, capabilities=["netns", "cgroups", "fuse"], shared_dir=shared)
    out = _pytest_on_hosts(lab, tmp_path, work, f"--elastic-hosts={hosts.name}", "--junitxml=run.xml", str(SCENARIOS))
    cases = _junit(tmp_path / "run.xml")
    bundled = {path.stem for path in SCENARIOS.rglob("*.toml")}
    assert {name: case["outcome"] for name, case in cases.items()} == dict.fromkeys(bundled, "passed"), \
        out.stdout[-20000:] + out.stderr
    _assert_no_table(lab)
    assert list(shared.iterdir()) == []


def _assert_no_table(lab: SshdLab) -> None:
    """No nft table of ours (``pe_...``) on either host, asked in its own namespace."""
    for index in (0, 1):
        done = subprocess.run(["nsenter", f"--net={lab.net.namespace_path(index)}", "nft", "list", "tables"],
                              capture_output=True, text=True, check=True)
        assert "pe_" not in done.stdout, done.stdout


@pytest.mark.slow  # the default run: kill_worker on a host (test_placement_job), the header and usage errors
def test_chaos_on_hosts_draws_what_they_can_do(lab, hosts_toml, tmp_path, work):
    """--elastic-chaos with hosts: the kinds drawn are those the hosts can carry out (the
    header says which: the default, kill_worker, is one); the run is green (the worker
    killed on its host, the job restarted, no step lost). (That the same seed draws the
    same schedule on hosts: the slow partition test below, which runs it twice.)"""
    (tmp_path / "scenarios").mkdir()
    (tmp_path / "scenarios" / "chaos_on_hosts.toml").write_text(CHAOS_SCENARIO)
    runs = [[f"--elastic-hosts={hosts_toml.name}", "--elastic-chaos", "--elastic-seed=29", "--junitxml=run1.xml",
             "scenarios/chaos_on_hosts.toml"]]
    for run, out in enumerate(_pytests_on_hosts(lab, tmp_path, work, *runs, rootdir=tmp_path), start=1):
        assert out.returncode == 0, out.stdout + out.stderr
        assert any(line.endswith("; chaos draws kill_worker there") for line in out.stdout.splitlines()), out.stdout
        (case,) = _junit(tmp_path / f"run{run}.xml").values()
        assert case["outcome"] == "passed"
        props = case["props"]
        assert props["elastic_chaos_faults"] == "kill_worker" and props["elastic_seed"] == "29"
        assert props["elastic_replay"] == ("pytest 'scenarios/chaos_on_hosts.toml::chaos_on_hosts' "
                                           "--elastic-hosts=hosts.toml --elastic-chaos --elastic-seed=29")
        (job,) = json.loads(str(props["elastic_schedule"]))
        assert job and {fault["kind"] for fault in job} == {"kill_worker"}
        # it fired on its host (after at most 1 s of a job that trains for 2 s) and the job recovered
        assert props["elastic_faults"] == "; ".join(fault["kind"] for fault in job)
        assert props["elastic_recovered"] == str(len(job))


@pytest.mark.slow
def test_chaos_on_hosts_that_allow_network_faults_draws_partitions_and_replays(lab, tmp_path, work):
    """--elastic-chaos --elastic-faults=partition on two hosts listing netns and cgroups, a
    1:2 job (each node alone on a host): the drawn partition is carried out by the node's
    host's nftables, healed, the job green; the same seed draws the same schedule; no table
    left. The two sessions run side by side on the same hosts, so the file says they are
    not a job's alone (exclusive = false): each partition falls on its node's sockets, never
    on the other session's nodes."""
    lab.start(0)
    lab.start(1, port=2222)
    hosts = _hosts_file(lab, tmp_path, work, capabilities=["netns", "cgroups"], exclusive=False)
    (tmp_path / "scenarios").mkdir()
    (tmp_path / "scenarios" / "chaos_on_hosts.toml").write_text(CHAOS_SCENARIO)
    runs = [[f"--elastic-hosts={hosts.name}", "--elastic-chaos", "--elastic-seed=29", "--elastic-faults=partition",
             f"--junitxml=run{run}.xml", "scenarios/chaos_on_hosts.toml"] for run in (1, 2)]
    schedules = []
    for run, out in enumerate(_pytests_on_hosts(lab, tmp_path, work, *runs, rootdir=tmp_path), start=1):
        assert out.returncode == 0, out.stdout + out.stderr
        (case,) = _junit(tmp_path / f"run{run}.xml").values()
        assert case["outcome"] == "passed", out.stdout + out.stderr
        (job,) = json.loads(str(case["props"]["elastic_schedule"]))
        assert "partition" in {fault["kind"] for fault in job}, job
        assert "partition" in str(case["props"]["elastic_faults"]).split("; "), case["props"]  # it fired
        schedules.append(job)
    assert schedules[1] == schedules[0]
    _assert_no_table(lab)


# -- usage errors: no hosts needed -------------------------------------------------------


def test_a_bad_hosts_file_is_one_usage_error_line(pytester):
    """A missing file and a bad port: one ``ERROR:`` line naming the option, the file, the
    host and the field, exit 4 (usage error), no traceback."""
    result = pytester.runpytest_subprocess("--elastic-hosts=missing.toml", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert result.stderr.lines[0].startswith(
        "ERROR: --elastic-hosts='missing.toml' is not valid: hosts file='missing.toml' cannot be read: No such file")
    pytester.makefile(".toml", hosts='[defaults]\nuser = "ci"\n\n[[host]]\naddress = "10.0.0.5"\n\n'
                                     '[[host]]\naddress = "10.0.0.6"\nport = "x"\n')
    result = pytester.runpytest_subprocess("--elastic-hosts=hosts.toml", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = [line for line in result.stderr.lines if line.strip()]
    assert errors == ["ERROR: --elastic-hosts='hosts.toml' is not valid: port='x' must be an int in [1, 65535] "
                      "(from hosts.toml host[1] 10.0.0.6)"]
    assert "Traceback" not in result.stdout.str() + result.stderr.str()


def test_chaos_kinds_the_hosts_cannot_do_are_a_usage_error(pytester):
    """--elastic-faults naming only kinds no host can carry out: one line saying why; with
    some the hosts can do, the header names those drawn and those left out. Nothing
    connects to a host while pytest configures."""
    pytester.makefile(".toml", hosts='[[host]]\naddress = "10.0.0.5"\nuser = "ci"\n')
    result = pytester.runpytest_subprocess("--elastic-hosts=hosts.toml", "--elastic-chaos",
                                           "--elastic-faults=partition,packet_loss", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --elastic-faults='partition,packet_loss' names no kind the hosts of "
                                 "--elastic-hosts='hosts.toml' can carry out: partition, packet_loss (host "
                                 "ci@10.0.0.5:22 cannot do it: it needs netns, *); name others, or leave "
                                 "--elastic-faults out*"])
    pytester.makefile(".toml", hosts='[[host]]\naddress = "10.0.0.5"\nuser = "ci"\ncapabilities = ["netns"]\n')
    result = pytester.runpytest_subprocess("--elastic-hosts=hosts.toml", "--elastic-chaos", "--elastic-seed=3",
                                           "--elastic-faults=partition,scale,slow_node", "--co", "-p",
                                           "no:cacheprovider")
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED
    result.stdout.fnmatch_lines([
        "elastic: chaos=on seed=3 faults=partition,scale,slow_node * hosts=hosts.toml network=*",
        "elastic: nodes on 1 host(s) of hosts.toml: ci@10.0.0.5:22; chaos draws partition,remove_node,add_node "
        "there (network kinds where each of a job's nodes is alone on its host, which no other job shares, or its "
        "host lists 'cgroups'), not slow_node (host ci@10.0.0.5:22 cannot do it: it needs cgroups, *)"])


def test_chaos_on_hosts_draws_network_kinds_only_where_each_node_is_alone_or_its_host_has_cgroups():
    """A job whose nodes are each alone on a host draws the session's network kinds; one
    whose host would carry two of its nodes leaves them out, saying why (the fault would
    fall on both), unless that host lists cgroups (a fault falls on the node's sockets):
    the rest of its kinds are drawn."""
    from harness.hosts import parse_host
    from harness.sim.places.hosts.refusals import chaos_kinds

    two = [parse_host("ssh://ci@10.0.0.5", capabilities=["netns"]), parse_host("ssh://ci@10.0.0.6",
                                                                              capabilities=["netns"])]
    kinds = ("partition", "packet_loss", "kill_worker")
    assert chaos_kinds(kinds, two, None, 2) == (kinds, {})
    assert chaos_kinds(kinds, two, [1, 0], 2) == (kinds, {})
    drawn, left_out = chaos_kinds(kinds, two, None, 3)
    assert drawn == ("kill_worker",) and set(left_out) == {"partition", "packet_loss"}
    assert left_out["partition"] == ("host ci@10.0.0.5:22 would carry 2 of this job's nodes, and a network fault "
                                     "there falls on each (network kinds where each of a job's nodes is alone on its "
                                     "host, which no other job shares, or its host lists 'cgroups')")
    assert chaos_kinds(kinds, two, [0, 0], 2)[0] == ("kill_worker",)
    sockets = [parse_host("ssh://ci@10.0.0.5", capabilities=["netns", "cgroups"]), two[1]]
    assert chaos_kinds(kinds, sockets, [0, 0], 2) == (kinds, {})
    assert chaos_kinds(kinds, sockets, [1, 1], 2)[0] == ("kill_worker",)


def test_hosts_other_jobs_share_take_only_the_faults_that_fall_on_the_nodes_sockets(pytester):
    """Hosts that are not a job's alone (``exclusive = false``; what pytest -n makes of the
    --elastic-hosts ones, as two of its workers may put jobs on one host at once): a fault
    that falls on the whole host (bandwidth, host_unreachable, a partition where the host
    lists no cgroups) is refused, saying why, and chaos leaves such kinds out; a partition
    where the host lists cgroups falls on the node's sockets, and is kept."""
    from harness.faults import Bandwidth, FaultRefused, Immediately, Partition, ScheduledFault
    from harness.hosts import parse_host
    from harness.sim.faults import fault_class
    from harness.sim.places.hosts.refusals import chaos_kinds, refuse_faults

    def shared(*capabilities: str) -> list:
        return [dataclasses.replace(parse_host(f"ssh://ci@10.0.0.{i}", capabilities=capabilities), exclusive=False)
                for i in (5, 6)]

    def now(fault) -> list[ScheduledFault]:
        return [ScheduledFault(fault, Immediately())]

    refuse_faults(now(Partition(node=1)), shared("netns", "cgroups"), None, 2)
    for fault, hosts, why in [
            (Partition(node=1), shared("netns"), "it needs 'cgroups' in that host's capabilities"),
            (Bandwidth(node=1, rate="1mbit"), shared("netns", "cgroups"), "run it where no other job does"),
            (fault_class("host_unreachable")(node=1), shared("netns", "cgroups"), "run it where no other job does")]:
        with pytest.raises(FaultRefused, match=r"host ci@10.0.0.6:22 is not the job's alone \(exclusive = false: "
                                               r"other jobs run there too, as under pytest -n\), and a \w+ there "
                                               rf"falls on their nodes too: {why}"):
            refuse_faults(now(fault), hosts, None, 2)
    kinds = ("partition", "kill_worker")
    assert chaos_kinds(kinds, shared("netns", "cgroups"), None, 2) == (kinds, {})
    drawn, left_out = chaos_kinds(kinds, shared("netns"), None, 2)
    assert drawn == ("kill_worker",) and "is not the job's alone" in left_out["partition"]
    pytester.makefile(".toml", hosts='[[host]]\naddress = "10.0.0.5"\nuser = "ci"\ncapabilities = ["netns"]\n')
    result = pytester.runpytest_subprocess("--elastic-hosts=hosts.toml", "--elastic-chaos",
                                           "--elastic-faults=partition,kill_worker", "-n", "2", "--co", "-p",
                                           "no:cacheprovider")
    result.stdout.fnmatch_lines(["elastic: nodes on 1 host(s) of hosts.toml: ci@10.0.0.5:22; chaos draws kill_worker "
                                 "there, not partition (host ci@10.0.0.5:22 is not the job's alone *)"])


def test_a_scenario_with_its_own_hosts_fails_on_what_they_cannot_do(pytester):
    """A scenario's own [job] hosts win over --elastic-hosts; a fault they cannot carry
    out, or a [job] setting not done with hosts, then fails it (it asked for what cannot
    be) in one line, before anything connects."""
    pytester.makefile(".toml", hosts='[[host]]\naddress = "10.0.0.9"\nuser = "ci"\n')
    scenarios = pytester.mkdir("scenarios")
    job = ('[job]\nscript = "train.py"\nnnodes = "1:2"\nhosts = ["ssh://ci@10.0.0.5", "ssh://ci@10.0.0.6"]\n')
    (scenarios / "cut.toml").write_text(job + '\n[[fault]]\nkind = "partition"\nnode = 1\n')
    (scenarios / "store.toml").write_text(job + 'args = ["--ckpt-dir", "{tmp}"]\n')
    result = pytester.runpytest_subprocess("--elastic-hosts=hosts.toml", "-p", "no:cacheprovider", "scenarios")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(["*scenario cut: [[][[]fault[]][]] kind='partition' is refused: host ci@10.0.0.6:22 "
                                 "cannot do it: it needs netns*",
                                 "*scenario store: [[]job[]] its args use {tmp}, a dir its nodes share*"],
                                consecutive=False)


def test_a_scenario_whose_nodes_share_shared_across_two_hosts_is_skipped_or_failed():
    """``{shared}`` and ``{tmp}`` are each host's own dir: a scenario whose nodes may be on two hosts and
    checkpoint there is skipped under ``--elastic-hosts`` (its resume hung on the mismatch:
    ``worker_crash_resume_is_golden`` ran to its timeout, 121 s), failed where it names its
    own hosts; one whose nodes all land on one host, that does not use it, or whose hosts
    name one ``shared_dir``, runs."""
    from harness.hosts import parse_host
    from pytest_elastic._scenarios import ScenarioFailure, _skip_on_hosts

    two = [parse_host("ssh://ci@10.0.0.5"), parse_host("ssh://ci@10.0.0.6")]
    args = ["--ckpt-dir", "{shared}/ckpt"]
    skipped = r"^the nodes are on hosts, and \[job\] its args use "
    with pytest.raises(pytest.skip.Exception, match=skipped + r"\{shared\}, a dir its nodes share .*own dir"):
        _skip_on_hosts({"hosts": two, "nnodes": 2}, [], from_option=True, args=args)
    with pytest.raises(ScenarioFailure, match=r"^\[job\] its args use \{shared\}"):
        _skip_on_hosts({"hosts": two, "nnodes": "1:2"}, [], from_option=False, args=args)
    assert _skip_on_hosts({"hosts": two, "nnodes": 1}, [], from_option=True, args=args) == tuple(two)
    assert _skip_on_hosts({"hosts": two, "nnodes": 2, "placement": [0, 0]}, [], from_option=True, args=args)
    with pytest.raises(pytest.skip.Exception, match=skipped + r"\{tmp\}, a dir"):
        _skip_on_hosts({"hosts": two, "nnodes": 2}, [], from_option=True, args=["--ckpt-dir", "{tmp}"])
    # every reason at once: a user who fixes the first must not find the next only then
    with pytest.raises(pytest.skip.Exception) as caught:
        _skip_on_hosts({"hosts": two, "nnodes": 2}, [{"kind": "partition", "node": 1}], from_option=True,
                       args=["--ckpt-dir", "{tmp}", "--out", "{shared}"])
    reasons = str(caught.value).split("; ")
    assert reasons[0] == ("the nodes are on hosts, and [job] its args use {shared} and {tmp}, a dir its nodes "
                          "share (checkpoints), which is each host's own dir there: name one the hosts share "
                          "(shared_dir in the hosts or Slurm file)")
    assert reasons[1].startswith("[[fault]] kind='partition' is refused: host ci@10.0.0.6:22 cannot do it: it "
                                 "needs netns")
    sharing = [parse_host(spec.url, shared_dir="/nfs") for spec in two]  # they name one they share: it runs
    assert _skip_on_hosts({"hosts": sharing, "nnodes": 2}, [], from_option=True, args=args) == tuple(sharing)

"""``pytest --elastic-slurm=FILE``: bundled scenarios whose nodes run in an allocation of the
real Slurm lab, each node's agent a job step. A scenario the nodes can run passes there (a
node killed on its Slurm node); one that needs what the Slurm file does not list is
skipped saying why; the header names the allocation; nothing is left in the lab's queue."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import unused_plugin_args
from tests.hosts.sshd import checkout_python
from tests.slurm.lab import SlurmLab

ROOT = Path(__file__).resolve().parents[2]
#: a pytest session of its own, without the plugins no session of ours uses
PYTEST = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *unused_plugin_args()]


def _slurm_file(slurm_lab: SlurmLab, tmp_path: Path) -> Path:
    """The lab as a user's Slurm file: its controller's side, config, clients, the nodes'
    interpreter (this checkout's) and a dir they all share."""
    python = checkout_python(tmp_path / "node-python")
    shared = tmp_path / "shared"
    shared.mkdir()
    prefix = ", ".join(f'"{part}"' for part in slurm_lab.command())
    slurm_file = tmp_path / "slurm.toml"
    slurm_file.write_text(f'[slurm]\ncontroller_address = "{slurm_lab.controller_address}"\n'
                          f'controller_netns = "/run/netns/{slurm_lab.net.store_namespace}"\n'
                          f'slurm_conf = "{slurm_lab.conf}"\nclient_prefix = [{prefix}]\n'
                          f'python = "{python}"\nshared_dir = "{shared}"\nwork_dir = "{slurm_lab.work_dir}"\n')
    return slurm_file


def test_bundled_scenarios_run_in_a_slurm_allocation(slurm_lab: SlurmLab, tmp_path):
    slurm_file = _slurm_file(slurm_lab, tmp_path)
    scenarios = ["scenarios/multi_node/node_failure.toml", "scenarios/network/flapping_link.toml",
                 "scenarios/multi_node/shrink_to_minimum_and_grow_32_nodes.toml"]
    done = subprocess.run([*PYTEST, "-rs",
                           f"--elastic-slurm={slurm_file}", *scenarios], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert "1 passed, 2 skipped" in out, out[-3000:]
    assert "the nodes are on hosts, and [[fault]] kind='partition' is refused" in out and "needs netns" in out
    assert (f"Slurm: the job needs 32 node(s) (one per node, up to nnodes' most) and partition 'lab' has "
            f"{slurm_lab.nnodes}: set nodes = {slurm_lab.nnodes}") in out, out[-3000:]
    assert f"elastic: nodes in a Slurm allocation ({slurm_file})" in out
    assert slurm_lab.run("squeue", "--noheader", "--format=%i").stdout.split() == []


@pytest.mark.slow
def test_chaos_on_slurm_replays_with_its_seed(slurm_lab: SlurmLab, tmp_path):
    """The same seed on Slurm draws the same schedule, and a run with it passes each time
    (the rerun line names the Slurm file: tests/unit/test_slurm_spec.py)."""
    slurm_file = _slurm_file(slurm_lab, tmp_path)
    import xml.etree.ElementTree as ElementTree

    runs = []
    for i in range(2):
        junit = tmp_path / f"run{i}.xml"
        done = subprocess.run([*PYTEST, f"--junitxml={junit}",
                               f"--elastic-slurm={slurm_file}", "--elastic-chaos", "--elastic-seed=4242",
                               "--elastic-faults=kill_worker", "scenarios/single_node/worker_sigkill.toml"],
                              cwd=ROOT, capture_output=True, text=True, timeout=300)
        out = done.stdout + done.stderr
        assert done.returncode == 0, out[-3000:]
        properties = {p.get("name"): p.get("value") for p in ElementTree.parse(junit).iter("property")}
        runs.append(properties.get("elastic_schedule"))
    assert runs[0] and runs[0] == runs[1], runs
    assert "kill_worker" in runs[0], runs[0]
    assert slurm_lab.run("squeue", "--noheader", "--format=%i").stdout.split() == []


@pytest.mark.slow
@pytest.mark.timeout(900)  # the bundled scenarios one after another: about 2 minutes here
def test_every_bundled_scenario_passes_in_a_slurm_allocation_or_says_why_not(slurm_lab: SlurmLab, tmp_path):
    """``pytest scenarios --elastic-slurm=FILE`` as a user runs it on a staging partition whose
    nodes list no capabilities: every scenario the nodes can run passes, the others are
    skipped each with its reasons (network, resource and disk faults need capabilities
    the file does not list), and nothing is left in the queue."""
    import xml.etree.ElementTree as ElementTree

    slurm_file = _slurm_file(slurm_lab, tmp_path)
    junit = tmp_path / "run.xml"
    done = subprocess.run([*PYTEST, f"--junitxml={junit}",
                           f"--elastic-slurm={slurm_file}", "scenarios"], cwd=ROOT, capture_output=True, text=True,
                          timeout=900)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-5000:]
    cases = list(ElementTree.parse(junit).iter("testcase"))
    skipped = {case.get("name"): case.find("skipped").get("message", "") for case in cases
               if case.find("skipped") is not None}
    failed = [case.get("name") for case in cases if case.find("failure") is not None or case.find("error") is not None]
    assert failed == [] and len(cases) >= 30, out[-5000:]
    assert len(cases) - len(skipped) >= 15, skipped
    assert all(why.strip() for why in skipped.values()), skipped
    assert slurm_lab.run("squeue", "--noheader", "--format=%i").stdout.split() == []


@pytest.mark.slow  # run by CI's Slurm step: the default run is at its budget
def test_chaos_on_slurm_draws_the_schedulers_own_faults_where_the_file_lets_it(slurm_lab: SlurmLab, tmp_path):
    """Without ``slurm_admin`` in the Slurm file, chaos on Slurm leaves ``down_node`` and
    ``drain_node`` out, and the run says why; with it, chaos draws each (the header says so)
    and the job survives it; every node is back in service after."""
    import xml.etree.ElementTree as ElementTree

    slurm_file = _slurm_file(slurm_lab, tmp_path)
    (tmp_path / "scenarios").mkdir()
    scenario = tmp_path / "scenarios" / "two_nodes.toml"  # a scenario file is one under a scenarios dir
    scenario.write_text(f'description = "Two nodes train; chaos does the rest."\n\n[job]\n'
                        f'script = "{ROOT / "scenarios" / "scripts" / "train.py"}"\n'
                        'args = ["--steps", "60", "--step-time", "0.05", "--ckpt-dir", "{tmp}"]\n'
                        'nnodes = "1:2"\nnproc_per_node = 1\nmax_restarts = 1\nsteps = 60\ntimeout = 120\n\n'
                        '[expect]\nstate = "SUCCEEDED"\n')
    command = [*PYTEST, f"--rootdir={tmp_path}", "--elastic-chaos",
               "--elastic-seed=4", "scenarios/two_nodes.toml"]
    left = subprocess.run([*command, "--elastic-faults=down_node,drain_node", f"--elastic-slurm={slurm_file}"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert left.returncode != 0 and "names no kind the hosts of --elastic-slurm" in left.stdout + left.stderr
    assert "it needs slurm_admin" in left.stdout + left.stderr
    slurm_file.write_text(slurm_file.read_text() + 'capabilities = ["slurm_admin"]\n')
    for kind in ("down_node", "drain_node"):
        junit = tmp_path / f"{kind}.xml"
        done = subprocess.run([*command, f"--elastic-faults={kind}", f"--elastic-slurm={slurm_file}",
                               f"--junitxml={junit}"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
        out = done.stdout + done.stderr
        assert done.returncode == 0, out[-3000:]
        assert f"chaos draws {kind} there" in out, out[-3000:]
        properties = {p.get("name"): p.get("value") for p in ElementTree.parse(junit).iter("property")}
        assert f'"kind":"{kind}"' in properties["elastic_schedule"], properties
    assert slurm_lab.run("squeue", "--noheader", "--format=%i").stdout.split() == []
    slurm_lab.wait_idle(timeout=10)  # every node back in service (a released node passes through comp)

"""The runtime's public face is pinned: what the simulation (and users) may import from it.

Adding or removing a name here is a decision; the layer test makes sure the simulation
uses nothing else.
"""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

PINNED = {
    "harness.run": {  # torchrun's home of main, LaunchConfig, elastic_launch, launch_agent
        "LaunchConfig", "NnodesFormatError", "cli", "configure_logging", "config_from_args",
        "determine_local_world_size",
        "elastic_launch", "get_args_parser", "launch_agent", "main", "parse_args",
        "parse_min_max_nnodes", "run_script_path", "run_with_signal_handlers",
    },
    "harness.launch": {"LaunchConfig", "elastic_launch", "launch_agent", "build_agent", "run_agent"},
    "harness.endpoints": {"PortReservation", "fqdn", "split_endpoint"},
    "harness.selfpipe": {"close_pipe", "drain_pipe", "self_pipe", "wake_pipe"},
    "harness.timer_env": {"ENABLE_FILE_TIMER_ENV", "TIMER_FILE_ENV"},
    "harness.procs": {
        "OOM_REASON", "STACKS_ENV", "START_METHODS", "WORKER_CGROUP_ENV", "WORKER_NICE_ENV", "ZYGOTE_ENV",
        "LogsSpecs", "ProcessContext",
        "RunProcsResult", "Std", "ZygoteError", "ZygoteServerProcess", "cgroup_dirs", "cgroup_mounts",
        "die_with_parent", "frozen_imports",
        "is_same_process", "join_netns", "process_start_time", "process_state", "remove_dead_owned", "render_prefix",
        "run_ahead", "same_netns", "set_pdeathsig", "share_imports", "signal_process_group",
    },
    "harness.events": {"EVENTS_ENV", "NODE_ENV", "WAKE_ENV", "EventWriter", "NullEventWriter",
                       "event_writer_from_env", "node_key"},
}


@pytest.mark.parametrize("module", sorted(PINNED))
def test_exported_names_are_pinned(module):
    mod = importlib.import_module(module)
    assert set(mod.__all__) == PINNED[module]
    for name in mod.__all__:
        assert hasattr(mod, name), f"{module}.__all__ lists {name} but it is missing"


def test_harness_net_is_a_deprecated_alias_of_harness_endpoints(monkeypatch):
    """``harness.net`` was renamed (it read as part of ``harness.sim.net``); the README named
    it, so the old path still works, says it is deprecated, and gives the same objects."""
    import harness.endpoints

    monkeypatch.delitem(sys.modules, "harness.net", raising=False)
    with pytest.warns(DeprecationWarning, match="harness.endpoints"):
        net = importlib.import_module("harness.net")
    assert set(net.__all__) == set(harness.endpoints.__all__)
    for name in net.__all__:
        assert getattr(net, name) is getattr(harness.endpoints, name)


def test_run_reexports_the_launcher_objects_themselves():
    import harness.launch
    import harness.run

    for name in ("LaunchConfig", "elastic_launch", "launch_agent"):
        assert getattr(harness.run, name) is getattr(harness.launch, name)


def test_importing_the_runtime_loads_neither_torch_nor_the_simulation():
    code = ("import sys, harness.run, harness.procs, harness.endpoints, harness.launch; "
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('harness.sim')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_errors_a_fault_ends_in_are_public_beside_the_faults():
    import harness.faults
    from harness.sim.faults.scheduler import FaultError, TargetNotReady

    assert harness.faults.FaultError is FaultError and harness.faults.TargetNotReady is TargetNotReady
    assert {"FaultError", "TargetNotReady", "NodeKill", "AtStep"} <= set(harness.faults.__all__)


def test_the_top_level_names_are_pinned_and_resolve():
    import harness

    assert set(harness.__all__) == {
        "Cluster", "ClusterConfig", "ClusterLeakError", "ConfigError", "ElasticError", "InvariantViolation", "Job",
        "JobResult", "RunResult", "Timeline", "WarmPool", "WorkerState", "report_checkpoint", "report_step"}
    for name in harness.__all__:
        assert getattr(harness, name) is not None
    assert set(harness.__all__) <= set(dir(harness))


def test_every_error_raised_on_purpose_has_one_root():
    import harness
    from harness.sim.faults.scheduler import FaultError, TargetNotReady
    from pytest_elastic._settings import SettingError

    for error in (harness.ConfigError, harness.ClusterLeakError, harness.InvariantViolation, FaultError,
                  TargetNotReady, SettingError):
        assert issubclass(error, harness.ElasticError), error


def test_the_simulations_errors_live_in_one_leaf_and_stay_where_they_were():
    """``harness.sim.errors`` holds them all; each is still importable where it was defined
    before (the same class), and ``harness``/``harness.faults`` hand on the same objects."""
    import harness
    import harness.faults
    import harness.sim.errors as errors
    from harness.sim import cluster, net
    from harness.sim.faults import scheduler
    from harness.sim.net import network
    from harness.sim.places.hosts import refusals as host_refusals
    from harness.sim.truth import hangs, invariants, twin

    homes = {cluster: ["ClusterLeakError"], invariants: ["InvariantViolation"], hangs: ["JobHung"],
             scheduler: ["FaultError", "FaultNotFired", "TargetNotReady"], twin: ["TwinError"],
             network: ["NetworkError", "NetworkUnavailable"], net: ["NetworkError", "NetworkUnavailable"],
             host_refusals: ["FaultRefused"],
             harness.faults: ["FaultError", "FaultNotFired", "TargetNotReady", "FaultRefused"],
             harness: ["ClusterLeakError", "InvariantViolation"]}
    assert sorted({name for names in homes.values() for name in names}) == sorted(errors.__all__)
    for module, names in homes.items():
        for name in names:
            assert getattr(module, name) is getattr(errors, name), f"{module.__name__}.{name}"


def test_the_faults_package_exports_what_the_faults_module_did():
    """``harness.sim.faults`` became a package; its face exports its ``data`` module's names,
    and hands on any other (a class made from a row, an old class name)."""
    from harness.sim import faults
    from harness.sim.faults import data

    assert faults.__all__ == data.__all__
    assert all(getattr(faults, name) is getattr(data, name) for name in data.__all__)
    assert faults.PUBLIC is data.PUBLIC and faults.WorkerState is data.WorkerState

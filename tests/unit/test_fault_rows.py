"""The fault row is the whole truth about a kind (``harness.sim.schema.FaultKind``): the
scenario skips, the report's kind sets, the invariants and chaos derive from the rows, one
``Fault.apply`` hands every kind to its part, registration is explicit, and every fault is
recorded under its kind's name (an older run's retired names are read as today's).

The last test adds a fake kind from a module written to ``tmp_path`` and proves, editing no
file of the project, that it is scheduled, applied, recorded, skipped and reported: a new
kind on an existing part is its row, the part's method, a test and a scenario."""

from __future__ import annotations

import dataclasses
import importlib
import json
import subprocess
import sys
import textwrap

import pytest
import tomllib

from harness.errors import ConfigError
from harness.sim import faults, schema
from harness.sim.truth import invariants
from harness.sim.truth.timeline import Timeline
from pytest_elastic import _scenarios
from pytest_elastic.report import model

# -- the kind sets, derived: the same kinds each module listed by hand before -----------------


def _kinds(test) -> set[str]:
    return set(schema.kinds_where(test))


#: the kinds there were when the sets below were written by hand (a kind added since is in
#: them or not by its row alone: docs/architecture.md's recipe edits no test's list)
_HAND_WRITTEN_KINDS = frozenset({
    "kill_worker", "hang_worker", "kill_agent", "kill_node", "remove_node", "add_node", "freeze_node",
    "kill_store_host", "partition", "heal", "packet_loss", "bandwidth", "link_down", "slow_node",
    "memory_limit", "disk_full", "slow_io", "io_error"})


def _then(kinds: object) -> set[str]:
    return set(kinds) & _HAND_WRITTEN_KINDS  # type: ignore[call-overload]


def test_the_derived_kind_sets_are_the_ones_once_written_by_hand():
    assert _HAND_WRITTEN_KINDS <= set(schema.FAULT_KINDS)
    assert _then(model.LASTING_FAULTS) == {"partition", "packet_loss", "bandwidth", "link_down", "freeze_node",
                                         "hang_worker", "slow_node", "memory_limit", "disk_full", "slow_io",
                                         "io_error"}
    assert _then(model.KILL_FAULTS) == {"kill_node", "kill_agent"}
    assert _then(model.LEAVE_FAULTS) == {"remove_node"}
    assert _then(invariants._AGENT_LOSING_FAULTS) == {"kill_agent", "kill_node", "freeze_node", "kill_store_host"}
    assert _then(invariants._WORKER_FAILURES) == {"kill_worker"}
    assert _then(_kinds(lambda row: schema.NETNS in row.needs)) == {"partition", "packet_loss", "bandwidth",
                                                                    "link_down"}
    assert _then(_kinds(lambda row: schema.CGROUPS in row.needs)) == {"slow_node", "memory_limit"}
    assert _then(_kinds(lambda row: schema.FUSE in row.needs)) == {"disk_full", "slow_io", "io_error"}
    # the classes' old ``is_failure``: a failure uses a restart, a membership change none
    assert _then(_kinds(lambda row: row.failure)) == {"kill_worker", "hang_worker", "memory_limit", "disk_full",
                                                      "io_error"}
    assert _kinds(lambda row: row.heal_after is not None) <= _kinds(lambda row: row.lasts == schema.UNTIL_HEALED)


def test_a_kind_set_knows_an_older_runs_names_and_is_live():
    assert "node_kill" in model.KILL_FAULTS and "node_leave" in model.LEAVE_FAULTS
    assert "worker_exit_order" in invariants._WORKER_FAILURES and "store_host_loss" in invariants._AGENT_LOSING_FAULTS
    assert "meteor" not in model.KILL_FAULTS and 3 not in model.KILL_FAULTS
    assert "kill_node" in repr(model.KILL_FAULTS)


@pytest.mark.parametrize("spec, needs", [
    ({"kind": "partition"}, {schema.NETNS}),
    ({"kind": "slow_node"}, {schema.CGROUPS}),
    ({"kind": "disk_full"}, {schema.FUSE}),
    ({"kind": "kill_node"}, set()),
    ({"kind": "kill_node", "lose_unsynced": True}, {schema.FUSE}),
    ({"kind": "kill_node", "torn": True}, {schema.FUSE}),
    ({"kind": "kill_worker", "on_file": "*.pt"}, {schema.FUSE}),
    ({"kind": "heal"}, set()),
])
def test_what_a_spec_needs_comes_from_its_row_and_keys(spec, needs):
    assert schema.needs_of(spec) == needs
    assert _scenarios._needs_fuse(spec) == (schema.FUSE in needs)


@pytest.mark.parametrize("kinds, wants", [
    (["heal"], True),  # a heal alone can only be for links
    (["slow_node", "heal"], False),  # ... with a resource fault it may be for that alone
    (["disk_full", "heal"], False),
    (["packet_loss"], True),
    (["kill_worker"], False),
])
def test_the_netns_skip_follows_the_rows(monkeypatch, kinds, wants):
    monkeypatch.setattr("harness.sim.net.netns_missing", lambda: ["not root"])
    faults_ = [{"kind": kind} for kind in kinds]
    if wants:
        with pytest.raises(pytest.skip.Exception, match="needs network namespaces: not root"):
            _scenarios._skip_without_netns({}, faults_)
    else:
        _scenarios._skip_without_netns({}, faults_)
    _scenarios._skip_without_netns({"network": "loopback"}, faults_)  # never for loopback


def test_a_scenario_whose_fault_acts_on_a_host_is_skipped_with_its_nodes_here():
    """``host_unreachable`` (a ``hosts_only`` row) has no connection to lose on this machine:
    the scenario is skipped in one line naming it; other kinds are not."""
    with pytest.raises(pytest.skip.Exception) as info:
        _scenarios._skip_without_hosts([{"kind": "kill_worker"}, {"kind": "host_unreachable", "node": 1}])
    assert str(info.value) == ("needs the nodes on hosts (--elastic-hosts): host_unreachable acts on a node's "
                               "host, and a node on this machine has no connection to lose")
    _scenarios._skip_without_hosts([{"kind": "partition"}, {"kind": "no_such_kind"}])
    assert [k for k, row in schema.FAULT_KINDS.items() if row.hosts_only] == [
        "host_unreachable", "down_node", "drain_node", "kill_slurmd"]


def test_a_scenario_with_the_schedulers_own_fault_says_it_needs_slurm_here_and_on_ssh_hosts():
    """The scheduler's own kinds (``slurm_only`` rows) are Slurm's: here the scenario is
    skipped saying it needs an allocation; on SSH hosts the fault is refused saying why; on
    the nodes of a Slurm allocation it is done where the Slurm file lists ``slurm_admin``
    (and, for ``kill_slurmd``, gives the commands for the node's slurmd)."""
    from harness.hosts import HostSpec
    from harness.sim.errors import FaultRefused
    from harness.sim.faults import Immediately, ScheduledFault, fault_class
    from harness.sim.places.hosts.refusals import refuse_faults

    with pytest.raises(pytest.skip.Exception) as info:
        _scenarios._skip_without_hosts([{"kind": "down_node", "node": 1}])
    assert str(info.value) == ("needs the nodes in a Slurm allocation (--elastic-slurm): down_node is the "
                               "scheduler's own, and a node on this machine has no scheduler")
    assert [k for k, row in schema.FAULT_KINDS.items() if row.slurm_only] == ["down_node", "drain_node", "kill_slurmd"]
    ssh = [HostSpec(address="198.18.0.1", user="root", capabilities=frozenset({"slurm_admin"})),
           HostSpec(address="198.18.0.2", user="root", capabilities=frozenset({"slurm_admin"}))]

    def entry(kind: str) -> list[ScheduledFault]:
        return [ScheduledFault(fault_class(kind)(node=1), Immediately())]

    for kind in ("down_node", "drain_node", "kill_slurmd"):
        with pytest.raises(FaultRefused, match=f"{kind} needs the nodes in a Slurm allocation"):
            refuse_faults(entry(kind), ssh, None, 2)

    def slurm_nodes(*capabilities: str) -> list[HostSpec]:
        return [HostSpec(address=f"198.18.0.{i}", user="root", name=f"node{i}", scheduler="slurm",
                         capabilities=frozenset(capabilities)) for i in (1, 2)]

    with pytest.raises(FaultRefused, match="host node2 cannot do it: it needs slurm_admin, which the host.s"):
        refuse_faults(entry("drain_node"), slurm_nodes(), None, 2)
    with pytest.raises(FaultRefused, match="node node2 cannot do it: kill_slurmd needs slurmd_kill and slurmd_start"):
        refuse_faults(entry("kill_slurmd"), slurm_nodes("slurm_admin"), None, 2)
    for kind in ("down_node", "drain_node", "kill_slurmd"):
        refuse_faults(entry(kind), slurm_nodes("slurm_admin", "slurmd"), None, 2)


# -- one apply, explicit registration ----------------------------------------------------------


class _Part:
    def __init__(self, calls: list, name: str):
        self._calls, self._name = calls, name

    def __getattr__(self, method: str):
        return lambda **fields: self._calls.append((self._name, method, fields))


@pytest.mark.parametrize("kind", [k for k, row in schema.FAULT_KINDS.items() if row.part])
def test_apply_hands_every_field_to_the_part_the_row_names(kind):
    row = schema.FAULT_KINDS[kind]
    calls: list = []
    parts = ("processes", "network", "storage", "resources", "slurm")
    job = type("Job", (), {part: _Part(calls, part) for part in parts})()
    fault = faults.fault_class(kind)()
    fault.apply(job)
    assert calls == [(row.part, kind, {p.name: getattr(fault, p.name) for p in row.params})]


def test_register_refuses_a_class_that_disagrees_with_its_row():
    row = schema.FaultKind("poke_worker", "WorkerPoke", (schema.NODE,), "a worker is poked", part="processes")

    @dataclasses.dataclass(frozen=True)
    class WorkerPoke(faults.Fault):
        kind = "poke_worker"
        node: int = 1  # the row says 0

    with pytest.raises(ConfigError, match=r"must have the row's params, same order and defaults"):
        faults.register(row, WorkerPoke)
    with pytest.raises(ConfigError, match="must be the row's class 'WorkerPoke'"):
        faults.register(row, faults.WorkerKill)
    with pytest.raises(ConfigError, match="is registered already, as WorkerKill"):
        faults.register(dataclasses.replace(schema.FAULT_KINDS["kill_worker"], doc="another"))
    headless = dataclasses.replace(row, part=None)
    with pytest.raises(ConfigError, match="needs an apply of WorkerPoke's own"):
        faults.register(headless)
    assert "poke_worker" not in schema.FAULT_KINDS
    assert faults.register(schema.FAULT_KINDS["heal"], faults.Heal) is faults.Heal  # the same pair again: nothing


@pytest.mark.parametrize("fields, message", [
    ({"chaos": "poke"}, "must be None or the kind's own name"),
    ({"lasts": "forever"}, "must be None, 'healed' or 'end'"),
    ({"heal_after": (1.0, 2.0)}, "needs lasts='healed'"),
    ({"worker_failure": True}, "needs failure=True"),
    ({"needs": ("gpu",)}, "names ['gpu']; each must be one of netns, fuse, cgroups"),
])
def test_a_row_that_contradicts_itself_fails_where_it_is_written(fields, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("[", r"\[")):
        schema.FaultKind("poke_worker", "WorkerPoke", (), "a worker is poked", part="processes", **fields)


# -- names: recorded under the kind, older names read as today's ---------------------------------


def test_every_retired_name_reads_as_a_kind():
    assert set(schema.RENAMED_EVENTS.values()) <= set(schema.FAULT_KINDS)
    assert schema.event_kind("worker_kill") == "kill_worker" and schema.event_kind("partition") == "partition"
    event = {"kind": "fault", "fault": "kill_worker"}
    assert schema.modern_event(event) is event  # today's: no copy
    old = {"kind": "state", "cause": "node_leave", "state": "SUCCEEDED"}
    assert schema.modern_event(old) == {**old, "cause": "remove_node"} and old["cause"] == "node_leave"


def test_the_process_part_records_no_retired_name():
    """Each process fault records its event (and tells the ledger) under its kind's name."""
    source = (faults.__file__.rsplit("/", 2)[0] + "/nodes/faults.py")
    with open(source) as fp:
        text = fp.read()
    assert not [old for old in schema.RENAMED_EVENTS if f'"{old}"' in text]


def test_a_timeline_of_an_older_run_names_its_faults_by_kind(tmp_path):
    path = tmp_path / "events.jsonl"
    old = [{"kind": "fault", "fault": "worker_kill", "node": "harness", "mono": 1.0, "target_node": 0},
           {"kind": "fault", "fault": "worker_exit_order", "node": 0, "mono": 2.0, "exit_code": 3},
           {"kind": "node_exit", "cause": "node_kill", "node": "harness", "mono": 3.0, "target_node": 1},
           {"kind": "state", "cause": "node_freeze", "source": "harness", "state": "FAILED", "node": 1, "mono": 4.0}]
    path.write_text("".join(json.dumps(e) + "\n" for e in old))
    timeline = Timeline(str(path))
    assert [f["fault"] for f in timeline.faults()] == ["kill_worker", "kill_worker"]
    assert [e["cause"] for e in timeline.events("node_exit") + timeline.events("state")] == ["kill_node",
                                                                                              "freeze_node"]
    timeline.close()


# -- a kind added from another module, no file of the project edited ------------------------------

#: what an in-tree kind's row (harness/sim/schema.py) and its part's method
#: (harness/sim/nodes/faults.py) would hold; here one module outside the project
FAKE_KIND = '''
"""A fault kind from outside the harness: a worker gets SIGTERM (a plain worker failure)."""
import os
import signal

from harness.sim import faults, schema
from harness.sim.faults.target import record_fault

ROW = schema.FaultKind(
    "term_worker", "WorkerTerm", (schema.NODE, schema.LOCAL_RANK), "a worker is sent SIGTERM",
    part="processes", chaos="term_worker", failure=True, worker_failure=True,
    needs=(schema.NETNS, schema.FUSE, schema.CGROUPS))  # needs all three: each skip is seen
WorkerTerm = faults.register(ROW)  # no class written out: one is made from the row


def term_worker(self, node, local_rank):
    """The part's mechanism (a method of ``ProcessFaults``, as in-tree)."""
    pid = self._worker_pid(node, local_rank)
    record_fault(self._target, "term_worker", target_node=node, local_rank=local_rank)
    os.kill(pid, signal.SIGTERM)
'''

SCENARIO = '''
description = "A worker gets SIGTERM at step 3; the job restarts it."
[job]
script = "scripts/train.py"
nproc_per_node = 2
[[fault]]
kind = "term_worker"
local_rank = 1
at_step = 3
[expect]
state = "SUCCEEDED"
restarts = 1
'''


class _StandInJob:
    """The job as ``ProcessFaults`` and the scheduler see it (a ``FaultTarget``): one node
    whose only worker is a real ``sleep``; the events go to a real file, timeline and bus."""

    def __init__(self, directory: str, worker_pid: int):
        from harness.events import EventWriter
        from harness.sim.bus import EventBus
        from harness.sim.config import ClusterConfig
        from harness.sim.nodes.faults import LocalOrders, ProcessFaults

        self.run_id = "fake"
        self.events_path = f"{directory}/events.jsonl"
        self.timeline = Timeline(self.events_path)
        self.bus = EventBus(self.timeline, directory)
        self.harness_events = EventWriter(self.events_path, "harness", self.run_id, self.bus.wake_path)
        self.cluster = type("Cluster", (), {"config": ClusterConfig(nproc_per_node=1)})()
        self.nodes = {0: object()}
        self._worker_pid = worker_pid
        self.scheduler = None
        self.processes = ProcessFaults(self, LocalOrders(directory))

    def node(self, node: int) -> object:
        if node not in self.nodes:
            raise ConfigError("node", node, "is no node of this job")
        return self.nodes[node]

    def worker_pids(self, node: int) -> dict[int, int]:
        return {0: self._worker_pid}

    def record(self, event: str, **fields) -> None:
        assert self.scheduler is not None
        with self.scheduler.recording():
            self.harness_events.emit(event, **fields)


@pytest.fixture
def fake_kind(tmp_path, monkeypatch):
    """The fake kind's module imported from ``tmp_path``, its mechanism put on the part;
    unregistered afterwards, so no other test sees it."""
    from harness.sim.nodes.faults import ProcessFaults

    (tmp_path / "fake_fault_kind.py").write_text(textwrap.dedent(FAKE_KIND))
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("fake_fault_kind")
    monkeypatch.setattr(ProcessFaults, "term_worker", module.term_worker, raising=False)
    try:
        yield module
    finally:
        faults.unregister("term_worker")
        sys.modules.pop("fake_fault_kind", None)


def test_a_kind_added_from_another_module_is_scheduled_applied_recorded_skipped_and_reported(fake_kind, tmp_path,
                                                                                              monkeypatch):
    from harness.sim.faults import ScheduledFault, from_spec, to_spec
    from harness.sim.faults.chaos import generate_schedule, parse_fault_kinds
    from harness.sim.faults.scheduler import FaultScheduler
    from harness.sim.truth.invariants import JobFacts, check_timeline
    from pytest_elastic import _settings
    from pytest_elastic.report.index import index_rows

    # scheduled: a spec, a scenario file, --elastic-schedule, --elastic-faults and chaos know it
    spec = {"kind": "term_worker", "local_rank": 1, "at_step": 3}
    entry = from_spec(spec)
    assert type(entry.fault) is fake_kind.WorkerTerm is faults.WorkerTerm and to_spec(entry) == spec
    assert schema.check_scenario(tomllib.loads(SCENARIO)) == []
    assert _settings.parse_schedule(json.dumps([[spec]])) == [[spec]]
    assert "term_worker" in _settings.FAULT_KINDS and "term_worker" in _settings.SCHEDULE_FAULT_KINDS
    assert parse_fault_kinds("term_worker") == ("term_worker",)
    drawn = generate_schedule(7, ("term_worker",), min_nodes=1, max_nodes=1, nproc_per_node=2, max_restarts=2)
    assert drawn and {type(e.fault) for e in drawn} == {fake_kind.WorkerTerm}

    # applied and recorded: the scheduler fires it, Fault.apply hands it to job.processes, the
    # part records it under its kind's name and the worker dies of SIGTERM
    worker = subprocess.Popen(["sleep", "60"])
    job = _StandInJob(str(tmp_path), worker.pid)
    try:
        job.scheduler = FaultScheduler(job)
        job.scheduler.add(ScheduledFault(fake_kind.WorkerTerm(node=0, local_rank=0)))
        assert job.bus.wait_until(lambda: not job.scheduler.pending(), 10), job.scheduler.failures()
        assert worker.wait(10) == -15
        assert job.bus.wait_until(lambda: job.timeline.faults(), 10)
    finally:
        if job.scheduler is not None:
            job.scheduler.stop()
        job.harness_events.close()
        job.bus.close()
        worker.kill()
        worker.wait()
    [fault] = job.timeline.faults()
    assert (fault["fault"], fault["target_node"], fault["local_rank"]) == ("term_worker", 0, 0)

    # reported: the timeline page and the session index name it; the invariants judge it by its row
    events = job.timeline.events()
    drawn_model = model.build_model(events)
    assert [f.kind for f in drawn_model.faults] == ["term_worker"]
    assert model.fault_text(drawn_model.faults[0]).startswith("term_worker at ")
    assert index_rows([{"elastic_test": "t", "elastic_faults": "term_worker"}])[0]["fault_kinds"] == ["term_worker"]
    facts = JobFacts(max_restarts=3, nproc_per_node=1, finished=True, succeeded=False)
    assert check_timeline(job.timeline, facts) == [
        "job failed with 1 injected worker failure(s) although max_restarts=3 allows more"]

    # skipped: a scenario with it is skipped where what its row needs is missing, each need
    specs = tomllib.loads(SCENARIO)["fault"]
    monkeypatch.setattr("harness.sim.net.netns_missing", lambda: ["not root"])
    monkeypatch.setattr("harness.sim.storage.mount.fuse_missing", lambda: "libfuse3")
    monkeypatch.setattr("harness.sim.resources.probe", lambda: "cgroups (none delegated)")
    with pytest.raises(pytest.skip.Exception, match="needs network namespaces: not root"):
        _scenarios._skip_without_netns({}, specs)
    with pytest.raises(pytest.skip.Exception, match="needs FUSE: missing libfuse3"):
        _scenarios._skip_without_fuse(specs)
    with pytest.raises(pytest.skip.Exception, match=r"needs cgroups \(none delegated\)"):
        _scenarios._skip_without_cgroups(specs)


def test_the_fake_kind_leaves_nothing_behind():
    """After the fake kind's test (or on its own), the vocabulary is the built-in one."""
    assert "term_worker" not in schema.FAULT_KINDS and "term_worker" not in schema.CHAOS_CHOICES
    assert "term_worker" not in schema.kinds_where(lambda row: True)
    assert set(schema.FAULT_KINDS) == {cls.kind for cls in faults.BUILT_IN}


def test_a_scenario_whose_script_needs_what_is_not_installed_is_skipped_naming_each():
    """``[job] requires``: every requirement missing here (not installed, or another version)
    in the one skip line, with the install that fixes it; a met one is no skip."""
    with pytest.raises(pytest.skip.Exception) as info:
        _scenarios._skip_without_requirements(["pytest>=1", "no-such-distribution>=1", "pytest<1"])
    said = str(info.value)
    assert said.startswith("needs no-such-distribution>=1 (not installed), pytest<1 (")
    assert "installed): pip install 'pytest>=1' 'no-such-distribution>=1' 'pytest<1'" in said
    _scenarios._skip_without_requirements(["pytest>=1"])
    assert schema.check_scenario({"job": {"script": "t.py", "requires": ["transformers>=5"]}}) == []
    assert "requires" in " ".join(schema.check_scenario({"job": {"script": "t.py", "requires": ["not a req!"]}}))

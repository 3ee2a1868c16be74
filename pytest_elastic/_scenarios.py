"""``scenarios/**/*.toml`` collected as test items.

A scenario is a job, a fault schedule and expectations::

    description = "A worker exits with code 3 at step 5; the job restarts it and resumes."

    [job]
    script = "scripts/train.py"         # relative to the .toml file (or module = "pkg.train")
    args = ["--steps", "20", "--ckpt-dir", "{tmp}"]   # {tmp}: a fresh dir per job
    nnodes = "1:1"                      # + every other harness.Cluster keyword
    nproc_per_node = 2
    timeout = 60                        # seconds for the whole job
    steps = 20                          # for the no-lost-progress check

    [[fault]]
    kind = "kill_worker"                # or hang_worker, kill_agent, kill_node, remove_node, ...
    node = 0
    local_rank = 1
    exit_code = 3                       # or sig = 9
    at_step = 5                         # trigger: at_step (+ rank), after_healthy = s, on_state (+
    rank = 1                            #   state_node), on_world_size; after_previous = true
                                        #   arms it only once the fault before it fired
    [expect]
    state = "SUCCEEDED"
    world_sizes = [2, 2]
    restarts = 1
    no_lost_steps = true                # steps done >= steps asked, none skipped after resume
    max_recovery_latency = 10.0

Every key, with its default and meaning, is defined once in ``harness.sim.schema`` and
listed by ``python -m harness.sim.schema`` (a reference that is itself a valid scenario;
``tests/unit/test_schema.py`` checks it, and this example).

A ``[[fault]]`` that names a node, local rank or rank the job can never have fails the
scenario before it runs; one whose trigger is never met (the job ended first) fails it
afterwards, saying why (``rank 0 reported no step >= 8``...), unless the scenario says
``allow_unfired = true`` in ``[expect]`` (for a fault that legitimately may not fire) or
runs under ``--elastic-chaos`` (chaos moves the job's timing: a heal chained after a
partition may find the job already done, as the other timing expectations, ``world_sizes``
and ``restarts``, are not checked under chaos either; the unfired are still listed). For
the same reason ``faults_fired`` is not judged under chaos when the job ended after a chaos
fault with some of the scenario's own still pending (a worker killed during a naive save
ends the job before the node crash the scenario waits for): the captured output says which
and why. Faults chaos adds never fail it: the report lists them as not fired.
"""

from __future__ import annotations

import functools
import statistics
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_elastic._places import names_its_place

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover (pyproject declares tomli for Python < 3.11)
    import tomli as tomllib

if TYPE_CHECKING:
    from _pytest._code.code import TerminalRepr  # what Item.repr_failure returns; not public API

    from harness.sim.faults.chaos import ChaosConfig

__all__ = ["ScenarioFile", "ScenarioItem", "ScenarioFailure", "hosts_from_option"]

class ScenarioFailure(AssertionError):
    """An expectation of a scenario did not hold."""


class ScenarioFile(pytest.File):
    def collect(self) -> Iterator[ScenarioItem]:
        try:
            data = _parse(self.path.read_text(encoding="utf-8"))
        except ValueError as e:
            raise self.CollectError(f"{self.path}: {e}") from None
        faults = data.get("fault")
        if isinstance(faults, list) and all(isinstance(f, dict) for f in faults):
            data["fault"] = _modern(faults)  # an old spelling warns once, here
        problems = _validate(data)
        if problems:
            raise self.CollectError(f"{self.path}: " + "; ".join(problems))
        yield ScenarioItem.from_parent(self, name=self.path.stem, spec=data)


def _parse(text: str) -> dict[str, Any]:
    """The file's tables; ValueError (one line) if it is not TOML, or nests deeper than
    tomllib's recursion reaches (``a = [[[[...]]]]``: a RecursionError otherwise)."""
    try:
        data: dict[str, Any] = tomllib.loads(text)
    except (tomllib.TOMLDecodeError, RecursionError) as e:
        raise ValueError(f"not valid TOML: {e}") from None
    return data


def _validate(data: dict[str, Any]) -> list[str]:
    from harness.sim.schema import check_scenario

    return check_scenario(data)


def _modern(faults: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ``[[fault]]`` tables in today's spelling (an old one warned once, at collection)."""
    from harness.sim.schema import modern_spec

    return [modern_spec(spec) for spec in faults]


def _fault(spec: dict[str, Any]) -> Any:
    from harness.errors import ConfigError
    from harness.sim.faults import from_spec

    try:
        return from_spec(spec)
    except ConfigError as e:
        raise ScenarioFailure(f"[[fault]] {e}") from None


def _schedule(job: Any, entries: list[Any]) -> None:
    from harness.errors import ConfigError

    try:
        job.schedule(entries)
    except ConfigError as e:  # a target this job can never have
        raise ScenarioFailure(f"[[fault]] {e}") from None


@dataclass
class _Launch:
    """What ``cluster.launch`` gets from a scenario's ``[job]``: the entry (a script relative
    to the .toml file, or a module), its arguments, the nodes it runs on."""

    entry: str
    module: bool
    args: list[str]
    nodes: Any

    def start(self, cluster: Any) -> Any:
        # {tmp} (checkpoints) is the job's: filled in per node by the harness, where the node
        # runs (on a host too), fresh for every job: the twin's is not this run's
        return cluster.launch(self.entry, *self.args, nodes=self.nodes, module=self.module)


def _launch_args(job_spec: dict[str, Any], base: Path) -> _Launch:
    """Takes the launch keys out of ``job_spec`` (what is left are ``Cluster``'s keywords)."""
    nodes = job_spec.pop("nodes", None)
    script, module = job_spec.pop("script", None), job_spec.pop("module", None)
    args = [str(a) for a in job_spec.pop("args", [])]
    return _Launch(str(base / script) if script else module, module is not None, args, nodes)


class ScenarioItem(pytest.Item):
    def __init__(self, *, spec: dict[str, Any], **kwargs: Any):
        super().__init__(**kwargs)
        self.spec = spec
        self.add_marker(pytest.mark.elastic)

    def runtest(self) -> None:
        from harness import ClusterConfig  # the facade, as the plugin takes Cluster and WarmPool
        from harness.settings import DEFAULT_MAX_RESTARTS
        from harness.sim.waits import never_fired
        from pytest_elastic._session import chaos_config, elastic_run, item_settings

        settings = item_settings(self)
        job_spec = dict(self.spec["job"])
        timeout = float(job_spec.pop("timeout", settings.timeout))
        steps = job_spec.pop("steps", None)
        _skip_without_requirements(job_spec.pop("requires", []))
        launch = _launch_args(job_spec, Path(self.path).parent)
        job_spec.setdefault("start_method", settings.start_method)
        faults = self.spec.get("fault", [])
        if settings.place is not None and not names_its_place(job_spec):
            job_spec[settings.place.keyword] = settings.place.value
        hosts = _skip_on_hosts(job_spec, faults, from_option=hosts_from_option(self), args=launch.args)
        chaos, seed = chaos_config(settings, self, hosts)
        if chaos is not None:
            chaos = _chaos_around(chaos, faults, job_spec.get("max_restarts", DEFAULT_MAX_RESTARTS))
        if hosts is None:  # on hosts, what a fault needs is the host's (refused above)
            _skip_without_netns(job_spec, faults)
            _skip_without_cgroups(faults)
            _skip_without_fuse(faults)
            _skip_without_hosts(faults)
        expect = self.spec.get("expect", {})
        if _twin_asked(expect):
            job_spec["golden"] = True  # the workers digest their final state for the twin
        # [job] was checked at collection (check_scenario: every problem at once); the frozen
        # config the cluster is made from runs the same schema keys
        config = ClusterConfig(**job_spec, chaos=chaos)
        with elastic_run(self, config, seed) as record:
            job = launch.start(record.cluster)
            _schedule(job, [_fault(f) for f in faults])
            allow_unfired = expect.get("allow_unfired", False) or chaos is not None  # see the module doc
            result = job.wait(timeout=timeout, allow_unfired=allow_unfired)
            _check_expectations(expect, job, result, steps, chaos is not None, timeout,
                                unfired=[f"{what} ({why})" for what, why in never_fired(job)])

    def repr_failure(self, excinfo: Any, style: Any = None) -> str | TerminalRepr:
        from harness.faults import FaultError

        if isinstance(excinfo.value, (ScenarioFailure, TimeoutError, FaultError)):
            return f"scenario {self.name}: {excinfo.value}"
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self) -> tuple[Any, int, str]:
        return self.path, 0, f"scenario: {self.name}"


def _chaos_around(chaos: ChaosConfig, faults: list[dict[str, Any]],
                  max_restarts: int) -> ChaosConfig | None:
    """Chaos that leaves the scenario's expected outcome decidable (None: no chaos fits).

    Chaos adds failures only within the restarts the scenario's own faults leave; it
    keeps spare every node the scenario's own faults take out (a chaos node kill on top
    of the scenario's would drop the job below ``min_nodes``); a scenario with lasting
    faults of its own (or heals) gets no lasting chaos faults (a chaos heal ends every
    lasting fault of its node: the scenario's partition, straggler or full disk would end
    whenever chaos likes, and its outcome with it), and one that cuts links itself no chaos
    cuts, one that slows a node no chaos resource faults (its straggler is the one its
    expectations name), and one whose own faults fire on world sizes, or order an exit at
    an exact (rank, step), no chaos membership changes. Which kinds are which: their rows.
    What is taken out is listed, with why, in ``left_out`` (the report's)."""
    import dataclasses

    from harness.sim.schema import CGROUPS, FAULT_KINDS, NETNS, UNTIL_HEALED

    rows = [FAULT_KINDS[f["kind"]] for f in faults]
    if not chaos.overload:
        # restarts are the job's (one count through the rendezvous): keep one for each fault of
        # the scenario's that fails workers, a cut link included (a step timer reaps the
        # worker stuck behind it: a restart); a heal costs none
        own = sum(1 for row in rows if row.failure or NETNS in row.needs)
        chaos = dataclasses.replace(chaos, max_faults=max(0, max_restarts - own))
    taken = {f.get("node", 0) for f, row in zip(faults, rows, strict=True) if row.membership < 0}
    chaos = dataclasses.replace(chaos, reserved_nodes=len(taken))
    lasting = {k for k in chaos.kinds if FAULT_KINDS[k].heal_after is not None}
    rules = [(any(row.lasts == UNTIL_HEALED or row.kind == "heal" for row in rows), lasting,
              "the scenario has lasting faults (or heals) of its own, and a chaos heal ends every lasting "
              "fault of its node"),
             (any(CGROUPS in row.needs for row in rows), {k for k in chaos.kinds if CGROUPS in FAULT_KINDS[k].needs},
              "the scenario slows a node itself: its straggler is the one judged"),
             (any("on_world_size" in f for f in faults),
              {k for k in chaos.kinds if FAULT_KINDS[k].membership != 0},
              "the scenario's own faults fire on world sizes, which chaos's membership changes would move"),
             (any(f.get("kind") == "kill_worker" and "exit_code" in f and "at_step" in f for f in faults),
              {k for k in chaos.kinds if FAULT_KINDS[k].membership != 0},
              "the scenario orders an exit at an exact (rank, step), and chaos's membership changes would give "
              "that rank to another worker, or none"),
             (any(NETNS in row.needs or row.kind == "heal" for row in rows),
              {k for k in chaos.kinds if NETNS in FAULT_KINDS[k].needs},
              "the scenario cuts links itself: chaos cuts healed whenever chaos likes would make its outcome "
              "undecidable")]
    left_out = dict(chaos.left_out)
    for applies, dropped, why in rules:
        if applies:
            left_out.update({k: why for k in chaos.kinds if k in dropped and k not in left_out})
    kinds = tuple(k for k in chaos.kinds if k not in left_out)
    if not kinds:
        return None
    return dataclasses.replace(chaos, kinds=kinds, left_out=tuple(left_out.items()))


def _needs(faults: list[dict[str, Any]]) -> frozenset[str]:
    """What the scenario's faults need of the machine (network namespaces, FUSE, cgroups):
    each kind's row and the keys each spec sets (``lose_unsynced``, ``on_file``)."""
    from harness.sim.schema import needs_of

    return frozenset().union(*(needs_of(f) for f in faults))


def hosts_from_option(item: pytest.Item) -> bool:
    """Whether ``item``'s nodes were put on hosts by ``--elastic-hosts``, not by its own
    ``hosts`` (the marker's keyword, a scenario's ``[job]`` key): what it asks that they
    cannot do then skips it (the user's file chose them), rather than failing it (it asked
    for what cannot be)."""
    from pytest_elastic._settings import settings_of

    if settings_of(item.config).placed_by_option() is None:
        return False
    marker = item.get_closest_marker("elastic")
    if marker is not None and names_its_place(marker.kwargs):
        return False
    return not (isinstance(item, ScenarioItem) and names_its_place(item.spec["job"]))


def _skip_on_hosts(job: dict[str, Any], faults: list[dict[str, Any]], from_option: bool,
                   args: Sequence[str] = ()) -> tuple[Any, ...] | None:
    """The hosts the scenario's nodes run on (``harness.hosts.HostSpec``s; None: this
    machine). A scenario ``--elastic-hosts`` put on hosts that cannot run it is skipped,
    saying why in one line, as one is where this machine lacks network namespaces, FUSE or
    cgroups: a ``[[fault]]`` its node's host cannot carry out (the refusal ``inject()``
    would give: ``harness.sim.places.hosts.refusals.refuse_faults``), a ``[job]`` setting not
    done with hosts (``store_host = "node0"``), or ``{shared}`` or ``{tmp}`` in its args where
    its nodes may be on two hosts (each host's own dir there: one node's checkpoint is not the
    other's, and a resume hung on the mismatch). Where the scenario names its own hosts,
    each fails it instead (it asked for what cannot be)."""
    if job.get("hosts") is None and job.get("slurm") is None:
        return None
    from harness import ClusterConfig
    from harness.errors import ConfigError
    from harness.sim.errors import FaultRefused
    from harness.sim.places import place_of
    from harness.sim.places.hosts.refusals import placed_hosts, refuse_faults
    from harness.sim.places.hosts.shared import shared_base

    try:
        config = ClusterConfig(**job)
    except ConfigError as e:
        if from_option:
            option = "--elastic-slurm" if job.get("slurm") is not None else "--elastic-hosts"
            pytest.skip(f"the nodes are on hosts ({option}), and [job] {e}")
        raise ScenarioFailure(f"[job] {e}") from None
    hosts = place_of(config).planned_hosts() or ()
    spread = set(placed_hosts(hosts, config.placement, config.max_nodes))
    shares = [p for p in ("{shared}", "{tmp}") if any(p in arg for arg in args)]
    reasons: list[str] = []  # every reason, not the first: a fix for one must not reveal the next
    if len(spread) > 1 and shared_base(tuple(spread)) is None and shares:
        reasons.append(f"[job] its args use {' and '.join(shares)}, a dir its nodes share (checkpoints), which is "
                       "each host's own dir there: name one the hosts share (shared_dir in the hosts or Slurm file)")
    if config.slurm is not None and (short := _partition_too_small(config.slurm, config.max_nodes)):
        reasons.append(short)
    for spec in faults:
        try:
            refuse_faults([_fault(spec)], hosts, config.placement, config.max_nodes)
        except FaultRefused as e:
            reasons.append(f"[[fault]] kind={spec['kind']!r} {e.constraint}")
    reasons = list(dict.fromkeys(reasons))
    if reasons and from_option:
        pytest.skip(f"the nodes are on hosts, and {'; '.join(reasons)}")
    if reasons:
        raise ScenarioFailure("; ".join(reasons))
    return hosts


@functools.cache
def _partition_too_small(spec: Any, max_nodes: int) -> str | None:
    """``harness.hosts.allocation_refusal``, asked of ``sinfo`` once per Slurm file and size."""
    from harness.hosts import allocation_refusal

    return allocation_refusal(spec, max_nodes)


def _skip_without_requirements(requires: list[str]) -> None:
    """A scenario whose script needs a distribution that is not installed here (a training
    framework: ``requires = ["transformers>=5"]``) is skipped, naming every one missing."""
    import importlib.metadata

    from packaging.requirements import Requirement

    missing = []
    for text in requires:
        wanted = Requirement(text)
        try:
            have = importlib.metadata.version(wanted.name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(f"{text} (not installed)")
            continue
        if wanted.specifier and not wanted.specifier.contains(have, prereleases=True):
            missing.append(f"{text} ({have} installed)")
    if missing:
        pytest.skip(f"needs {', '.join(missing)}: pip install {' '.join(repr(r) for r in requires)}")


def _skip_without_netns(job: dict[str, Any], faults: list[dict[str, Any]]) -> None:
    """A scenario that needs network namespaces is skipped, saying what is missing, where
    they cannot be made (not root, no nft...), as the network tests are. A heal needs them
    unless the scenario has faults that need something else (cgroups, FUSE): the heal may
    be for those alone."""
    from harness.sim.schema import NETNS

    needs = _needs(faults)
    heals_links = any(f.get("kind") == "heal" for f in faults) and not needs - {NETNS}
    wants = job.get("network") == "netns" or NETNS in needs or heals_links
    if not wants or job.get("network") == "loopback":
        return
    from harness.sim.net import netns_missing

    missing = netns_missing()
    if missing:
        pytest.skip(f"needs network namespaces: {'; '.join(missing)}")


def _skip_without_cgroups(faults: list[dict[str, Any]]) -> None:
    """A scenario with a fault that needs cgroups (a resource fault) is skipped, saying what
    is missing, where this process may make no cgroups, as the resource tests are."""
    from harness.sim.schema import CGROUPS

    if CGROUPS not in _needs(faults):
        return
    from harness.sim.resources import CgroupSupport, probe

    support = probe()
    if not isinstance(support, CgroupSupport):
        pytest.skip(f"needs {support}")


def _skip_without_hosts(faults: list[dict[str, Any]]) -> None:
    """A scenario with a fault that acts on a node's host (``host_unreachable``) is skipped
    where its nodes run on this machine: there is no connection to lose; one with the
    scheduler's own (``down_node``, ``drain_node``, ``kill_slurmd``) says it needs a Slurm allocation."""
    from harness.sim.schema import FAULT_KINDS

    rows = [row for f in faults if (row := FAULT_KINDS.get(str(f.get("kind")))) is not None and row.hosts_only]
    slurm = sorted({row.kind for row in rows if row.slurm_only})
    if slurm:
        pytest.skip(f"needs the nodes in a Slurm allocation (--elastic-slurm): {', '.join(slurm)} is the "
                    "scheduler's own, and a node on this machine has no scheduler")
    kinds = sorted({row.kind for row in rows})
    if kinds:
        pytest.skip(f"needs the nodes on hosts (--elastic-hosts): {', '.join(kinds)} acts on a node's host, "
                    "and a node on this machine has no connection to lose")


def _needs_fuse(fault: dict[str, Any]) -> bool:
    from harness.sim.schema import FUSE

    return FUSE in _needs([fault])


def _skip_without_fuse(faults: list[dict[str, Any]]) -> None:
    """A scenario with a fault that needs the harness's FUSE filesystem (a storage fault, a
    crash that loses unsynced writes, an ``on_file`` trigger) is skipped, saying what is
    missing, where the harness cannot serve one (the storage tests skip the same way)."""
    from harness.sim.schema import FUSE

    if FUSE not in _needs(faults):
        return
    from harness.sim.storage.mount import fuse_missing

    missing = fuse_missing()
    if missing:
        pytest.skip(f"needs FUSE: missing {missing}")


def _check_expectations(expect: dict[str, Any], job: Any, result: Any, steps: int | None, chaotic: bool,
                        timeout: float = 120.0, unfired: Sequence[str] = ()) -> None:
    """Raise ``ScenarioFailure`` naming every ``[expect]`` key the finished ``job`` broke.
    ``unfired``: the scenario's own faults still pending at the job's end, each with why."""
    from pytest_elastic.report.chart import timeline_chart

    problems: list[str] = []
    if "state" in expect and result.state.value != expect["state"]:
        problems.append(f"final state {result.state.value}, expected {expect['state']}")
    sizes = job.timeline.world_sizes()
    if "world_sizes" in expect and not chaotic and sizes != expect["world_sizes"]:
        problems.append(f"world sizes {sizes}, expected {expect['world_sizes']}")
    leaves, joins = _chaos_membership(job) if chaotic else (0, 0)
    nproc = job.cluster.config.nproc_per_node if leaves or joins else 0
    if "min_world_size" in expect:
        floor = expect["min_world_size"] - leaves * nproc  # chaos may take out as many nodes as it did
        if any(size < floor for size in sizes):
            problems.append(f"world sizes {sizes}, none expected below {floor}" + _modulo(expect["min_world_size"],
                                                                                          leaves, joins))
    if "final_world_size" in expect:
        low, high = expect["final_world_size"] - leaves * nproc, expect["final_world_size"] + joins * nproc
        if not sizes or not low <= sizes[-1] <= high:
            wanted = f"{low}..{high}" if low != high else str(low)
            problems.append(f"final world size {sizes[-1] if sizes else None}, expected {wanted}"
                            + _modulo(expect["final_world_size"], leaves, joins))
    restarts = max(job.timeline.restart_counts().values(), default=0)
    if "restarts" in expect and not chaotic and restarts != expect["restarts"]:
        problems.append(f"{restarts} restart(s), expected {expect['restarts']}")
    own = [f for f in job.timeline.faults() if not f.get("chaos")]  # the scenario's own faults
    if "faults_fired" in expect:
        # a heal is a scheduled entry too: it fired when its ``heal`` event was recorded
        heals = [h for h in job.timeline.events("heal") if not h.get("chaos")]
        fired = [f["fault"] for f in own] + ["heal"] * len(heals)
        if len(fired) < expect["faults_fired"]:
            excuse = _ended_by_chaos(job, unfired) if chaotic else None
            if excuse:
                print(f"scenario: faults_fired {expect['faults_fired']} not judged under chaos: {excuse}")
            else:
                problems.append(f"{len(fired)} fault(s) fired {fired}, expected {expect['faults_fired']}")
    if expect.get("no_lost_steps") and steps:
        problems.extend(_lost_progress(job, steps))
    bound = expect.get("max_recovery_latency")
    if bound is not None:
        for fault in own:
            latency = fault.recovery_latency
            if latency is not None and latency > bound:
                problems.append(f"{fault['fault']} recovered after {latency:.2f}s > {bound}s")
    problems.extend(_training_truth(expect, job, timeout, own, chaotic))
    problems.extend(_resource_truth(expect, job))
    if problems:
        raise ScenarioFailure("; ".join(problems) + "\n" + timeline_chart(job.timeline))


def _resource_truth(expect: dict[str, Any], job: Any) -> list[str]:
    """The expectations about resource faults: the straggler named, the slowdown, OOM kills."""
    from harness.sim.truth.training import rank_rates, rates_summary, slow_windows, step_cpu, step_times, straggler

    problems: list[str] = []
    steps, windows = job.timeline.steps(), slow_windows(job.timeline.events())
    if ("straggler_node" in expect or "min_slowdown" in expect) and not windows:
        problems.append("no node was slowed (slow_node), so no straggler to name")
    for fault, start, end in windows:
        during, earlier = rank_rates(steps, since=start, until=end), rank_rates(steps, until=start)
        before, slowed = step_times(steps, until=start), step_times(steps, since=start, until=end)
        slowed_ranks = [rank for rank in earlier if _node_of_rank(job, rank, start) == fault.get("target_node")]
        headroom = quota_headroom(fault, [step_cpu(steps, rank, until=start) for rank in slowed_ranks], before)
        unjudged = quota_cannot_bite(fault, earlier, headroom)
        if unjudged:
            print(f"scenario: {unjudged}")  # in the report's captured output
            continue
        if "straggler_node" in expect:
            rank = straggler(during)
            node = _node_of_rank(job, rank, start) if rank is not None else None
            if node != expect["straggler_node"]:
                problems.append(f"straggler node {node} (rank {rank}), expected {expect['straggler_node']}: "
                                f"{rates_summary(during)}")
        if "min_slowdown" in expect and before and slowed:
            slowdown = slowdown_of(before, slowed)
            floor, waited = slowdown_floor(expect["min_slowdown"], earlier, headroom)
            if slowdown < floor:
                forced = f", and the quota forces {headroom:.2f}x" if headroom is not None else ""
                wanted = (f"{floor:.2f}x (scaled from {expect['min_slowdown']}x: the ranks waited {waited:.0%} "
                          f"of the time for a CPU before{forced})" if floor != expect["min_slowdown"]
                          else f"{expect['min_slowdown']}x")
                problems.append(f"step time grew {slowdown:.2f}x while node {fault.get('target_node')} was "
                                f"slowed, expected at least {wanted}")
    if "oom_kills" in expect:
        ooms = [e for e in job.timeline.events("worker_exit") if e.get("reason") == "oom"]
        if len(ooms) != expect["oom_kills"]:
            problems.append(f"{len(ooms)} worker(s) killed by the OOM killer, expected {expect['oom_kills']}")
    return problems


def slowdown_of(before: Sequence[float], slowed: Sequence[float]) -> float:
    """How much a slowed node's steps slowed the job: the mean step time while it was slowed
    over the median before. A mean, not a median: a CPU quota is spent in bursts (each
    100 ms period, the node runs until its share is used up, then waits out the period), so
    of three steps two may run at full speed and the third wait out the rest of the period.
    Their median said 1.4-1.8x where the mean, the job's pace, said 5-7x (the main job's
    straggler; in one of two runs of ``bench/flake.py`` on a busy machine the median said
    1.19x and went red). Before, the median: a first
    step's warm-up is not the job's pace."""
    return statistics.mean(slowed) / statistics.median(before)


def quota_headroom(fault: Mapping[str, Any], step_cpus: Sequence[float | None],
                   before: Sequence[float]) -> float | None:
    """How many times more CPU the slowed node's ranks took per step (``step_cpus``: each
    one's, ``step_cpu``) than its ``slow_node`` quota gives in a step's time before
    (``before``: the step times): the slowdown the quota forces on a job whose pace is its
    slowest rank's. None where a rank's CPU or the step times are unknown."""
    quota = fault.get("cpu")
    known = [cpu for cpu in step_cpus if cpu is not None]
    if not isinstance(quota, (int, float)) or quota <= 0 or not known or not before:
        return None
    pace = statistics.median(before)
    return max(known) / (quota * pace) if pace > 0 else None


def quota_cannot_bite(fault: Mapping[str, Any], before: Mapping[int, Any], headroom: float | None = None) -> str | None:
    """Why a ``slow_node`` window cannot be judged, None when it can. A CPU quota slows a
    worker only if its steps took more CPU than the quota gives them: on a machine so
    loaded that the slowed node's ranks already ran on less than 1.5x the quota's share of a
    CPU per step (``headroom``, ``quota_headroom``; without one, every rank's share of the
    time it ran before: the main job's straggler at a load of 10 on 2 cores, both ranks
    waited 63-70 % of the time, step time 0.97x), the fault changes nothing measurable, and
    a straggler or a slowdown expected of it would be red for the machine's sake, not the
    training's."""
    quota = fault.get("cpu")
    if headroom is not None:
        if headroom >= 1.5:
            return None
        return (f"straggler_node and min_slowdown not judged: before node {fault.get('target_node')} was "
                f"slowed to cpu={quota:g} a step of its ranks took {headroom:.2f}x the CPU the quota gives in a "
                "step's time (the machine was that loaded), so the quota could not slow them")
    runs = [rate.cpu_run for rate in before.values() if rate.cpu_run is not None]
    if not isinstance(quota, (int, float)) or not runs or max(runs) >= 1.5 * quota:
        return None
    return (f"straggler_node and min_slowdown not judged: before node {fault.get('target_node')} was "
            f"slowed to cpu={quota:g} its ranks ran on at most {max(runs):.0%} of a CPU (the machine was "
            f"that loaded), so the quota could not slow them")


def slowdown_floor(min_slowdown: float, before: dict[int, Any], headroom: float | None = None) -> tuple[float, float]:
    """``min_slowdown`` scaled to the load the job ran under, and that load: the largest
    share of its time a rank waited for a CPU before the node was slowed. A quota slows only
    the time a worker would have run: on a quiet machine that is all of a CPU-bound step (the
    full ``min_slowdown`` holds), on one where the ranks already waited 80 % of the time for
    a CPU it is a fifth of it (the main job's straggler grew 1.07x at a load of 10 on 2
    cores). So the floor is ``1 + (min_slowdown - 1) * (1 - waited)``, and never more than
    half way to what the quota forces (``headroom``): a node whose steps need twice the
    quota's CPU slows the job at least 2x, and half of that is what a noisy machine is held
    to. The straggler is still named by its waits (``straggler_node``), which hold under any
    load."""
    waits = [rate.cpu_wait for rate in before.values() if rate.cpu_wait is not None]
    waited = max(waits, default=0.0)
    floor = 1.0 + (min_slowdown - 1.0) * (1.0 - waited)
    if headroom is not None:
        floor = min(floor, 1.0 + (headroom - 1.0) / 2)
    return floor, waited


def _node_of_rank(job: Any, rank: int, at: float) -> Any:
    """The node whose worker had global ``rank`` in the round running at monotonic ``at``."""
    starts = [e for e in job.timeline.events("worker_start") if e.get("rank") == rank and e["mono"] <= at]
    return starts[-1]["node"] if starts else None


def _ended_by_chaos(job: Any, unfired: Sequence[str]) -> str | None:
    """Why the scenario's own faults that never fired are chaos's doing, None when they are
    not. Chaos may end a job before a scenario fault's trigger comes: a worker killed during
    a naive save tears the checkpoint, and the job fails (as the scenario expects of its node
    crash) before the step that crash waits for. That shortfall is chaos's timing, as a heal
    chained after a partition finding the job done is; one with no chaos fault fired is not."""
    chaos = [f["fault"] for f in job.timeline.faults() if f.get("chaos")]
    if not chaos or not unfired:
        return None
    return (f"the job ended after chaos's {', '.join(chaos)} and before the scenario's "
            f"{'; '.join(unfired)} could fire")


def _chaos_membership(job: Any) -> tuple[int, int]:
    """(nodes chaos took out, nodes chaos added) in this job: its fired faults whose kind
    changes the membership (a partition counts as a node taken out: its node may end the job
    cut off)."""
    from harness.sim.schema import FAULT_KINDS

    rows = [FAULT_KINDS.get(f["fault"]) for f in job.timeline.faults() if f.get("chaos")]
    return (sum(1 for row in rows if row is not None and row.membership < 0),
            sum(1 for row in rows if row is not None and row.membership > 0))


def _modulo(expected: int, leaves: int, joins: int) -> str:
    """What a world size was compared with under chaos (empty without chaos membership)."""
    if not leaves and not joins:
        return ""
    return f" ({expected} modulo chaos's membership changes: {leaves} node(s) out, {joins} in)"


def _training_truth(expect: dict[str, Any], job: Any, timeout: float, own: list[Any] | None = None,
                    chaotic: bool = False) -> list[str]:
    """The expectations judged on the training: resume latency, goodput, the twin. Under
    chaos, the latency bounds hold for the scenario's ``own`` faults and ``min_goodput`` is
    not judged (chaos's faults cost what they cost); the twin is, bitwise."""
    problems: list[str] = []
    bound = expect.get("max_resume_latency")
    if bound is not None:
        for fault in (own if own is not None else job.timeline.faults()):
            latency = fault.resume_latency
            if latency is None:
                problems.append(f"{fault['fault']}: training never resumed after it")
            elif latency > bound:
                problems.append(f"{fault['fault']}: training resumed after {latency:.2f}s > {bound}s")
    floor = expect.get("min_goodput")
    if floor is not None and chaotic:
        print(f"scenario: min_goodput {floor} not judged under chaos (its faults cost goodput too)")
    elif floor is not None:
        goodput = job.goodput()
        if goodput.ratio < floor:
            problems.append(f"{goodput.summary()} < min_goodput {floor}")
    at_step = expect.get("diverges_at_step")
    if _twin_asked(expect):
        diff = job.compare_golden(rtol=expect.get("golden_rtol"), timeout=timeout)
        if expect.get("same_as_golden") and diff.diverged:
            problems.append(diff.explain())
        if (expect.get("diverges") or at_step is not None) and not diff.diverged:
            problems.append("expected the run to diverge from its fault-free twin (diverges = true), but it "
                            f"did not: {diff.explain()} -- the oracle missed what the script forgot")
        elif at_step is not None and not chaotic and (diff.first is None or diff.first[1] != at_step):
            problems.append(f"expected the run to diverge from its fault-free twin first at step {at_step} "
                            f"(diverges_at_step), but {diff.explain()}")
    return problems


def _twin_asked(expect: dict[str, Any]) -> bool:
    """Whether ``[expect]`` judges the run by its fault-free twin (the same, or diverging)."""
    return bool(expect.get("same_as_golden") or expect.get("diverges") or "diverges_at_step" in expect)


def _lost_progress(job: Any, steps: int) -> list[str]:
    """Rank 0's steps over all attempts cover 0..steps-1; a resumed attempt starts no later
    than one past the previous attempt's last step (nothing skipped)."""
    events = job.timeline.steps(rank=0)
    done = {e["step"] for e in events}
    problems = []
    missing = sorted(set(range(steps)) - done)
    if missing:
        problems.append(f"steps never done: {missing[:10]}")
    # one attempt = one rank-0 process (restarts and membership changes both start new ones)
    by_process: dict[int, list[int]] = {}
    for e in events:
        by_process.setdefault(e.get("pid", 0), []).append(e["step"])
    highest = -1
    for attempt, steps_done in enumerate(by_process.values()):
        first = min(steps_done)
        if first > highest + 1:
            problems.append(f"attempt {attempt} resumed at step {first}, skipping {highest + 1}..{first - 1}")
        highest = max(highest, max(steps_done))
    return problems

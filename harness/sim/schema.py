"""One schema: every key a user can write, with its type, default, check and meaning.

The same vocabulary reaches the harness through five doors, and each used to keep its own
list (they drifted: ``--elastic-schedule`` rejected ``after_previous``, which the specs it
was printed from contained). Now each door derives from the tables below:

* ``harness.Cluster(...)`` keywords: ``CLUSTER_OPTIONS`` (a test compares them with
  ``inspect.signature(Cluster.__init__)``, exceptions listed by name there), frozen into a
  ``harness.sim.config.ClusterConfig`` that these keys check once;
* ``@pytest.mark.elastic(...)`` keywords: ``MARKER_OPTIONS`` = the cluster options the
  plugin does not own (``PLUGIN_OWNED``) + ``timeout``; the signature ``pytest --markers``
  shows is rendered from it (``marker_signature``);
* scenario files (``scenarios/**/*.toml``): ``[job]`` = ``SCENARIO_JOB_OPTIONS``,
  ``[[fault]]`` = a fault spec, ``[expect]`` = ``EXPECT_KEYS``; ``check_scenario`` checks a
  parsed file and ``scenario_reference()`` (``python -m harness.sim.schema``) prints every
  key with its default and meaning, as a scenario file that itself passes the check;
* fault specs (``[[fault]]`` tables, ``--elastic-schedule`` JSON, what a shrunk chaos
  failure prints): ``FAULT_KINDS`` (kind -> Fault class, its keys with defaults),
  ``TRIGGERS`` (trigger key -> Trigger class and fields) and ``AFTER_PREVIOUS``;
  ``harness.sim.faults.from_spec``/``to_spec`` are written against these tables only;
* chaos kinds (``--elastic-faults``): each ``FaultKind.chaos`` name, plus ``CHAOS_ALIASES``
  (``scale`` = ``remove_node`` + ``add_node``); ``harness.sim.faults.chaos`` generates faults from the row.

**The fault row is the whole truth about a kind** (``FaultKind``): its name (the method of
the job's part that applies it, the scenario and chaos kind, and the name its ``fault``
event is recorded under), its class, its parameters, the part that applies it, whether it
lasts, ends an agent or is a plain worker failure, what it needs of the machine (network
namespaces, FUSE, cgroups). Every place that used to keep its own list of kinds derives it
from the rows (``kinds_where``): the scenario skips, the report's spans and dead nodes, the
invariants, chaos. Adding a kind on an existing part is one row here plus the part's
method of the kind's name (docs/architecture.md, "Adding a fault kind"); its ``Fault``
class is made from the row unless ``harness.sim.faults`` has one written out, and a kind
can be added from any module with ``harness.sim.faults.register(row)``. A renamed spelling
goes in the ``RENAMED_*`` tables, which keep it working with a DeprecationWarning; the
fault events of older runs, recorded under retired names (``worker_kill``...), are read
in today's spelling (``RENAMED_EVENTS``, ``modern_event``). ``tests/unit/test_schema.py``
round-trips every row and fails if the class and the row disagree. A new trigger form is
one ``TriggerForm`` row plus its ``Trigger`` subclass. A new ``Cluster`` keyword
is one ``Key`` in ``CLUSTER_OPTIONS`` (put it in ``PLUGIN_OWNED`` if the plugin, not the
test author, provides it, as it does ``chaos``), plus one typed line, by hand, in
``harness.sim.config.ClusterConfig`` (its default read from the Key; the config is checked
by these keys when made) and its parameter in ``Cluster.__init__``:
``tests/unit/test_cluster_config.py`` and ``tests/unit/test_schema.py`` fail until the
three agree. A setting the runtime takes too is checked by the runtime's own rule
(``runtime_rule(harness.settings.MAX_RESTARTS_RULE)``), never by a second copy of it here.

**Import cost.** The pytest plugin must load without torch or the harness
(``pytest --help`` stays fast), yet it needs this schema at configure time (the marker
line, checking ``--elastic-faults`` and ``--elastic-schedule``). So this module imports
only leaves: ``harness.errors``, ``harness.settings`` (the defaults and the rules of the
runtime's settings), ``harness.states`` (``WorkerState``) and ``harness.sim.checks`` (the
standard library), never the agent; the plugin imports it lazily, in
``pytest_addoption``/``pytest_configure``, never at its own import time, and ``pytest
--help`` loads no module of the engine (``tests/plugin/test_plugin.py`` pins both). Nothing here may import the rest of
``harness.sim`` (``tests/unit/test_schema.py`` pins that): ``harness.sim.config`` imports
this module, never the other way round.

Bad input is reported as one line naming the key (or kind) and what is valid, in the
``ConfigError`` form: ``kind='meteor' must be one of kill_worker, ...``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Set
from dataclasses import dataclass, field
from typing import Any

from harness.errors import ConfigError
from harness.settings import (
    DEFAULT_MAX_RESTARTS,
    DEFAULT_MONITOR_INTERVAL,
    MAX_RESTARTS_RULE,
    MONITOR_INTERVAL_RULE,
    SettingRule,
)
from harness.sim.checks import (
    ARGS,
    BOOL,
    GPUS,
    HOSTS,
    MEMORY_LIMIT,
    NNODES,
    PEERS,
    PLACEMENT,
    PROBABILITY,
    RATE,
    REQUIREMENT,
    SLURM,
    STR_TABLE,
    TABLE,
    TEXT,
    Check,
    integer,
    list_of,
    number,
    one_of,
    optional,
)
from harness.states import WorkerState

__all__ = [
    "Key", "FaultKind", "TriggerForm", "KindSet",
    "CLUSTER_OPTIONS", "PLUGIN_OWNED", "TIMEOUT", "MARKER_OPTIONS", "JOB_ONLY_OPTIONS",
    "SCENARIO_JOB_OPTIONS", "EXPECT_KEYS", "SCENARIO_TABLES",
    "FAULT_KINDS", "NODE", "LOCAL_RANK", "DISK", "NETNS", "FUSE", "CGROUPS", "SLURM_ADMIN", "SLURMD",
    "NEEDS", "UNTIL_HEALED", "UNTIL_END",
    "add_kind", "remove_kind", "kinds_where", "needs_of",
    "RENAMED_KINDS", "RENAMED_CHAOS_KINDS", "RENAMED_CLASSES", "RENAMED_SPEC_KEYS", "RENAMED_EVENTS",
    "event_kind", "modern_event",
    "deprecated", "modern_spec", "TRIGGERS", "DEFAULT_TRIGGER", "AFTER_PREVIOUS", "SPEC_KEYS",
    "CHAOS_KINDS", "CHAOS_ALIASES", "CHAOS_CHOICES", "DEFAULT_CHAOS_KINDS", "EVERY_CHAOS_KIND",
    "START_METHODS", "STATES",
    "runtime_rule", "keys_of", "check_fault_spec", "trigger_form", "parse_chaos_kinds", "check_options",
    "check_cluster_keywords", "check_fields",
    "check_scenario", "marker_signature", "scenario_reference",
]


@dataclass(frozen=True)
class Key:
    """One key a user writes: ``name = default``, what it means, what it must be."""

    name: str
    default: Any
    doc: str
    check: Check | None = None  # None: any value
    #: a value to show in the scenario reference where the default cannot be written (None)
    example: Any = None
    #: the default as the marker signature spells it, where repr() would not do
    shown: str | None = None
    #: spec value -> the Python value a dataclass field holds (``on_state`` -> WorkerState)
    load: Callable[[Any], Any] | None = None
    #: what a spec that sets this key (to a true value) needs of the machine, as
    #: ``FaultKind.needs`` (``lose_unsynced``, ``on_file``: the harness's FUSE filesystem)
    needs: str | None = None

    def validate(self, value: Any) -> None:
        """Raise ``ConfigError`` (one line: ``name=value must be ...``) if ``value`` is bad."""
        if self.check is not None and not self.check(value):
            raise ConfigError(self.name, value, self.check.says)

    def to_python(self, value: Any) -> Any:
        return value if self.load is None or value is None else self.load(value)

    def good_value(self) -> Any:
        """A value that passes the check, to show in a fix (``e.g. node=0``)."""
        return self.example if self.example is not None else self.default


def runtime_rule(rule: SettingRule) -> Check:
    """The runtime's own rule of a setting (``harness.agent.MAX_RESTARTS_RULE``...), as the
    check of its key: one rule, whichever door (``WorkerSpec``, ``LaunchConfig``, the CLI,
    ``Cluster``, the marker, a scenario) the value came through."""
    return Check(rule.test, rule.says)


START_METHODS = ("zygote", "spawn", "fork", "forkserver")
STATES = tuple(state.value for state in WorkerState)


# -- the cluster, the marker and a scenario's [job] ---------------------------------------

#: every keyword of ``harness.Cluster(...)``, in signature order
CLUSTER_OPTIONS: tuple[Key, ...] = (
    Key("nnodes", "1:1", "nodes: N, or 'MIN:MAX' for an elastic job", NNODES, shown="'1'"),
    Key("nproc_per_node", 1, "workers per node", integer(1)),
    Key("max_restarts", DEFAULT_MAX_RESTARTS, "restarts of the worker group before the job fails",
        runtime_rule(MAX_RESTARTS_RULE)),
    Key("rdzv_backend", "c10d", "rendezvous backend (etcd needs the etcd binary)",
        one_of("c10d", "etcd", "etcd-v2")),
    Key("monitor_interval", DEFAULT_MONITOR_INTERVAL,
        "seconds between the agent's looks at its workers (an exit wakes it at once)",
        runtime_rule(MONITOR_INTERVAL_RULE)),
    Key("start_method", "zygote", "how workers start (zygote: forked from a warm process)",
        one_of(*START_METHODS)),
    Key("env", None, "extra environment of every worker", optional(STR_TABLE),
        example={"OMP_NUM_THREADS": "1"}),
    Key("rdzv_conf", None, "extra rendezvous settings (e.g. join_timeout)", optional(TABLE),
        example={"join_timeout": 30}),
    Key("shutdown_timeout", 5.0, "seconds a stopping worker gets before SIGKILL", number(0)),
    Key("store_host", "harness", "where the rendezvous store lives: the harness or node 0",
        one_of("harness", "node0")),
    Key("seed", 0, "seed of the generated node names", integer()),
    Key("exit_barrier_timeout", 30.0, "seconds an agent waits for the others at exit",
        number(0)),
    Key("check_invariants", True, "check the timeline's invariants when the cluster closes", BOOL),
    Key("chaos", None, "a seeded fault schedule per job (harness.sim.faults.chaos.ChaosConfig)"),
    Key("gpus", None, "GPUs to split between nodes: a count, device ids, or None to detect",
        GPUS, example=0),
    Key("pool", None, "a harness.WarmPool shared across clusters (None: the cluster's own)"),
    Key("network", "auto", "nodes as network hosts: 'netns' (a namespace and address each; "
        "network faults), 'loopback' (127.0.1.x, no network faults) or 'auto' (netns where "
        "possible)", one_of("auto", "netns", "loopback")),
    Key("golden", False, "judge each job against its fault-free twin (workers digest their final state; "
        "the plugin fails a test whose run diverges)", BOOL),
    Key("golden_rtol", 0.0, "relative tolerance of the twin comparison (0: bitwise)", number(0)),
    Key("hosts", None, 'hosts the nodes run on, over SSH: ["ssh://user@address[:port]", ...] or '
        "harness.hosts.HostSpec (None: every node on this machine; docs/hosts.md)", optional(HOSTS),
        example=["ssh://ci@10.0.0.5:2222"]),
    Key("placement", None, "node i runs on hosts[placement[i]] (None: round robin over hosts)",
        optional(PLACEMENT), example=[0]),
    Key("slurm", None, "a Slurm allocation the nodes run in, each a job step: a harness.hosts.SlurmSpec or a "
        "dict of its fields (None: not on Slurm; docs/slurm.md)", optional(SLURM),
        example={"controller_address": "10.0.0.1", "partition": "staging"}),
)

#: cluster options the plugin provides itself, so neither the marker nor a scenario takes them
PLUGIN_OWNED: dict[str, str] = {
    "chaos": "built by the plugin from --elastic-chaos, --elastic-seed and --elastic-faults",
    "pool": "the plugin's one warm pool per session (per xdist worker)",
}

#: the test's own time limit (marker and scenario; the default is --elastic-timeout's)
TIMEOUT = Key("timeout", 120.0, "seconds the test (the whole job) may take; default: --elastic-timeout",
              number(0, strict=True))

MARKER_OPTIONS: tuple[Key, ...] = tuple(
    key for key in CLUSTER_OPTIONS if key.name not in PLUGIN_OWNED) + (TIMEOUT,)

#: keys only a scenario's [job] has (a marked test launches its jobs itself)
JOB_ONLY_OPTIONS: tuple[Key, ...] = (
    Key("script", None, "training script, relative to the scenario file (or module=)", TEXT,
        example="../scripts/train.py"),
    Key("module", None, "run this module (python -m) instead of a script", TEXT,
        example="mypackage.train"),
    Key("args", [], "arguments of the script; {tmp} becomes a fresh dir of the job's that every node sees "
        "(checkpoints), {shared} its shared filesystem (storage faults), {node_disk} the node's disk", ARGS,
        example=["--steps", "20", "--ckpt-dir", "{tmp}"]),
    Key("nodes", None, "node agents started (default: the maximum of nnodes)", integer(1), example=1),
    Key("steps", None, "steps the script trains (for expect.no_lost_steps)", integer(0), example=20),
    Key("requires", [], "Python distributions the script needs, as pip spells them: the scenario is skipped, "
        "saying which, where one is missing", list_of(REQUIREMENT, "requirements (\"transformers>=5\")"),
        example=["transformers>=5"]),
)

SCENARIO_JOB_OPTIONS: tuple[Key, ...] = JOB_ONLY_OPTIONS + MARKER_OPTIONS

EXPECT_KEYS: tuple[Key, ...] = (
    Key("state", None, "final state of the job", one_of(*STATES), example="SUCCEEDED"),
    Key("world_sizes", None, "WORLD_SIZE of every rendezvous round, in order (not under chaos)",
        list_of(integer(1), "ints >= 1"), example=[1]),
    Key("restarts", None, "restarts of the most restarted node (not under chaos)", integer(0),
        example=0),
    Key("no_lost_steps", False, "every step done, none skipped after a resume (needs job.steps)",
        BOOL),
    Key("max_recovery_latency", None, "seconds from a fault to the job HEALTHY again, at most",
        number(0, strict=True), example=10.0),
    Key("min_world_size", None, "no rendezvous round smaller than this", integer(1), example=1),
    Key("final_world_size", None, "WORLD_SIZE of the last round", integer(1), example=1),
    Key("faults_fired", None, "faults that fired, at least", integer(0), example=0),
    Key("allow_unfired", False, "a [[fault]] still pending when the job ends is no failure (by "
        "default the scenario fails, saying why each never fired; under --elastic-chaos it never does)", BOOL),
    Key("same_as_golden", False, "the run computes what its fault-free twin does: every (rank, step) loss "
        "and the final state digests (harness.report_step(step, loss=, state=))", BOOL),
    Key("diverges", False, "the run must differ from its fault-free twin (a scenario that tests the oracle: "
        "a trainer that forgets state on resume)", BOOL),
    Key("diverges_at_step", None, "the run first differs from its fault-free twin at this step (implies "
        "diverges; not under chaos, whose faults may resume it earlier)", integer(0), example=11),
    Key("golden_rtol", None, "relative tolerance of the twin comparison (default 0: bitwise; a run whose "
        "world size changed uses 1e-4 unless given)", number(0), example=0.0),
    Key("min_goodput", None, "the job's goodput (productive / wall time) is at least this",
        number(0), example=0.5),
    Key("max_resume_latency", None, "seconds from a fault to the first training step of a later round, "
        "at most", number(0, strict=True), example=10.0),
    Key("straggler_node", None, "while a node was slowed (slow_node), the step rates name this node's rank "
        "the straggler (it waited most for a CPU)", integer(0), example=1),
    Key("min_slowdown", None, "the job's mean step time while a node was slowed, over its median step "
        "time before, at least (on a loaded machine scaled down by the share of time the ranks already "
        "waited for a CPU before: 1 + (min_slowdown - 1) x (1 - waited), and never past half way to the "
        "slowdown the quota forces: the slowed ranks' CPU per step over what the quota gives in a step)",
        number(0, strict=True), example=1.5),
    Key("oom_kills", None, "workers the kernel's OOM killer took (worker_exit reason oom), exactly",
        integer(0), example=1),
)

#: top-level entries of a scenario file
SCENARIO_TABLES = ("description", "job", "fault", "expect")


# -- faults and triggers ------------------------------------------------------------------

NODE = Key("node", 0, "index of the node", integer(0))
#: a storage fault's disk: a node's local disk, or (none) the job's shared filesystem
DISK = Key("node", None, "the node whose local disk it hits (none: the shared filesystem)",
           optional(integer(0)), example=1)
LOCAL_RANK = Key("local_rank", 0, "local rank of the worker on that node", integer(0))


#: what a fault may need of the machine (``FaultKind.needs``): a scenario that has a fault
#: needing one is skipped, saying what is missing, where it cannot be had
NETNS = "netns"  # nodes as network hosts: a namespace each (Cluster(network="netns"))
FUSE = "fuse"  # the harness's FUSE filesystem (harness.sim.storage)
CGROUPS = "cgroups"  # a cgroup per node (harness.sim.resources)
#: the scheduler's node states may be changed (``scontrol update``: an operator's right)
SLURM_ADMIN = "slurm_admin"
#: the node's scheduler daemon may be killed and started (a Slurm file's ``slurmd_kill``/``slurmd_start``)
SLURMD = "slurmd"
NEEDS = (NETNS, FUSE, CGROUPS, SLURM_ADMIN, SLURMD)
#: how long a fault lasts (``FaultKind.lasts``; None: it is an act, over once done)
UNTIL_HEALED = "healed"  # until ``job.heal()`` ends it (or the job's end)
UNTIL_END = "end"  # until the job's end: a stopped process stays stopped until reaped


@dataclass(frozen=True)
class FaultKind:
    """A fault kind, the whole truth about it: every place that treats kinds differently
    (the scenario skips, the report, the invariants, chaos) asks these fields, never a list
    of names of its own, so that a new kind is this row and its part's method."""

    #: its one name: the method of ``job.<part>`` that applies it (and the ``Job`` method,
    #: where the row is ``public``), its scenario and chaos kind, and the name its ``fault``
    #: event is recorded under (``{"kind": "fault", "fault": "kill_worker"...}``)
    kind: str
    cls: str  # its ``Fault`` class's name (in harness.sim.faults, or made from this row)
    params: tuple[Key, ...]  # = the class's dataclass fields, same order and defaults
    doc: str
    #: the part of the job that applies it: ``Fault.apply`` calls ``job.<part>.<kind>(**params)``
    #: ("processes", "network", "storage", "resources", "slurm"); None: its class applies itself
    #: (``heal`` ends the lasting faults of every part)
    part: str | None = None
    chaos: str | None = None  # its --elastic-faults name (= kind; None: chaos never generates it)
    #: nodes it takes out of (-1) or adds to (+1) the job; chaos keeps min_nodes alive
    membership: int = 0
    #: parameter -> values chaos draws from (``node``/``local_rank`` it always fills)
    chaos_choices: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)
    #: a fault that lasts until healed: chaos follows it with a ``heal`` of its node, this
    #: many seconds later (drawn from the range), so every job ends healed and its outcome is decidable
    heal_after: tuple[float, float] | None = None
    #: how long it lasts once applied (the report draws it as a span): None, an act;
    #: ``UNTIL_HEALED``; ``UNTIL_END`` (a SIGSTOPped worker or node)
    lasts: str | None = None
    #: it is a failure that may use one of the job's restarts (not a membership change or a
    #: slowdown): chaos keeps one restart for each it draws
    failure: bool = False
    #: a plain worker failure: it costs exactly one restart, so a job that fails with fewer
    #: of them than ``max_restarts`` broke an invariant
    worker_failure: bool = False
    #: after it the target node's agent is gone or stopped, so it cannot stop its workers
    #: (the no-overlap invariant excuses that node) and, with ``membership`` -1 and
    #: ``lasts`` None, the report draws the node killed (without: left)
    agent_losing: bool = False
    #: what it needs of the machine (``NEEDS``); a parameter may add one (``Key.needs``)
    needs: tuple[str, ...] = ()
    #: it acts on a node's host (``Cluster(hosts=...)``) and means nothing on this machine: a
    #: scenario with it run here is skipped, saying so
    hosts_only: bool = False
    #: it is the scheduler's own (Slurm's: ``Cluster(slurm=...)``) and means nothing elsewhere:
    #: refused on this machine and on SSH hosts, a scenario with it run there skipped, saying so
    slurm_only: bool = False
    #: part of the public API: a one-line ``Job`` method of its name, its class exported by
    #: ``harness.faults`` (every kind is in docs/reference/faults.md either way). A new kind is
    #: complete without (scenarios, chaos, ``job.inject``, ``job.<part>.<kind>``)
    public: bool = False

    def __post_init__(self) -> None:
        """A row that contradicts itself fails where it is written (here or in ``register``)."""
        if self.chaos not in (None, self.kind):
            raise ConfigError("chaos", self.chaos, f"must be None or the kind's own name {self.kind!r}")
        if self.lasts not in (None, UNTIL_HEALED, UNTIL_END):
            raise ConfigError("lasts", self.lasts, f"must be None, {UNTIL_HEALED!r} or {UNTIL_END!r}")
        if self.heal_after is not None and self.lasts != UNTIL_HEALED:
            raise ConfigError("heal_after", self.heal_after, f"needs lasts={UNTIL_HEALED!r} (a heal ends it)")
        if self.worker_failure and not self.failure:
            raise ConfigError("worker_failure", True, "needs failure=True (it uses a restart)")
        unknown = sorted(set(self.needs) - set(NEEDS))
        if unknown:
            raise ConfigError("needs", self.needs, f"names {unknown}; each must be one of {', '.join(NEEDS)}")


#: One name per fault: a row's ``kind`` is its part's method, its ``Job`` method, its scenario
#: kind, its chaos kind (where chaos draws it) and its event name; its class is the method's
#: words turned round (``kill_node`` -> ``NodeKill``). docs/reference/faults.md is made from
#: these rows (``pytest_elastic._reference``). Rows added at run
#: time (``harness.sim.faults.register``) join this dict (``add_kind``).
FAULT_KINDS: dict[str, FaultKind] = {row.kind: row for row in (
    FaultKind("kill_worker", "WorkerKill",
              (NODE, LOCAL_RANK, Key("sig", 9, "signal that kills the worker", integer(1)),
               Key("exit_code", None, "exit with this code at the worker's next report_step "
                   "instead of a signal", optional(integer(0)), example=3)),
              "a worker dies (of a signal, or exits with a code)", part="processes", chaos="kill_worker",
              chaos_choices={"sig": (9, 15)}, failure=True, worker_failure=True, public=True),
    FaultKind("hang_worker", "WorkerHang", (NODE, LOCAL_RANK), "a worker is SIGSTOPped (stuck, not dead)",
              part="processes", chaos="hang_worker", lasts=UNTIL_END, failure=True, public=True),
    FaultKind("kill_agent", "AgentKill", (NODE,), "a node's agent is SIGKILLed; its workers follow",
              part="processes", chaos="kill_agent", membership=-1, agent_losing=True, public=True),
    FaultKind("kill_node", "NodeKill",
              (NODE, Key("lose_unsynced", False, "what the node wrote and never fsynced is lost too "
                         "(needs the harness's FUSE filesystem)", BOOL, needs=FUSE),
               Key("torn", False, "with lose_unsynced: a prefix of the node's last unsynced write survives",
                   BOOL, needs=FUSE)),
              "a node's agent and workers are SIGKILLed at once", part="processes", chaos="kill_node",
              membership=-1, agent_losing=True, public=True),
    FaultKind("remove_node", "NodeRemove", (NODE,), "a node leaves gracefully (SIGTERM to its agent)",
              part="processes", chaos="remove_node", membership=-1, public=True),
    FaultKind("add_node", "NodeAdd", (), "a new node joins (scale up)", part="processes", chaos="add_node",
              membership=+1, public=True),
    FaultKind("freeze_node", "NodeFreeze", (NODE,), "a whole node is SIGSTOPped (frozen, not dead)",
              part="processes", chaos="freeze_node", membership=-1, lasts=UNTIL_END, agent_losing=True,
              public=True),
    FaultKind("kill_store_host", "StoreHostKill", (), "the process hosting the rendezvous store dies",
              part="processes", agent_losing=True, public=True),
    # network faults (Cluster(network="netns")); chaos heals each before the job ends
    FaultKind("partition", "Partition",
              (NODE, Key("peers", "all", 'whom the node loses: "all", "store" or [node, ...]', PEERS,
                         example="store"),
               Key("direction", "both", "which packets are dropped", one_of("both", "in", "out"),
                   example="in")),
              "a node's packets to/from its peers are silently dropped (no RST, no FIN)", part="network",
              chaos="partition", membership=-1, chaos_choices={"peers": ("store", "all")},
              heal_after=(1.0, 4.0), lasts=UNTIL_HEALED, needs=(NETNS,), public=True),
    FaultKind("heal", "Heal", (Key("node", None, "the node to heal (none: every node)",
                                   optional(integer(0)), example=1),),
              "a node's lasting faults end (partition, loss, bandwidth, link down, slow_node, memory_limit)",
              public=True),
    FaultKind("packet_loss", "PacketLoss",
              (NODE, Key("probability", 0.05, "chance each packet is dropped", PROBABILITY)),
              "a share of a node's packets is dropped", part="network", chaos="packet_loss",
              chaos_choices={"probability": (0.02, 0.05)}, heal_after=(2.0, 5.0), lasts=UNTIL_HEALED,
              needs=(NETNS,), public=True),
    FaultKind("bandwidth", "Bandwidth",
              (NODE, Key("rate", "1mbit", "the link's rate", RATE, example="500kbit")), "a node's link is slowed",
              part="network", lasts=UNTIL_HEALED, needs=(NETNS,), public=True),
    FaultKind("link_down", "LinkDown", (NODE,), "a node's cable is pulled (no carrier)", part="network",
              lasts=UNTIL_HEALED, needs=(NETNS,), public=True),
    FaultKind("host_unreachable", "HostUnreachable",
              (NODE, Key("seconds", 3.0, "how long this machine cannot reach the host", number(0.1), example=20)),
              "this machine loses the SSH connection to a node's host for a while (nodes on hosts)", part="network",
              membership=-1, needs=(NETNS,), hosts_only=True),
    # the scheduler's own faults (nodes in a Slurm allocation: ``Cluster(slurm=...)``)
    FaultKind("down_node", "NodeDown", (NODE,),
              "Slurm marks the node's Slurm node DOWN (the scheduler's own node failure): every step there "
              "ends", part="slurm", chaos="down_node", membership=-1, agent_losing=True, needs=(SLURM_ADMIN,),
              hosts_only=True, slurm_only=True),
    FaultKind("drain_node", "NodeDrain", (NODE,),
              "Slurm drains the node's Slurm node: its steps go on, no new node of the job lands there",
              part="slurm", chaos="drain_node", heal_after=(1.0, 4.0), lasts=UNTIL_HEALED, needs=(SLURM_ADMIN,),
              hosts_only=True, slurm_only=True),
    FaultKind("kill_slurmd", "SlurmdKill", (NODE,),
              "the node's slurmd is killed: Slurm sees the node lost only after its SlurmdTimeout, then "
              "ends the node's step", part="slurm", membership=-1, lasts=UNTIL_HEALED, agent_losing=True,
              needs=(SLURM_ADMIN, SLURMD), hosts_only=True, slurm_only=True),
    # resource faults (cgroups: harness.sim.resources); chaos heals a slow node before the job ends
    FaultKind("slow_node", "SlowNode",
              (NODE, Key("cpu", 0.2, "CPUs' worth of time the node's workers get together",
                         number(0.01), example=0.5)),
              "a node's workers get a CPU quota (a straggler; its agent keeps its keep-alive)", part="resources",
              chaos="slow_node", chaos_choices={"cpu": (0.1, 0.3)}, heal_after=(2.0, 5.0), lasts=UNTIL_HEALED,
              needs=(CGROUPS,), public=True),
    FaultKind("memory_limit", "MemoryLimit",
              (NODE, Key("limit", "300M", 'memory the node\'s processes share ("300M", "1G", bytes; "+300M": '
                                          'that much above what they hold when it fires)', MEMORY_LIMIT,
                         example="1G")),
              "a node's processes share a memory limit: past it the kernel OOM-kills one", part="resources",
              lasts=UNTIL_HEALED, failure=True, needs=(CGROUPS,), public=True),  # its OOM kill costs a restart
    # storage faults (the harness's FUSE filesystem); chaos heals each before the job ends
    FaultKind("disk_full", "DiskFull", (DISK,), "writes and fsyncs on a disk fail with ENOSPC", part="storage",
              chaos="disk_full", heal_after=(1.0, 3.0), lasts=UNTIL_HEALED, failure=True, needs=(FUSE,),
              public=True),
    FaultKind("slow_io", "SlowIO",
              (DISK, Key("delay", 0.2, "seconds added to every write and fsync request", number(0))),
              "every write and fsync on a disk is slower", part="storage", chaos="slow_io",
              chaos_choices={"delay": (0.01, 0.05)}, heal_after=(1.0, 3.0), lasts=UNTIL_HEALED, needs=(FUSE,),
              public=True),
    FaultKind("io_error", "IoError",
              (DISK, Key("errno", 5, "the error number I/O fails with (5: EIO)", integer(1)),
               Key("path", "*", "glob of the files whose I/O fails (path below the disk, or name)", TEXT,
                   example="*.distcp"),
               Key("probability", 1.0, "chance each operation fails", PROBABILITY, example=0.5)),
              "I/O on matching files fails with an errno", part="storage", chaos="io_error",
              chaos_choices={"probability": (0.05, 0.2)}, heal_after=(1.0, 3.0), lasts=UNTIL_HEALED,
              failure=True, needs=(FUSE,), public=True),
)}


class KindSet(Set[str]):
    """The kinds whose row passes a test, read from ``FAULT_KINDS`` at each use, so that a
    kind registered after the set was made is in it (``kinds_where``). A kind's retired
    event name is in it too (``"node_kill" in kills``: ``RENAMED_EVENTS``), so the sets
    judge the events of older runs as they judge today's."""

    def __init__(self, test: Callable[[FaultKind], bool], doc: str = ""):
        self._test = test
        self._doc = doc

    def __contains__(self, kind: object) -> bool:
        row = FAULT_KINDS.get(event_kind(kind)) if isinstance(kind, str) else None
        return row is not None and self._test(row)

    def __iter__(self) -> Iterator[str]:
        return iter([kind for kind, row in FAULT_KINDS.items() if self._test(row)])

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __repr__(self) -> str:
        return f"KindSet({self._doc or 'kinds'}: {', '.join(self)})"


def kinds_where(test: Callable[[FaultKind], bool], doc: str = "") -> KindSet:
    """The live set of the kinds whose row passes ``test`` (``doc`` names it in its repr):
    ``kinds_where(lambda row: row.agent_losing)``."""
    return KindSet(test, doc)


def add_kind(row: FaultKind) -> None:
    """Make ``row`` a kind of the vocabulary: specs, scenario files, ``--elastic-schedule``,
    and (with a ``chaos`` name) ``--elastic-faults`` and the chaos generator accept it from
    now on. ``harness.sim.faults.register`` calls this with the row's class: use that."""
    known = FAULT_KINDS.get(row.kind)
    if known is not None and known != row:
        raise ConfigError("kind", row.kind, "is a fault kind already (with another row); "
                          "remove_kind it first or choose another name")
    FAULT_KINDS[row.kind] = row
    _derive()


def remove_kind(kind: str) -> None:
    """Forget a kind added with ``add_kind`` (``harness.sim.faults.unregister``)."""
    FAULT_KINDS.pop(kind, None)
    _derive()

#: old spellings, each still accepted with a DeprecationWarning naming the new one
RENAMED_KINDS: dict[str, str] = {
    "worker_crash": "kill_worker", "worker_hang": "hang_worker", "agent_kill": "kill_agent",
    "node_kill": "kill_node", "node_leave": "remove_node", "node_join": "add_node",
    "node_freeze": "freeze_node", "store_host_loss": "kill_store_host"}
RENAMED_CHAOS_KINDS: dict[str, str] = {
    "worker": "kill_worker", "hang": "hang_worker", "agent": "kill_agent", "node": "kill_node",
    "leave": "remove_node", "join": "add_node", "freeze": "freeze_node", "loss": "packet_loss"}
RENAMED_CLASSES: dict[str, str] = {
    "WorkerCrash": "WorkerKill", "NodeLeave": "NodeRemove", "NodeJoin": "NodeAdd",
    "StoreHostLoss": "StoreHostKill", "HealthyThenAfter": "AfterHealthy"}
RENAMED_SPEC_KEYS: dict[str, str] = {"after": "after_healthy"}
#: the names fault events were recorded under before each was recorded under its kind, ->
#: the kind: event files and reports of older runs name them so (and an exit-code crash
#: was ``worker_exit_order``). Read through ``event_kind``/``modern_event`` wherever events
#: are read (the timeline, the invariants' and the report's kind sets, the report)
RENAMED_EVENTS: dict[str, str] = {**RENAMED_KINDS, "worker_kill": "kill_worker", "worker_exit_order": "kill_worker"}
#: the fields of an event that name a fault kind: ``fault`` (a ``fault`` or ``fault_armed``
#: event) and ``cause`` (what the harness did to a node that ended: ``node_exit``, ``state``)
_KIND_FIELDS = ("fault", "cause")
_NAMING_EVENTS = frozenset({"fault", "fault_armed", "node_exit", "state"})


def event_kind(name: Any) -> Any:
    """A recorded fault name in today's spelling: ``"worker_kill"`` -> ``"kill_worker"``
    (anything else as it is)."""
    return RENAMED_EVENTS.get(name, name) if isinstance(name, str) else name


def modern_event(event: dict[str, Any]) -> dict[str, Any]:
    """``event`` with a retired fault name in its ``fault`` or ``cause`` field in today's
    spelling (a copy); the event itself when it has none (the common case: no copy; most
    of a long job's events are steps, passed over at the cost of one lookup)."""
    if event.get("kind") not in _NAMING_EVENTS:
        return event
    renamed = {name: RENAMED_EVENTS[value] for name in _KIND_FIELDS
               if isinstance(value := event.get(name), str) and value in RENAMED_EVENTS}
    return {**event, **renamed} if renamed else event


def deprecated(old: str, new: str, where: str) -> None:
    """The one DeprecationWarning of an old spelling: ``where`` says which vocabulary."""
    warnings.warn(f"{where} {old!r} is deprecated: use {new!r}", DeprecationWarning, stacklevel=3)


def modern_spec(spec: Mapping[str, Any]) -> dict[str, Any]:
    """``spec`` with old kinds and keys in their new spelling (a DeprecationWarning each)."""
    new = dict(spec)
    kind = new.get("kind")
    if isinstance(kind, str) and kind in RENAMED_KINDS:
        deprecated(kind, RENAMED_KINDS[kind], "fault kind")
        new["kind"] = RENAMED_KINDS[kind]
    for old, modern in RENAMED_SPEC_KEYS.items():
        if old in new and modern not in new:
            deprecated(old, modern, "fault spec key")
            new = {modern if k == old else k: v for k, v in new.items()}
    return new


@dataclass(frozen=True)
class TriggerForm:
    """One way to say *when*: the spec key that selects it, its ``Trigger`` class, and
    each key's dataclass field (the selecting key first; the others are optional)."""

    cls: str  # class name in harness.sim.faults
    fields: tuple[tuple[Key, str], ...]
    doc: str

    @property
    def key(self) -> str:
        return self.fields[0][0].name


TRIGGERS: tuple[TriggerForm, ...] = (
    TriggerForm("AfterHealthy", ((Key("after_healthy", 0.0, "seconds after the job was first HEALTHY",
                                      number(0), load=float), "seconds"),),
                "a delay after the job first ran"),
    TriggerForm("AtStep", ((Key("at_step", 0, "training step reached (harness.report_step)", integer(0),
                                example=5), "step"),
                           (Key("rank", 0, "global rank whose step counts", integer(0)), "rank")),
                "a rank reports a training step"),
    TriggerForm("OnState", ((Key("on_state", "HEALTHY", "worker-group state reached", one_of(*STATES),
                                 load=WorkerState), "state"),
                            (Key("state_node", None, "node whose state counts (default: every running node)",
                                 optional(integer(0)), example=0), "node")),
                "a node (or every node) reaches a state"),
    TriggerForm("OnWorldSize", ((Key("on_world_size", 1, "a rendezvous round forms with this WORLD_SIZE",
                                     integer(1)), "size"),),
                "a round of a given size forms"),
    TriggerForm("OnFile", ((Key("on_file", "*", "a file matching this glob is created or renamed (held there "
                                "until the fault is applied)", TEXT, example="*.metadata.tmp", needs=FUSE),
                            "path_glob"),
                           (Key("file_node", None, "node whose process creates or renames it (default: any)",
                                optional(integer(0)), example=0), "node")),
                "a file is created or renamed"),
)
#: the trigger of a spec that names none: every running node HEALTHY
DEFAULT_TRIGGER = {"on_state": "HEALTHY"}
AFTER_PREVIOUS = Key("after_previous", False, "arm the trigger only once the fault before it fired",
                     BOOL)

_TRIGGER_KEYS = {key.name: form for form in TRIGGERS for key, _ in form.fields}


class _SpecKeys(Set[str]):
    """Every key a fault spec may have, read from the rows at each use (so a kind added
    with ``add_kind`` brings its keys to every copy of this set)."""

    def _now(self) -> frozenset[str]:
        return frozenset({"kind", AFTER_PREVIOUS.name} | {p.name for row in FAULT_KINDS.values() for p in row.params}
                         | set(_TRIGGER_KEYS))

    def __contains__(self, key: object) -> bool:
        return key in self._now()

    def __iter__(self) -> Iterator[str]:
        return iter(self._now())

    def __len__(self) -> int:
        return len(self._now())

    def __repr__(self) -> str:
        return f"SPEC_KEYS({', '.join(sorted(self))})"


SPEC_KEYS: Set[str] = _SpecKeys()


def keys_of(kind: str) -> tuple[str, ...]:
    """Every key a spec of ``kind`` may have, in documentation order."""
    return (("kind",) + tuple(p.name for p in FAULT_KINDS[kind].params)
            + tuple(_TRIGGER_KEYS) + (AFTER_PREVIOUS.name,))


def _spec_key(kind: str, name: str) -> Key:
    if name == AFTER_PREVIOUS.name:
        return AFTER_PREVIOUS
    for param in FAULT_KINDS[kind].params:
        if param.name == name:
            return param
    form = _TRIGGER_KEYS[name]
    return next(key for key, _ in form.fields if key.name == name)


def check_fault_spec(spec: Mapping[str, Any]) -> None:
    """Raise ``ConfigError`` (one line) unless ``spec`` is a valid fault spec (old
    spellings pass, with a DeprecationWarning: ``modern_spec``)."""
    if not isinstance(spec, Mapping):  # ``fault = [1]``, ``[["x"]]``: no table at all
        raise ConfigError("fault", spec, "must be a table like {kind = \"kill_worker\", ...}")
    spec = modern_spec(spec)
    kind = spec.get("kind")
    if not isinstance(kind, str) or kind not in FAULT_KINDS:  # a list kind is unhashable
        raise ConfigError("kind", kind, f"must be one of {', '.join(FAULT_KINDS)}")
    allowed = keys_of(kind)
    unknown = sorted(set(spec) - set(allowed))
    if unknown:
        raise ConfigError("kind", kind, f"takes no key(s) {unknown}; its keys: {', '.join(allowed)}")
    for name, value in spec.items():
        if name != "kind":
            _spec_key(kind, name).validate(value)
    forms = [form for form in TRIGGERS if any(key.name in spec for key, _ in form.fields)]
    if len(forms) > 1:
        raise ConfigError("trigger", sorted(f.key for f in forms),
                          f"must be one of {', '.join(f.key for f in TRIGGERS)}, not several")
    for form in forms:
        if form.key not in spec:
            extra = [key.name for key, _ in form.fields if key.name in spec]
            raise ConfigError(extra[0], spec[extra[0]], f"needs {form.key}= (it qualifies that trigger)")


def trigger_form(spec: Mapping[str, Any]) -> TriggerForm | None:
    """The trigger a (checked) spec names; None: it names none (``DEFAULT_TRIGGER``)."""
    return next((form for form in TRIGGERS if form.key in spec), None)


def needs_of(spec: Mapping[str, Any]) -> frozenset[str]:
    """What a fault spec needs of the machine (``NEEDS``): its kind's ``needs`` and those of
    each key it sets to a true value (``lose_unsynced = true``, an ``on_file`` trigger)."""
    row = FAULT_KINDS.get(event_kind(spec.get("kind")))
    keys = {p.name: p for p in row.params} if row is not None else {}
    keys.update({key.name: key for form in TRIGGERS for key, _ in form.fields})
    return frozenset(row.needs if row is not None else ()) | {
        key.needs for name, key in keys.items() if key.needs and spec.get(name)}


# -- chaos kinds (--elastic-faults) ---------------------------------------------------------

#: chaos kind -> its row (kept by ``add_kind``: one dict, updated in place)
CHAOS_KINDS: dict[str, FaultKind] = {}
#: --elastic-faults names that stand for several kinds (chaos kind groups: "scale" is both directions)
CHAOS_ALIASES: dict[str, tuple[str, ...]] = {"scale": ("remove_node", "add_node")}
#: every --elastic-faults name (``add_kind`` rebinds it: read it as ``schema.CHAOS_CHOICES``)
CHAOS_CHOICES: tuple[str, ...] = ()
DEFAULT_CHAOS_KINDS: tuple[str, ...] = ("kill_worker",)
#: the --elastic-faults name of every chaos kind at once (each job then draws those it can survive)
EVERY_CHAOS_KIND = "all"


def _derive() -> None:
    """The chaos tables, made again from ``FAULT_KINDS`` whenever a kind is added or
    removed, so that ``--elastic-faults`` and chaos see the kinds registered at run time."""
    global CHAOS_CHOICES
    CHAOS_KINDS.clear()
    CHAOS_KINDS.update({row.chaos: row for row in FAULT_KINDS.values() if row.chaos})
    CHAOS_CHOICES = tuple(CHAOS_KINDS) + tuple(CHAOS_ALIASES) + (EVERY_CHAOS_KIND,)


_derive()


def parse_chaos_kinds(text: str | None) -> tuple[str, ...]:
    """``"kill_worker,scale"`` -> ``("kill_worker", "remove_node", "add_node")``; empty:
    the default kinds. Old names pass, with a DeprecationWarning naming the new one."""
    names = [k.strip() for k in (text or "").split(",") if k.strip()]
    if not names:
        return DEFAULT_CHAOS_KINDS
    unknown = [k for k in names if k not in CHAOS_CHOICES and k not in RENAMED_CHAOS_KINDS]
    if unknown:
        raise ConfigError("--elastic-faults", text, _unknown_kinds(unknown))
    expanded: list[str] = []
    for name in names:
        if name in RENAMED_CHAOS_KINDS:
            deprecated(name, RENAMED_CHAOS_KINDS[name], "chaos kind")
            name = RENAMED_CHAOS_KINDS[name]
        expanded.extend(CHAOS_KINDS if name == EVERY_CHAOS_KIND else CHAOS_ALIASES.get(name, (name,)))
    return tuple(dict.fromkeys(expanded))


def _unknown_kinds(unknown: list[str]) -> str:
    aliases = "; ".join([*(f"{a} = {' + '.join(k)}" for a, k in CHAOS_ALIASES.items()),
                         f"{EVERY_CHAOS_KIND} = every kind"])
    return f"names unknown fault kind(s) {unknown}; choose from {', '.join(CHAOS_CHOICES)} ({aliases})"


# -- checking tables -----------------------------------------------------------------------


def check_cluster_keywords(values: Mapping[str, Any]) -> None:
    """Raise ``ConfigError`` for the first bad ``harness.Cluster(...)`` keyword, naming it
    as the caller wrote it (``nnodes='3:1' must be ... (from Cluster(nnodes=...))``)."""
    for key in CLUSTER_OPTIONS:
        if key.name in values and key.check is not None and not key.check(values[key.name]):
            raise ConfigError(key.name, values[key.name], key.check.says, f"Cluster({key.name}=...)")


def check_fields(owner: str, fields: Iterable[tuple[str, Key, Any]]) -> None:
    """Raise ``ConfigError`` for the first (field, key, value) whose value fails the key's
    check: ``node='a' must be an int >= 0; e.g. WorkerCrash(node=0)`` (``owner``: the class,
    whose constructor the fix spells; enums are checked by value)."""
    for name, key, value in fields:
        if key.check is not None and not key.check(getattr(value, "value", value)):
            raise ConfigError(name, value, f"{key.check.says}; e.g. {owner}({name}={key.good_value()!r})")


def check_options(values: Mapping[str, Any], keys: Iterable[Key], where: str) -> list[str]:
    """One line per unknown key or bad value of ``values`` (``where``: e.g. ``[job]``)."""
    known = {key.name: key for key in keys}
    unknown = sorted(set(values) - set(known))
    problems = [f"{where} has unknown key(s) {unknown}; known: {', '.join(known)}"] if unknown else []
    for name, value in values.items():
        if name in known:
            try:
                known[name].validate(value)
            except ConfigError as e:
                problems.append(f"{where} {e}")
    return problems


def check_scenario(data: Mapping[str, Any]) -> list[str]:
    """Every problem of a parsed scenario file, one line each (empty: it is valid)."""
    job = data.get("job")
    if not isinstance(job, dict):
        return ["missing [job] table"]
    problems = []
    unknown = sorted(set(data) - set(SCENARIO_TABLES))
    if unknown:
        problems.append(f"unknown table(s) {unknown}; known: {', '.join(SCENARIO_TABLES)}")
    if ("script" in job) == ("module" in job):
        problems.append("[job] needs exactly one of script= or module=")
    problems += check_options(job, SCENARIO_JOB_OPTIONS, "[job]")
    expect = data.get("expect", {})
    if not isinstance(expect, dict):
        problems.append("[expect] must be a table")
    else:
        problems += check_options(expect, EXPECT_KEYS, "[expect]")
        if expect.get("same_as_golden") and (expect.get("diverges") or "diverges_at_step" in expect):
            problems.append("[expect] same_as_golden and diverges contradict each other: a run is judged one or the "
                            "other")
    faults = data.get("fault", [])
    if not isinstance(faults, list):
        return problems + ["fault must be an array of tables: [[fault]]"]
    for i, spec in enumerate(faults):
        try:
            check_fault_spec(spec)
        except ConfigError as e:
            problems.append(f"[[fault]] #{i + 1}: {e}")
    return problems


# -- documentation, generated ------------------------------------------------------------


def marker_signature() -> str:
    """``elastic(nnodes='1', ...)`` as ``pytest --markers`` shows it. pytest splits a marker
    line at its first ':', so no default may be shown with one (``Key.shown``)."""
    args = ", ".join(f"{k.name}={k.shown or repr(k.default)}" for k in MARKER_OPTIONS)
    return f"elastic({args})"


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + " }"
    return repr(value)


def _line(key: Key, value: Any) -> str:
    default = "" if key.default is None else f" (default {_toml(key.default)})"
    text = f"{key.name} = {_toml(value)}"
    return f"{text:<39} # {key.doc}{default}"


def _doc_value(key: Key) -> Any:
    return key.example if key.default is None or key.example is not None else key.default


def scenario_reference() -> str:
    """Every key of a scenario file with its default and meaning, as a TOML scenario that
    is itself valid (``check_scenario``): one ``[[fault]]`` per fault kind, then one per
    trigger form. ``module`` is shown commented out (a job has a script or a module)."""
    lines = ['description = "what this scenario shows (free text)"', "", "[job]"]
    for key in SCENARIO_JOB_OPTIONS:
        line = _line(key, _doc_value(key))
        lines.append("# " + line if key.name == "module" else line)
    for row in FAULT_KINDS.values():
        chaos = f"; chaos kind {row.chaos!r}" if row.chaos else ""
        lines += ["", f"[[fault]]                               # {row.doc}{chaos}",
                  f"kind = {_toml(row.kind)}"]
        lines += [_line(p, _doc_value(p)) for p in row.params]
    for form in TRIGGERS:
        lines += ["", f"[[fault]]                               # trigger: {form.doc}",
                  'kind = "kill_worker"']
        lines += [_line(key, _doc_value(key)) for key, _ in form.fields]
        if form is TRIGGERS[-1]:
            lines.append(_line(AFTER_PREVIOUS, True))
    lines += ["", "# no trigger key: when every running node is HEALTHY "
              f"({', '.join(f'{k} = {_toml(v)}' for k, v in DEFAULT_TRIGGER.items())})",
              "", "[expect]                                # each key is optional"]
    lines += [_line(key, _doc_value(key)) for key in EXPECT_KEYS]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # python -m harness.sim.schema: the scenario reference
    print(scenario_reference(), end="")

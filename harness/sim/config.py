"""``ClusterConfig``: a cluster's settings, frozen, checked once by the schema.

Every door that makes a cluster builds one: ``Cluster(**keywords)``, the pytest marker, a
scenario's ``[job]``, and the fault-free twin (``Cluster.fault_free_copy``: the same config
with chaos off and golden on, ``dataclasses.replace``). Its fields are ``CLUSTER_OPTIONS``
(``harness.sim.schema``) in order, with the schema's defaults, but for ``pool``: a live
object a cluster shares or owns, never a setting (``Cluster.from_config(config, pool=...)``).
``tests/unit/test_cluster_config.py`` pins the fields and defaults to the schema.

What the config holds is what was asked: ``network="auto"`` stays ``"auto"`` (the cluster
resolves it on its machine: ``Cluster.network``); ``env`` and ``rdzv_conf`` are read-only
copies (``types.MappingProxyType``: ``{**config.env}`` and ``.get()`` work as on a dict;
None becomes empty), ``gpus`` a tuple when ids are given; ``hosts`` a tuple of
``harness.hosts.HostSpec`` (a URL given is parsed: one ``ConfigError`` line naming it) and
``placement`` a tuple; ``min_nodes``/``max_nodes`` are derived from ``nnodes``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from harness.errors import ConfigError
from harness.sim.schema import CLUSTER_OPTIONS, check_cluster_keywords

if TYPE_CHECKING:
    from harness.sim.faults.chaos import ChaosConfig

__all__ = ["ClusterConfig", "NOT_CONFIG"]

#: ``Cluster`` keywords that are no setting of the config, and why
NOT_CONFIG: dict[str, str] = {
    "pool": "a live WarmPool the cluster shares or owns (Cluster.from_config(config, pool=...))",
}

_DEFAULTS = {key.name: key.default for key in CLUSTER_OPTIONS}


def _default(name: str) -> Any:
    return _DEFAULTS[name]


@dataclass(frozen=True)
class ClusterConfig:
    """A cluster's settings: ``harness.Cluster``'s keywords but ``pool``, checked when made
    (``ConfigError``: ``nnodes='3:1' must be ... (from Cluster(nnodes=...))``). A new
    ``Cluster`` keyword is a ``Key`` in ``CLUSTER_OPTIONS`` plus its one typed line here."""

    nnodes: str | int = _default("nnodes")
    nproc_per_node: int = _default("nproc_per_node")
    max_restarts: int = _default("max_restarts")
    rdzv_backend: str = _default("rdzv_backend")
    monitor_interval: float = _default("monitor_interval")
    start_method: str = _default("start_method")
    #: extra environment of every worker (read-only; None given: empty)
    env: Mapping[str, str] = _default("env")
    #: extra rendezvous settings (read-only; None given: empty)
    rdzv_conf: Mapping[str, Any] = _default("rdzv_conf")
    shutdown_timeout: float = _default("shutdown_timeout")
    store_host: str = _default("store_host")
    seed: int = _default("seed")
    exit_barrier_timeout: float = _default("exit_barrier_timeout")
    check_invariants: bool = _default("check_invariants")
    #: a seeded fault schedule per job (None: no chaos)
    chaos: ChaosConfig | None = _default("chaos")
    #: None: detect; a count; or device ids (a tuple)
    gpus: int | Sequence[str | int] | None = _default("gpus")
    #: as asked: "auto", "netns" or "loopback" (``Cluster.network``: what it resolved to)
    network: str = _default("network")
    golden: bool = _default("golden")
    golden_rtol: float = _default("golden_rtol")
    #: the hosts nodes run on, each a ``harness.hosts.HostSpec`` (a URL given is parsed); None: this machine
    hosts: Sequence[Any] | None = _default("hosts")
    #: node i's host index (None: round robin over ``hosts``)
    placement: Sequence[int] | None = _default("placement")
    #: the Slurm allocation nodes run in (a ``harness.hosts.SlurmSpec``; a dict given is checked
    #: into one); None: not on Slurm
    slurm: Any = _default("slurm")
    #: from ``nnodes``: the fewest and most nodes of a job
    min_nodes: int = field(init=False, repr=False, compare=False)
    max_nodes: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_cluster_keywords(self.keywords())  # each through its schema key, named as written
        from harness.run import parse_min_max_nnodes

        low, high = parse_min_max_nnodes(str(self.nnodes))  # checked above: cannot fail
        frozen = {"min_nodes": low, "max_nodes": high,
                  "env": MappingProxyType(dict(self.env or {})),
                  "rdzv_conf": MappingProxyType(dict(self.rdzv_conf or {}))}
        if isinstance(self.gpus, list):
            frozen["gpus"] = tuple(self.gpus)
        if self.hosts is not None:
            if self.gpus is not None:
                raise ConfigError("gpus", self.gpus, "is this machine's: with hosts, each host's own are split "
                                  "(gpus in its spec, the hosts file's gpus = N)", "Cluster(hosts=...)")
            frozen["hosts"] = specs = _host_specs(self.hosts)
            frozen["placement"] = _placement(specs, self.placement, high)
        elif self.placement is not None:
            raise ConfigError("placement", self.placement, "places nodes on hosts: give hosts= too",
                              "Cluster(placement=...)")
        if self.slurm is not None:
            if self.hosts is not None:
                raise ConfigError("slurm", "...", "and hosts= are two places for the same nodes: give one",
                                  "Cluster(slurm=...)")
            if self.gpus is not None:
                raise ConfigError("gpus", self.gpus, "is this machine's: on Slurm the nodes' own are used",
                                  "Cluster(slurm=...)")
            frozen["slurm"] = _slurm_spec(self.slurm)
        for name, value in frozen.items():
            object.__setattr__(self, name, value)  # frozen: set once, here

    def keywords(self) -> dict[str, Any]:
        """The settings as ``Cluster`` keywords (``Cluster(**config.keywords(), pool=...)``)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.init}


def _slurm_spec(slurm: Any) -> Any:
    """``slurm`` as a ``harness.hosts.SlurmSpec`` (a dict's fields checked: one line naming
    a bad one)."""
    from harness.hosts import SlurmSpec, slurm_spec

    return slurm if isinstance(slurm, SlurmSpec) else slurm_spec("Cluster(slurm=...)", **slurm)


def _host_specs(hosts: Sequence[Any]) -> tuple[Any, ...]:
    """Each host as a ``HostSpec`` (``parse_host`` for a URL: one ``ConfigError`` line naming it)."""
    from harness.hosts import HostSpec, parse_host

    specs = []
    for index, host in enumerate(hosts):
        if isinstance(host, str):
            host = parse_host(host, source=f"Cluster(hosts=...)[{index}]")  # one line naming the field
        elif not isinstance(host, HostSpec):
            raise ConfigError(f"hosts[{index}]", host, "must be a harness.hosts.HostSpec or an ssh:// URL",
                              "Cluster(hosts=...)")
        specs.append(host)
    return tuple(specs)


def _placement(hosts: tuple[Any, ...], placement: Sequence[int] | None, nodes: int) -> tuple[int, ...] | None:
    """``placement`` checked against the hosts and the job's most nodes, in one line; a
    node here beside nodes on hosts is not done yet (the schema takes host indexes only).
    Every rendezvous works with hosts: the harness's store or etcd, reached through each
    host's connection, or node 0's store on its host."""
    from harness.hosts import place

    where = "Cluster(placement=...)"
    if placement is None:
        return None
    for node, index in enumerate(placement):  # the schema took ints >= 0 (a node here beside hosts: not yet)
        if index >= len(hosts):
            raise ConfigError(f"placement[{node}]", index, f"must be a host index in [0, {len(hosts) - 1}] "
                              f"({len(hosts)} hosts)", where)
    place(nodes, hosts, placement, where)  # one index per node
    return tuple(placement)

"""``ClusterConfig`` (harness.sim.config): a cluster's settings, frozen and checked once by
the schema; and the runtime's one rule per setting that every door uses (``max_restarts``
was checked in four places, three ways). No processes: a ``Cluster`` made here never
launches (network="loopback": no probe either)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from harness.agent import MAX_RESTARTS_RULE, MONITOR_INTERVAL_RULE, WorkerSpec
from harness.errors import ConfigError
from harness.launch import LaunchConfig
from harness.sim import schema
from harness.sim.config import NOT_CONFIG, ClusterConfig


def test_the_config_fields_are_the_cluster_options_with_their_defaults():
    """A new Cluster keyword is a Key in CLUSTER_OPTIONS plus one typed line in ClusterConfig
    (its default read from the Key): this fails until both agree, in order."""
    options = [key for key in schema.CLUSTER_OPTIONS if key.name not in NOT_CONFIG]
    fields = [f for f in dataclasses.fields(ClusterConfig) if f.init]
    assert [f.name for f in fields] == [key.name for key in options]
    assert [f.default for f in fields] == [key.default for key in options]
    assert set(NOT_CONFIG) <= {key.name for key in schema.CLUSTER_OPTIONS}
    derived = {f.name for f in dataclasses.fields(ClusterConfig) if not f.init}
    assert derived == {"min_nodes", "max_nodes"}


def test_a_cluster_is_made_of_its_config_and_from_one():
    from harness import Cluster

    with Cluster(nnodes="1:3", nproc_per_node=2, max_restarts=1, env={"A": "1"}, network="loopback") as cluster:
        assert cluster.config == ClusterConfig(nnodes="1:3", nproc_per_node=2, max_restarts=1, env={"A": "1"},
                                               network="loopback")
        assert (cluster.config.min_nodes, cluster.config.max_nodes, cluster.network) == (1, 3, "loopback")
        with Cluster.from_config(cluster.config, pool=cluster.pool) as other:
            assert other.config is cluster.config and other.pool is cluster.pool
    with pytest.raises(ConfigError, match=r"^config=\{'nnodes': 2\} must be a harness.ClusterConfig$"):
        Cluster.from_config({"nnodes": 2})


def test_the_config_is_frozen_and_holds_read_only_copies_of_its_tables():
    env, conf, gpus = {"A": "1"}, {"join_timeout": 5}, ["0", 1]
    config = ClusterConfig(env=env, rdzv_conf=conf, gpus=gpus)
    env["A"], conf["join_timeout"] = "changed", 99
    gpus.append(2)
    assert (dict(config.env), dict(config.rdzv_conf), config.gpus) == ({"A": "1"}, {"join_timeout": 5}, ("0", 1))
    with pytest.raises(TypeError):
        config.env["B"] = "2"
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.max_restarts = 5
    # usable where a dict was: merged, read, copied
    assert {**config.env, "B": "2"} == {"A": "1", "B": "2"} and config.rdzv_conf.get("join_timeout") == 5
    assert ClusterConfig().env == {} and ClusterConfig(env=None) == ClusterConfig(env={})


def test_replace_keeps_the_rest_and_checks_again():
    config = ClusterConfig(nnodes="2:4", env={"A": "1"}, store_host="node0", gpus=0)
    twin = dataclasses.replace(config, golden=True)  # the tables go through the check as they are
    assert twin.keywords() == {**config.keywords(), "golden": True}
    assert (twin.min_nodes, twin.max_nodes) == (2, 4)
    with pytest.raises(ConfigError) as info:
        dataclasses.replace(config, max_restarts=-1)
    assert str(info.value) == "max_restarts=-1 must be an int >= 0 (from Cluster(max_restarts=...))"


@pytest.mark.parametrize("nnodes, low, high", [(1, 1, 1), (3, 3, 3), ("2", 2, 2), ("1:4", 1, 4)])
def test_min_and_max_nodes_come_from_nnodes(nnodes, low, high):
    config = ClusterConfig(nnodes=nnodes)
    assert (config.nnodes, config.min_nodes, config.max_nodes) == (nnodes, low, high)


def test_a_bad_setting_is_one_line_naming_the_keyword():
    with pytest.raises(ConfigError) as info:
        ClusterConfig(nnodes="3:1")
    assert str(info.value) == "nnodes='3:1' must be N or 'MIN:MAX' with 1 <= MIN <= MAX (from Cluster(nnodes=...))"
    with pytest.raises(TypeError):
        ClusterConfig(pool=None)  # a live object, never a setting


# -- one rule per setting, whichever door -------------------------------------------------


def _doors(name: str, value: object) -> dict[str, object]:
    """What each door says of ``name=value``: the constraint of its ConfigError, or "ok"."""
    makers = {
        "WorkerSpec": lambda: WorkerSpec(role="r", local_world_size=1, rdzv_handler=None, entrypoint="python",
                                         **{name: value}),
        "LaunchConfig": lambda: LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=1, shutdown_timeout=1.0,
                                             **{name: value}),
        "ClusterConfig": lambda: ClusterConfig(**{name: value}),
    }
    said: dict[str, object] = {}
    for door, make in makers.items():
        try:
            make()
            said[door] = "ok"
        except ConfigError as e:
            said[door] = e.constraint
    return said


@pytest.mark.parametrize("value", [-1, 1.5, True, "3", None, 0, 3])
def test_every_door_takes_max_restarts_by_the_one_rule(value):
    """LaunchConfig took True and crashed on "3" (TypeError); WorkerSpec took True."""
    expected = "ok" if MAX_RESTARTS_RULE(value) else MAX_RESTARTS_RULE.says
    assert _doors("max_restarts", value) == dict.fromkeys(("WorkerSpec", "LaunchConfig", "ClusterConfig"), expected)
    assert MAX_RESTARTS_RULE(value) == (value in (0, 3))


@pytest.mark.parametrize("value", [0, -1, 7200, 1e28, math.inf, math.nan, True, "0.1", 0.1, 5, 3600])
def test_every_door_takes_monitor_interval_by_the_one_rule(value):
    """The schema took 7200 s, which every node agent's LaunchConfig then refused."""
    expected = "ok" if MONITOR_INTERVAL_RULE(value) else MONITOR_INTERVAL_RULE.says
    assert _doors("monitor_interval", value) == dict.fromkeys(("WorkerSpec", "LaunchConfig", "ClusterConfig"),
                                                              expected)
    assert MONITOR_INTERVAL_RULE(value) == (value in (0.1, 5, 3600))


def test_the_schema_keys_are_the_runtime_rules():
    keys = {key.name: key for key in schema.CLUSTER_OPTIONS}
    for rule in (MAX_RESTARTS_RULE, MONITOR_INTERVAL_RULE):
        assert keys[rule.name].check is not None
        assert (keys[rule.name].check.test, keys[rule.name].check.says) == (rule.test, rule.says)


# -- hosts and placement ----------------------------------------------------------------


def test_hosts_are_parsed_once_into_specs_and_placement_frozen():
    from harness.hosts import HostSpec

    spec = HostSpec(address="10.0.0.7", user="ci", python="/opt/py")
    config = ClusterConfig(nnodes="1:3", hosts=["ssh://ci@10.0.0.5:2222", spec], placement=[1, 0, 1])
    assert [h.label for h in config.hosts] == ["ci@10.0.0.5:2222", "ci@10.0.0.7:22"]
    assert config.hosts[1] is spec and config.placement == (1, 0, 1)
    from harness.sim.places import place_of

    assert place_of(config).name == "hosts" and place_of(ClusterConfig()).name == "here"
    assert dataclasses.replace(config, golden=True).hosts == config.hosts  # the twin: checked again, the same


@pytest.mark.parametrize("keywords, message", [
    ({"hosts": "ssh://ci@10.0.0.5"},
     "hosts='ssh://ci@10.0.0.5' must be a non-empty list of hosts: \"ssh://user@address[:port]\" or "
     "harness.hosts.HostSpec (or None) (from Cluster(hosts=...))"),
    ({"hosts": []}, "hosts=[] must be a non-empty list of hosts: "),
    ({"hosts": ["ci@10.0.0.5"]}, "hosts=['ci@10.0.0.5'] must be a non-empty list of hosts: "),
    ({"hosts": ["ssh://ci@10.0.0.5:x"]},
     "host='ssh://ci@10.0.0.5:x' must be ssh://user@address[:port] (bad port) (from Cluster(hosts=...)[0])"),
    ({"hosts": ["ssh://10.0.0.5"]},
     "host='ssh://10.0.0.5' must be ssh://user@address[:port] (no user) (from Cluster(hosts=...)[0])"),
    ({"nnodes": 2, "hosts": ["ssh://ci@a", "ssh://ci@b"], "placement": [0, 2]},
     "placement[1]=2 must be a host index in [0, 1] (2 hosts) (from Cluster(placement=...))"),
    ({"nnodes": 2, "hosts": ["ssh://ci@a"], "placement": [0]},
     "placement=[0] must give one host index per node: 2 nodes, 1 given (from Cluster(placement=...))"),
    ({"nnodes": 2, "hosts": ["ssh://ci@a"], "placement": [0, None]},
     "placement=[0, None] must be a list of host indexes (ints >= 0), one per node (or None) "
     "(from Cluster(placement=...))"),
    ({"placement": [0]}, "placement=[0] places nodes on hosts: give hosts= too (from Cluster(placement=...))"),
])
def test_bad_hosts_or_placement_is_one_line_naming_the_keyword(keywords, message):
    with pytest.raises(ConfigError) as info:
        ClusterConfig(**keywords)
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


def test_only_a_script_or_a_module_runs_on_hosts():
    """A callable would have to be pickled to the host: refused at launch, in one line,
    before any host is reached (none is reachable here)."""
    from harness import Cluster

    with Cluster(nnodes=2, hosts=["ssh://ci@198.18.255.254"], network="loopback") as cluster:
        with pytest.raises(ConfigError) as info:
            cluster.launch(print)
    assert str(info.value) == (f"entrypoint={print!r} must be a script path or a module (module=True) with hosts: "
                               "a node on a host gets its entrypoint as JSON, never a pickled callable")

"""The Slurm file and ``Cluster(slurm=...)``'s fields: each checked by its row, a bad one a
single ``ConfigError`` line naming the field and where it came from."""

from __future__ import annotations

import pytest

from harness.errors import ConfigError
from harness.hosts import SlurmSpec, load_slurm, slurm_spec


def test_a_slurm_file_gives_its_spec(tmp_path):
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=x\n")
    (tmp_path / "slurm.toml").write_text(
        '[slurm]\ncontroller_address = "198.18.0.1"\npartition = "gpu-staging"\naccount = "ml-infra"\n'
        'time_limit = "0:30:00"\nnodes = 4\npython = "/opt/venv/bin/python"\ncapabilities = ["netns", "cgroups"]\n'
        'slurm_conf = "slurm.conf"\nclient_prefix = ["nsenter", "--net=/run/netns/ctl"]\n')
    spec = load_slurm(tmp_path / "slurm.toml")
    assert spec == SlurmSpec(controller_address="198.18.0.1", partition="gpu-staging", account="ml-infra",
                             time_limit="0:30:00", nodes=4, python="/opt/venv/bin/python",
                             capabilities=frozenset({"netns", "cgroups"}), slurm_conf=str(conf),
                             client_prefix=("nsenter", "--net=/run/netns/ctl"))


@pytest.mark.parametrize("fields, message", [
    ({}, "controller_address=None is required"),
    ({"controller_address": "198.18.0.1", "nodes": 0}, "nodes=0 must be an int >= 1"),
    ({"controller_address": "198.18.0.1", "time_limit": "soon"}, "time_limit='soon' must be a Slurm time limit"),
    ({"controller_address": "198.18.0.1", "partition": "a b"}, "partition='a b' must be a partition name"),
    ({"controller_address": "198.18.0.1", "job_id": "12x"}, "job_id='12x' must be a Slurm job id"),
    ({"controller_address": "198.18.0.1", "slurm_conf": "/nonexistent/slurm.conf"}, "does not exist"),
    ({"controller_address": "198.18.0.1", "gpus": 2}, "gpus=2 is not a Slurm field"),
    ({"controller_address": "-oProxyCommand=x"}, "controller_address='-oProxyCommand=x' must be the IP address"),
    ({"controller_address": "198.18.0.1", "slurmd_kill": "kill"}, "slurmd_kill='kill' must be a list of strings"),
    ({"controller_address": "198.18.0.1", "slurmd_kill": ["k", "{node}"]}, "needs slurmd_start too"),
    ({"controller_address": "198.18.0.1", "slurmd_start": ["s", "{node}"]}, "needs slurmd_kill too"),
    ({"controller_address": "198.18.0.1", "capabilities": ["slurmd"]}, "must not list 'slurmd'"),
])
def test_a_bad_field_is_one_line_naming_it(fields, message):
    with pytest.raises(ConfigError) as caught:
        slurm_spec("slurm.toml", **fields)
    text = str(caught.value)
    assert message in text and "slurm.toml" in text and "\n" not in text


def test_the_nodes_can_lose_their_slurmd_where_the_file_gives_its_commands():
    """``slurmd`` (what ``kill_slurmd`` needs) is no listed capability: the Slurm file's
    ``slurmd_kill`` and ``slurmd_start`` give it to every node of the allocation; the
    nodes are the scheduler's (``scheduler="slurm"``), which SSH hosts are not."""
    from harness.hosts import stand_ins

    plain = slurm_spec(controller_address="198.18.0.1", capabilities=["slurm_admin"])
    assert plain.node_capabilities == {"slurm_admin"}
    daemon = slurm_spec(controller_address="198.18.0.1", capabilities=["slurm_admin"],
                        slurmd_kill=["ssh", "{node}", "kill"], slurmd_start=["ssh", "{node}", "start"])
    assert daemon.node_capabilities == {"slurm_admin", "slurmd"}
    assert [(h.capabilities, h.scheduler) for h in stand_ins(daemon, 2)] == [({"slurm_admin", "slurmd"}, "slurm")] * 2


@pytest.mark.parametrize("text, message", [
    ("[slurm\n", "is not TOML"),
    ("[hosts]\n", "table='hosts' is not one of a Slurm file's ([slurm])"),
    ('slurm = 3\n', "slurm=3 needs a [slurm] table"),
])
def test_a_bad_file_is_one_line(tmp_path, text, message):
    path = tmp_path / "slurm.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        load_slurm(path)
    with pytest.raises(ConfigError, match="cannot be read"):
        load_slurm(tmp_path / "missing.toml")


def test_the_sessions_place_is_one_value_the_plugin_asks():
    """``--elastic-slurm`` and ``--elastic-hosts`` as the plugin holds them: the keyword a
    cluster takes, the hosts faults are judged by, the header's item, the header line, and
    the rerun of a test there (a Slurm run's rerun named no place before)."""
    from harness.hosts import HostSpec
    from pytest_elastic._places import hosts_option, slurm_option
    from pytest_elastic._replay import reproduction_line, rerun_line
    from pytest_elastic._settings import Settings, hosts_line

    slurm = slurm_option("lab/slurm.toml", SlurmSpec(controller_address="198.18.0.1", partition="debug"))
    settings = Settings(place=slurm, seed=7)
    assert (slurm.keyword, slurm.value.partition) == ("slurm", "debug")
    assert [h.address for h in settings.placed_by_option() or ()] == ["slurm-node0", "slurm-node1"]  # stand-ins
    assert settings.place_option() == "--elastic-slurm" and "slurm=lab/slurm.toml" in settings.header()
    assert hosts_line(settings) == ("elastic: nodes in a Slurm allocation (lab/slurm.toml): the allocation of "
                                    "$SLURM_JOB_ID, else one of its own in partition debug")
    assert rerun_line("t.py::x", settings, False) == "pytest 't.py::x' --elastic-slurm=lab/slurm.toml"
    assert reproduction_line("t.py::x", settings).startswith("pytest 't.py::x' --elastic-slurm=lab/slurm.toml "
                                                              "--elastic-chaos --elastic-seed=7")
    hosts = hosts_option("my hosts.toml", (HostSpec(address="198.18.0.9", user="root"),))
    assert rerun_line("t.py::x", Settings(place=hosts), False) == "pytest 't.py::x' --elastic-hosts='my hosts.toml'"
    assert hosts_line(Settings(place=hosts)) == "elastic: nodes on 1 host(s) of my hosts.toml: root@198.18.0.9:22"
    assert Settings().placed_by_option() is None and hosts_line(Settings()) is None


def test_a_step_that_failed_is_told_by_what_its_command_said_not_by_srun():
    from harness.hosts._errors import last_line

    said = ("cannot bind the wake socket /w/x: its path is 169 bytes\n"
            "srun: error: node0: task 0: Exited with exit code 2\n")
    assert last_line(said) == "cannot bind the wake socket /w/x: its path is 169 bytes"
    assert last_line("srun: error: Unable to create step for job 7\n") == "srun: error: Unable to create step for job 7"
    assert last_line("") == "no output"


def test_a_scenario_job_the_slurm_option_cannot_run_is_skipped_naming_that_option():
    from pytest_elastic import _scenarios

    spec = SlurmSpec(controller_address="198.18.0.1")
    with pytest.raises(pytest.skip.Exception, match=r"the nodes are on hosts \(--elastic-slurm\), and \[job\] "):
        _scenarios._skip_on_hosts({"slurm": spec, "nnodes": "many"}, [], from_option=True)

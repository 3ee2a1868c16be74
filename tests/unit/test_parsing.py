import socket

import pytest

from harness.endpoints import PortReservation, split_endpoint
from harness.errors import ConfigError
from harness.procs import Std
from harness.procs._logs import LogsSpecs, render_prefix
from harness.procs._std import parse_std
from harness.run import determine_local_world_size, parse_min_max_nnodes


@pytest.mark.parametrize("text,expected", [("3", Std.ALL), ("0", Std.NONE), ("1", Std.OUT)])
def test_std_single(text, expected):
    assert parse_std(text, "redirects") == expected


def test_std_per_rank():
    assert parse_std("0:3,1:0", "tee") == {0: Std.ALL, 1: Std.NONE}


@pytest.mark.parametrize("text", ["4", "x", "0:9", "a:1"])
def test_std_bad(text):
    with pytest.raises(ConfigError, match="--"):
        parse_std(text, "redirects")


@pytest.mark.parametrize("text,expected", [("2", (2, 2)), ("1:4", (1, 4))])
def test_nnodes(text, expected):
    assert parse_min_max_nnodes(text) == expected


@pytest.mark.parametrize("text,fragment",
                         [("4:1", "MIN <= MAX"), ("0", "MIN >= 1"), ("a", "integers"), ("1:2:3", "integers")])
def test_nnodes_bad(text, fragment):
    with pytest.raises(ConfigError, match=fragment):
        parse_min_max_nnodes(text)


def test_nproc_per_node_values():
    assert determine_local_world_size("3") == 3
    assert determine_local_world_size("cpu") >= 1
    assert determine_local_world_size("auto") >= 1
    with pytest.raises(ConfigError, match="nproc_per_node=0 must be >= 1"):
        determine_local_world_size("0")
    with pytest.raises(ConfigError, match="'cpu', 'gpu' or 'auto'"):
        determine_local_world_size("many")


@pytest.mark.parametrize("endpoint,expected", [
    ("host", ("host", 29400)), ("host:1234", ("host", 1234)), ("[::1]:5", ("::1", 5)), ("[::1]", ("::1", 29400)),
    ("::1", ("::1", 29400)),
])
def test_split_endpoint(endpoint, expected):
    assert split_endpoint(endpoint, 29400) == expected


@pytest.mark.parametrize("endpoint", ["", ":80", "h:99999", "h:x", "[::1"])
def test_split_endpoint_bad(endpoint):
    with pytest.raises(ValueError):
        split_endpoint(endpoint, 1)


def test_port_reservation_keeps_port_from_others_but_store_can_bind():
    with PortReservation() as reservation:
        seen = set()
        for _ in range(300):
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                seen.add(s.getsockname()[1])
        assert reservation.port not in seen
        with socket.socket() as server:  # what TCPStore does: SO_REUSEADDR, bind, listen
            server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            server.bind(("127.0.0.1", reservation.port))
            server.listen()


def test_prefix_template():
    assert render_prefix(None, "trainer", 5, 1) == "[trainer1]:"
    assert render_prefix("${role_name}/${rank}/${local_rank}|", "r", 7, 2) == "r/7/2|"


def test_logs_layout_and_cleanup(tmp_path):
    specs = LogsSpecs(log_dir=str(tmp_path), redirects=Std.OUT, tee={1: Std.ERR})
    logs = specs.reify("run", 2, "role", {0: 0, 1: 1}, None)
    assert logs.attempt_dir.endswith("attempt_2")
    r0, r1 = logs.ranks[0], logs.ranks[1]
    assert r0.stdout_file.endswith("0/stdout.log") and r0.stderr_file is None
    assert r1.stderr_file.endswith("1/stderr.log") and r1.tee == Std.ERR
    specs.cleanup()
    assert (tmp_path / logs.attempt_dir).exists()  # a user's log dir is kept

    owned = LogsSpecs()
    root = owned.root("r")
    owned.cleanup()
    import os
    assert not os.path.exists(root)

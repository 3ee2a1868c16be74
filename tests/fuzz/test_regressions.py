"""The bugs the fuzz suite found, each pinned by the input that found it (the fuzz
sequence changes whenever a generator does; these stay)."""

from __future__ import annotations

import signal

import pytest

from harness.errors import ConfigError
from harness.procs._logs import LogsSpecs
from harness.procs._std import parse_std
from harness.run import _parse_signals, determine_local_world_size, get_args_parser
from tests.conftest import SCRIPTS, run_elastic


def test_usage_error_is_one_line() -> None:
    """argparse printed its 23-line usage block before the error (``--max-restarts``
    with no value, elastic-run flags case 0)."""
    result = run_elastic("--max-restarts", timeout=30)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1, result.stderr
    assert "--max-restarts" in result.stderr and "--help" in result.stderr


def test_usage_error_escapes_line_breaks_in_arguments() -> None:
    result = run_elastic("--bogus\nsecond", str(SCRIPTS / "sleeper.py"), timeout=30)
    assert result.returncode != 0
    assert result.stderr.count("\n") == 1, result.stderr


@pytest.mark.parametrize("text", ["SIGKILL", "SIGTERM,SIGSTOP"])
def test_uncatchable_signal_is_a_config_error(text: str) -> None:
    """``--signals-to-handle SIGKILL`` raised OSError(EINVAL) out of signal.signal()."""
    with pytest.raises(ConfigError, match="no process can catch"):
        _parse_signals(text)
    assert _parse_signals("SIGTERM, SIGHUP") == [signal.SIGTERM, signal.SIGHUP]


@pytest.mark.parametrize("text", ["²", "①", "--5"])
def test_nproc_per_node_digits_int_refuses(text: str) -> None:
    """``--nproc-per-node=²`` passed isdigit() and raised ValueError from int()."""
    with pytest.raises(ConfigError, match="nproc_per_node"):
        determine_local_world_size(text)
    assert determine_local_world_size(" 3 ") == 3


@pytest.mark.parametrize("text", ["①", "²:1", "0:²", "٣:4"])
def test_std_digits_int_refuses(text: str) -> None:
    """``--redirects ①`` passed isdigit() and raised ValueError from int()."""
    with pytest.raises(ConfigError, match="--redirects"):
        parse_std(text, "redirects")
    assert parse_std("٣:3", "redirects") == {3: 3}  # Arabic-Indic digits are decimal: int() takes them


def test_pet_flag_with_a_digit_int_refuses(monkeypatch: pytest.MonkeyPatch) -> None:
    """``PET_STANDALONE=²`` raised ValueError while the parser was being built."""
    monkeypatch.setenv("PET_STANDALONE", "²")
    assert get_args_parser().parse_args(["x.py"]).standalone is False


def test_log_dir_that_cannot_exist_is_a_config_error(tmp_path) -> None:
    """``--log-dir`` past NAME_MAX raised OSError(ENAMETOOLONG) as a traceback from the
    agent's first attempt (elastic-run end-to-end case 5)."""
    for bad in (tmp_path / ("x" * 300), tmp_path / "file" / "sub"):
        (tmp_path / "file").write_text("")
        with pytest.raises(ConfigError, match="--log-dir"):
            LogsSpecs(log_dir=str(bad)).root("run")


@pytest.mark.parametrize("fault", [1, "kill_worker", ["x"], {"kind": ["kill_worker"]}, {"kind": {}}])
def test_fault_that_is_not_a_table_is_refused_in_one_line(fault: object) -> None:
    """``fault = [..., "SUCCEEDED"]`` raised AttributeError ('str' has no 'get') and a
    list ``kind`` raised TypeError (unhashable) from check_fault_spec (scenario case 3,
    schedule case 16)."""
    from harness.sim.schema import check_fault_spec, check_scenario

    with pytest.raises(ConfigError):
        check_fault_spec(fault)  # type: ignore[arg-type]
    problems = check_scenario({"job": {"script": "x.py"}, "fault": [fault]})
    assert len(problems) == 1 and "[[fault]] #1" in problems[0]


def test_schedule_nested_past_the_decoder_is_refused() -> None:
    """``--elastic-schedule='[[[[...]]]]'`` raised RecursionError (schedule case 17)."""
    from pytest_elastic._settings import parse_schedule

    with pytest.raises(ValueError, match="not JSON"):
        parse_schedule("[" * 100_000 + "]" * 100_000)


def test_scenario_nested_past_the_parser_is_refused() -> None:
    """``deep = [[[[...]]]]`` in a scenario raised RecursionError out of tomllib at
    collection (scenario case 14)."""
    from pytest_elastic._scenarios import _parse

    with pytest.raises(ValueError, match="not valid TOML"):
        _parse("deep = " + "[" * 5000 + "]" * 5000)


def test_nnodes_digit_that_int_refuses() -> None:
    """``nnodes = "²"`` passed isdigit() in the schema's check, then int() raised
    (scenario case 7055 of seed 5)."""
    from harness.sim.schema import check_scenario

    problems = check_scenario({"job": {"script": "x.py", "nnodes": "²"}})
    assert len(problems) == 1 and "nnodes" in problems[0]


def test_chaos_schedule_is_bounded_whatever_the_restart_budget() -> None:
    """A scenario with ``max_restarts = 9223372036854775807`` drew that many chaos faults
    (seed 2 of the scenario fuzz ran out of memory)."""
    from harness.sim.faults.chaos import MAX_FAULTS, generate_schedule

    schedule = generate_schedule(1, ("kill_worker",), 1, 1, 1, 2**63 - 1)
    assert 1 <= len(schedule) <= MAX_FAULTS


def test_timer_expiration_past_float_range_is_rejected_not_fatal() -> None:
    """``"expiration_time": 1000...0`` (400 digits) on the FIFO raised OverflowError in
    the watchdog, which died of it (timer FIFO case 253)."""
    from harness.timer import FileTimerRequest, FileTimerServer

    server = FileTimerServer(None, "regression", workers={})
    try:
        server.register_timers([FileTimerRequest(4_000_000, "s", 10**400),  # type: ignore[arg-type]
                                FileTimerRequest(4_000_000, "s", -(10**400))])  # type: ignore[arg-type]
        assert server.rejected == 2
    finally:
        server.stop()


def test_store_add_past_i64_drops_that_client_only() -> None:
    """ADD that overflowed the i64 answer raised struct.error in the server's loop, which
    died of it, taking every client with it (store wire case 180)."""
    from harness.rendezvous._store import StoreClient, StoreConnectionError, StoreServer

    server = StoreServer("127.0.0.1", 0).start()
    try:
        other = StoreClient("127.0.0.1", server.port, timeout=5)
        greedy = StoreClient("127.0.0.1", server.port, timeout=5)
        greedy.set("n", str(2**63 - 1))
        with pytest.raises(StoreConnectionError):
            greedy.add("n", 1)
        other.ping()
        assert other.get("n") == str(2**63 - 1).encode() and other.add("m", 2) == 2
        other.close()
        greedy.close()
    finally:
        server.stop()


@pytest.mark.parametrize("flag,value", [("--monitor-interval", "inf"), ("--monitor-interval", "nan"),
                                        ("--monitor-interval", "6.098715497510755e+28"),
                                        ("--shutdown-timeout", "nan"), ("--exit-barrier-timeout", "nan")])
def test_timeouts_out_of_range_are_refused(flag: str, value: str) -> None:
    """``--monitor-interval inf`` (or 6e28, end-to-end accepted case 0) passed the check
    and raised OverflowError in the agent's loop (a traceback); nan passed ``< 0`` checks
    of the two timeouts."""
    from harness.run import config_from_args, parse_args

    with pytest.raises(ConfigError, match=flag):
        config_from_args(parse_args([flag, value, str(SCRIPTS / "sleeper.py")]))

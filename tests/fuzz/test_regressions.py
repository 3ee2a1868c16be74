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

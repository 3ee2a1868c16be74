import json
import signal

import pytest

from harness.errors import (
    ChildFailedError,
    ConfigError,
    ElasticError,
    ProcessFailure,
    record,
)


def test_config_error_names_field_value_and_constraint():
    e = ConfigError("nproc_per_node", 0, "must be >= 1", "--nproc-per-node")
    assert str(e) == "nproc_per_node=0 must be >= 1 (from --nproc-per-node)"
    assert isinstance(e, ElasticError) and isinstance(e, ValueError)


def test_record_writes_torch_format(tmp_path, monkeypatch):
    path = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))

    @record
    def main():
        raise ValueError("boom")

    with pytest.raises(ValueError):
        main()
    data = json.loads(path.read_text())
    assert data["message"]["message"] == "ValueError: boom"
    extra = data["message"]["extraInfo"]
    assert "raise ValueError" in extra["py_callstack"]
    assert extra["timestamp"].isdigit()  # torch parses it with int()
    assert int(extra["timestamp_ns"]) // 1_000_000_000 == int(extra["timestamp"])


def test_record_system_exit(tmp_path, monkeypatch):
    path = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))

    @record
    def ok():
        raise SystemExit(0)

    assert ok() is None and not path.exists()

    @record
    def bad():
        raise SystemExit(4)

    with pytest.raises(SystemExit):
        bad()
    assert json.loads(path.read_text())["message"]["message"] == "SystemExit: 4"


def test_torch_reads_our_error_file(tmp_path, monkeypatch):
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure as TorchFailure

    path = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))

    @record
    def main():
        raise KeyError("k")

    with pytest.raises(KeyError):
        main()
    theirs = TorchFailure(local_rank=0, pid=1, exitcode=1, error_file=str(path))
    assert theirs.message["message"] == "KeyError: 'k'"


def test_we_read_torch_error_file(tmp_path, monkeypatch):
    from torch.distributed.elastic.multiprocessing.errors import record as torch_record

    path = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))

    @torch_record
    def main():
        raise RuntimeError("theirs")

    with pytest.raises(RuntimeError):
        main()
    ours = ProcessFailure(local_rank=0, pid=1, exitcode=1, error_file=str(path))
    assert ours.summary() == "RuntimeError: theirs"
    assert ours.timestamp > 0


@pytest.mark.parametrize("content", ["{\"message\": {\"mess", "", "[1, 2]", "\x00\xff garbage"])
def test_malformed_error_file_is_a_failure_not_a_crash(tmp_path, content):
    path = tmp_path / "error.json"
    path.write_text(content)
    failure = ProcessFailure(local_rank=1, pid=123, exitcode=1, error_file=str(path))
    assert str(path) in failure.summary()
    assert "exit code 1" in failure.summary()


def test_missing_error_file_and_signal_message():
    failure = ProcessFailure(local_rank=0, pid=42, exitcode=-int(signal.SIGKILL), error_file="/nonexistent")
    assert failure.error_file == "<N/A>"
    assert failure.signal_name() == "SIGKILL"
    assert "Signal 9 (SIGKILL) received by PID 42" == failure.summary()


def test_root_cause_is_the_earliest_with_sub_second_resolution(tmp_path):
    def failure(rank, ns):
        path = tmp_path / f"e{rank}.json"
        path.write_text(json.dumps({"message": {"message": f"E{rank}", "extraInfo": {
            "py_callstack": f"trace{rank}", "timestamp": str(ns // 10**9), "timestamp_ns": str(ns)}}}))
        return ProcessFailure(local_rank=rank, pid=100 + rank, exitcode=1, error_file=str(path))

    base = 1_700_000_000 * 10**9
    failures = {0: failure(0, base + 900_000_000), 1: failure(1, base + 100_000_000)}
    err = ChildFailedError("train.py", failures)
    assert err.get_first_failure()[0] == 1
    text = str(err)
    root = text.split("Root Cause (first observed failure):")[1]
    assert "rank      : 1 (local_rank: 1)" in root and "trace1" in root
    assert "train.py FAILED" in text


def test_child_failed_error_needs_failures():
    with pytest.raises(ValueError):
        ChildFailedError("x", {})


@pytest.mark.parametrize("data", [
    {"message": "plain text", "timestamp": 10},
    {"message": {"message": "RuntimeError: x", "extraInfo": {"py_callstack": "", "timestamp": "10"}}},
])
def test_timestamp_comes_from_the_error_file_like_torch(tmp_path, data):
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure as TorchFailure

    path = tmp_path / "error.json"
    path.write_text(json.dumps(data))
    ours, theirs = ProcessFailure(0, 1, 1, str(path)), TorchFailure(0, 1, 1, str(path))
    assert ours.timestamp == theirs.timestamp == 10
    assert ours.message == theirs.message

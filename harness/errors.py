"""Errors: the root exception, worker error files, ``@record`` and the root-cause report.

Error files use torch's JSON layout so that a worker decorated with torch's own
``@record`` works under our agent and ours under torch's::

    {"message": {"message": "ValueError: boom",
                 "extraInfo": {"py_callstack": "<traceback>", "timestamp": "<int s>"}}}

We add ``extraInfo.timestamp_ns`` (torch ignores unknown keys) so the root cause is
picked with nanosecond, not one-second, resolution. Unlike torch's agent, an error
file that cannot be parsed never crashes the agent: it becomes part of the failure.
"""

from __future__ import annotations

import faulthandler
import functools
import json
import os
import signal as _signal
import socket
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from string import Template
from typing import Any, TypeVar

__all__ = [
    "ElasticError",
    "ConfigError",
    "SignalException",
    "ProcessFailure",
    "ChildFailedError",
    "record",
    "write_error_file",
    "ERROR_FILE_ENV",
]

#: the file a worker's ``@record`` writes its error to, per worker, read into the error summary
ERROR_FILE_ENV = "TORCHELASTIC_ERROR_FILE"
NOT_AVAILABLE = "<N/A>"
_MAX_ERROR_FILE_BYTES = 4 * 1024 * 1024

F = TypeVar("F", bound=Callable[..., Any])


class ElasticError(Exception):
    """Root of every error this project raises on purpose."""


class ConfigError(ElasticError, ValueError):
    """Bad user input; the message names the field, the value and the constraint."""

    def __init__(self, name: str, value: Any, constraint: str, source: str | None = None):
        self.name, self.value, self.constraint, self.source = name, value, constraint, source
        where = f" (from {source})" if source else ""
        super().__init__(f"{name}={value!r} {constraint}{where}")


class SignalException(ElasticError):
    """The agent received a termination signal; carries the signal so workers get the same."""

    def __init__(self, msg: str, sigval: _signal.Signals):
        super().__init__(msg)
        self.sigval = sigval


# ----------------------------------------------------------------------------------------
# error files


def _now_stamp() -> tuple[str, int]:
    ns = time.time_ns()
    return str(ns // 1_000_000_000), ns


def _error_payload(message: str, callstack: str) -> dict[str, Any]:
    seconds, ns = _now_stamp()
    return {
        "message": {
            "message": message,
            "extraInfo": {"py_callstack": callstack, "timestamp": seconds, "timestamp_ns": ns},
        }
    }


def write_error_file(path: str, payload: dict[str, Any]) -> None:
    """Write ``payload`` atomically (tmp + rename): a reader never sees half a file."""
    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix=".error.", dir=directory)
    try:
        with os.fdopen(fd, "w") as fp:
            json.dump(payload, fp)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _read_error_file(path: str) -> tuple[dict[str, Any] | None, str | None]:
    """Return (data, problem). ``problem`` says why the file could not be used."""
    try:
        size = os.path.getsize(path)
        if size > _MAX_ERROR_FILE_BYTES:
            return None, f"error file {path} is {size} bytes (limit {_MAX_ERROR_FILE_BYTES})"
        with open(path, encoding="utf-8", errors="replace") as fp:
            data = json.load(fp)
    except json.JSONDecodeError as e:
        return None, f"error file {path} is malformed ({e.msg} at char {e.pos})"
    except OSError as e:
        return None, f"error file {path} could not be read ({e.strerror})"
    if not isinstance(data, dict) or "message" not in data:
        return None, f"error file {path} has no 'message' field"
    return data, None


def _signal_name(exitcode: int) -> str:
    if exitcode < 0:
        try:
            return _signal.Signals(-exitcode).name
        except ValueError:
            return NOT_AVAILABLE
    return NOT_AVAILABLE


@dataclass
class ProcessFailure:
    """One failed worker process, as torch's ``ProcessFailure``.

    ``message`` is a str or the error file's ``message`` dict; ``timestamp`` is int seconds
    (torch's field), ``timestamp_ns`` the precise time used to pick the root cause.
    """

    local_rank: int
    pid: int
    exitcode: int
    error_file: str
    error_file_data: dict[str, Any] = field(init=False)
    message: Any = field(init=False)
    timestamp: int = field(init=False)
    timestamp_ns: int = field(init=False)

    def __post_init__(self) -> None:
        self.message = ""
        self.timestamp_ns = time.time_ns()
        self.error_file_data = {"message": "<NONE>"}
        data, problem = (None, None)
        if self.error_file and os.path.isfile(self.error_file):
            data, problem = _read_error_file(self.error_file)
        else:
            self.error_file = NOT_AVAILABLE
        stamp: int | None = None
        if data is not None:
            self.error_file_data = data
            self.message, self.timestamp_ns = self._message_and_time(data, self.error_file)
            stamp = self._file_timestamp(data)
        elif problem is not None:
            self.message = f"{problem}; exit code {self.exitcode}"
        self.timestamp = self.timestamp_ns // 1_000_000_000 if stamp is None else stamp
        if not self.message:
            if self.exitcode < 0:
                self.message = (
                    f"Signal {-self.exitcode} ({self.signal_name()}) received by PID {self.pid}"
                )
            else:
                self.message = (
                    "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html"
                )

    @staticmethod
    def _message_and_time(data: dict[str, Any], path: str) -> tuple[Any, int]:
        message = data["message"]
        stamp_ns = os.stat(path).st_mtime_ns
        if isinstance(message, dict):
            extra = message.get("extraInfo") or {}
            if isinstance(extra, dict):
                try:
                    stamp_ns = int(extra["timestamp_ns"])
                except (KeyError, TypeError, ValueError):
                    pass  # torch's @record: 1-s stamp only; the file's mtime is finer
        return message, stamp_ns

    @staticmethod
    def _file_timestamp(data: dict[str, Any]) -> int | None:
        """The seconds the file itself records, as torch reads them: top-level ``timestamp``
        for a str message, ``extraInfo.timestamp`` for a dict one (None: not recorded)."""
        message = data.get("message")
        holder = message.get("extraInfo") if isinstance(message, dict) else data
        try:
            return int(holder["timestamp"])  # type: ignore[index]
        except (KeyError, TypeError, ValueError):
            return None

    def signal_name(self) -> str:
        return _signal_name(self.exitcode)

    def timestamp_isoformat(self) -> str:
        return datetime.fromtimestamp(self.timestamp).isoformat(sep="_")

    def summary(self) -> str:
        """One line: what a person reads first."""
        if isinstance(self.message, dict):
            return str(self.message.get("message", NOT_AVAILABLE))
        return str(self.message)

    def to_json(self) -> dict[str, Any]:
        return {
            "local_rank": self.local_rank,
            "pid": self.pid,
            "exitcode": self.exitcode,
            "error_file": self.error_file,
            "message": self.summary(),
            "timestamp_ns": self.timestamp_ns,
        }


_MSG_FORMAT_TEMPLATE = """
${boarder}
${title}
${section}
Failures:
${other_failures}
${section}
Root Cause (first observed failure):
${root_failure}
${boarder}"""

_FAILURE_FORMAT_TEMPLATE = """[${idx}]:
  time      : ${time}
  host      : ${hostname}
  rank      : ${rank} (local_rank: ${local_rank})
  exitcode  : ${exitcode} (pid: ${pid})${signal_name}
  error_file: ${error_file}
  traceback : ${message}"""


class ChildFailedError(ElasticError):
    """Raised by the launcher when workers failed; its message is the root-cause report."""

    def __init__(self, name: str, failures: dict[int, ProcessFailure]):
        if not failures:
            raise ValueError("ChildFailedError needs at least one failure")
        self.name = name
        self.failures = failures
        super().__init__(self.format_msg())

    def get_first_failure(self) -> tuple[int, ProcessFailure]:
        rank = min(self.failures, key=lambda r: (self.failures[r].timestamp_ns, r))
        return rank, self.failures[rank]

    def format_msg(self, boarder_delim: str = "=", section_delim: str = "-") -> str:
        title = f"{self.name} FAILED"
        root_rank, _ = self.get_first_failure()
        root_fmt, others, width = "", [], len(title)
        for idx, (rank, failure) in enumerate(self.failures.items()):
            fmt = self._format_failure(idx, rank, failure)
            width = max(width, *(len(line) for line in fmt.split("\n")))
            if rank == root_rank:
                root_fmt = fmt
            else:
                others.append(fmt)
        width = min(width, 60)
        return Template(_MSG_FORMAT_TEMPLATE).substitute(
            boarder=boarder_delim * width,
            title=title,
            section=section_delim * width,
            root_failure=root_fmt,
            other_failures="\n".join(others or ["  <NO_OTHER_FAILURES>"]),
        )

    @staticmethod
    def _format_failure(idx: int, rank: int, failure: ProcessFailure) -> str:
        msg = failure.message
        if isinstance(msg, dict):
            info = msg.get("extraInfo")
            extra = info if isinstance(info, dict) else {}
            msg = str(extra.get("py_callstack", msg.get("message", NOT_AVAILABLE)))
            msg = msg.replace("\n", "\n  ")
        sig = failure.signal_name()
        return Template(_FAILURE_FORMAT_TEMPLATE).substitute(
            idx=idx,
            time=failure.timestamp_isoformat(),
            hostname=socket.getfqdn(),
            rank=rank,
            local_rank=failure.local_rank,
            exitcode=failure.exitcode,
            pid=failure.pid,
            signal_name=f" ({sig})" if sig != NOT_AVAILABLE else "",
            error_file=failure.error_file,
            message=msg,
        )


# ----------------------------------------------------------------------------------------
# @record


def _copy_child_error(error_file: str, failure: ProcessFailure) -> None:
    data = dict(failure.error_file_data)
    message = data.get("message")
    if isinstance(message, dict):
        data["message"] = {**message, "errorCode": failure.exitcode}
    write_error_file(error_file, data)


def record(fn: F | None = None, error_handler: Any = None) -> Any:
    """Decorate a worker's entrypoint so an uncaught exception lands in its error file.

    Same file and semantics as torch's ``@record``; additionally ``sys.exit(n)`` with
    ``n != 0`` leaves an error file (torch leaves none) so the report says why.
    """

    def wrap(f: F) -> F:
        @functools.wraps(f)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            path = os.environ.get(ERROR_FILE_ENV)
            try:
                faulthandler.enable(all_threads=True)
            except (ValueError, OSError, AttributeError):
                pass  # stderr closed or replaced: nothing to enable
            try:
                return f(*args, **kwargs)
            except SystemExit as se:
                if se.code in (None, 0):
                    return None
                if path:
                    _write_quietly(path, _error_payload(f"SystemExit: {se.code}", ""))
                raise
            except ChildFailedError as e:
                _, first = e.get_first_failure()
                if path and first.error_file != NOT_AVAILABLE:
                    _copy_child_error(path, first)
                raise
            except BaseException as e:
                if path:
                    message = f"{type(e).__name__}: {e}"
                    _write_quietly(path, _error_payload(message, traceback.format_exc()))
                raise

        return wrapper  # type: ignore[return-value]

    if fn is None:
        return wrap
    return wrap(fn)


def _write_quietly(path: str, payload: dict[str, Any]) -> None:
    try:
        write_error_file(path, payload)
    except OSError as e:
        print(f"[harness] could not write error file {path}: {e}", file=sys.stderr)

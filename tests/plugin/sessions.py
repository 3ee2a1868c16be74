"""Pytest sessions that a test starts side by side instead of one after another.

Several plugin tests compare whole sessions (the same seed twice, the signal and the thread
timeout method) whose jobs mostly wait: for a hang bound, a timeout, a lease. One after
another, a 2-core runner sat idle through each wait in turn; side by side, the waits overlap.
Each session gets what ``pytester.runpytest_subprocess`` gives one (its own ``--basetemp``,
the test directory on ``PYTHONPATH``) plus a cache directory of its own, so that no two
write the same ``.pytest_cache`` at once.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence

import pytest

from tests.conftest import unused_plugin_args

__all__ = ["runpytest_side_by_side"]

TIMEOUT_S = 300.0


def runpytest_side_by_side(pytester: pytest.Pytester, *runs: Sequence[str],
                           env: Sequence[Mapping[str, str | None]] = (),
                           timeout: float = TIMEOUT_S) -> list[pytest.RunResult]:
    """Start one pytest session per ``runs`` entry at once, wait for all, and return their
    results in that order. ``env[i]`` changes session i's environment (None removes a name).
    A session still running at ``timeout`` is killed with the others, and the test fails."""
    changes = list(env) + [{}] * (len(runs) - len(env))
    started = time.monotonic()
    sessions = [_start(pytester, index, args, changes[index]) for index, args in enumerate(runs)]
    try:
        codes = [proc.wait(timeout=max(0.0, started + timeout - time.monotonic())) for proc, _ in sessions]
    except subprocess.TimeoutExpired:
        pytest.fail(f"pytest sessions still running after {timeout:.0f}s: {[list(r) for r in runs]}")
    finally:
        for proc, _ in sessions:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return [_result(code, out) for code, (_, out) in zip(codes, sessions, strict=True)]


def _start(pytester: pytest.Pytester, index: int, args: Sequence[str],
           changes: Mapping[str, str | None]) -> tuple[subprocess.Popen[bytes], tuple[str, str]]:
    basetemp = tempfile.mkdtemp(prefix=f"runpytest-{index}-", dir=pytester.path)
    environ = os.environ.copy()
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), environ.get("PYTHONPATH", "")]))
    for name, value in changes.items():
        if value is None:
            environ.pop(name, None)
        else:
            environ[name] = value
    out = (str(pytester.path / f"stdout-{index}"), str(pytester.path / f"stderr-{index}"))
    cmd = [sys.executable, "-mpytest", f"--basetemp={basetemp}", "-o", f"cache_dir=.pytest_cache-{index}",
           *unused_plugin_args(), *args]
    print("running:", *cmd)
    with open(out[0], "wb") as stdout, open(out[1], "wb") as stderr:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr, env=environ)
    return proc, out


def _result(code: int, out: tuple[str, str]) -> pytest.RunResult:
    lines = []
    for path in out:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines.append(f.read().splitlines())
        print("\n".join(lines[-1]))
    ret: int = code
    try:
        ret = pytest.ExitCode(code)
    except ValueError:
        pass
    return pytest.RunResult(ret, lines[0], lines[1], 0.0)

"""A clock shifted by SHIFT seconds: ``python fake_clock.py SHIFT -c CODE ARGS...`` runs
CODE as ``python -c CODE ARGS...`` would, but with ``time.time()`` and
``time.monotonic()`` reading SHIFT seconds ahead: a host whose clocks are off, for code
that reads them as ``time.time()`` (the lease does). Interpreter flags before ``-c``
(``-I -S``, as ``SshHost`` passes them) are accepted and ignored.
"""

from __future__ import annotations

import sys
import time


def main(args: list[str]) -> None:
    shift = float(args[0])
    rest = args[1:]
    while rest and rest[0] != "-c":
        rest.pop(0)
    if len(rest) < 2:
        raise SystemExit("usage: fake_clock.py SHIFT [flags] -c CODE ARGS...")
    real_time, real_monotonic = time.time, time.monotonic
    time.time = lambda: real_time() + shift  # type: ignore[assignment]
    time.monotonic = lambda: real_monotonic() + shift  # type: ignore[assignment]
    sys.argv = ["-c", *rest[2:]]
    exec(compile(rest[1], "<string>", "exec"), {"__name__": "__main__"})


if __name__ == "__main__":
    main(sys.argv[1:])

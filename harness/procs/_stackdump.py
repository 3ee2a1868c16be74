"""Workers that can show their Python stacks on demand: ``SIGUSR1`` -> faulthandler.

When ``HARNESS_STACK_DUMP_DIR`` is set in a worker's environment (the pytest plugin sets it
for its session), the worker registers ``faulthandler`` for ``SIGUSR1`` with all threads,
writing to ``<dir>/<pid>.txt``; a timed-out test signals its hung workers and reads the
files (``pytest_elastic._timeout``). Unset, nothing changes: SIGUSR1 keeps its default
action, as under torchrun. Called where our code runs first in a worker: the zygote's
forked child and a callable's child; a spawned script runs nothing of ours first.
"""

from __future__ import annotations

import os
import signal

#: the variable naming the dump directory; public as ``harness.procs.STACKS_ENV`` (the plugin
#: sets it, so it imports the name instead of spelling it again)
STACKS_ENV = "HARNESS_STACK_DUMP_DIR"

_file = None  # kept open for faulthandler, which writes to its fd from the signal handler


def install_from_env(env: os._Environ[str] | dict[str, str]) -> None:
    """Once per process: a second call (an agent run twice in one process) keeps the first's file."""
    global _file
    directory = env.get(STACKS_ENV)
    if not directory or (_file is not None and _file.name == os.path.join(directory, f"{os.getpid()}.txt")):
        return
    try:
        import faulthandler

        _file = open(os.path.join(directory, f"{os.getpid()}.txt"), "w")
        faulthandler.register(signal.SIGUSR1, file=_file, all_threads=True, chain=False)
    except (OSError, ValueError, RuntimeError):
        _file = None  # a missing dir must never keep a worker from running

"""One simulated node: an agent process started by ``Cluster`` (``python -m harness.sim.nodes.main``).

It runs the same agent as ``elastic-run`` (same signals, same exit codes) but takes its
configuration as a pickle, so the entrypoint may be a picklable callable, and writes its
``RunResult`` (return values included) to a file the harness reads.
"""

from __future__ import annotations

import os
import pickle
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["NodeSpec", "main"]


@dataclass
class NodeSpec:
    """What a node process needs; pickled by the harness."""

    config: Any  # harness.launch.LaunchConfig
    entrypoint: Callable[..., Any] | str
    args: list[Any] = field(default_factory=list)
    result_path: str = ""


def _write_result(path: str, result: Any) -> None:
    tmp = path + ".tmp"
    with open(tmp, "wb") as fp:
        pickle.dump(result, fp)
    os.replace(tmp, path)


#: ``os.pathsep``-joined ``cgroup.procs`` files of the node's cgroup (harness.sim.resources)
CGROUP_ENV = "HARNESS_NODE_CGROUP"


def settle(parent: int | None, netns: str | None) -> None:
    """First thing in a node process: die with the harness (``parent``), move into the
    node's network namespace and into its cgroup (before any fork: its workers inherit
    it). Done here rather than in a ``preexec_fn``: a ``preexec_fn`` forces a full fork of
    the (large) harness process, ~40 ms per node instead of ~8 ms with the vfork Popen can
    use otherwise; the orphan window is closed by the parent check."""
    from harness.procs import die_with_parent, join_netns

    if parent is not None:
        die_with_parent(parent)
    if netns is not None:
        join_netns(netns)
    _join_cgroup(os.environ.pop(CGROUP_ENV, ""))


def _join_cgroup(procs_files: str) -> None:
    """Join the node's cgroup; one that cannot be joined is said in the agent's log (the
    resource faults on this node then check and fail, naming it)."""
    for path in filter(None, procs_files.split(os.pathsep)):
        try:
            with open(path, "w") as fp:
                fp.write(str(os.getpid()))
        except OSError as e:
            print(f"[node] cannot join cgroup {os.path.dirname(path)}: {e.strerror}", file=sys.stderr)


#: the TMPDIR the node's workers get (on the node's disk); the agent keeps its own
WORKER_TMPDIR_ENV = "HARNESS_WORKER_TMPDIR"


def split_tmpdir() -> None:
    """The agent keeps its temp files (timer FIFOs, logs, error files) in the node's own
    ``TMPDIR``; the workers it starts inherit ``TMPDIR`` on the node's disk, where storage
    faults reach them (``harness.sim.storage``)."""
    worker_tmp = os.environ.pop(WORKER_TMPDIR_ENV, None)
    if worker_tmp:
        import tempfile

        tempfile.tempdir = None
        tempfile.tempdir = tempfile.gettempdir()  # the agent's, fixed before TMPDIR changes
        os.environ["TMPDIR"] = worker_tmp


def main(spec_path: str, parent: int | None = None, netns: str | None = None) -> int:
    settle(parent, netns)
    split_tmpdir()
    from harness.run import configure_logging, run_with_signal_handlers

    configure_logging()
    with open(spec_path, "rb") as fp:
        spec: NodeSpec = pickle.load(fp)
    result = run_with_signal_handlers(spec.config, spec.entrypoint, spec.args, "node")
    if result is None:
        return 1
    _write_result(spec.result_path, result)
    return 1 if result.is_failed() else 0


def _cli(argv: list[str]) -> int:
    """``python -m harness.sim.nodes.main SPEC [--parent PID] [--netns PATH]`` (written by ``start_node``). The
    node fork server is its own program (``python -m harness.sim.nodes.forks``)."""
    options = dict(zip(argv[1::2], argv[2::2], strict=True))  # flag, value pairs
    parent = options.get("--parent")
    return main(argv[0], int(parent) if parent else None, options.get("--netns"))


def exit_now(code: int) -> None:
    """End the node without the interpreter's teardown. The result is on disk and the
    agent has stopped its workers and servers; what is left (unloading ~300 modules,
    collecting their objects) costs ~30 ms of CPU per node, a second of wall time when a
    32-node job ends on two cores. ``atexit`` handlers, non-daemon threads and the
    streams still get their turn, as they would with ``sys.exit``."""
    import atexit
    import threading

    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


if __name__ == "__main__":
    exit_now(_cli(sys.argv[1:]))

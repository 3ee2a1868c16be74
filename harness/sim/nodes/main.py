"""One simulated node: an agent process started by ``Cluster`` (``python -m harness.sim.nodes.main``).

It runs the same agent as ``elastic-run`` (same signals, same exit codes) but takes its
configuration as a pickle, so the entrypoint may be a picklable callable, and writes its
``RunResult`` (return values included) to a file the harness reads.

A node on a host (``harness.sim.places.hosts.nodes``) is started as ``... main --json SPEC``
instead: nothing that crossed the network is unpickled, so its spec is JSON (the
``LaunchConfig`` fields, the command's argv, the environment, the dirs to make), and its
``RunResult`` is written as JSON beside it (the controller reads the agent's ``result``
event, relayed with the others).
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


#: the keys of a remote node's JSON spec (``harness.sim.places.hosts.nodes`` writes it)
JSON_SPEC_KEYS = ("config", "entrypoint", "args", "env", "dirs", "result_path")
#: a spec's entrypoint that means "the interpreter this agent runs on" (``sys.executable``
#: there). Why not the hosts file's ``python``: the zygote forks a worker only for a Python
#: run of its own interpreter (``procs._zygote_client.python_target``: the same real path),
#: and ``python3``, a command name, or a wrapper is not one: every worker on a host was
#: exec'd and imported torch again, every round (a restart there took 1.9 s, here 0.05 s)
SAME_PYTHON = "{python}"


def interface_of(address: str) -> str | None:
    """The name of this machine's interface that holds the IPv4 ``address`` (None: none
    does), for ``GLOO_SOCKET_IFNAME``: gloo would otherwise take whatever the hostname
    resolves to, which peers on other hosts may not reach."""
    import fcntl
    import socket
    import struct

    siocgifaddr = 0x8915
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            try:
                answer = fcntl.ioctl(sock.fileno(), siocgifaddr, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue
            if socket.inet_ntoa(answer[20:24]) == address:
                return name
    return None


def main_json(spec_path: str) -> int:
    """A node on a host: its spec is JSON (``JSON_SPEC_KEYS``), its result JSON too."""
    import json

    with open(spec_path) as fp:
        spec = json.load(fp)
    missing = [key for key in JSON_SPEC_KEYS if key not in spec]
    if missing or not isinstance(spec["entrypoint"], str):
        print(f"[node] {spec_path}: not a node spec (missing {missing or 'a str entrypoint'})", file=sys.stderr)
        return 2
    os.environ.update({str(k): str(v) for k, v in spec["env"].items()})
    for directory in spec["dirs"]:
        os.makedirs(directory, mode=0o700, exist_ok=True)
    local_addr = spec["config"].get("local_addr")
    if local_addr and "GLOO_SOCKET_IFNAME" not in os.environ:
        interface = interface_of(local_addr)
        if interface is not None:
            os.environ["GLOO_SOCKET_IFNAME"] = interface
    settle(None, None)  # the host's supervisor ends it with the controller (PDEATHSIG, the channel)
    _say_slurm_step(str(spec["config"].get("run_id") or ""))
    split_tmpdir()
    from harness.launch import LaunchConfig
    from harness.run import configure_logging, run_with_signal_handlers

    configure_logging()
    config = LaunchConfig(**spec["config"])
    entrypoint = sys.executable if spec["entrypoint"] == SAME_PYTHON else spec["entrypoint"]
    result = run_with_signal_handlers(config, entrypoint, [str(a) for a in spec["args"]], "node")
    if result is None:
        return 1
    tmp = spec["result_path"] + ".tmp"
    with open(tmp, "w") as fp:
        json.dump(result.to_json(), fp)
    os.replace(tmp, spec["result_path"])
    return 1 if result.is_failed() else 0


def _say_slurm_step(run_id: str) -> None:
    """A node that runs as a Slurm job step says which, in its events (``slurm_step``: its
    job, its step as ``JOB.STEP``, its Slurm node): the timeline names them, and a fault
    carried out by Slurm (``scancel --signal`` on the step) is aimed by it."""
    from harness.events import event_writer_from_env

    job, step = os.environ.get("SLURM_JOB_ID"), os.environ.get("SLURM_STEP_ID")
    if not job or not step:
        return
    writer = event_writer_from_env(os.environ, run_id, "0")
    try:
        writer.emit("slurm_step", job=job, step=f"{job}.{step}", slurm_node=os.environ.get("SLURMD_NODENAME"))
    finally:
        writer.close()


def _cli(argv: list[str]) -> int:
    """``python -m harness.sim.nodes.main SPEC [--parent PID] [--netns PATH]`` (written by ``start_node``),
    or ``... main --json SPEC`` (a node on a host). The node fork server is its own program
    (``python -m harness.sim.nodes.forks``)."""
    if argv[:1] == ["--json"] and len(argv) == 2:
        return main_json(argv[1])
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

"""Worker process control: start, watch, stop; redirects, tee and log prefixes.

Also the process primitives the rest of the project builds on (the simulation starts its
node agents and store servers with them): children that die with their parent, signalling
a process group, a process identity that survives pid reuse, dirs removed once the process
named in them is gone, the cgroups a process is in, joining a network namespace, and the
zygote server (a warm interpreter that has imported torch and forks workers), the
imports of a server that forks, kept out of its children's garbage collections, and a
shared server's CPU priority above the processes it serves.
"""

from harness.procs._cgroup import OOM_REASON, cgroup_dirs, cgroup_mounts
from harness.procs._context import START_METHODS, ProcessContext, RunProcsResult
from harness.procs._handles import (
    is_same_process,
    process_start_time,
    process_state,
    signal_process_group,
)
from harness.procs._heap import frozen_imports
from harness.procs._logs import LogsSpecs, render_prefix
from harness.procs._owned import remove_dead_owned
from harness.procs._placement import WORKER_CGROUP_ENV, WORKER_NICE_ENV
from harness.procs._prctl import die_with_parent, join_netns, same_netns, set_pdeathsig
from harness.procs._preload import share_imports
from harness.procs._priority import run_ahead
from harness.procs._stackdump import STACKS_ENV
from harness.procs._std import Std
from harness.procs._zygote import ZYGOTE_ENV
from harness.procs._zygote_client import ZygoteError, ZygoteServerProcess

__all__ = [
    "OOM_REASON", "STACKS_ENV", "START_METHODS", "WORKER_CGROUP_ENV", "WORKER_NICE_ENV", "ZYGOTE_ENV",
    "LogsSpecs", "ProcessContext",
    "RunProcsResult", "Std", "ZygoteError", "ZygoteServerProcess", "cgroup_dirs", "cgroup_mounts", "die_with_parent",
    "frozen_imports", "is_same_process", "join_netns", "process_start_time", "process_state", "remove_dead_owned",
    "render_prefix", "run_ahead", "same_netns", "set_pdeathsig", "share_imports", "signal_process_group",
]

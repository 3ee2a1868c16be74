"""Hosts beyond this machine: the building block ``Cluster(hosts=[...])`` places nodes with
(docs/hosts.md), reached over SSH, or as the nodes of a Slurm allocation through job steps.

``HostSpec`` (``parse_host("ssh://user@addr[:port]")``, ``load_hosts("hosts.toml")``) says
where a host is and how to use it; ``SshHost(spec)`` is one multiplexed, owned OpenSSH
connection to it: it checks the host's interpreter and pytest-elastic version, keeps a work
dir there for as long as it lives, runs and starts commands (argv lists), and leaves nothing
on either side when it is closed, when this process dies, or when the host stops hearing
from it (``lost_after``). ``SrunHost(spec, job_id=..., node=...)`` is the same channel to a
node of a Slurm allocation, each command a job step (``srun``) instead of an SSH session.

``measure_offset(host)`` measures the host's clocks against ours over that connection
(NTP's exchange; a hard error bound); ``EventRelay(host, path, sink, offset=...)`` follows
a node's events file on the host and hands each line, checked and moved onto our clocks,
to ``sink``. ``place(nodes, hosts, placement)`` says which host each node runs on, and
``refusal(host, needs)`` why a fault cannot run on a host that lacks a capability.

This package sits beside the simulation, above the runtime: it imports ``harness.errors``
and ``harness.procs`` only, and the runtime never imports it.
"""

from harness.hosts._clock import ClockOffset, ClockSample, measure_offset
from harness.hosts._errors import (
    HostAuthError,
    HostCommandError,
    HostError,
    HostKeyError,
    HostPythonError,
    HostTimeout,
    HostUnreachable,
    last_line,
)
from harness.hosts._placement import CAPABILITIES, place, refusal
from harness.hosts._process import CommandResult, RemoteProcess
from harness.hosts._relay import EventRelay, check_event
from harness.hosts._slurm import (
    SLURM_FIELDS,
    SlurmAllocation,
    SlurmSpec,
    allocation_refusal,
    load_slurm,
    slurm_spec,
    stand_ins,
)
from harness.hosts._spec import FIELDS, HostSpec, load_hosts, parse_host
from harness.hosts._srun import SrunHost
from harness.hosts._ssh import SILENT_LINK_S, RemoteInfo, SshHost, controller_version

__all__ = [
    "CAPABILITIES", "FIELDS", "ClockOffset", "ClockSample", "CommandResult", "EventRelay", "HostAuthError",
    "HostCommandError", "HostError", "HostKeyError", "HostPythonError", "HostSpec", "HostTimeout", "HostUnreachable",
    "RemoteInfo", "RemoteProcess", "SLURM_FIELDS", "SlurmAllocation", "SlurmSpec", "SrunHost", "SshHost",
    "check_event", "controller_version", "load_hosts", "measure_offset", "last_line", "load_slurm", "parse_host",
    "allocation_refusal", "place", "refusal", "slurm_spec", "stand_ins", "SILENT_LINK_S",
]

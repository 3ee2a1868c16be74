"""Hosts beyond this machine, over SSH: the building block ``Cluster(hosts=[...])`` will
place nodes with (issue 29; docs/hosts.md).

``HostSpec`` (``parse_host("ssh://user@addr[:port]")``, ``load_hosts("hosts.toml")``) says
where a host is and how to use it; ``SshHost(spec)`` is one multiplexed, owned OpenSSH
connection to it: it checks the host's interpreter and pytest-elastic version, keeps a work
dir there for as long as it lives, runs and starts commands (argv lists), and leaves nothing
on either side when it is closed or when this process dies.

This package sits beside the simulation, above the runtime: it imports ``harness.errors``
and ``harness.procs`` only, and the runtime never imports it.
"""

from harness.hosts._errors import (
    HostAuthError,
    HostCommandError,
    HostError,
    HostKeyError,
    HostPythonError,
    HostTimeout,
    HostUnreachable,
)
from harness.hosts._process import CommandResult, RemoteProcess
from harness.hosts._spec import FIELDS, HostSpec, load_hosts, parse_host
from harness.hosts._ssh import RemoteInfo, SshHost, controller_version

__all__ = [
    "FIELDS", "CommandResult", "HostAuthError", "HostCommandError", "HostError", "HostKeyError", "HostPythonError",
    "HostSpec", "HostTimeout", "HostUnreachable", "RemoteInfo", "RemoteProcess", "SshHost", "controller_version",
    "load_hosts", "parse_host",
]

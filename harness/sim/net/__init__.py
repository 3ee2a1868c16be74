"""Simulated nodes as network hosts: namespaces on a bridge, and the faults of a network.

Modules: ``network`` (``Network``: build, address, enter, fault, close), ``rules`` (faults as
data, validated, and the nftables they render to), ``names`` (namespace names carry the
owner's pid; a dead owner's leftovers are swept), ``probe`` (``"auto"`` -> netns or loopback).
"""

from harness.sim.net.network import NETNS_RANGE, Network, NetworkChange, NetworkError, NetworkUnavailable
from harness.sim.net.probe import MODES, netns_missing, resolve_mode
from harness.sim.net.rules import WIRE as NODE_INTERFACE

__all__ = ["MODES", "NETNS_RANGE", "NODE_INTERFACE", "Network", "NetworkChange", "NetworkError",
           "NetworkUnavailable", "netns_missing", "resolve_mode"]

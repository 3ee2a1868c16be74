"""The nftables ruleset of a node's network faults on a real host (issue 29; docs/hosts.md).

A node on a host has no namespace of its own: the host *is* its network host, and its
faults are one table of the host's, rewritten whole in one ``nft -f`` transaction on each
change, as a local node's (``harness.sim.net.rules``). What differs, and why:

* **No wire to hook.** The host's interfaces are the user's; the table is of the ``inet``
  family, at the ``input`` and ``output`` hooks, and matches every interface but ``lo``
  (``iifname != "lo"``): the node's own workers talk over loopback and are never faulted,
  as locally. A drop at ``input`` is silent to the sender; one at ``output`` is silent to
  TCP (the segment is retransmitted, as if lost on the wire: gloo and the store are TCP),
  while a UDP send fails with EPERM there (a local node's netdev egress hook is silent to
  both).
* **The harness's own connection is never cut.** Packets of the SSH connections from this
  machine (the host's sshd port, from the address the host sees them come from:
  ``$SSH_CONNECTION``) are accepted before any drop: the node's events, the faults that
  follow and ``heal`` itself travel on them. A fault that would cut them (``link_down``)
  is not done on hosts.
* **The store is on the loopback.** The job's store is reached through a port the
  connection forwards on the host's loopback (``SshHost.forward_remote``): a partition from
  the store drops that port's packets at ``input`` on ``lo`` (``tcp dport`` is the node's
  way to the store, ``tcp sport`` the store's way back), and packet loss thins them too.
* **IPv4 and IPv6.** Addresses are matched as ``ip`` or ``ip6`` as they are written; "every
  packet" is every IPv4 packet and every IPv6 one but ICMPv6 (neighbour discovery passes,
  as ARP does locally: the failure modelled is the silent black hole).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

from harness.sim.net.rules import LOSS_SCALE

__all__ = ["Control", "HostLoss", "HostPartition", "HostRule", "render_cut", "render_host"]

_EVERY_PACKET = ("meta nfproto ipv4", "meta nfproto ipv6 meta l4proto != ipv6-icmp")


@dataclass(frozen=True)
class Control:
    """The harness's SSH connections as the host sees them: from ``address`` to its sshd's ``port``."""

    address: str
    port: int


@dataclass(frozen=True)
class HostPartition:
    """Drop the node's packets to/from the hosts at ``peers`` (empty and ``wire``: every
    host) and, with ``store``, to/from the job's store, ``direction`` "both", "in" or "out"."""

    peers: tuple[str, ...]
    direction: str
    wire: bool = True
    store: bool = False


@dataclass(frozen=True)
class HostLoss:
    """Drop each packet of the node's, either way, with this probability (the store's too)."""

    probability: float


HostRule = HostPartition | HostLoss


def _family(address: str) -> str:
    return "ip6" if ipaddress.ip_address(address).version == 6 else "ip"


def _addresses(direction: str, peers: Sequence[str]) -> list[str]:
    """``ip saddr { a, b }`` / ``ip6 daddr { c }``: one match per family."""
    by_family: dict[str, list[str]] = {}
    for peer in peers:
        by_family.setdefault(_family(peer), []).append(peer)
    return [f"{family} {direction} {{ {', '.join(found)} }}" for family, found in sorted(by_family.items())]


def _chain(hook: str, rules: Sequence[HostRule], control: Control, store_port: int | None) -> str:
    inbound = hook == "input"
    wire = f'{"iifname" if inbound else "oifname"} != "lo"'
    there = "saddr" if inbound else "daddr"
    lines = [f"{wire} {_family(control.address)} {there} {control.address} "
             f"tcp {'dport' if inbound else 'sport'} {control.port} accept"]
    for rule in rules:
        if isinstance(rule, HostLoss):
            threshold = round(rule.probability * LOSS_SCALE)
            if threshold <= 0:
                continue
            drop = "drop" if threshold >= LOSS_SCALE else f"numgen random mod {LOSS_SCALE} < {threshold} drop"
            lines += [f"{wire} {every} {drop}" for every in _EVERY_PACKET]
            if inbound and store_port is not None:
                lines += [f'iifname "lo" tcp {port} {store_port} {drop}' for port in ("dport", "sport")]
            continue
        if rule.store and inbound and store_port is not None:
            ways = {"both": ("dport", "sport"), "out": ("dport",), "in": ("sport",)}[rule.direction]
            lines += [f'iifname "lo" tcp {port} {store_port} drop' for port in ways]
        if rule.wire and rule.direction in ("both", "in" if inbound else "out"):
            matches = _addresses(there, rule.peers) if rule.peers else list(_EVERY_PACKET)
            lines += [f"{wire} {match} drop" for match in matches]
    body = "".join(f"\t\t{line}\n" for line in lines)
    return f"\tchain {hook} {{\n\t\ttype filter hook {hook} priority filter; policy accept;\n{body}\t}}\n"


def render_host(table: str, rules: Sequence[HostRule], control: Control, store_port: int | None) -> str:
    """An ``nft -f`` script that replaces the host's fault table ``table`` by ``rules``
    (none: no table). ``store_port``: the store's forwarded port on the host's loopback
    (None: the job has no store of the harness's)."""
    script = f"table inet {table}\ndelete table inet {table}\n"
    if rules:
        script += (f"table inet {table} {{\n{_chain('input', rules, control, store_port)}"
                   f"{_chain('output', rules, control, store_port)}}}\n")
    return script


def render_cut(table: str, control: Control) -> str:
    """An ``nft -f`` script that makes table ``table`` drop the harness's own SSH connections
    to the host, both ways, and nothing else: this machine cannot reach the host (the
    ``host_unreachable`` fault). Nothing else of the host's traffic is touched."""
    family = _family(control.address)
    return (f"table inet {table}\ndelete table inet {table}\ntable inet {table} {{\n"
            f"\tchain input {{\n\t\ttype filter hook input priority filter; policy accept;\n"
            f"\t\t{family} saddr {control.address} tcp dport {control.port} drop\n\t}}\n"
            f"\tchain output {{\n\t\ttype filter hook output priority filter; policy accept;\n"
            f"\t\t{family} daddr {control.address} tcp sport {control.port} drop\n\t}}\n}}\n")

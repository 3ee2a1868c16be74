"""The nftables ruleset of a node's network faults on a real host (docs/hosts.md).

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
* **A node that shares its host** (``NodeSockets``). Its rules match its own sockets: the
  cgroup v2 dir its agent and workers are in (``socket cgroupv2``: at ``output`` the
  sender's socket, at ``input`` the receiver's). Its traffic with the job's other nodes on
  the host is the host's loopback, where neither hook knows both ends: so while the table
  holds a rule of such a node, the ``output`` hook tags each loopback packet of a node of
  the host with its sender (the packet's ``priority``, ``e1a5:<node + 1>``: a tc class,
  which nothing on loopback reads, rather than the mark, which the input route lookup and
  the user's policy routing read), and the ``input`` hook drops by the tag and the
  receiver's socket. A node's own processes are never cut from each other (their tag is
  their receiver's). What carries no tag (a listener's SYN-ACK: its socket is a request,
  not a full one; the kernel's resets) is let through: a cut "in" of such a node lets its
  own connect complete, and then drops what comes in on it.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from harness.sim.net.rules import LOSS_SCALE

__all__ = ["Control", "HostLoss", "HostPartition", "HostRule", "NodeSockets", "render_cut", "render_host"]

_EVERY_PACKET = ("meta nfproto ipv4", "meta nfproto ipv6 meta l4proto != ipv6-icmp")
#: the tc class major of the tags a host's nodes' loopback packets carry (``NodeSockets``)
_TAG_MAJOR = 0xE1A5


@dataclass(frozen=True)
class Control:
    """The harness's SSH connections as the host sees them: from ``address`` to its sshd's ``port``."""

    address: str
    port: int


@dataclass(frozen=True)
class NodeSockets:
    """A node's sockets on a host it shares with others of its job: its cgroup v2 dir as nft
    names it (``path`` under /sys/fs/cgroup, ``level`` its depth in the hierarchy)."""

    node: int
    path: str
    level: int

    def match(self) -> str:
        return f'socket cgroupv2 level {self.level} "{self.path}"'

    def tag(self) -> str:
        """The tag its loopback packets carry (the node's index + 1: 0 is no tag)."""
        return f"{_TAG_MAJOR:x}:{self.node + 1:x}"


@dataclass(frozen=True)
class HostPartition:
    """Drop the node's packets to/from the hosts at ``peers`` (empty and ``wire``: every
    host), with ``store`` to/from the job's store, and to/from the job's nodes
    ``neighbours`` on its own host (its loopback), ``direction`` "both", "in" or "out"."""

    peers: tuple[str, ...]
    direction: str
    wire: bool = True
    store: bool = False
    neighbours: tuple[int, ...] = ()


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


def _tags(sockets: Sequence[NodeSockets]) -> str:
    """``meta priority X`` / ``meta priority { X, Y }``: a loopback packet sent by one of them."""
    tags = [s.tag() for s in sockets]
    return f"meta priority {tags[0]}" if len(tags) == 1 else f"meta priority {{ {', '.join(tags)} }}"


def _node_lines(inbound: bool, rules: Sequence[HostRule], own: NodeSockets | None,
                sockets: Mapping[int, NodeSockets], store_port: int | None) -> list[str]:
    """One node's drops at one hook: every packet of the host's where ``own`` is None (the
    node is alone there), else its sockets' alone."""
    wire = f'{"iifname" if inbound else "oifname"} != "lo"'
    there = "saddr" if inbound else "daddr"
    mine = f"{own.match()} " if own is not None else ""
    # the store (the forwarded port on loopback) at input: the node's way there by its
    # destination port (and its tag, if it shares the host), the store's way back by its
    # source port (and the receiver: the node)
    store_way = {"dport": f"meta priority {own.tag()} " if own is not None else "", "sport": mine}
    lines = []
    for rule in rules:
        if isinstance(rule, HostLoss):
            threshold = round(rule.probability * LOSS_SCALE)
            if threshold <= 0:
                continue
            drop = "drop" if threshold >= LOSS_SCALE else f"numgen random mod {LOSS_SCALE} < {threshold} drop"
            lines += [f"{wire} {mine}{every} {drop}" for every in _EVERY_PACKET]
            if inbound and store_port is not None:
                lines += [f'iifname "lo" tcp {port} {store_port} {way}{drop}' for port, way in store_way.items()]
            if inbound and own is not None:
                lines += _loopback(own, [s for s in sockets.values() if s != own], "both", drop)
            continue
        if rule.store and inbound and store_port is not None:
            ways = {"both": ("dport", "sport"), "out": ("dport",), "in": ("sport",)}[rule.direction]
            lines += [f'iifname "lo" tcp {port} {store_port} {store_way[port]}drop' for port in ways]
        if rule.wire and rule.direction in ("both", "in" if inbound else "out"):
            matches = _addresses(there, rule.peers) if rule.peers else list(_EVERY_PACKET)
            lines += [f"{wire} {mine}{match} drop" for match in matches]
        if inbound and own is not None:
            lines += _loopback(own, [sockets[n] for n in rule.neighbours if n in sockets and n != own.node],
                               rule.direction, "drop")
    return lines


def _loopback(own: NodeSockets, others: Sequence[NodeSockets], direction: str, drop: str) -> list[str]:
    """At input on loopback: ``own``'s packets from ``others`` ("in"), to them ("out")."""
    if not others:
        return []
    lines = [f'iifname "lo" {_tags(others)} {own.match()} {drop}'] if direction in ("both", "in") else []
    if direction in ("both", "out"):
        lines += [f'iifname "lo" meta priority {own.tag()} {other.match()} {drop}' for other in others]
    return lines


def _chain(hook: str, faults: Mapping[int, Sequence[HostRule]], control: Control, store_port: int | None,
           sockets: Mapping[int, NodeSockets] | None) -> str:
    inbound = hook == "input"
    wire = f'{"iifname" if inbound else "oifname"} != "lo"'
    there = "saddr" if inbound else "daddr"
    lines = []
    if sockets and not inbound:  # each loopback packet of the host's nodes tagged with its sender
        lines += [f'oifname "lo" {s.match()} meta priority set {s.tag()}' for _, s in sorted(sockets.items())]
    lines.append(f"{wire} {_family(control.address)} {there} {control.address} "
                 f"tcp {'dport' if inbound else 'sport'} {control.port} accept")
    for node, rules in sorted(faults.items()):
        lines += _node_lines(inbound, rules, sockets[node] if sockets is not None else None, sockets or {},
                             store_port)
    body = "".join(f"\t\t{line}\n" for line in lines)
    return f"\tchain {hook} {{\n\t\ttype filter hook {hook} priority filter; policy accept;\n{body}\t}}\n"


def render_host(table: str, faults: Mapping[int, Sequence[HostRule]], control: Control, store_port: int | None,
                sockets: Mapping[int, NodeSockets] | None = None) -> str:
    """An ``nft -f`` script that replaces the host's fault table ``table`` by the rules of
    ``faults`` (node -> its rules; none: no table). ``store_port``: the store's forwarded
    port on the host's loopback (None: the job has no store of the harness's).
    ``sockets``: None where the host cannot say whose sockets are whose (it lists no
    cgroups: the faulted node's rules are the host's, and it is alone there); else the
    sockets of each of the job's nodes there that has started, every faulted one among
    them (each's rules are its sockets')."""
    script = f"table inet {table}\ndelete table inet {table}\n"
    if sockets is not None and not set(faults) <= set(sockets):
        raise ValueError(f"the sockets of nodes {sorted(set(faults) - set(sockets))} are unknown")
    if any(faults.values()):
        script += (f"table inet {table} {{\n{_chain('input', faults, control, store_port, sockets)}"
                   f"{_chain('output', faults, control, store_port, sockets)}}}\n")
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

"""Network faults as data, checked once, and the nftables ruleset a node's faults render to.

Every fault on a node lives in one table of that node's namespace, rewritten whole in one
``nft -f`` transaction on each change (create, delete, define): the kernel swaps it
atomically, so a packet sees either the old rules or the new ones, never half of each.
The table is of the ``netdev`` family, hooked to the node's wire interface (``eth0``) at
ingress and egress: its loopback, where the node's own workers talk, is never faulted, and
a dropped packet has already left the node's stack, so the sender sees no error (an
``output``-hook drop would fail a UDP send with EPERM). Everything is ``drop``: no RST, no
ICMP, no FIN: to the other side the node simply went quiet. Only IPv4 is dropped: ARP still
resolves, because an ARP failure makes the sender's kernel report "host unreachable" to its
sockets after a few seconds, and the failure this models is the silent black hole in which
peers wait in a collective until a timeout (``link_down`` is the unplugged cable).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from harness.errors import ConfigError

__all__ = ["DIRECTIONS", "Rule", "Partition", "Loss", "parse_rate", "check_node", "check_peers", "check_probability",
           "render"]

DIRECTIONS = ("both", "in", "out")
TABLE = "harness_faults"
WIRE = "eth0"
#: probability resolution: numgen draws from 0..LOSS_SCALE-1
LOSS_SCALE = 10000
_IP = "meta protocol ip"  # IPv4 only: ARP passes (see the module docstring)
_RATE = re.compile(r"(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit|bps|kbps|mbps|gbps)", re.IGNORECASE)
_RATE_BITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9,
              "bps": 8, "kbps": 8 * 10**3, "mbps": 8 * 10**6, "gbps": 8 * 10**9}


@dataclass(frozen=True)
class Partition:
    """Drop the node's packets to/from ``peers`` (addresses; empty = everyone) one or both ways."""

    peers: tuple[str, ...]
    direction: str


@dataclass(frozen=True)
class Loss:
    """Drop each packet crossing the node's wire with this probability, each way."""

    probability: float


Rule = Partition | Loss


def check_node(node: Any, count: int, name: str = "node") -> int:
    """``node`` if it is a node index in [0, ``count``); else one ``ConfigError`` line."""
    if isinstance(node, bool) or not isinstance(node, int) or not 0 <= node < count:
        raise ConfigError(name, node, f"must be a node index in [0, {count})")
    return node


def check_peers(node: int, peers: Any, count: int) -> str | list[int]:
    """A partition's ``peers`` checked: "all", "store", or the nodes listed (each a node
    index in [0, ``count``), the partitioned ``node`` not among them)."""
    if peers in ("all", "store"):
        return str(peers)
    if isinstance(peers, str) or not isinstance(peers, Sequence) or not peers:
        raise ConfigError("peers", peers, 'must be "all", "store" or a non-empty list of nodes')
    nodes = [check_node(p, count, name="peers") for p in peers]
    if node in nodes:
        raise ConfigError("peers", nodes, f"must not contain the partitioned node {node}")
    return nodes


def check_direction(direction: str) -> str:
    if direction not in DIRECTIONS:
        raise ConfigError("direction", direction, 'must be "both", "in" or "out"')
    return direction


def check_probability(probability: float) -> float:
    try:
        p = float(probability)
    except (TypeError, ValueError):
        raise ConfigError("probability", probability, "must be a number in [0, 1]") from None
    if not 0.0 <= p <= 1.0:
        raise ConfigError("probability", probability, "must be in [0, 1]")
    return p


def parse_rate(rate: str | int) -> int:
    """``"1mbit"``, ``"500kbit"``, ``"2mbps"`` (bytes) or an int of bits/s -> bits/s (tc units)."""
    if isinstance(rate, bool):
        raise ConfigError("rate", rate, 'must be a rate like "1mbit", "500kbit" or "2mbps"')
    if isinstance(rate, int):
        bits = rate
    else:
        match = _RATE.fullmatch(str(rate).strip())
        if match is None:
            raise ConfigError("rate", rate, 'must be a rate like "1mbit", "500kbit" or "2mbps"')
        bits = int(float(match.group(1)) * _RATE_BITS[match.group(2).lower()])
    if bits < 8:
        raise ConfigError("rate", rate, "must be at least 8bit (one byte a second)")
    return bits


def _chain(hook: str, rules: Sequence[Rule]) -> str:
    addr = "saddr" if hook == "ingress" else "daddr"
    lines = []
    for rule in rules:
        if isinstance(rule, Loss):
            threshold = round(rule.probability * LOSS_SCALE)
            if threshold >= LOSS_SCALE:
                lines.append(f"{_IP} drop")
            elif threshold > 0:
                lines.append(f"{_IP} numgen random mod {LOSS_SCALE} < {threshold} drop")
        elif rule.direction in ("both", "in" if hook == "ingress" else "out"):
            lines.append(f"ip {addr} {{ {', '.join(rule.peers)} }} drop" if rule.peers else f"{_IP} drop")
    body = "".join(f"\t\t{line}\n" for line in lines)
    return (f"\tchain {hook} {{\n\t\ttype filter hook {hook} device \"{WIRE}\" priority filter; "
            f"policy accept;\n{body}\t}}\n")


def render(rules: Sequence[Rule]) -> str:
    """An ``nft -f`` script that replaces the node's fault table by ``rules`` (none: no table)."""
    script = f"table netdev {TABLE}\ndelete table netdev {TABLE}\n"
    if rules:
        script += f"table netdev {TABLE} {{\n{_chain('ingress', rules)}{_chain('egress', rules)}}}\n"
    return script

"""Network faults as data, checked once, and the nftables ruleset a node's faults render to.

Every fault on a node lives in one table of that node's namespace, rewritten whole in one
``nft -f`` transaction on each change (create, delete, define): the kernel swaps it
atomically, so a packet sees either the old rules or the new ones, never half of each.
Rules match only the node's wire interface (``eth0``); its loopback, where the node's own
workers talk, is never faulted. Everything is ``drop``: no RST, no ICMP, no FIN: to the
other side the node simply went quiet, as when a switch port fails.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

from harness.errors import ConfigError

__all__ = ["DIRECTIONS", "Rule", "Partition", "Loss", "parse_rate", "check_probability", "render"]

DIRECTIONS = ("both", "in", "out")
TABLE = "harness_faults"
WIRE = "eth0"
#: probability resolution: numgen draws from 0..LOSS_SCALE-1
LOSS_SCALE = 10000
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
    iface, addr = ("iifname", "saddr") if hook == "input" else ("oifname", "daddr")
    lines = []
    for rule in rules:
        if isinstance(rule, Loss):
            if rule.probability > 0:
                threshold = round(rule.probability * LOSS_SCALE)
                lines.append(f'{iface} "{WIRE}" numgen random mod {LOSS_SCALE} < {threshold} drop')
        elif rule.direction in ("both", "in" if hook == "input" else "out"):
            match = f" ip {addr} {{ {', '.join(rule.peers)} }}" if rule.peers else ""
            lines.append(f'{iface} "{WIRE}"{match} drop')
    body = "".join(f"\t\t{line}\n" for line in lines)
    return (f"\tchain {hook} {{\n\t\ttype filter hook {hook} priority filter; policy accept;\n"
            f"{body}\t}}\n")


def render(rules: Sequence[Rule]) -> str:
    """An ``nft -f`` script that replaces the node's fault table by ``rules`` (none: no table)."""
    script = f"table inet {TABLE}\ndelete table inet {TABLE}\n"
    if rules:
        script += f"table inet {TABLE} {{\n{_chain('input', rules)}{_chain('output', rules)}}}\n"
    return script

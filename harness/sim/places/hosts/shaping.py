"""``bandwidth`` on a node's host: its links shaped each way, the harness's connection spared.

Here a node's link is a veth of its own, shaped by a token bucket at each end
(``harness.sim.net.network``). A host has one link for everything, the harness's SSH
connection included: the node's events, every later fault and heal, and the store, which
the node reaches through that connection's forward. Shaping it whole would slow the
harness with the node, and a heal could take as long as the fault. So each interface that
carries the job's traffic (the route to this machine and to each peer host: ``ip route
get``) gets an HTB qdisc whose default class has the rate and whose other class, not
limited, takes that connection's packets (u32: to this machine's address, from sshd's
port). What comes in is redirected (``mirred``) to an ifb device of the connection's and
shaped there the same way (from this machine's address, to sshd's port). The loopback is
never shaped (the node's store traffic there is the spared connection's).

What it takes from the host: ``tc``, ``ip``, the ifb module and root (the ``netns``
capability says the user allows network faults there); a host that lacks one says so in
one line. The interface's own root and ingress qdiscs are replaced while the fault lasts
and removed after (the kernel's default comes back, not an admin's own qdisc).

Ownership as the fault table's (``network``): before the first change a keeper starts
under the connection's supervisor, a shell that does nothing until SIGTERM and then
removes the qdiscs and the ifb device; the supervisor sends it when the connection ends
in any way, so the shaping never outlives its owner. ``clear`` removes it at once.
"""

from __future__ import annotations

import ipaddress
import re
import shlex
import subprocess
from collections.abc import Sequence
from typing import TYPE_CHECKING

from harness.hosts import CommandResult, HostError, SshHost
from harness.sim.errors import NetworkError
from harness.sim.places.hosts.rules import Control

if TYPE_CHECKING:
    from harness.hosts import RemoteProcess

__all__ = ["HostShaper", "burst_of"]

_NEEDS = "bandwidth on a host needs tc, ip, the ifb module and root there"
#: the spared class's rate: not a limit (HTB needs one)
_UNLIMITED = "10gbit"
#: the keeper: nothing until the connection ends, then "$0" (the removal) runs. Its output is
#: /dev/null, not the channel (a write there once the controller is gone would kill it by SIGPIPE)
_KEEPER = ('exec >/dev/null 2>&1; trap "" PIPE; trap \'sh -c "$0"; exit 0\' TERM HUP INT; '
           'while :; do sleep 3600 & wait $!; done')


def burst_of(bits: int) -> int:
    """The token bucket's burst for ``bits`` per second: 10 ms of it, at least 16 KiB (as a
    node's link here has)."""
    return max(16 * 1024, bits // 8 // 100)


class HostShaper:
    """The shaping of one host's links, owned by one connection (``host``)."""

    def __init__(self, host: SshHost, control: Control, name: str):
        self.host, self.control = host, control
        #: the ifb device that takes the host's incoming traffic (at most 15 characters)
        self.ifb = ("pe" + re.sub(r"[^A-Za-z0-9]", "", name))[:15]
        self._devices: tuple[str, ...] = ()  # shaped now
        self._keeper: RemoteProcess | None = None
        self._kept: tuple[str, ...] = ()  # the devices the keeper removes the shaping of

    def devices(self, peers: Sequence[str]) -> tuple[str, ...]:
        """The host's interfaces toward this machine and toward ``peers`` (their addresses):
        the links the job's traffic takes there, the loopback left out."""
        addresses = [self.control.address, *peers]
        script = 'for a; do ip -o route get "$a" || exit 1; done'
        done = self._run(["sh", "-c", script, "routes", *addresses])
        found = []
        for line in done.stdout.splitlines():
            words = line.split()
            if "dev" in words and words.index("dev") + 1 < len(words):
                found.append(words[words.index("dev") + 1])
        return tuple(dict.fromkeys(d for d in found if d != "lo"))

    def shape(self, bits: int, peers: Sequence[str]) -> None:
        """Limit the host's links to ``bits`` per second each way (replacing an earlier
        rate), the harness's connection spared."""
        address = ipaddress.ip_address(self.control.address)
        if address.version != 4:
            raise NetworkError(f"host {self.host.spec.label}: this machine reaches it over IPv6 ({address}); "
                               "bandwidth on hosts spares the harness's connection by its IPv4 address only")
        devices = self.devices(peers)
        if not devices:
            raise NetworkError(f"host {self.host.spec.label}: no interface there routes to this machine or the "
                               "job's other hosts: nothing to shape")
        if devices != self._kept:  # the keeper removes what it was told: a new one for other links
            if self._keeper is not None:
                self._keeper.close()  # its removal runs: the new shaping replaces it anyway
            self._keeper = self.host.start(["sh", "-c", _KEEPER, self._removal(devices)],
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            self._kept = devices
        self._devices = devices
        self._run(["sh", "-c", self._removal(devices) + "; " + self._script(bits, devices)])

    def clear(self) -> None:
        """Remove the shaping now (the keeper would at the connection's end)."""
        if self._devices:
            self._run(["sh", "-c", self._removal(self._devices)])
            self._devices = ()

    def shown(self) -> str:
        """``tc`` as the host shows the shaped links' qdiscs (tests)."""
        script = 'for d; do tc qdisc show dev "$d"; done'
        return self._run(["sh", "-c", script, "show", *self._devices, self.ifb], check=False).stdout

    def _script(self, bits: int, devices: Sequence[str]) -> str:
        ifb, port, me = shlex.quote(self.ifb), self.control.port, self.control.address
        limited = f"htb rate {bits}bit burst {burst_of(bits)}"
        spared = f"htb rate {_UNLIMITED} quantum 200000"
        lines = ["set -e", f"ip link add {ifb} type ifb", f"ip link set {ifb} up"]

        def classes(dev: str, match: str) -> None:
            lines.extend([f"tc qdisc add dev {dev} root handle 1: htb default 20",
                          f"tc class add dev {dev} parent 1: classid 1:10 {spared}",
                          f"tc class add dev {dev} parent 1: classid 1:20 {limited}",
                          f"tc filter add dev {dev} parent 1: protocol ip prio 1 u32 {match} flowid 1:10"])

        for dev in map(shlex.quote, devices):  # out: to this machine, from sshd's port
            classes(dev, f"match ip dst {me}/32 match ip sport {port} 0xffff")
            lines.extend([f"tc qdisc add dev {dev} handle ffff: ingress",
                          f"tc filter add dev {dev} parent ffff: protocol all prio 1 u32 match u32 0 0 "
                          f"action mirred egress redirect dev {ifb}"])
        classes(ifb, f"match ip src {me}/32 match ip dport {port} 0xffff")  # in: from this machine, to sshd
        return "\n".join(lines)

    def _removal(self, devices: Sequence[str]) -> str:
        """A shell line that removes the shaping, whatever of it exists."""
        parts = [f"tc qdisc del dev {d} root; tc qdisc del dev {d} ingress" for d in map(shlex.quote, devices)]
        return "{ " + "; ".join([*parts, f"ip link del {shlex.quote(self.ifb)}"]) + "; } 2>/dev/null; true"

    def _run(self, argv: Sequence[str], check: bool = True) -> CommandResult:
        try:
            done = self.host.run(list(argv), check=False)
        except HostError as e:
            raise NetworkError(f"{e}; {_NEEDS}") from None
        if check and done.returncode != 0:
            lines = [line for line in (done.stderr or done.stdout).splitlines() if line.strip()]
            why = lines[-1].strip() if lines else "no output"
            raise NetworkError(f"host {self.host.spec.label}: shaping its links exited {done.returncode}: {why}; "
                               f"{_NEEDS}")
        return done

"""A job's network faults on nodes placed on hosts (``job.network`` there; docs/hosts.md).

Each host that takes a fault gets one nftables table of its own (``HostFirewall``), named
by the connection's work dir, rewritten whole by ``nft -f`` on each change (the rules:
``harness.sim.places.hosts.rules``). What it takes from the host: nftables and root there
(the ``netns`` capability of the hosts file says the user allows it); a host that lacks
either says so in one line when the fault is applied.

Ownership: before the first rule, a *keeper* starts on the host under the connection's
supervisor, a shell that does nothing until SIGTERM and then deletes the table. The
supervisor sends SIGTERM when the connection ends in any way (``close()``, this machine's
process dying, the link dropping: the lease ends), so the table never outlives its
owner, whichever way the owner goes. ``heal`` removes the table at once.

A partition or packet loss falls on the node's sockets alone where its host lists
``cgroups`` (``rules.NodeSockets``: its cgroup v2 dir there, which its resource
keeper makes), so neither the job's other nodes there nor another job's (a host that is
not the job's alone: ``exclusive``) are cut. Elsewhere the table matches by address, and
so falls on the whole host: it is refused before anything is recorded (``refusals``)
where the host carries another node of the job or is not the job's alone, as the other
network faults of such a node are. One table per host holds the rules of each of its
faulted nodes, and is written again when a node of the host starts (its loopback packets
are tagged from then).
"""

from __future__ import annotations

import logging
import re
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from harness.errors import ConfigError
from harness.hosts import CommandResult, HostError, SshHost
from harness.sim.errors import NetworkError
from harness.sim.net.network import NetworkChange
from harness.sim.net.rules import check_direction, check_node, check_peers, check_probability, parse_rate
from harness.sim.places.hosts.rules import (
    Control,
    HostLoss,
    HostPartition,
    HostRule,
    NodeSockets,
    render_cut,
    render_host,
)
from harness.sim.places.hosts.shaping import HostShaper

if TYPE_CHECKING:
    from harness.hosts import RemoteProcess

__all__ = ["HostFirewall", "HostNetwork", "NOT_ON_HOSTS", "NodeLinks"]

_log = logging.getLogger(__name__)

#: the network faults not done on hosts, and why
NOT_ON_HOSTS = {
    "link_down": "it would cut the host off from this machine, the harness's SSH connection with it "
                 "(partition with peers='all' cuts the node off and spares that connection)",
}
#: how a shell run under the connection's supervisor removes table "$0" when the connection
#: ends (the supervisor's SIGTERM). Its output is /dev/null, not the channel: once the
#: controller is gone, a write there (the shell's own "Terminated" for its killed sleep)
#: would kill it by SIGPIPE before its trap
_DELETE_AT_END = 'exec >/dev/null 2>&1; trap "" PIPE; trap \'nft delete table inet "$0"; exit 0\' TERM HUP INT; '
#: the keeper: nothing until the connection ends, then the table goes
_KEEPER = _DELETE_AT_END + 'while :; do sleep 3600 & wait $!; done'
_NEEDS = "network faults on a host need nftables (nft) and root there"
#: the cutter (``host_unreachable``): loads the cut, and lifts it itself after its seconds (this
#: machine cannot reach the host to lift it), or at once when the connection ends
_CUTTER = _DELETE_AT_END + 'nft -f "$1" || exit 1; sleep "$2" & wait $!; nft delete table inet "$0"'
#: how long the cut may take to be felt here (the cutter starts, nft loads it)
_CUT_FELT_S = 10.0
#: after the cut is lifted, how long the host may take to answer again: TCP's retransmission
#: backoff (the next try may come as late as the outage was long), then a margin
_BACK_MARGIN_S = 20.0


def _nft_error(text: str) -> str:
    """nft's complaint in one line: its ``Error:`` line (the lines after it echo the input
    and mark the place with ``^^^``), else the last line it wrote."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return next((line for line in lines if "Error:" in line), lines[-1] if lines else "no output")


class HostFirewall:
    """The fault table of one host, owned by one connection (``host``)."""

    def __init__(self, host: SshHost):
        self.host = host
        self.table = "pe_" + re.sub(r"[^A-Za-z0-9_]", "_", host.work_dir.rsplit("/", 1)[-1])
        self._keeper: RemoteProcess | None = None
        self._control: Control | None = None
        self._changes = 0

    def control(self) -> Control:
        """The harness's SSH connections as the host sees them (its ``$SSH_CONNECTION``)."""
        if self._control is None:
            words = self.host.run(["sh", "-c", 'printf "%s" "$SSH_CONNECTION"']).stdout.split()
            if len(words) != 4 or not words[3].isdigit():
                raise NetworkError(f"host {self.host.spec.label}: cannot tell this machine's address there "
                                   f"($SSH_CONNECTION is {' '.join(words)!r}), so a network fault would cut the "
                                   "harness's own connection: not applied")
            self._control = Control(words[0], int(words[3]))
        return self._control

    def apply(self, faults: Mapping[int, Sequence[HostRule]], store_port: int | None,
              sockets: Mapping[int, NodeSockets] | None = None) -> None:
        """The table made to hold the rules of ``faults`` (node -> its rules; none: removed),
        in one transaction; ``sockets`` as ``render_host`` takes them."""
        if any(faults.values()) and self._keeper is None:
            self._keeper = self.host.start(["sh", "-c", _KEEPER, self.table], stdout=subprocess.DEVNULL,
                                           stderr=subprocess.DEVNULL)
        self._nft("-f", self._put(render_host(self.table, faults, self.control(), store_port, sockets)))

    def cut(self, seconds: float) -> RemoteProcess:
        """This machine's SSH connections to the host dropped there for ``seconds``: the
        table is checked (``nft -c``) while the host is still reachable, then loaded by the
        cutter, which lifts it when the time is up. The cutter's handle."""
        table = f"{self.table}_cut"
        path = self._put(render_cut(table, self.control()))
        self._nft("-c", "-f", path)
        return self.host.start(["sh", "-c", _CUTTER, table, path, repr(float(seconds))],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def _put(self, script: str) -> str:
        self._changes += 1
        return self.host.put(f"net/{self._changes}.nft", script.encode())

    def _nft(self, *args: str) -> CommandResult:
        try:
            done = self.host.run(["nft", *args], check=False)
        except HostError as e:
            raise NetworkError(f"{e}; {_NEEDS}") from None
        if done.returncode != 0:
            raise NetworkError(f"host {self.host.spec.label}: nft {' '.join(args[:-1])} exited {done.returncode}: "
                               f"{_nft_error(done.stderr or done.stdout)}; {_NEEDS}")
        return done

    def listed(self) -> str | None:
        """The table as the host's ``nft`` lists it now (None: there is none)."""
        done = self.host.run(["nft", "list", "table", "inet", self.table], check=False)
        return done.stdout if done.returncode == 0 else None


def _answers(host: SshHost, timeout: float) -> bool:
    """Whether the host's lease answers a ping within ``timeout`` s."""
    try:
        host.ping(timeout)
    except HostError:
        return False
    return True


class NodeLinks(Protocol):
    """The job's hosts as its network faults see them (``RemoteNodes``)."""

    def address(self, node: int) -> str:
        """Node ``node``'s host's address."""
        ...

    def connection(self, node: int) -> tuple[SshHost, int | None]:
        """Node ``node``'s host's connection (opened by its start) and the store's port there."""
        ...

    def node_count(self) -> int:
        """How many node indices the job can have (its network's slots)."""
        ...

    def neighbours(self, node: int) -> list[int]:
        """The job's other node indices placed on node ``node``'s host."""
        ...

    def sockets(self, node: int) -> tuple[str, int] | str:
        """Node ``node``'s cgroup v2 dir as its host's nft matches its sockets (``[path,
        level]``), or why it has none (a clause: what is missing)."""
        ...

    def reconnect(self, node: int) -> SshHost:
        """A new connection to node ``node``'s host, in place of one that was lost."""
        ...

    def deliver_missed(self, node: int) -> dict[int, int | None]:
        """For each node that ran on node ``node``'s host over the connection lost: how many
        lines its agent wrote to its events file there that never reached this machine,
        now read over the new connection and delivered (None: the host no longer had them)."""
        ...


class HostNetwork:
    """The network faults of a job's nodes on hosts: the same calls as ``Network``'s, the
    same ``NetworkChange``s, carried out by each faulted node's host."""

    def __init__(self, links: NodeLinks):
        self._links = links
        self._rules: dict[int, list[HostRule]] = {}
        self._firewalls: dict[SshHost, HostFirewall] = {}
        self._shapers: dict[SshHost, HostShaper] = {}
        self._shaped: dict[int, int] = {}  # node -> the rate its host's links are shaped to (bits/s)
        self._lock = threading.RLock()  # faults come from the scheduler's thread and the test's

    def address(self, node: int) -> str:
        return self._links.address(self._check_node(node))

    def partition(self, node: int, peers: str | Sequence[int] = "all", direction: str = "both") -> NetworkChange:
        """As ``Network.partition``: "all" is every host and the store (never the harness's
        connection), "store" the store alone, a list of nodes their hosts."""
        self._check_node(node)
        check_direction(direction)
        checked = check_peers(node, peers, self._links.node_count())
        shown: str | list[int]
        near = self._links.neighbours(node)  # cut over its host's loopback, by their sockets
        if isinstance(checked, str):  # "all": every host, the store and its neighbours; "store": the store alone
            every = checked == "all"
            rule = HostPartition((), direction, wire=every, store=True, neighbours=tuple(near) if every else ())
            shown = checked
        else:
            addresses = tuple(dict.fromkeys(self._links.address(p) for p in checked if p not in near))
            rule = HostPartition(addresses, direction, wire=bool(addresses),
                                 neighbours=tuple(sorted({p for p in checked if p in near})))
            shown = sorted(set(checked))
        with self._lock:
            self._change(node, [*self._rules.get(node, []), rule])
        return NetworkChange("partition", node, {"peers": shown, "direction": direction})

    def packet_loss(self, node: int, probability: float) -> NetworkChange:
        """As ``Network.packet_loss``: replaces an earlier loss on this node; 0 removes it."""
        self._check_node(node)
        p = check_probability(probability)
        with self._lock:
            kept = [r for r in self._rules.get(node, []) if not isinstance(r, HostLoss)]
            self._change(node, kept + ([HostLoss(p)] if p > 0 else []))
        return NetworkChange("packet_loss", node, {"probability": p})

    def bandwidth(self, node: int, rate: str | int) -> NetworkChange:
        """As ``Network.bandwidth``: node ``node``'s host's links toward this machine and the
        job's other hosts limited to ``rate`` each way, the harness's connection spared
        (``shaping``); replaces an earlier rate."""
        self._check_node(node)
        bits = parse_rate(rate)
        own = self._links.address(node)
        peers = [a for a in dict.fromkeys(self._links.address(n) for n in range(self._links.node_count())) if a != own]
        with self._lock:
            self._shaper(node).shape(bits, peers)
            self._shaped[node] = bits
        return NetworkChange("bandwidth", node, {"rate": rate, "bits_per_second": bits})

    def link_down(self, node: int) -> NetworkChange:
        raise ConfigError("fault", "link_down", f"is not done on hosts: {NOT_ON_HOSTS['link_down']}")

    def host_unreachable(self, node: int, seconds: float = 3.0,
                         on_back: Callable[[dict[str, Any]], None] | None = None) -> NetworkChange:
        """This machine loses node ``node``'s host for ``seconds``: the host drops the
        harness's SSH connections (``HostFirewall.cut``), so the node's events stop coming,
        no fault or heal reaches it, and the store, which it reaches over that connection,
        goes quiet for it (its peers go on without it, per the runtime's rules). The host
        lifts the cut itself. An outage shorter than ``harness.hosts.SILENT_LINK_S`` resumes (TCP
        retransmits: the events come late); a longer one loses the connection, and with it
        the node (its host's lease ends what it started there). Returns once the cut is
        felt here; ``on_back`` is called, from a thread, with what came of it once the host
        answers again: ``connection`` "kept", "reconnected" (a new connection; the node is
        lost) or "lost" (no answer), and ``unreachable_s``; reconnected, ``missed_events``:
        per node, the lines the lost connection never brought, now delivered
        (``deliver_missed``)."""
        self._check_node(node)
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 < seconds <= 3600:
            raise ConfigError("seconds", seconds, "must be a number of seconds in (0, 3600]")
        firewall = self.firewall(node)
        with self._lock:
            cutter = firewall.cut(seconds)
        began = time.monotonic()
        while _answers(firewall.host, 0.5):
            if time.monotonic() - began > _CUT_FELT_S:
                cutter.close()
                raise NetworkError(f"host {firewall.host.spec.label}: this machine still reached it "
                                   f"{_CUT_FELT_S:g} s after the cut was started: not applied")
        threading.Thread(target=self._await_back, args=(node, firewall.host, began, seconds, on_back),
                         name=f"host_unreachable {node}", daemon=True).start()
        return NetworkChange("host_unreachable", node, {"seconds": seconds, "host": firewall.host.spec.label})

    def _await_back(self, node: int, host: SshHost, began: float, seconds: float,
                    on_back: Callable[[dict[str, Any]], None] | None) -> None:
        """Once the cut is lifted: until the host answers again, on the same connection or
        (once the client gave it up) on a new one; what came of it to ``on_back``."""
        time.sleep(max(0.0, began + seconds - time.monotonic()))
        deadline = began + 2 * seconds + _BACK_MARGIN_S
        connection = "lost"
        while time.monotonic() < deadline and not host.closed:
            if host.connected() and _answers(host, 1.0):
                connection = "kept"
                break
            if not host.connected():
                try:
                    _answers(self._links.reconnect(node), 5.0)
                except HostError as e:
                    _log.warning("node %d: reconnecting to its host: %s", node, e)
                    time.sleep(1.0)
                    continue
                connection = "reconnected"
                break
        if host.closed and connection == "lost":
            return  # the job ended meanwhile (closed its hosts): nobody is left to tell
        fields: dict[str, Any] = {"connection": connection, "unreachable_s": round(time.monotonic() - began, 3)}
        if connection == "reconnected":  # what the lost connection never delivered, read over the new one
            fields["missed_events"] = {str(n): count for n, count in self._links.deliver_missed(node).items()}
        if on_back is not None:
            try:
                on_back(fields)
            except (OSError, ValueError) as e:  # the job's event file closed as it came back
                _log.warning("node %d: its host is reachable again, but that could not be recorded: %s", node, e)

    def heal(self, node: int | None = None) -> NetworkChange:
        """Remove node ``node``'s faults (every node's with None): its host's table goes."""
        if node is not None:
            self._check_node(node)
        healed: set[str] = set()
        with self._lock:
            for n in [node] if node is not None else sorted({*self._rules, *self._shaped}):
                if self._rules.pop(n, None):
                    healed.add("partition/packet_loss")
                    self._apply(n)
                if self._shaped.pop(n, None) is not None:
                    healed.add("bandwidth")
                    self._shaper(n).clear()
        return NetworkChange("heal", node, {"healed": sorted(healed)})

    def faulted(self) -> dict[int, list[str]]:
        with self._lock:
            faulted = {n: ["partition" if isinstance(r, HostPartition) else "packet_loss" for r in rules]
                       for n, rules in self._rules.items() if rules}
            for n in self._shaped:
                faulted.setdefault(n, []).append("bandwidth")
            return faulted

    def firewall(self, node: int) -> HostFirewall:
        """Node ``node``'s host's fault table (made on first use)."""
        return self._firewall_of(self._links.connection(node)[0])

    def _firewall_of(self, host: SshHost) -> HostFirewall:
        with self._lock:
            if host not in self._firewalls:
                self._firewalls[host] = HostFirewall(host)
            return self._firewalls[host]

    def _shaper(self, node: int) -> HostShaper:
        """Node ``node``'s host's shaping (made on first use; it asks the fault table for how
        the host sees the harness's connection)."""
        firewall = self.firewall(node)
        with self._lock:
            if firewall.host not in self._shapers:
                self._shapers[firewall.host] = HostShaper(firewall.host, firewall.control(), firewall.table)
            return self._shapers[firewall.host]

    def _change(self, node: int, rules: list[HostRule]) -> None:
        """Node ``node``'s rules made ``rules`` on its host; as they were if that fails."""
        before = self._rules.get(node)
        self._rules[node] = rules
        try:
            self._apply(node)
        except BaseException:
            if before is None:
                self._rules.pop(node, None)
            else:
                self._rules[node] = before
            raise

    def node_started(self, node: int) -> None:
        """Node ``node`` started on its host: where the host's table holds a rule, it is
        written again, so that it knows the node's sockets (its loopback packets tagged)."""
        with self._lock:
            if self._links.neighbours(node) and any(self._rules.get(n) for n in self._on_host(node)):
                try:
                    self._apply(node)
                except (NetworkError, HostError) as e:  # the faults in place stay; the node's start goes on
                    _log.warning("node %d: its host's fault table was not written again as it started: %s", node, e)

    def _on_host(self, node: int) -> list[int]:
        return sorted([node, *self._links.neighbours(node)])

    def _apply(self, node: int) -> None:
        """Node ``node``'s host's table written with the rules of each of its nodes: by
        each node's sockets where the host knows them (it lists cgroups), else by address
        (the node is then alone there: refused otherwise, ``refusals``)."""
        host, store_port = self._links.connection(node)
        on_host = self._on_host(node)
        faults = {n: self._rules[n] for n in on_host if self._rules.get(n)}
        sockets: dict[int, NodeSockets] = {}
        for n in on_host:
            found = self._links.sockets(n)
            if isinstance(found, tuple):
                sockets[n] = NodeSockets(n, *found)
            elif n in faults and len(on_host) > 1:
                raise NetworkError(f"node {n} shares its host {host.spec.label} with node(s) "
                                   f"{', '.join(str(m) for m in on_host if m != n)}, and a network fault on it "
                                   f"alone needs {found}: not applied")
        # by sockets wherever the host says whose they are: no other node, of this job or of
        # another one there (``exclusive``), is cut; by address only where it cannot say
        self._firewall_of(host).apply(faults, store_port, sockets if sockets else None)

    def _check_node(self, node: object) -> int:
        return check_node(node, self._links.node_count())

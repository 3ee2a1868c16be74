"""``Network``: the simulated nodes as hosts on a switch, and the faults a network suffers.

In ``"netns"`` mode every node, and the store, is a network namespace with one interface
(``eth0``, a veth) plugged into a bridge that lives in a switch namespace of its own, and an
address from 198.18.0.0/15 (RFC 2544's benchmark range). This machine's root namespace gets
nothing: no interface, address, route or nft rule; the harness reaches its agents over
Unix sockets, pipes and files, which cross namespaces. A process joins node i's network
with ``preexec_fn=network.enter(i)`` (one ``setns``; everything it starts inherits it).

In ``"loopback"`` mode the nodes share this machine's loopback (addresses from 127/8,
which Linux routes to ``lo`` with no setup) and there are no network faults.

Faults are applied inside the faulted node's namespace (nftables drops, tbf qdiscs) or on
its switch port (link down), each call returning a ``NetworkChange`` for the timeline.
"""

from __future__ import annotations

import functools
import ipaddress
import os
import subprocess
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from harness.errors import ConfigError
from harness.procs import join_netns
from harness.sim.errors import NetworkError, NetworkUnavailable
from harness.sim.net.names import NETNS_DIR, delete_namespaces, namespace_prefix, sweep_dead_owners
from harness.sim.net.netlink import HostSetup, configure_hosts
from harness.sim.net.nft import Nft, open_nft
from harness.sim.net.probe import netns_missing, resolve_mode
from harness.sim.net.rules import (
    WIRE,
    Loss,
    Partition,
    Rule,
    check_direction,
    check_node,
    check_peers,
    check_probability,
    parse_rate,
    render,
)

T = TypeVar("T")

__all__ = ["Network", "NetworkChange", "NetworkError", "NetworkUnavailable", "NETNS_RANGE"]

NETNS_RANGE = ipaddress.ip_network("198.18.0.0/15")
_STORE_ADDRESS = ipaddress.ip_address("198.18.0.2")
_FIRST_NODE = ipaddress.ip_address("198.18.1.1")
_MAX_NODES = 60000  # stays well inside the /15
_LOOPBACK_STORE = "127.0.0.1"
_LOOPBACK_FIRST_NODE = ipaddress.ip_address("127.0.1.1")
_BRIDGE = "br0"
_TBF_LATENCY = "200ms"
F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class NetworkChange:
    """One change made to the network: what, to which node, and when it took effect
    (after the kernel had it: packets from ``monotonic`` on see the new state)."""

    kind: str  # "partition" | "packet_loss" | "bandwidth" | "link_down" | "heal"
    node: int | None
    params: dict[str, Any] = field(default_factory=dict)
    at: float = 0.0  # time.time()
    monotonic: float = 0.0


@dataclass
class _Owned:
    """What close() must remove, kept apart from the Network so a finalizer can run it."""

    owner: int
    namespaces: list[str] = field(default_factory=list)
    fds: list[int] = field(default_factory=list)
    nft: list[Nft] = field(default_factory=list)  # their sockets pin namespaces: closed first
    closed: bool = False


def _teardown(owned: _Owned) -> None:
    if owned.closed or os.getpid() != owned.owner:  # a forked child owns none of it
        return
    owned.closed = True
    for nft in owned.nft:
        nft.close()
    owned.nft.clear()
    for fd in owned.fds:
        try:
            os.close(fd)
        except OSError:
            pass
    owned.fds.clear()
    # the switch goes last: while it exists every node's veth peer is still plugged in
    delete_namespaces(list(reversed(owned.namespaces)))
    owned.namespaces.clear()


def _locked(method: F) -> F:
    """One change at a time: a job's scheduler thread and the test may both fault."""
    @functools.wraps(method)
    def locked(self: Network, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return method(self, *args, **kwargs)
    return locked  # type: ignore[return-value]


class Network:
    """The network of one cluster. ``Network(nnodes=3, mode="auto")``; ``close()`` it."""

    def __init__(self, nnodes: int, mode: str = "auto"):
        if isinstance(nnodes, bool) or not isinstance(nnodes, int) or not 0 <= nnodes <= _MAX_NODES:
            raise ConfigError("nnodes", nnodes, f"must be an int in [0, {_MAX_NODES}]")
        self.requested = mode
        self.mode = resolve_mode(mode)
        self.nnodes = 0
        self._prefix = namespace_prefix()
        self._owned = _Owned(owner=os.getpid())
        self._finalizer = weakref.finalize(self, _teardown, self._owned)
        self._fds: dict[str, int] = {}  # host -> fd of its namespace
        self._hosts: list[tuple[str, str]] = []  # (host, address) of every host plugged in
        self._nft: dict[int, Nft] = {}  # node -> its nft runner, made at its first fault
        self._lock = threading.RLock()  # faults may come from the job's scheduler thread
        self._rules: dict[int, list[Rule]] = {}
        self._shaped: set[int] = set()
        self._down: set[int] = set()
        if self.mode == "netns":
            try:
                sweep_dead_owners()
                self._build(nnodes)
            except BaseException:
                self.close()
                raise
        else:
            self.nnodes = nnodes

    # -- naming and addresses ------------------------------------------------------------

    def namespace(self, node: int) -> str | None:
        """The name of node ``node``'s namespace (under /run/netns); None in loopback mode."""
        self._check_node(node)
        return f"{self._prefix}n{node}" if self.mode == "netns" else None

    def namespace_path(self, node: int) -> str | None:
        """``/run/netns/<name>`` of node ``node``: hand it to a child that joins by itself
        (``harness.procs.join_netns(path)`` first thing, or ``nsenter --net=PATH``), which
        avoids the full fork a ``preexec_fn`` forces on a large parent."""
        name = self.namespace(node)
        return os.path.join(NETNS_DIR, name) if name else None

    @property
    def store_namespace(self) -> str | None:
        return f"{self._prefix}store" if self.mode == "netns" else None

    @property
    def switch_namespace(self) -> str | None:
        return f"{self._prefix}sw" if self.mode == "netns" else None

    def address(self, node: int) -> str:
        """Node ``node``'s IPv4 address, as other nodes and the store reach it."""
        self._check_node(node)
        first = _FIRST_NODE if self.mode == "netns" else _LOOPBACK_FIRST_NODE
        return str(first + node)

    @property
    def store_address(self) -> str:
        return str(_STORE_ADDRESS) if self.mode == "netns" else _LOOPBACK_STORE

    def enter(self, node: int) -> Callable[[], None] | None:
        """A ``preexec_fn`` that moves the new process into node ``node``'s network (None
        in loopback mode, where there is nothing to enter)."""
        return self._enter(f"n{self._check_node(node)}")

    def enter_store(self) -> Callable[[], None] | None:
        """A ``preexec_fn`` for the store (the harness's rendezvous server or etcd)."""
        return self._enter("store")

    def _enter(self, host: str) -> Callable[[], None] | None:
        if self.mode != "netns":
            return None
        if self._owned.closed:
            raise NetworkError("the network is closed")
        fd = self._fds[host]
        return lambda: join_netns(fd)

    def call_in_store(self, fn: Callable[[], T]) -> T:
        """``fn()`` run from inside the store's namespace (directly in loopback mode): the
        harness's own way to check a store it started, since the root namespace has no
        route into the network. A network namespace is per thread, so a short-lived thread
        joins it and this process stays where it is."""
        if self.mode != "netns":
            return fn()
        fd = self._fds["store"]
        outcome: list[Any] = []

        def run() -> None:
            try:
                join_netns(fd)
                outcome.append((True, fn()))
            except BaseException as e:  # handed to the caller below, whatever it is
                outcome.append((False, e))

        thread = threading.Thread(target=run, name="in-store-netns", daemon=True)
        thread.start()
        thread.join()
        ok, value = outcome[0]
        if not ok:
            raise value
        return value  # type: ignore[no-any-return]

    # -- building ------------------------------------------------------------------------

    @_locked
    def add_node(self) -> int:
        """Plug one more node into the switch (a scale-up); its index."""
        node = self.nnodes
        if node >= _MAX_NODES:
            raise ConfigError("nnodes", node + 1, f"must be <= {_MAX_NODES}")
        if self.mode == "netns":
            self._add_hosts([(f"n{node}", str(_FIRST_NODE + node))])
        self.nnodes += 1
        return node

    def _build(self, nnodes: int) -> None:
        hosts = [("store", str(_STORE_ADDRESS))]
        hosts += [(f"n{i}", str(_FIRST_NODE + i)) for i in range(nnodes)]
        self._add_hosts(hosts, switch=True)
        self.nnodes = nnodes

    def _add_namespaces(self, hosts: Sequence[str]) -> None:
        full = [self._prefix + h for h in hosts]
        self._owned.namespaces[len(self._owned.namespaces):] = full  # recorded first: close() removes
        _check(subprocess.run(["ip", "-batch", "-"], input="".join(f"netns add {n}\n" for n in full),
                              capture_output=True, text=True), "creating namespaces")
        for host, name in zip(hosts, full, strict=True):
            fd = os.open(os.path.join(NETNS_DIR, name), os.O_RDONLY | os.O_CLOEXEC)
            self._owned.fds.append(fd)
            self._fds[host] = fd

    def _add_hosts(self, hosts: Sequence[tuple[str, str]], switch: bool = False) -> None:
        """Namespaces, one veth each (``eth0`` inside, ``p<host>`` on the bridge), addresses;
        with ``switch``, the switch namespace and its bridge first. Two ``ip`` processes (one
        for all namespaces, one for the switch); each namespace's own settings are made from
        here, over netlink (``harness.sim.net.netlink``): an ``ip`` process per namespace
        was most of the build's cost.

        Every host knows every other host's MAC address from the start (permanent neighbour
        entries; MACs derived from the addresses): no ARP ever. On 2 loaded cores ARP
        replies, answered in softirq time that competes with everything else, came too late
        for 32 nodes opening a gloo full mesh at once ("No route to host" after three
        tries); and a partition, which drops IPv4 only, cannot leave a node unresolved."""
        known = dict(self._hosts)  # the hosts already plugged in learn of the new ones
        self._hosts.extend(hosts)
        self._add_namespaces(["sw"] * switch + [h for h, _ in hosts])
        # addrgenmode none: no IPv6 link-local addresses anywhere (the only addresses are
        # ours from 198.18.0.0/15, and no IPv6 path slips past the IPv4 fault rules)
        bridge = (f"link add {_BRIDGE} type bridge\nlink set {_BRIDGE} addrgenmode none\n"
                  f"link set {_BRIDGE} up\n") if switch else ""
        self._ip("sw", bridge + "".join(
            f"link add p{h} type veth peer name {WIRE} address {_mac(a)} netns {self._prefix}{h}\n"
            f"link set p{h} addrgenmode none\nlink set p{h} master {_BRIDGE}\nlink set p{h} up\n"
            for h, a in hosts))
        everyone = [(addr, _mac_bytes(addr)) for _, addr in self._hosts]
        new = [(addr, _mac_bytes(addr)) for _, addr in hosts]
        setups = [HostSetup(self._fds[h], WIRE, addr, NETNS_RANGE.prefixlen,
                            [(a, mac) for a, mac in everyone if a != addr]) for h, addr in hosts]
        setups += [HostSetup(self._fds[h], WIRE, neighbours=new) for h in known]
        try:
            configure_hosts(setups)
        except OSError as e:
            raise NetworkError(f"configuring namespaces failed: {e}") from None

    def _ip(self, host: str, script: str) -> None:
        _check(subprocess.run(["ip", "-n", self._prefix + host, "-batch", "-"], input=script,
                              capture_output=True, text=True), f"ip in {host}")

    # -- faults --------------------------------------------------------------------------

    @_locked
    def partition(self, node: int, peers: str | Sequence[int] = "all",
                  direction: str = "both") -> NetworkChange:
        """Silently drop node ``node``'s packets to/from ``peers`` ("all", "store" or a list
        of nodes), both ways or only ``"in"`` (to the node) or ``"out"`` (from it)."""
        self._check_node(node)
        check_direction(direction)
        addresses, shown = self._peer_addresses(node, peers)
        self._require_netns("partition")
        self._rules.setdefault(node, []).append(Partition(addresses, direction))
        self._apply_rules(node)
        return _change("partition", node, peers=shown, direction=direction)

    @_locked
    def packet_loss(self, node: int, probability: float) -> NetworkChange:
        """Drop each packet crossing node ``node``'s wire, either way, with ``probability``
        (0 removes the loss; replaces an earlier loss on this node)."""
        self._check_node(node)
        p = check_probability(probability)
        self._require_netns("packet_loss")
        kept = [r for r in self._rules.get(node, []) if not isinstance(r, Loss)]
        self._rules[node] = kept + ([Loss(p)] if p > 0 else [])
        self._apply_rules(node)
        return _change("packet_loss", node, probability=p)

    @_locked
    def bandwidth(self, node: int, rate: str | int) -> NetworkChange:
        """Limit node ``node``'s link to ``rate`` ("1mbit", "500kbit", "2mbps"), each way: a
        token bucket on its interface (out) and on its switch port (in)."""
        self._check_node(node)
        bits = parse_rate(rate)
        self._require_netns("bandwidth")
        burst = max(16 * 1024, bits // 8 // 100)
        qdisc = f"root tbf rate {bits}bit burst {burst} latency {_TBF_LATENCY}"
        self._shaped.add(node)
        self._tc(f"n{node}", f"qdisc replace dev {WIRE} {qdisc}")
        self._tc("sw", f"qdisc replace dev pn{node} {qdisc}")
        return _change("bandwidth", node, rate=rate, bits_per_second=bits)

    @_locked
    def link_down(self, node: int) -> NetworkChange:
        """Unplug node ``node``'s cable: its switch port goes down (the node sees no carrier)."""
        self._check_node(node)
        self._require_netns("link_down")
        self._down.add(node)
        self._ip("sw", f"link set pn{node} down\n")
        return _change("link_down", node)

    def host_unreachable(self, node: int, seconds: float = 3.0,
                         on_back: Callable[[dict[str, Any]], None] | None = None) -> NetworkChange:
        """Refused: this machine cannot lose sight of itself (a node on a host can: its place's
        network carries it out, ``harness.sim.places.hosts.network``)."""
        raise ConfigError("fault", "host_unreachable", "needs the node on a host (Cluster(hosts=...)): "
                          "a node on this machine has no connection to lose")

    @_locked
    def heal(self, node: int | None = None) -> NetworkChange:
        """Remove every network fault of ``node`` (partitions, loss, bandwidth, link down),
        or of every node when ``node`` is None."""
        if node is not None:
            self._check_node(node)
        self._require_netns("heal")
        nodes = [node] if node is not None else sorted({*self._rules, *self._shaped, *self._down})
        healed: set[str] = set()
        for n in nodes:
            if self._rules.pop(n, None):
                healed.add("partition/packet_loss")
                self._apply_rules(n)
            if n in self._shaped:
                self._shaped.discard(n)
                healed.add("bandwidth")
                self._tc(f"n{n}", f"qdisc del dev {WIRE} root", missing_ok=True)
                self._tc("sw", f"qdisc del dev pn{n} root", missing_ok=True)
            if n in self._down:
                self._down.discard(n)
                healed.add("link_down")
                self._ip("sw", f"link set pn{n} up\n")
        return _change("heal", node, healed=sorted(healed))

    def faulted(self) -> dict[int, list[str]]:
        """node -> the kinds of fault it has now (what a test must heal or report)."""
        out: dict[int, list[str]] = {}
        for n, rs in self._rules.items():
            for r in rs:
                out.setdefault(n, []).append("partition" if isinstance(r, Partition) else "packet_loss")
        for n in self._shaped:
            out.setdefault(n, []).append("bandwidth")
        for n in self._down:
            out.setdefault(n, []).append("link_down")
        return out

    def _peer_addresses(self, node: int, peers: str | Sequence[int]) -> tuple[tuple[str, ...], Any]:
        checked = check_peers(node, peers, self.nnodes)
        if isinstance(checked, str):  # "all" or "store"
            return ((self.store_address,) if checked == "store" else ()), checked
        return tuple(self.address(p) for p in checked), sorted(set(checked))

    def _apply_rules(self, node: int) -> None:
        nft = self._nft.get(node)
        if nft is None:
            nft = self._nft[node] = open_nft(self._fds[f"n{node}"])
            self._owned.nft.append(nft)
        error = nft.run(render(self._rules.get(node, [])))
        if error is not None:
            lines = error.strip().splitlines()
            raise NetworkError(f"nft in node {node} failed: {lines[0] if lines else 'no output'}")

    def _tc(self, host: str, command: str, missing_ok: bool = False) -> None:
        out = subprocess.run(["tc", "-n", self._prefix + host, *command.split()],
                             capture_output=True, text=True)
        if not missing_ok:
            _check(out, f"tc in {host}")

    # -- checks and lifetime -------------------------------------------------------------

    def _check_node(self, node: Any, name: str = "node") -> int:
        return check_node(node, self.nnodes, name)

    def _require_netns(self, what: str) -> None:
        if self._owned.closed and self.mode == "netns":
            raise NetworkError(f"{what}: the network is closed")
        if self.mode != "netns":
            missing = netns_missing()
            why = f"; not possible here: needs {'; '.join(missing)}" if missing else ""
            raise NetworkUnavailable("network", self.mode, f'has no {what} fault: it needs network="netns"{why}')

    def close(self) -> None:
        """Remove every namespace (and so every link, bridge, qdisc and nft table). Idempotent."""
        self._finalizer()

    def __enter__(self) -> Network:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._owned.closed else f"nnodes={self.nnodes}"
        where = f" prefix={self._prefix!r}" if self.mode == "netns" else ""
        return f"<Network {self.mode}{where} {state}>"


def _mac_bytes(address: str) -> bytes:
    """A host's MAC: locally administered (02:00) followed by its IPv4 address."""
    return bytes((2, 0)) + ipaddress.IPv4Address(address).packed


def _mac(address: str) -> str:
    """``_mac_bytes`` as ``ip`` writes it (``02:00:c6:12:01:01``)."""
    return ":".join(f"{octet:02x}" for octet in _mac_bytes(address))


def _change(kind: str, node: int | None, **params: Any) -> NetworkChange:
    return NetworkChange(kind, node, params, time.time(), time.monotonic())


def _check(out: subprocess.CompletedProcess[str], what: str) -> None:
    if out.returncode != 0:
        lines = (out.stderr or "").strip().splitlines()
        raise NetworkError(f"{what} failed (exit {out.returncode}): {lines[-1] if lines else 'no output'}")

"""A host's side of the simulated network set up over rtnetlink, from this process.

A namespace's own settings (its loopback up, its ``eth0``'s address, no IPv6 link-local
address, a permanent neighbour entry for every other host) can only be made from inside it.
``ip -n NS -batch`` does that with one process per namespace: at 128 nodes, 129 processes
forked from the harness, most of the network's build time. Here a short-lived thread joins
each namespace in turn (a network namespace is per thread, so this process stays where it
is) and sends the kernel the same requests ``ip`` would, batched on one netlink socket per
namespace: no process at all.

Only what the build needs is spoken: ``RTM_NEWLINK`` (flags, IPv6 address generation),
``RTM_NEWADDR`` and ``RTM_NEWNEIGH``. Every request asks for an acknowledgement, and the
first refusal is raised as ``OSError`` with the kernel's errno and what was asked.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import struct
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from harness.procs import join_netns

__all__ = ["HostSetup", "configure_hosts"]

_NETLINK_ROUTE = 0
_RTM_NEWLINK = 16
_RTM_NEWADDR = 20
_RTM_NEWNEIGH = 28
_NLMSG_ERROR = 2
_NLM_F_REQUEST = 0x1
_NLM_F_ACK = 0x4
_NLM_F_REPLACE = 0x100
_NLM_F_EXCL = 0x200
_NLM_F_CREATE = 0x400
_IFF_UP = 0x1
_IFA_ADDRESS = 1
_IFA_LOCAL = 2
_NDA_DST = 1
_NDA_LLADDR = 2
_NUD_PERMANENT = 0x80
_IFLA_AF_SPEC = 26
_IFLA_INET6_ADDR_GEN_MODE = 8
_IN6_ADDR_GEN_MODE_NONE = 1
_NLA_F_NESTED = 0x8000

_HEADER = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, sequence, port
_IFINFO = struct.Struct("=BxHiII")  # ifinfomsg: family, type, index, flags, change
_IFADDR = struct.Struct("=BBBBI")  # ifaddrmsg: family, prefix length, flags, scope, index
_NDMSG = struct.Struct("=BxxxiHBB")  # ndmsg: family, index, state, flags, type
_ATTR = struct.Struct("=HH")  # rtattr: length, type
#: requests per write: each acknowledgement is a buffer of its own in the socket's receive
#: queue (about a kilobyte of it, whatever its size), and a queue that overflows drops them
_WRITE = 64
_READ = 256 * 1024


@dataclass
class HostSetup:
    """What one namespace gets: its loopback up and ``interface`` up with ``address`` /
    ``prefix_len`` and no IPv6 address (None: the interface is configured already), and a
    permanent neighbour entry on ``interface`` for each (IPv4 address, MAC) of ``neighbours``."""

    namespace_fd: int
    interface: str
    address: str | None = None
    prefix_len: int = 0
    neighbours: Sequence[tuple[str, bytes]] = field(default_factory=list)  # (IPv4, MAC)


def configure_hosts(hosts: Sequence[HostSetup]) -> None:
    """Configure every host of ``hosts``, each from inside its namespace (one thread that
    joins them in turn); the first refusal raised as ``OSError``."""
    failure: list[BaseException] = []

    def run() -> None:
        try:
            for host in hosts:
                join_netns(host.namespace_fd)
                _configure(host)
        except BaseException as e:  # handed to the caller below, whatever it is
            failure.append(e)

    thread = threading.Thread(target=run, name="netns-setup", daemon=True)
    thread.start()
    thread.join()
    if failure:
        raise failure[0]


def _configure(host: HostSetup) -> None:
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_ROUTE) as sock:
        sock.bind((0, 0))
        requests = _Requests()
        wire = socket.if_nametoindex(host.interface)  # this thread's namespace: it has joined
        if host.address is not None:
            requests.link(socket.if_nametoindex("lo"), up=True)
            requests.no_ipv6_addresses(wire)  # before it is up: an address is made at the up
            requests.address(wire, host.address, host.prefix_len)
            requests.link(wire, up=True)
        for address, mac in host.neighbours:
            requests.neighbour(wire, address, mac)
        requests.send(sock)


def _attr(kind: int, data: bytes) -> bytes:
    length = _ATTR.size + len(data)
    return _ATTR.pack(length, kind) + data + b"\0" * (-length % 4)


class _Requests:
    """Requests for one namespace, sent ``_WRITE`` at a time, each acknowledged."""

    def __init__(self) -> None:
        self._messages: list[bytes] = []
        self._asked: dict[int, str] = {}  # sequence -> what it asked, for an error

    def _add(self, kind: int, flags: int, body: bytes, what: str) -> None:
        sequence = len(self._messages) + 1
        self._messages.append(_HEADER.pack(_HEADER.size + len(body), kind, _NLM_F_REQUEST | _NLM_F_ACK | flags,
                                           sequence, 0) + body)
        self._asked[sequence] = what

    def link(self, index: int, up: bool) -> None:
        self._add(_RTM_NEWLINK, 0, _IFINFO.pack(socket.AF_UNSPEC, 0, index, _IFF_UP if up else 0, _IFF_UP),
                  f"link {index} {'up' if up else 'down'}")

    def no_ipv6_addresses(self, index: int) -> None:
        mode = _attr(_IFLA_INET6_ADDR_GEN_MODE, struct.pack("=B", _IN6_ADDR_GEN_MODE_NONE))
        spec = _attr(_IFLA_AF_SPEC | _NLA_F_NESTED, _attr(socket.AF_INET6 | _NLA_F_NESTED, mode))
        self._add(_RTM_NEWLINK, 0, _IFINFO.pack(socket.AF_UNSPEC, 0, index, 0, 0) + spec,
                  f"link {index} addrgenmode none")

    def address(self, index: int, address: str, prefix_len: int) -> None:
        packed = ipaddress.IPv4Address(address).packed
        body = _IFADDR.pack(socket.AF_INET, prefix_len, 0, 0, index) + _attr(_IFA_LOCAL, packed) \
            + _attr(_IFA_ADDRESS, packed)
        self._add(_RTM_NEWADDR, _NLM_F_CREATE | _NLM_F_EXCL, body, f"addr add {address}/{prefix_len}")

    def neighbour(self, index: int, address: str, mac: bytes) -> None:
        body = _NDMSG.pack(socket.AF_INET, index, _NUD_PERMANENT, 0, 0) \
            + _attr(_NDA_DST, ipaddress.IPv4Address(address).packed) + _attr(_NDA_LLADDR, mac)
        self._add(_RTM_NEWNEIGH, _NLM_F_CREATE | _NLM_F_REPLACE, body, f"neigh replace {address}")

    def send(self, sock: socket.socket) -> None:
        """Send them ``_WRITE`` at a time, reading each write's acknowledgements before the
        next; the first refusal raised once all are read."""
        refused: OSError | None = None
        for start in range(0, len(self._messages), _WRITE):
            end = min(start + _WRITE, len(self._messages))
            sock.sendall(b"".join(self._messages[start:end]))
            answered = self._acknowledged(sock, set(range(start + 1, end + 1)))
            refused = refused or answered
        if refused is not None:
            raise refused

    def _acknowledged(self, sock: socket.socket, pending: set[int]) -> OSError | None:
        """Read until every request of ``pending`` is acknowledged; the first refusal."""
        refused: OSError | None = None
        while pending:
            data = sock.recv(_READ)
            offset = 0
            while offset + _HEADER.size <= len(data):
                length, kind, _, sequence, _ = _HEADER.unpack_from(data, offset)
                if length < _HEADER.size:
                    raise OSError(f"netlink: a malformed answer (length {length})")
                if kind == _NLMSG_ERROR:
                    (code,) = struct.unpack_from("=i", data, offset + _HEADER.size)
                    pending.discard(sequence)
                    if code != 0 and refused is None:
                        refused = OSError(-code, f"{self._asked.get(sequence, '?')}: {os.strerror(-code)}")
                offset += (length + 3) & ~3
        return refused

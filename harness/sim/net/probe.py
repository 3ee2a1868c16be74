"""Which network a cluster gets: ``"netns"`` where this process may build one, else loopback.

``"auto"`` probes instead of guessing: the tools the network is built and faulted with must
be on PATH, a forked child tries ``unshare(CLONE_NEWNET)`` (root or CAP_SYS_ADMIN), and then
one named namespace is made and removed the way a Network makes them. The answer (~20 ms)
is cached for the process.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import shutil
import subprocess

from harness.errors import ConfigError
from harness.sim.net.names import delete_namespaces, namespace_prefix

__all__ = ["MODES", "netns_missing", "resolve_mode"]

MODES = ("auto", "netns", "loopback")
_CLONE_NEWNET = 0x40000000
#: binary -> the Debian package that ships it
_TOOLS = {"ip": "iproute2", "tc": "iproute2", "nft": "nftables"}
_NETNS_DIR = "/run/netns"


@functools.cache
def netns_missing() -> tuple[str, ...]:
    """What this process lacks to build namespaced networks; empty when it can."""
    if not os.path.exists("/proc/self/ns/net"):
        return ("network namespaces (no /proc/self/ns/net: not Linux, or a kernel without them)",)
    missing = [f"the {tool!r} binary (Debian package {package})"
               for tool, package in _TOOLS.items() if shutil.which(tool) is None]
    if not _can_unshare_net():
        missing.insert(0, "root/CAP_NET_ADMIN (unshare(CLONE_NEWNET) is not permitted here)")
    elif not _netns_dir_writable():
        missing.insert(0, f"a writable {_NETNS_DIR} (where named namespaces are mounted)")
    elif not missing:
        error = _named_namespace_error()
        if error:
            missing.append(f"named network namespaces (ip netns add failed: {error})")
    return tuple(missing)


def resolve_mode(mode: str) -> str:
    """``"auto"`` -> ``"netns"`` or ``"loopback"``; ``"netns"`` where impossible -> ConfigError."""
    if mode not in MODES:
        raise ConfigError("network", mode, 'must be "auto", "netns" or "loopback"')
    if mode == "loopback":
        return mode
    missing = netns_missing()
    if not missing:
        return "netns"
    if mode == "auto":
        return "loopback"
    raise ConfigError("network", mode, f"needs {'; '.join(missing)} (or use network=\"loopback\")")


def _can_unshare_net() -> bool:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    unshare = libc.unshare  # resolved before the fork: the child only calls it
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os._exit(0 if unshare(_CLONE_NEWNET) == 0 else 1)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


def _named_namespace_error() -> str | None:
    """Make and remove one named namespace, as a Network will (bind mounts under /run/netns
    can fail where unshare works, e.g. in a container); None when that works."""
    name = f"{namespace_prefix()}probe"
    out = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    delete_namespaces([name])
    lines = out.stderr.strip().splitlines()
    return None if out.returncode == 0 else (lines[-1] if lines else f"exit {out.returncode}")


def _netns_dir_writable() -> bool:
    if os.path.isdir(_NETNS_DIR):
        return os.access(_NETNS_DIR, os.W_OK | os.X_OK)
    return os.access(os.path.dirname(_NETNS_DIR), os.W_OK | os.X_OK)

"""Names of the namespaces a Network makes, and the sweep of a dead owner's leftovers.

Every name starts ``pe<owner pid>-<serial>-``: a Network killed before ``close()`` (SIGKILL,
a crashed test run) leaves namespaces behind, and the next Network in any process removes
those whose owner pid is gone, never one whose owner still runs. Links, bridges, qdiscs
and nft tables all live inside these namespaces, so removing the namespaces removes them.
"""

from __future__ import annotations

import itertools
import os
import re
import subprocess

from harness.sim.leftovers import owner_alive

__all__ = ["NETNS_DIR", "namespace_prefix", "owner_pid", "sweep_dead_owners", "delete_namespaces"]

NETNS_DIR = "/run/netns"
_NAME = re.compile(r"pe(\d+)-\d+-[a-z0-9]+")
_serial = itertools.count()


def namespace_prefix() -> str:
    """A prefix no other Network (in this process or another live one) uses."""
    return f"pe{os.getpid()}-{next(_serial)}-"


def owner_pid(name: str) -> int | None:
    """The pid in one of our namespace names; None for anybody else's namespace."""
    match = _NAME.fullmatch(name)
    return int(match.group(1)) if match else None


def sweep_dead_owners() -> list[str]:
    """Delete our namespaces whose owner process is dead; the names deleted."""
    try:
        names = os.listdir(NETNS_DIR)
    except FileNotFoundError:
        return []
    dead = [n for n in names if (pid := owner_pid(n)) is not None and not owner_alive(pid)]
    delete_namespaces(dead)
    return dead


def delete_namespaces(names: list[str]) -> None:
    """``ip netns del`` them all in one process; ones already gone are fine."""
    if not names:
        return
    script = "".join(f"netns del {name}\n" for name in names)
    subprocess.run(["ip", "-force", "-batch", "-"], input=script, text=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)

"""Which host each node runs on, and which faults a host cannot carry out.

``place(nodes, hosts, placement)``: round robin over ``hosts`` by default (node i on host
``i % len(hosts)``), or pinned, ``placement[i]`` being node i's host index (``None``: this
machine). With no hosts every node stays on this machine. Bad input is one
``ConfigError`` line naming the field.

``refusal(host, needs)``: a fault that needs ``netns``, ``fuse`` or ``cgroups`` (the words
of a fault row's ``needs``, ``harness.sim.schema.NEEDS``) can run on a host only if the
host's ``capabilities`` say it has them; else the one line ``inject()`` refuses it with.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from harness.errors import ConfigError
from harness.hosts._spec import HostSpec

__all__ = ["CAPABILITIES", "place", "refusal"]

#: what a fault may need of the machine it runs on, as a fault row's ``needs`` says it
CAPABILITIES = ("netns", "fuse", "cgroups", "slurm_admin", "slurmd")


def _is_index(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def place(nodes: int, hosts: Sequence[HostSpec], placement: Sequence[int | None] | None = None,
          source: str | None = None) -> list[HostSpec | None]:
    """Node i's host (None: this machine), for ``nodes`` nodes. ``source`` says where the
    input came from in errors (``--elastic-hosts``, a marker, a scenario file)."""
    if not _is_index(nodes) or nodes < 0:
        raise ConfigError("nodes", nodes, "must be an int >= 0", source)
    hosts = list(hosts)
    if placement is None:
        return [hosts[i % len(hosts)] if hosts else None for i in range(nodes)]
    if isinstance(placement, (str, bytes)) or not isinstance(placement, Sequence):
        raise ConfigError("placement", placement, "must be a list of host indexes, one per node", source)
    if len(placement) != nodes:
        raise ConfigError("placement", list(placement),
                          f"must give one host index per node: {nodes} nodes, {len(placement)} given", source)
    for node, index in enumerate(placement):
        if index is not None and not (_is_index(index) and 0 <= index < len(hosts)):
            constraint = (f"must be an int in [0, {len(hosts) - 1}] or None (this machine)" if hosts
                          else "must be None (this machine): no hosts are given")
            raise ConfigError(f"placement[{node}]", index, constraint, source)
    return [None if index is None else hosts[index] for index in placement]


def refusal(host: HostSpec, needs: Iterable[str]) -> str | None:
    """Why a fault that ``needs`` these cannot run on ``host`` (one line), or None."""
    needed = list(dict.fromkeys(needs))
    missing = [need for need in needed if need not in host.capabilities]
    if not missing:
        return None
    has = ", ".join(sorted(host.capabilities)) or "none"
    return (f"host {host.label} cannot do it: it needs {', '.join(missing)}, which the host's capabilities "
            f"({has}) do not list; add {', '.join(repr(m) for m in missing)} to its capabilities (its hosts "
            f"or Slurm file's) if the host has {'it' if len(missing) == 1 else 'them'}, or place the node elsewhere")

"""Where the session's option puts every job's nodes: ``--elastic-hosts=FILE`` (SSH hosts) or
``--elastic-slurm=FILE`` (a Slurm allocation), as one value the plugin asks.

Why one value: the plugin needs the same few things of either option (the keyword a
cluster takes it by, the hosts its faults and chaos kinds are judged by, its words in the
header and the report, the option that reruns a test there), and asking a value keeps one
branch per place here instead of one per use. A third place is a third class here, its
keyword in ``PLACE_KEYWORDS`` and a line in ``_settings``.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from harness.hosts import HostSpec

__all__ = ["PLACE_KEYWORDS", "HostsOption", "SessionPlace", "SlurmOption", "hosts_option", "names_its_place",
           "slurm_option"]

#: the keywords by which a marker or a scenario's ``[job]`` names its own place (then the
#: session's option does not place it)
PLACE_KEYWORDS = frozenset({"hosts", "slurm"})


def names_its_place(keys: Iterable[str]) -> bool:
    """Whether a marker's keywords or a ``[job]``'s keys name a place of their own."""
    return not PLACE_KEYWORDS.isdisjoint(keys)


@dataclass(frozen=True)
class SessionPlace:
    """The session's place: the option that chose it (``option``), the file as the user
    gave it (``file``), and what a cluster takes by ``keyword`` (``value``)."""

    option: str
    keyword: str
    file: str
    value: Any

    def stand_ins(self, max_nodes: int = 2) -> tuple[HostSpec, ...]:
        """The hosts a job's nodes run on there, as far as can be known before a job runs:
        what its faults and chaos kinds are judged by."""
        raise NotImplementedError

    def described(self) -> str:
        """The header line's words: where the nodes are."""
        raise NotImplementedError

    def header_part(self) -> str:
        """Its item of the session header line (``hosts=FILE``)."""
        return f"{self.keyword}={self.file}"

    def argument(self) -> str:
        """The option as a command line takes it (a rerun there)."""
        return f"{self.option}={shlex.quote(self.file)}"


@dataclass(frozen=True)
class HostsOption(SessionPlace):
    """``--elastic-hosts``: ``value`` is the hosts file's hosts."""

    def stand_ins(self, max_nodes: int = 2) -> tuple[HostSpec, ...]:
        return tuple(self.value)

    def described(self) -> str:
        return f"nodes on {len(self.value)} host(s) of {self.file}: {', '.join(host.label for host in self.value)}"


@dataclass(frozen=True)
class SlurmOption(SessionPlace):
    """``--elastic-slurm``: ``value`` is the Slurm file's spec (its allocation is made by
    the first job, so its nodes are the spec's stand-ins until then)."""

    def stand_ins(self, max_nodes: int = 2) -> tuple[HostSpec, ...]:
        from harness.hosts import stand_ins

        return stand_ins(self.value, max_nodes)

    def described(self) -> str:
        spec = self.value
        where = (f"job {spec.job_id}" if spec.job_id else "the allocation of $SLURM_JOB_ID, else one of its own"
                 + (f" in partition {spec.partition}" if spec.partition else ""))
        return f"nodes in a Slurm allocation ({self.file}): {where}"


def hosts_option(file: str, hosts: tuple[HostSpec, ...]) -> HostsOption:
    return HostsOption("--elastic-hosts", "hosts", file, hosts)


def slurm_option(file: str, spec: Any) -> SlurmOption:
    return SlurmOption("--elastic-slurm", "slurm", file, spec)

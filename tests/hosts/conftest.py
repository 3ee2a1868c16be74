"""Fixtures for the host tests: real sshd hosts in network namespaces (``sshd.py``).

They skip, with a one-line reason, without root, sshd, the client tools or namespaces.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from harness.hosts import HostSpec
from harness.sim.places.hosts import nodes as remote
from tests.hosts.sshd import SshdHost, SshdLab, checkout_python, sshd_missing


@pytest.fixture
def lab(tmp_path) -> Iterator[SshdLab]:
    """Two host namespaces, no sshd started yet (``lab.start(i, ...)``); all removed after."""
    why = sshd_missing()
    if why:
        pytest.skip(f"real sshd hosts: {why}")
    with SshdLab(tmp_path, 2) as built:
        yield built


@pytest.fixture
def two_hosts(lab: SshdLab) -> list[SshdHost]:
    """Two running sshd hosts, known to the lab's known_hosts: one on port 22, one on 2222."""
    return [lab.start(0), lab.start(1, port=2222)]


def _job_hosts(lab: SshdLab, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
               capabilities: Sequence[str] = ()) -> list[HostSpec]:
    """Two running hosts (ports 22 and 2222) for jobs placed on them, with ``capabilities``;
    their python is this checkout's, and a job reaches them with the lab's client."""
    lab.start(0)
    lab.start(1, port=2222)
    python = checkout_python(tmp_path / "host-python")
    monkeypatch.setattr(remote, "connector", lambda spec: lab.ssh_host(spec))
    return [lab.spec(i, python=str(python), capabilities=tuple(capabilities)) for i in (0, 1)]


@pytest.fixture
def hosts(lab: SshdLab, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[HostSpec]:
    """Two hosts for a job (``_job_hosts``), with no capabilities: process faults only."""
    return _job_hosts(lab, tmp_path, monkeypatch)


@pytest.fixture
def netns_hosts(lab: SshdLab, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[HostSpec]:
    """Two hosts for a job whose capabilities allow network faults (root and nft: the lab's)."""
    return _job_hosts(lab, tmp_path, monkeypatch, capabilities=("netns",))


@pytest.fixture
def netns_cgroup_hosts(lab: SshdLab, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[HostSpec]:
    """Two hosts for a job whose capabilities allow network faults and cgroups: a network
    fault on one of several nodes of a host falls on its sockets alone."""
    return _job_hosts(lab, tmp_path, monkeypatch, capabilities=("netns", "cgroups"))


@pytest.fixture
def cgroup_hosts(lab: SshdLab, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[HostSpec]:
    """Two hosts for a job whose capabilities allow resource faults (root and cgroups: the
    lab's hosts share this machine's kernel, so their cgroups are this machine's)."""
    return _job_hosts(lab, tmp_path, monkeypatch, capabilities=("cgroups",))


@pytest.fixture
def fuse_hosts(lab: SshdLab, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[HostSpec]:
    """Two hosts for a job whose capabilities allow storage faults on a node's disk (root
    and FUSE: the lab's hosts share this machine's /dev/fuse and libfuse)."""
    return _job_hosts(lab, tmp_path, monkeypatch, capabilities=("fuse",))

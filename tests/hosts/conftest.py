"""Fixtures for the host tests: real sshd hosts in network namespaces (``sshd.py``).

They skip, with a one-line reason, without root, sshd, the client tools or namespaces.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.hosts.sshd import SshdHost, SshdLab, sshd_missing


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

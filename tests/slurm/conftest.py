"""Fixtures for the Slurm tests: a real Slurm cluster in network namespaces (``lab.py``).

They skip, with a one-line reason, without root, Slurm's daemons and clients, or namespaces.
One lab serves every test of a session (of each xdist worker: its own namespaces and spool):
it comes up in about a second, and a test hands it back with its queue empty.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.slurm.lab import SlurmLab, slurm_missing


@pytest.fixture(scope="session")
def _session_lab(tmp_path_factory) -> Iterator[SlurmLab]:
    why = slurm_missing()
    if why:
        pytest.skip(f"a real Slurm cluster: {why}")
    with SlurmLab(tmp_path_factory.mktemp("slurm-lab"), 3) as lab:
        yield lab


@pytest.fixture
def slurm_lab(_session_lab: SlurmLab) -> Iterator[SlurmLab]:
    """A three-node Slurm cluster, every node idle; after the test, every job it left is
    cancelled and gone from the queue before the next test gets the lab."""
    yield _session_lab
    _session_lab.run("scancel", "--full", "--quiet", "--user=root")
    deadline = time.monotonic() + 30
    while _session_lab.run("squeue", "--noheader", "--format=%i").stdout.strip() and time.monotonic() < deadline:
        time.sleep(0.05)  # Slurm tells no one when a job leaves its queue
    _session_lab.wait_idle()

"""Fixtures for the Slurm tests: a real Slurm cluster in network namespaces (``lab.py``).

They skip, with a one-line reason, without root, Slurm's daemons and clients, or namespaces.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.slurm.lab import SlurmLab, slurm_missing


@pytest.fixture
def slurm_lab(tmp_path) -> Iterator[SlurmLab]:
    """A three-node Slurm cluster, every node idle; everything of it ended after."""
    why = slurm_missing()
    if why:
        pytest.skip(f"a real Slurm cluster: {why}")
    with SlurmLab(tmp_path, 3) as lab:
        yield lab

"""What ``pip install pytest-elastic`` gives: everything a documented feature needs at run time."""

from __future__ import annotations

import re
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~;\[ ]", r, maxsplit=1)[0].strip().lower() for r in requirements}


def test_the_job_filesystem_comes_with_the_package_not_only_with_the_test_extra():
    """Storage faults (``harness.sim.storage``) need mfusepy: with it only in the ``test``
    extra, a user's ``pip install pytest-elastic`` got a harness whose storage faults said
    "missing mfusepy"."""
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    assert "mfusepy" in _names(project["dependencies"])
    assert "mfusepy" not in _names(project["optional-dependencies"]["test"])  # one place says it

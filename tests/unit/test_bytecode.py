"""Node agents start from bytecode even where PYTHONDONTWRITEBYTECODE is set."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import harness
from harness.sim.nodes.bytecode import ensure_compiled


def test_every_harness_module_has_current_bytecode_after_ensure_compiled():
    ensure_compiled.cache_clear()
    assert ensure_compiled()
    package = Path(harness.__file__).parent
    stale = []
    for source in package.rglob("*.py"):
        cached = Path(importlib.util.cache_from_source(str(source)))
        if not cached.exists() or cached.stat().st_mtime < source.stat().st_mtime - 1:
            stale.append(str(source.relative_to(package)))
    assert stale == []

"""The runtime has no import cycle: every module of ``harness.agent``, ``rendezvous``,
``timer``, ``procs`` and the top-level runtime modules can be read bottom-up.

Imports are read with ``ast``, lazy ones inside functions included: a function-level
import that closes a loop is still a loop a reader has to untangle (the rendezvous was a
12-module cycle because ``_api`` imported ``_registry`` inside a function so backends could
register themselves as a side effect). The implicit import of a parent package (importing
``a.b.c`` runs ``a/b/__init__.py``) is not an edge: a package's ``__init__`` re-exporting
its own modules would otherwise always count as a cycle; an explicit ``from a.b import X``
is one.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: the runtime, as tests/unit/test_layers.py draws it
RUNTIME = ("harness.agent", "harness.rendezvous", "harness.timer", "harness.procs", "harness.errors",
           "harness.events", "harness.endpoints", "harness.net", "harness.selfpipe", "harness.timer_env",
           "harness.settings", "harness.states", "harness.launch", "harness.run")


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules_of(root: Path, packages: Iterable[str]) -> dict[str, Path]:
    found = {}
    for package in packages:
        base = root.joinpath(*package.split("."))
        files = sorted(base.rglob("*.py")) if base.is_dir() else [base.with_suffix(".py")]
        found.update({module_name(root, p): p for p in files if p.exists()})
    return found


def imported(path: Path, me: str, known: dict[str, Path]) -> set[str]:
    """The modules of ``known`` that ``path`` imports, anywhere in it."""
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            submodules = {f"{base}.{alias.name}" for alias in node.names} & known.keys()
            targets.update(submodules or {base})
    return (targets & known.keys()) - {me}


def cycles(root: Path, packages: Iterable[str]) -> list[list[str]]:
    """Every strongly connected set of more than one module (Tarjan's algorithm)."""
    known = modules_of(root, packages)
    graph = {me: imported(path, me, known) for me, path in known.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_runtime_has_no_import_cycle():
    assert cycles(ROOT, RUNTIME) == []


def test_the_rendezvous_names_its_backends_in_one_table():
    """No backend registers itself when imported: the registry's table has them all."""
    from harness.rendezvous import rendezvous_handler_registry
    from harness.rendezvous._registry import BUILT_IN_BACKENDS

    assert set(BUILT_IN_BACKENDS) == {"c10d", "static", "etcd", "etcd-v2"}
    assert set(BUILT_IN_BACKENDS) <= set(rendezvous_handler_registry.names())


def test_a_node_and_the_node_fork_server_are_two_modules_not_one_cycle():
    assert not [c for c in cycles(ROOT, ["harness.sim"]) if "harness.sim.nodes.main" in c]


@pytest.mark.parametrize("lazy", [False, True])
def test_the_checker_catches_a_cycle_even_through_a_function_level_import(tmp_path, lazy):
    """A checker that cannot fail is no check: plant a two-module loop and see it."""
    package = tmp_path / "harness" / "rendezvous"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "_a.py").write_text("from harness.rendezvous._b import B\nA = 1\n")
    back = "def f():\n    from harness.rendezvous import _a\n" if lazy else "from . import _a\n"
    (package / "_b.py").write_text(back + "B = 2\n")
    assert cycles(tmp_path, ["harness.rendezvous"]) == [["harness.rendezvous._a", "harness.rendezvous._b"]]

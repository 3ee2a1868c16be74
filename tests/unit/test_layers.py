"""The layers docs/architecture.md draws, checked on the source: the runtime never imports the
simulation or pytest; the simulation never imports pytest nor a private name of the runtime.

Imports are read with ``ast`` (every ``import``/``from`` anywhere in a module, lazy ones
inside functions included), so a violation fails here before it ships.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HARNESS = ROOT / "harness"

#: the runtime: what ``elastic-run`` needs, and nothing of the simulation
RUNTIME = ("harness.agent", "harness.rendezvous", "harness.timer", "harness.procs", "harness.errors",
           "harness.events", "harness.endpoints", "harness.net", "harness.selfpipe", "harness.timer_env",
           "harness.launch", "harness.run")
SIMULATION = ("harness.sim",)
#: hosts reached over SSH (issue 29): below the simulation, beside the runtime
HOSTS = ("harness.hosts",)
#: public faces assembled at the top of the package (re-exports only)
FACADES = ("harness", "harness.faults")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def in_layer(name: str, layer: tuple[str, ...]) -> bool:
    return any(name == top or name.startswith(top + ".") for top in layer)


def imports(path: Path) -> list[tuple[int, str, list[str]]]:
    """(line, module, names imported from it) for every import statement in ``path``."""
    tree = ast.parse(path.read_text(), str(path))
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name, []) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found.append((node.lineno, base, [alias.name for alias in node.names]))
    return found


def private_part(module: str, names: list[str]) -> str | None:
    """The private piece of ``from module import names`` (a ``_x`` module or name), if any."""
    for part in module.split("."):
        if part.startswith("_") and not part.startswith("__"):
            return module
    for name in names:
        if name.startswith("_") and not name.startswith("__"):
            return f"{module}.{name}"
    return None


def sources() -> list[Path]:
    return sorted(p for p in HARNESS.rglob("*.py"))


def violations() -> list[str]:
    found = []
    for path in sources():
        me = module_name(path)
        rel = path.relative_to(ROOT)
        for line, module, names in imports(path):
            where = f"{rel}:{line}"
            if module.split(".")[0] in ("pytest", "_pytest", "pytest_elastic"):
                found.append(f"{where}: {me} imports {module} (harness never imports pytest)")
            if in_layer(me, RUNTIME) and in_layer(module, SIMULATION + ("harness.faults",)):
                found.append(f"{where}: runtime module {me} imports the simulation ({module})")
            if in_layer(me, RUNTIME) and module == "harness" and set(names) - {"agent", "errors"}:
                found.append(f"{where}: runtime module {me} imports {names} from the harness facade")
            if in_layer(me, SIMULATION) and in_layer(module, RUNTIME):
                private = private_part(module, names)
                if private:
                    found.append(f"{where}: simulation module {me} imports the runtime's private {private}")
            if in_layer(me, RUNTIME) and in_layer(module, HOSTS):
                found.append(f"{where}: runtime module {me} imports the hosts layer ({module})")
            if in_layer(me, HOSTS) and in_layer(module, SIMULATION + ("harness.faults",)):
                found.append(f"{where}: hosts module {me} imports the simulation ({module})")
            if in_layer(me, HOSTS) and in_layer(module, RUNTIME):
                private = private_part(module, names)
                if private:
                    found.append(f"{where}: hosts module {me} imports the runtime's private {private}")
    return found


def test_every_harness_module_belongs_to_a_layer():
    unplaced = [module_name(p) for p in sources()
                if not in_layer(module_name(p), RUNTIME + SIMULATION + HOSTS) and module_name(p) not in FACADES]
    assert unplaced == [], "add each module to RUNTIME, SIMULATION or HOSTS in this test (or move it)"


def test_layers_are_respected():
    assert violations() == []


@pytest.mark.parametrize("source, expected", [
    ("from harness.sim.cluster import Cluster", "runtime module harness.agent.x imports the simulation"),
    ("import pytest", "harness never imports pytest"),
    ("from harness.faults import NodeKill", "imports the simulation (harness.faults)"),
])
def test_the_checker_catches_runtime_violations(tmp_path, monkeypatch, source, expected):
    """A checker that cannot fail is no check: plant a violation and see it reported."""
    fake_root = tmp_path
    target = fake_root / "harness" / "agent"
    target.mkdir(parents=True)
    (target / "x.py").write_text(f"def f():\n    {source}\n")
    monkeypatch.setattr(__import__(__name__, fromlist=["x"]), "ROOT", fake_root)
    monkeypatch.setattr(__import__(__name__, fromlist=["x"]), "HARNESS", fake_root / "harness")
    assert any(expected in v for v in violations())


@pytest.mark.parametrize("source", ["from harness.procs._handles import signal_process_group",
                                    "from harness.run import _configure_logging",
                                    "from harness.rendezvous import _registry"])
def test_the_checker_catches_private_runtime_names(tmp_path, monkeypatch, source):
    target = tmp_path / "harness" / "sim"
    target.mkdir(parents=True)
    (target / "y.py").write_text(source + "\n")
    this = __import__(__name__, fromlist=["x"])
    monkeypatch.setattr(this, "ROOT", tmp_path)
    monkeypatch.setattr(this, "HARNESS", tmp_path / "harness")
    assert any("imports the runtime's private" in v for v in violations())


# -- import cycles: each package reads bottom-up -----------------------------------------
#
# A module that imports one that imports it back (at module level or inside a function: a
# lazy import still ties the two together) cannot be read, tested or moved alone. The
# import graph of each package below is built from the source with ``ast``, as above, and
# its strongly connected components of more than one module are the cycles. Imports under
# ``if TYPE_CHECKING:`` are left out: they never run, and they are how an annotation names a
# type of a module above it.

#: packages that must have no import cycle inside them
ACYCLIC = ("pytest_elastic", "harness.sim", "harness.hosts")

#: cycles tolerated for now, each one cycle's modules (none: issue 18 removed the last ones).
#: A cycle listed here that is gone fails the test too, so the list cannot go stale.
KNOWN_CYCLES: list[frozenset[str]] = []


def _type_checking_only(tree: ast.AST) -> set[int]:
    """Line numbers of the imports under ``if TYPE_CHECKING:`` (never executed)."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                for inner in ast.walk(child):
                    if isinstance(inner, (ast.Import, ast.ImportFrom)):
                        lines.add(inner.lineno)
    return lines


def package_sources(package: str) -> list[Path]:
    return sorted((ROOT / package.replace(".", "/")).rglob("*.py"))


def import_graph(package: str) -> dict[str, set[str]]:
    """module -> the modules of ``package`` it imports (``from pkg import mod`` names a module)."""
    paths = package_sources(package)
    known = {module_name(p) for p in paths}
    graph: dict[str, set[str]] = {name: set() for name in known}
    for path in paths:
        me = module_name(path)
        skip = _type_checking_only(ast.parse(path.read_text(), str(path)))
        for line, module, names in imports(path):
            if line in skip:
                continue
            targets = {f"{module}.{n}" for n in names if f"{module}.{n}" in known}
            if not targets and module in known:
                targets = {module}
            graph[me] |= targets - {me}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[frozenset[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                members = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    members.add(member)
                    if member == node:
                        break
                if len(members) > 1:
                    cycles.append(frozenset(members))
    return cycles


@pytest.mark.parametrize("package", ACYCLIC)
def test_no_import_cycles(package):
    cycles = import_cycles(import_graph(package))
    unexpected = [sorted(c) for c in cycles if c not in KNOWN_CYCLES]
    assert unexpected == [], f"import cycles in {package} (break each: move what is shared down a layer)"


def test_known_cycles_still_exist():
    """An allow-listed cycle that is gone must leave the list (it would hide its return)."""
    cycles = [c for package in ACYCLIC for c in import_cycles(import_graph(package))]
    assert [sorted(c) for c in KNOWN_CYCLES if c not in cycles] == []


@pytest.mark.parametrize("files, expected", [
    ({"a": "from pkg import b\n", "b": "def f():\n    from pkg.a import x\n"}, [{"pkg.a", "pkg.b"}]),
    ({"a": "import pkg.b\n", "b": "from . import c\n", "c": "from .a import y\n"}, [{"pkg.a", "pkg.b", "pkg.c"}]),
    ({"a": "from pkg import b\n", "b": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import a\n"},
     []),
    ({"a": "from pkg import b\n", "b": "x = 1\n"}, []),
])
def test_the_checker_catches_cycles(tmp_path, monkeypatch, files, expected):
    """Plant a cycle (lazy, relative, or three modules long) and see it found; a
    TYPE_CHECKING import and a plain dependency are not cycles."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    for name, text in files.items():
        (tmp_path / "pkg" / f"{name}.py").write_text(text)
    monkeypatch.setattr(__import__(__name__, fromlist=["x"]), "ROOT", tmp_path)
    assert [set(c) for c in import_cycles(import_graph("pkg"))] == expected

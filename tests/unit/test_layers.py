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
           "harness.events", "harness.endpoints", "harness.net", "harness.selfpipe", "harness.launch",
           "harness.run")
SIMULATION = ("harness.sim",)
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
    return found


def test_every_harness_module_belongs_to_a_layer():
    unplaced = [module_name(p) for p in sources()
                if not in_layer(module_name(p), RUNTIME + SIMULATION) and module_name(p) not in FACADES]
    assert unplaced == [], "add each module to RUNTIME or SIMULATION in this test (or move it)"


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

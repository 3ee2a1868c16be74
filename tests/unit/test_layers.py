"""The layers docs/architecture.md draws, checked on the source: the runtime never imports the
simulation or pytest; the simulation never imports pytest nor a private name of the runtime;
no import cycle anywhere in ``harness`` or ``pytest_elastic``, between modules or between the
rooms (sub-packages) of ``harness``; and the leaves import only leaves.

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
           "harness.settings", "harness.states", "harness.thread_cpu", "harness.launch", "harness.run")
SIMULATION = ("harness.sim",)
#: hosts reached over SSH: below the simulation, beside the runtime
HOSTS = ("harness.hosts",)
#: public faces assembled at the top of the package (re-exports only)
FACADES = ("harness", "harness.faults")
#: the training frameworks' hooks (a user's script imports one): the public faces and the
#: runtime's public names only, never a private one nor the simulation's inside
INTEGRATIONS = ("harness.integrations",)


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
            if in_layer(me, INTEGRATIONS) and module.startswith("harness") and (
                    in_layer(module, SIMULATION) or private_part(module, names)):
                found.append(f"{where}: integration {me} imports {module} (the public faces and names only)")
    return found


def test_every_harness_module_belongs_to_a_layer():
    unplaced = [module_name(p) for p in sources()
                if not in_layer(module_name(p), RUNTIME + SIMULATION + HOSTS + INTEGRATIONS)
                and module_name(p) not in FACADES]
    assert unplaced == [], "add each module to RUNTIME, SIMULATION, HOSTS or INTEGRATIONS in this test (or move it)"


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
# type of a module above it (at the room level they are counted apart: see below).

#: packages that must have no import cycle inside them (``harness``: all of it, the runtime,
#: the simulation and the hosts together)
ACYCLIC = ("pytest_elastic", "harness")

#: cycles tolerated for now, each one cycle's modules (none left).
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


def import_graph(package: str, typing: bool = False) -> dict[str, set[str]]:
    """module -> the modules of ``package`` it imports; ``typing``: the ``TYPE_CHECKING``
    imports too. ``from pkg import mod`` names both ``pkg.mod`` and ``pkg``: it runs the
    package's ``__init__`` first, so a module that takes a sibling through its package's face
    is tied to whatever that face imports (``net/probe.py`` once took ``names`` through
    ``harness.sim.net``, whose ``__init__`` imports ``probe``). The implicit import of a
    parent package (``import a.b.c`` runs ``a/b/__init__.py``) is no edge: every submodule
    would then be tied to a face that re-exports it."""
    paths = package_sources(package)
    known = {module_name(p) for p in paths}
    graph: dict[str, set[str]] = {name: set() for name in known}
    for path in paths:
        me = module_name(path)
        skip = set() if typing else _type_checking_only(ast.parse(path.read_text(), str(path)))
        for line, module, names in imports(path):
            if line in skip:
                continue
            targets = {f"{module}.{n}" for n in names if f"{module}.{n}" in known}
            if module in known:
                targets.add(module)
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
    ({"__init__": "from pkg.a import f\n", "a": "from pkg import b\n", "b": ""}, [{"pkg", "pkg.a"}]),
])
def test_the_checker_catches_cycles(tmp_path, monkeypatch, files, expected):
    """Plant a cycle (lazy, relative, three modules long, or through the package's face) and
    see it found; a TYPE_CHECKING import and a plain dependency are not cycles."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    for name, text in files.items():
        (tmp_path / "pkg" / f"{name}.py").write_text(text)
    monkeypatch.setattr(__import__(__name__, fromlist=["x"]), "ROOT", tmp_path)
    assert [set(c) for c in import_cycles(import_graph("pkg"))] == expected


# -- rooms: the sub-packages of ``harness`` read bottom-up too ----------------------------
#
# A room is a sub-package (``harness.agent``, ``harness.sim.nodes``, ``harness.sim.net``...);
# a module that stands loose on a floor (``harness`` or ``harness.sim``: ``harness.errors``,
# ``harness.sim.cluster``...) is a room of its own. Rooms import each other one way only:
# the graph of rooms, built from the module graph above (imports that run, lazy ones
# included), has no cycle. Without this, modules could each read bottom-up while their
# rooms import each other (as ``harness/sim/net`` once did: -> ``leftovers`` -> ``storage`` ->
# the fault parts -> ... -> ``net``), and no room could be read, moved or tested alone.
#
# ``TYPE_CHECKING`` imports do not count here either: they never run. But they are not free:
# one that names a type of a room above it (a room that imports, at run time, the room it
# stands in) ties the two rooms for a reader. Those are pinned in ``TYPE_ONLY_BACK``, each
# with why; a new one fails, and one that is gone must leave the list. A part, a trigger or a
# helper typed against a protocol of its own room (``FaultTarget``, ``ScheduledJob``,
# ``FinishedNode``; the job's helpers: ``truth.subject``'s ``StackedJob`` and ``JudgedJob``,
# ``nodes.start.StartingJob``, ``waits.WaitedJob``; the job's own ``LaunchingCluster``) needs
# none: below ``job.py`` and ``cluster.py``, no module of ``harness.sim`` imports either.

#: floors: packages whose loose modules are each a room (their sub-packages are rooms too)
FLOORS = ("harness", "harness.sim")

#: ``TYPE_CHECKING`` imports that name a type of a room above their own, and why each
TYPE_ONLY_BACK = {
    # the door of the fault room names the things its parts act on (the nodes, the network)
    ("harness.sim.faults.target", "harness.sim.net"): "FaultTarget.net: the job's Network",
    ("harness.sim.faults.target", "harness.sim.nodes.ledger"): "FaultTarget.ledger: harm, await_exit",
    ("harness.sim.faults.target", "harness.sim.nodes.pool"): "FaultTarget.cluster.pool: a storage server",
    ("harness.sim.faults.target", "harness.sim.nodes.process"): "FaultTarget.nodes: the node handles",
    ("harness.sim.faults.target", "harness.sim.nodes.rendezvous_store"): "FaultTarget.store: the store's host",
}


def room_of(module: str, packages: set[str], floors: tuple[str, ...] = FLOORS) -> str:
    """The room ``module`` stands in: its outermost package below the floors, else itself."""
    parts = module.split(".")
    for i in range(1, len(parts) + 1):
        prefix = ".".join(parts[:i])
        if prefix in packages and prefix not in floors:
            return prefix
    return module


def room_graph(package: str, floors: tuple[str, ...] = FLOORS, typing: bool = False) -> dict[str, set[str]]:
    """room -> the rooms it imports (each module's imports, as ``import_graph`` reads them)."""
    packages = {module_name(p) for p in package_sources(package) if p.name == "__init__.py"}
    rooms: dict[str, set[str]] = {}
    for module, targets in import_graph(package, typing).items():
        mine = room_of(module, packages, floors)
        rooms.setdefault(mine, set()).update(room_of(t, packages, floors) for t in targets)
        rooms[mine].discard(mine)
    return rooms


def type_only_back(package: str, floors: tuple[str, ...] = FLOORS) -> set[tuple[str, str]]:
    """(module, what it imports under ``TYPE_CHECKING``) where that names a room above its own:
    one whose run-time imports reach the importer's room."""
    packages = {module_name(p) for p in package_sources(package) if p.name == "__init__.py"}
    running, typed, rooms = import_graph(package), import_graph(package, typing=True), room_graph(package, floors)

    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            room = todo.pop()
            if room == goal:
                return True
            if room not in seen:
                seen.add(room)
                todo.extend(rooms.get(room, ()))
        return False

    back = set()
    for module, targets in typed.items():
        mine = room_of(module, packages, floors)
        for target in targets - running[module]:
            theirs = room_of(target, packages, floors)
            if theirs != mine and reaches(theirs, mine):
                back.add((module, target))
    return back


def test_no_import_cycles_between_rooms():
    cycles = import_cycles(room_graph("harness"))
    assert [sorted(c) for c in cycles] == [], "rooms that import each other (move what is shared down a room)"


def test_type_only_imports_back_up_are_the_known_ones():
    """A new one fails (type it against a protocol of its own room, or add it here with why);
    one that is gone must leave the list, so it cannot hide a new one."""
    assert sorted(type_only_back("harness")) == sorted(TYPE_ONLY_BACK)


def _plant(root: Path, files: dict[str, str]) -> None:
    for name, text in {"pkg/__init__.py": "", **files}.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


@pytest.mark.parametrize("files, expected", [
    # modules read bottom-up (x -> y, z -> w), their rooms do not (a -> b -> a)
    ({"pkg/a/__init__.py": "", "pkg/a/x.py": "from pkg.b import y\n", "pkg/a/w.py": "",
      "pkg/b/__init__.py": "", "pkg/b/y.py": "", "pkg/b/z.py": "def f():\n    from pkg.a import w\n"},
     [{"pkg.a", "pkg.b"}]),
    # a loose module of the floor is a room of its own
    ({"pkg/m.py": "from pkg.a import x\n", "pkg/a/__init__.py": "", "pkg/a/x.py": "",
      "pkg/a/w.py": "import pkg.m\n"}, [{"pkg.a", "pkg.m"}]),
    # one way only: no cycle; a TYPE_CHECKING import back is none either
    ({"pkg/a/__init__.py": "", "pkg/a/x.py": "from pkg.b import y\n", "pkg/b/__init__.py": "",
      "pkg/b/y.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import x\n"}, []),
])
def test_the_checker_catches_cycles_between_rooms(tmp_path, monkeypatch, files, expected):
    """A checker that cannot fail is no check: plant a cycle of rooms and see it found."""
    _plant(tmp_path, files)
    monkeypatch.setattr(__import__(__name__, fromlist=["x"]), "ROOT", tmp_path)
    assert [set(c) for c in import_cycles(room_graph("pkg", floors=("pkg",)))] == expected


def test_the_checker_sees_a_type_only_import_back_up(tmp_path, monkeypatch):
    _plant(tmp_path, {"pkg/a/__init__.py": "", "pkg/a/x.py": "from pkg.b import y\n", "pkg/b/__init__.py": "",
                      "pkg/b/y.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import x\n",
                      "pkg/b/z.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.c import v\n",
                      "pkg/c/__init__.py": "", "pkg/c/v.py": ""})
    monkeypatch.setattr(__import__(__name__, fromlist=["x"]), "ROOT", tmp_path)
    # ``from pkg.a import x`` names the module and its package; b.z -> c runs down: not back
    assert type_only_back("pkg", floors=("pkg",)) == {("pkg.b.y", "pkg.a"), ("pkg.b.y", "pkg.a.x")}


# -- leaves: what the plugin's help and every error path load -----------------------------
#
# A leaf imports only leaves (and the standard library), ``TYPE_CHECKING`` imports included:
# ``pytest --help`` loads the schema, which must not load the agent (``tests/plugin``); any
# module may raise or catch the simulation's errors without importing the module that
# raises them.

#: leaf -> the only modules of ``harness`` it may import
LEAVES = {
    "harness.errors": set(),
    "harness.settings": {"harness.errors"},
    "harness.states": set(),
    "harness.thread_cpu": set(),
    "harness.sim.errors": {"harness.errors"},
    "harness.sim.checks": set(),
    "harness.sim.schema": {"harness.errors", "harness.settings", "harness.states", "harness.sim.checks"},
}


def leaf_imports(module: str) -> set[str]:
    path = ROOT.joinpath(*module.split(".")).with_suffix(".py")
    return {name for _, name, _ in imports(path) if name == "harness" or name.startswith("harness.")}


@pytest.mark.parametrize("module", sorted(LEAVES))
def test_leaves_import_only_leaves(module):
    assert leaf_imports(module) <= LEAVES[module], f"{module} must import no more of harness than {LEAVES[module]}"


def test_the_checker_sees_what_a_leaf_imports(tmp_path, monkeypatch):
    _plant(tmp_path, {"harness/sim/errors.py": "from harness.errors import ElasticError\n"
                                               "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                               "    from harness.sim.truth.timeline import Timeline\n"})
    monkeypatch.setattr(__import__(__name__, fromlist=["x"]), "ROOT", tmp_path)
    assert leaf_imports("harness.sim.errors") == {"harness.errors", "harness.sim.truth.timeline"}

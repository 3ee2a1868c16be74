"""House figures of a package, read from the source (``ast``; nothing imported):

    python bench/house.py [PACKAGE ...]     # default: pytest_elastic harness.sim harness

Per package: its module count, its import cycles (strongly connected components of more
than one module, lazy imports inside functions included, ``TYPE_CHECKING`` ones not: the
graph ``tests/unit/test_layers.py`` checks), its rooms (sub-packages; a loose module of a
floor is a room of its own), their cycles and the ``TYPE_CHECKING`` imports that run back up
a room, and its largest classes and functions in lines (decorators to last line; a method
counts as a function). Figures to compare before and after a restructuring, not targets.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.unit.test_layers import (  # noqa: E402
    FLOORS,
    import_cycles,
    import_graph,
    module_name,
    package_sources,
    room_graph,
    type_only_back,
)

TOP = 3


def sizes(package: str) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """(lines, module.Qual.name) of every class and every function of ``package``, largest first."""
    classes: list[tuple[int, str]] = []
    functions: list[tuple[int, str]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([child.lineno] + [d.lineno for d in child.decorator_list])
                entry = ((child.end_lineno or first) - first + 1, f"{prefix}.{child.name}")
                (classes if isinstance(child, ast.ClassDef) else functions).append(entry)
                visit(child, entry[1])
            else:
                visit(child, prefix)

    for path in package_sources(package):
        visit(ast.parse(path.read_text(), str(path)), module_name(path))
    return sorted(classes, reverse=True), sorted(functions, reverse=True)


def describe(package: str) -> list[str]:
    graph = import_graph(package)
    cycles = import_cycles(graph)
    classes, functions = sizes(package)
    floors = tuple(f for f in FLOORS if f == package or f.startswith(package + ".")) or (package,)
    rooms = room_graph(package, floors)
    room_cycles = import_cycles(rooms)
    back = type_only_back(package, floors)
    lines = [f"{package}: {len(graph)} modules, {len(cycles)} import cycle(s); {len(rooms)} rooms, "
             f"{len(room_cycles)} room cycle(s), {len(back)} type-only import(s) back up a room"]
    lines += [f"  cycle of {len(c)}: {' '.join(sorted(c))}" for c in cycles + room_cycles]
    lines += [f"  class {n} lines: {name}" for n, name in classes[:TOP]]
    lines += [f"  function {n} lines: {name}" for n, name in functions[:TOP]]
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("packages", nargs="*", default=["pytest_elastic", "harness.sim", "harness"])
    for package in parser.parse_args().packages:
        print("\n".join(describe(package)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

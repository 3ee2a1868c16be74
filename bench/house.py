"""House figures of a package, read from the source (``ast``; nothing imported):

    python bench/house.py [PACKAGE ...]     # default: pytest_elastic harness.sim

Per package: its module count, its import cycles (strongly connected components of more
than one module, lazy imports inside functions included, ``TYPE_CHECKING`` ones not: the
graph ``tests/unit/test_layers.py`` checks), and its largest classes and functions in
lines (decorators to last line; a method counts as a function). Issue 18 asked for these
before and after its changes; they are figures, not targets.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.unit.test_layers import import_cycles, import_graph, module_name, package_sources  # noqa: E402

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
    lines = [f"{package}: {len(graph)} modules, {len(cycles)} import cycle(s)"]
    lines += [f"  cycle of {len(c)}: {' '.join(sorted(c))}" for c in cycles]
    lines += [f"  class {n} lines: {name}" for n, name in classes[:TOP]]
    lines += [f"  function {n} lines: {name}" for n, name in functions[:TOP]]
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("packages", nargs="*", default=["pytest_elastic", "harness.sim"])
    for package in parser.parse_args().packages:
        print("\n".join(describe(package)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

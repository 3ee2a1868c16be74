"""A job's faults live in parts (``job.processes``, ``job.network``, ``job.storage``,
``job.resources``) that act on the job as a ``FaultTarget``: a part sees the protocol and
nothing else of the job, so a new kind of fault is a new part, not more methods mixed into
``Job``, and a part that needs more says so in the protocol. Checked on the source with
``ast``: no part imports ``Job``, no module of the job's reads another object's ``_private``
field, and ``heal`` asks every lasting part."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from harness.sim.faults.target import end_every
from harness.sim.job import Job

SIM = Path(__file__).resolve().parents[2] / "harness" / "sim"
#: the parts, and the protocol they see the job through
PART_MODULES = sorted([SIM / "nodes" / "faults.py", SIM / "net" / "faults.py", SIM / "faults" / "target.py",
                       *(SIM / "storage").glob("*.py"), *(SIM / "resources").glob("*.py")])
#: the job's face and the modules it hands its calls to
JOB_MODULES = sorted(SIM / name for name in (
    "job.py", "faults/methods.py", "truth/job_result.py", "nodes/start.py", "nodes/teardown.py", "truth/verdicts.py",
    "waits.py", "faults/scheduler.py"))


def _imported_modules(tree: ast.AST) -> set[str]:
    """Every module ``tree`` imports (lazy and ``TYPE_CHECKING`` imports too), and each
    ``from m import name`` as ``m.name`` as well."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def test_no_part_imports_the_job():
    """Not even for an annotation: a part typed as ``Job`` could reach all of it."""
    offenders = [path.relative_to(SIM).as_posix() for path in PART_MODULES
                 if {"harness.sim.job", "harness.sim.job.Job", "harness.sim.cluster.Job"}
                 & _imported_modules(ast.parse(path.read_text()))]
    assert offenders == []


def _private_reads(path: Path, root: Path = SIM) -> list[str]:
    """``x._name`` in ``path`` where ``x`` is neither ``self``/``cls`` nor an imported module
    (a library's own private function is its business, not an object's field)."""
    tree = ast.parse(path.read_text())
    modules = {alias.asname or alias.name.partition(".")[0]
               for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    reads = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")):
            continue
        owner = node.value
        if isinstance(owner, ast.Name) and owner.id in {"self", "cls", *modules}:
            continue
        reads.append(f"{path.relative_to(root).as_posix()}:{node.lineno}: {ast.unparse(node)}")
    return reads


def test_neither_the_job_nor_a_part_reads_another_objects_private_field():
    """``cluster._names``, ``job._scheduler._applying`` were such reads: the owner offers a
    public door instead (``Cluster.new_node_label``, ``FaultScheduler.await_applied``)."""
    assert [read for path in PART_MODULES + JOB_MODULES for read in _private_reads(path)] == []


def test_the_checks_see_what_they_look_for(tmp_path):
    """A checker that cannot fail is no check: plant each violation and see it found."""
    part = tmp_path / "part.py"
    part.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from harness.sim.job import Job\n"
                    "def f(job):\n    return job._scheduler._applying\n")
    assert "harness.sim.job" in _imported_modules(ast.parse(part.read_text()))
    reads = [read.partition(": ")[2] for read in _private_reads(part, tmp_path)]
    assert reads == ["job._scheduler._applying", "job._scheduler"]


def test_heal_asks_every_lasting_part():
    assert "end_every(self.lasting" in inspect.getsource(Job.heal)
    assert "end_lasting" in inspect.getsource(end_every)


def test_no_part_is_mixed_into_the_job_nor_declares_stubs_for_it():
    assert Job.__bases__ == (object,)
    for module in ("nodes/faults.py", "net/faults.py", "faults/target.py"):
        assert "NotImplementedError" not in (SIM / module).read_text(), module

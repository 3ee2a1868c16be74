"""``Job`` is a face, not a god: it hands each call to the module or part that holds the
logic, and stays small enough to read (the house's rule: a class past ~300 lines or ~30
public methods is two classes). Measured on the source with ``ast``, so it cannot grow back
unnoticed; the public fault methods are the parts' own methods, handed on
(``harness.sim.faults.methods``), one declaration per public row of the schema."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.sim import schema
from harness.sim.faults.methods import FaultMethod, hand_off
from harness.sim.job import Job
from harness.sim.net.faults import NetworkFaults
from harness.sim.nodes.faults import ProcessFaults
from harness.sim.places.here import HereJob
from harness.sim.resources import ResourceFaults
from harness.sim.storage.faults import StorageFaults

JOB_PY = Path(__file__).resolve().parents[2] / "harness" / "sim" / "job.py"
MAX_LINES = 300
MAX_PUBLIC_METHODS = 30
#: the class of each part a row may name (``FaultKind.part``)
PART_CLASSES = {"processes": ProcessFaults, "network": NetworkFaults, "resources": ResourceFaults,
                "storage": StorageFaults}
PUBLIC_KINDS = sorted(kind for kind, row in schema.FAULT_KINDS.items() if row.public and row.part)


def _job_class() -> ast.ClassDef:
    tree = ast.parse(JOB_PY.read_text())
    (job,) = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "Job"]
    return job


def test_the_job_is_a_face_of_at_most_300_lines_and_30_public_methods():
    """The methods written in ``Job``'s body (the fault hand-offs are declarations, counted
    by the next test against the schema's public rows)."""
    lines = len(JOB_PY.read_text().splitlines())
    public = [node.name for node in _job_class().body
              if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_")]
    assert lines <= MAX_LINES, f"harness/sim/job.py has {lines} lines: move logic out of the face"
    assert len(public) <= MAX_PUBLIC_METHODS, f"Job has {len(public)} public methods: {public}"


def test_the_job_hands_on_exactly_the_public_fault_kinds():
    """Each public fault method is a one-line ``hand_off`` declaration, and there is one for
    each public row with a part: neither the rows nor the face can drift."""
    declared = {name for name, value in vars(Job).items() if isinstance(value, FaultMethod)}
    assert declared == set(PUBLIC_KINDS)
    for node in _job_class().body:
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) in declared:
            assert isinstance(node.value, ast.Call) and ast.unparse(node.value.func) == "hand_off"


@pytest.mark.parametrize("kind", PUBLIC_KINDS)
def test_a_fault_method_of_the_job_is_its_parts_own(kind):
    """``job.<kind>`` is the bound method of the part its row names, the one ``Fault.apply``
    calls; ``Job.<kind>`` has that method's signature and docstring (``help(Job)``, IDEs)."""
    part = schema.FAULT_KINDS[kind].part
    method = getattr(PART_CLASSES[part], kind)
    assert vars(Job)[kind].part == part
    called = []
    here = HereJob(SimpleNamespace(orders_dir="/nonexistent", run_id="face"))  # this machine refuses nothing
    act = SimpleNamespace(**{kind: lambda *a, **k: called.append((a, k)) or 7})
    stand_in = SimpleNamespace(place=here, **{part: act})
    assert getattr(Job, kind).__get__(stand_in)(1, x=2) == 7  # a method on a job: bound to it
    assert vars(Job)[kind].__get__(stand_in, Job) is getattr(stand_in, part).__dict__[kind]
    assert called == [((1,), {"x": 2})]
    assert inspect.signature(getattr(Job, kind)) == inspect.signature(method)
    assert getattr(Job, kind).__doc__.startswith(inspect.getdoc(method) or "")
    assert getattr(Job, kind).__qualname__ == f"Job.{kind}"


def test_help_lists_the_fault_methods_with_their_parameters():
    import pydoc

    text = pydoc.render_doc(Job, renderer=pydoc.plaintext)
    assert "kill_worker(self, node: 'int', local_rank: 'int'" in text
    assert "partition(self, node: 'int', peers:" in text and "(``job.network.partition``, handed on.)" in text


def _raised_by_class_creation(make) -> BaseException:
    """The error a class body's ``__set_name__`` raised (Python < 3.12 wraps it in a
    RuntimeError whose cause it is)."""
    with pytest.raises(Exception) as caught:
        make()
    error = caught.value
    return error.__cause__ if isinstance(error, RuntimeError) and error.__cause__ else error


def test_a_hand_off_not_named_for_a_public_kind_fails_where_it_is_written():
    def misnamed() -> None:
        class Face:
            kill = hand_off(ProcessFaults.kill_worker)

    def not_public() -> None:
        class Face:
            signal_node_processes = hand_off(ProcessFaults.signal_node_processes)

    for make in (misnamed, not_public):
        error = _raised_by_class_creation(make)
        assert isinstance(error, TypeError) and "must be a public fault kind with a part" in str(error)

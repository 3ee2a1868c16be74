"""A job's faults live in parts (``job.processes``, ``job.network``) that act on the job as a
``FaultTarget``; ``Job`` keeps each fault's name as a one-line hand-off to its part, so that a
new kind of fault (storage, resources) is a new part, not more methods mixed into ``Job``."""

from __future__ import annotations

import ast
import inspect
import textwrap
from pathlib import Path

import pytest

from harness.sim import schema
from harness.sim.job import Job

SIM = Path(__file__).resolve().parents[2] / "harness" / "sim"


def _body(function) -> list[ast.stmt]:
    """The statements of ``function``, its docstring left out."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    return body


@pytest.mark.parametrize("kind", [k for k, row in schema.FAULT_KINDS.items() if row.public and row.part])
def test_each_job_fault_method_hands_the_call_to_its_part(kind):
    """The README's API (a public row): ``Job.<kind>`` is ``self.<the row's part>.<kind>(...)``."""
    (statement,) = _body(getattr(Job, kind))
    call = statement.value if isinstance(statement, (ast.Expr, ast.Return)) else None
    assert isinstance(call, ast.Call), ast.dump(statement)
    part, _, method = ast.unparse(call.func).removeprefix("self.").partition(".")
    assert (part, method) == (schema.FAULT_KINDS[kind].part, kind), ast.unparse(call.func)  # self.<part>.<kind>()


def test_heal_asks_every_lasting_part():
    source = inspect.getsource(Job.heal)
    assert "self.lasting" in source and "end_lasting" in source


def test_no_part_is_mixed_into_the_job_nor_declares_stubs_for_it():
    assert Job.__bases__ == (object,)
    for module in ("process_faults.py", "network_faults.py", "fault_target.py"):
        assert "NotImplementedError" not in (SIM / module).read_text(), module

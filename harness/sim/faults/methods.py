"""The public fault methods on ``Job`` (``job.kill_worker(node=0, local_rank=1)``): each is
the method of the part its row names, handed on as it is.

A public row of ``harness.sim.schema.FAULT_KINDS`` is part of the public API, so ``Job``
has a method of the kind's name. That method holds nothing of its own: ``Job`` declares
``kill_worker = hand_off(ProcessFaults.kill_worker)``, the row says which part applies the
kind (``processes``), and ``job.kill_worker`` *is* ``job.processes.kill_worker``: the same
call ``Fault.apply`` makes for a scheduled fault. The part's method is the one truth of the
signature and the docstring:

* mypy and an IDE read them through ``FaultMethod``'s types (a ``ParamSpec``): a wrong
  argument to ``job.kill_worker`` is an error in the user's file, as for a written method;
* ``help(Job)`` and ``inspect.signature(Job.kill_worker)`` show them (``Job.kill_worker``
  is a function of the part's signature and docstring that hands the call on).

Why not ``setattr`` a method per public row at import: nothing a type checker reads would
name them, and the public API would be ``Any`` to every user's mypy. One declaration line
per public kind is the price of being seen; ``tests/unit/test_job_face.py`` keeps those lines
equal to the public rows, so neither can drift.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Concatenate, Generic, ParamSpec, TypeVar, overload

if TYPE_CHECKING:
    from harness.sim.faults.target import Refusals

__all__ = ["FaultMethod", "hand_off"]

P = ParamSpec("P")
R = TypeVar("R")


class FaultMethod(Generic[P, R]):
    """A class attribute of ``Job`` named as a public fault kind: on a job, the bound method
    of the kind on the part its row names; on the class, a function taking the job first."""

    def __init__(self, method: Callable[Concatenate[Any, P], R]):
        self._method = method
        self._kind = ""
        self._part = ""
        self._function: Callable[..., R] = method

    def __set_name__(self, owner: type, name: str) -> None:
        """Find the part in the kind's row, when the class is made: a name that is not a
        public kind with a part, or a part's method of another name, fails the import."""
        from harness.sim.schema import FAULT_KINDS

        row = FAULT_KINDS.get(name)
        if row is None or not row.public or row.part is None or self._method.__name__ != name:
            raise TypeError(f"{owner.__name__}.{name} = hand_off({self._method.__qualname__}): "
                            f"{name!r} must be a public fault kind with a part (harness.sim.schema."
                            "FAULT_KINDS) and the part's method of that name")
        self._kind, self._part = name, row.part
        self._function = self._unbound(owner)

    def _unbound(self, owner: type) -> Callable[..., R]:
        """What ``Job.<kind>`` is: the part's signature and docstring, the call handed on."""
        kind, part = self._kind, self._part

        def method(job: Any, *args: Any, **kwargs: Any) -> R:
            result: R = getattr(getattr(job, part), kind)(*args, **kwargs)
            return result

        method.__name__ = kind
        method.__qualname__ = f"{owner.__qualname__}.{kind}"
        method.__module__ = owner.__module__
        method.__doc__ = f"{inspect.getdoc(self._method) or ''}\n\n(``job.{part}.{kind}``, handed on.)".lstrip()
        method.__signature__ = inspect.signature(self._method)  # type: ignore[attr-defined]
        return method

    @property
    def part(self) -> str:
        """The job's part that applies the kind (its row's ``part``)."""
        return self._part

    @overload
    def __get__(self, job: None, owner: type) -> Callable[Concatenate[Any, P], R]: ...

    @overload
    def __get__(self, job: object, owner: type) -> Callable[P, R]: ...

    def __get__(self, job: object | None, owner: type) -> Callable[..., R]:
        if job is None:
            return self._function
        bound: Callable[P, R] = getattr(getattr(job, self._part), self._kind)
        place: Refusals = job.place  # type: ignore[attr-defined]  # the job (``Job``): its place refuses first
        guarded: Callable[P, R] = place.guarded(self._kind, bound)  # what its place cannot do: refused first
        return guarded


def hand_off(method: Callable[Concatenate[Any, P], R]) -> FaultMethod[P, R]:
    """``kill_worker = hand_off(ProcessFaults.kill_worker)`` in ``Job``'s body: the public
    ``job.kill_worker`` is the part's method (module doc)."""
    return FaultMethod(method)

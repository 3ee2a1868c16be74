"""The fault-free twin's verdict: did the resumed run compute what the run without faults did?

A run that survived its faults can still be wrong: a resume that forgot the RNG, the data
position, the optimizer or the LR scheduler finishes with a plausible loss and a different
model. The oracle here compares the faulted run's training, step by step, with a twin that ran
the same script, args and cluster shape with no faults:

* per (rank, step), the loss of the attempt whose result counts: a step redone after a
  restart counts as redone, the last report of it (``report_step`` events, in time order);
* the final state digests (``report_step(..., state=...)`` under ``HARNESS_STATE_DIGEST``),
  per rank, where both runs have one and the world size never changed (a digest of a
  sharded state is per shard).

Bitwise (``rtol=0``) is the default: the same script on the same world size with the same
seeds is deterministic on CPU with gloo. A run whose world size changed (a scale-down) sums
in another order, so it is compared with a tolerance and the result says so.

Pure functions of event lists: the twin's events may come from a cache (``GoldenRecord``).
``event_fields`` is what the verdict's ``golden`` event carries, so the job page can draw the
twin's curve under the run's without the twin's own events.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["RESHARD_RTOL", "HINT", "EVENT_POINTS", "GoldenDiff", "GoldenRecord", "compare", "record_of",
           "same_loss", "event_fields"]

#: the tolerance used when the world size changed and the caller asked for bitwise
RESHARD_RTOL = 1e-4

HINT = ("a resume that diverges from its fault-free twin usually forgot state the checkpoint should "
        "carry: the RNG (torch/numpy/python generators, dropout), the data loader's position or "
        "sampler epoch, the optimizer's state (Adam moments), the LR scheduler, a GradScaler")

Key = tuple[int, int]  # (rank, step)

#: the most twin losses one ``golden`` event carries (the job page draws the twin's curve from
#: them): a line of the event stream stays ~100 KB however long the run; a longer twin is
#: thinned evenly and the event says how many it had
EVENT_POINTS = 4000
#: the most world sizes and per-rank digests the event carries (a chaos run has many rounds)
_EVENT_ITEMS = 256


@dataclass(frozen=True)
class GoldenRecord:
    """What the oracle needs of one run: the counted loss per (rank, step), the attempt that
    reported it, the final digest per rank, and the world sizes the run went through."""

    losses: dict[Key, float]
    attempts: dict[Key, int] = field(default_factory=dict)
    digests: dict[int, str] = field(default_factory=dict)
    world_sizes: list[int] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"losses": [[r, s, v] for (r, s), v in sorted(self.losses.items())],
                "attempts": [[r, s, a] for (r, s), a in sorted(self.attempts.items())],
                "digests": {str(r): d for r, d in sorted(self.digests.items())},
                "world_sizes": self.world_sizes}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> GoldenRecord:
        return cls(losses={(int(r), int(s)): float(v) for r, s, v in data["losses"]},
                   attempts={(int(r), int(s)): int(a) for r, s, a in data.get("attempts", [])},
                   digests={int(r): str(d) for r, d in data.get("digests", {}).items()},
                   world_sizes=[int(w) for w in data.get("world_sizes", [])])


@dataclass(frozen=True)
class GoldenDiff:
    """``diverged``; ``first`` = (rank, step, got, expected) of the first divergence, None if none."""

    diverged: bool
    first: tuple[int, int, float | None, float | None] | None
    steps_compared: int
    rtol: float
    world_size_changed: bool = False
    digests_compared: int = 0
    digest_mismatch: tuple[int, str, str] | None = None  # (rank, got, expected)
    attempt: int | None = None      # the attempt that reported the first divergent step
    resumed_at: int | None = None   # the first step that attempt ran (where it resumed from)
    note: str = ""

    def explain(self) -> str:
        """What a failing test prints: where it diverged, from which resume, and what to check."""
        if not self.diverged:
            return (f"same as the fault-free twin: {self.steps_compared} (rank, step) losses"
                    f"{f' and {self.digests_compared} final digests' if self.digests_compared else ''} "
                    f"compared (rtol={self.rtol:g}){'; ' + self.note if self.note else ''}")
        lines = []
        if self.first is not None:
            rank, step, got, expected = self.first
            lines.append(f"diverged from the fault-free twin at rank {rank}, step {step}: "
                         f"loss {_show(got)} (twin: {_show(expected)}), rtol={self.rtol:g}")
            if self.attempt is not None:
                where = f", which resumed at step {self.resumed_at}" if self.resumed_at else ""
                lines.append(f"  reported by attempt {self.attempt}{where}")
        elif self.digest_mismatch is not None:
            rank, mine, theirs = self.digest_mismatch
            lines.append(f"every loss matched, but rank {rank}'s final state differs from the twin's "
                         f"(digest {mine[:12]}… vs {theirs[:12]}…)")
        if self.note:
            lines.append(f"  {self.note}")
        lines.append(f"  hint: {HINT}")
        return "\n".join(lines)


def _show(value: float | None) -> str:
    return "missing" if value is None else repr(value)


def record_of(steps: Iterable[Mapping[str, Any]], world_sizes: Iterable[int] = ()) -> GoldenRecord:
    """The counted losses and final digests of a run, from its ``step`` events in time order."""
    losses: dict[Key, float] = {}
    attempts: dict[Key, int] = {}
    digests: dict[int, str] = {}
    for e in steps:
        key = (int(e.get("rank", -1)), int(e.get("step", -1)))
        if "loss" in e:
            losses[key] = float(e["loss"])  # a later report of the same step (a redo) counts
            attempts[key] = int(e.get("attempt", e.get("restart_count", 0)))
        if "digest" in e:
            digests[key[0]] = str(e["digest"])  # the last one a rank reported is its final state
    return GoldenRecord(losses, attempts, digests, list(world_sizes))


def same_loss(got: float, expected: float, rtol: float) -> bool:
    """The oracle's equality: bitwise (NaN equals NaN) at ``rtol=0``, else relative; the page
    marks the steps that differ with the same rule."""
    if rtol == 0:
        return got == expected or (math.isnan(got) and math.isnan(expected))
    return math.isclose(got, expected, rel_tol=rtol, abs_tol=0.0)


def compare(run: GoldenRecord, twin: GoldenRecord, rtol: float | None = None) -> GoldenDiff:
    """Compare a run with its fault-free twin (module doc). ``rtol``: as given (0.0: bitwise,
    even across a world-size change); None: 0.0, or ``RESHARD_RTOL`` where the world size
    changed."""
    changed = len(set(run.world_sizes)) > 1 or (bool(run.world_sizes) and bool(twin.world_sizes)
                                                 and run.world_sizes[-1] != twin.world_sizes[-1])
    note = ""
    used = 0.0 if rtol is None else rtol
    if changed:
        used = RESHARD_RTOL if rtol is None else rtol
        note = (f"the world size changed ({run.world_sizes}): compared with rtol={used:g}"
                + (" as asked" if used == 0 else ", not bitwise (another world size sums in another order)")
                + "; final digests not compared")
    # every step the twin reported on a rank the run still had at that step: a run that shrank
    # reports fewer ranks after the change, which is not a divergence
    ranks_at: dict[int, set[int]] = {}
    for rank, step in run.losses:
        ranks_at.setdefault(step, set()).add(rank)
    keys = sorted((k for k in twin.losses if k[0] in ranks_at.get(k[1], set()) or not changed),
                  key=lambda k: (k[1], k[0]))
    compared = 0
    for key in keys:
        expected = twin.losses[key]
        got = run.losses.get(key)
        compared += 1
        if got is None or not same_loss(got, expected, used):
            attempt = run.attempts.get(key)
            resumed = min((s for (r, s), a in run.attempts.items() if r == key[0] and a == attempt), default=None)
            return GoldenDiff(True, (key[0], key[1], got, expected), compared, used, changed, 0, None, attempt,
                              resumed, note)
    digests = 0
    if not changed:
        for rank in sorted(set(run.digests) & set(twin.digests)):
            digests += 1
            if run.digests[rank] != twin.digests[rank]:
                return GoldenDiff(True, None, compared, used, changed, digests,
                                  (rank, run.digests[rank], twin.digests[rank]), None, None, note)
    if not keys:
        note = (note + "; " if note else "") + "no step losses to compare: does the script call " \
            "harness.report_step(step, loss=...)?"
        return GoldenDiff(True, None, 0, used, changed, digests, None, None, None, note)
    return GoldenDiff(False, None, compared, used, changed, digests, None, None, None, note)


def _thin(losses: Mapping[Key, float], cap: int, keep: Iterable[Key]) -> list[Key]:
    """At most ``cap`` keys (plus ``keep``), evenly spread over (rank, step) order: every
    rank keeps its share, so each drawn curve keeps its shape."""
    keys = sorted(losses)
    if len(keys) > cap:
        last = len(keys) - 1
        picked = {keys[round(i * last / max(cap - 1, 1))] for i in range(cap)} if cap > 0 else set()
        keys = sorted(picked | {k for k in keep if k in losses})
    return keys


def event_fields(diff: GoldenDiff, run: GoldenRecord, twin: GoldenRecord,
                 cap: int = EVENT_POINTS) -> dict[str, Any]:
    """The ``golden`` event's fields, JSON only: the verdict (``diverged``, ``first``,
    ``steps_compared``, ``rtol``, ``note``, as the event always had), the rest of the diff,
    and what the job page draws that the run's own events lack: the twin's losses (at most
    ``cap``; ``twin_losses_total`` says how many it had), the world sizes and the final
    digests per rank of both runs. The run's own losses are its ``step`` events."""
    keep = [(diff.first[0], diff.first[1])] if diff.first is not None else []
    points = _thin(twin.losses, cap, keep)
    return {
        "diverged": diff.diverged, "first": list(diff.first) if diff.first is not None else None,
        "steps_compared": diff.steps_compared, "rtol": diff.rtol, "note": diff.note,
        "world_size_changed": diff.world_size_changed, "digests_compared": diff.digests_compared,
        "digest_mismatch": list(diff.digest_mismatch) if diff.digest_mismatch is not None else None,
        "attempt": diff.attempt, "resumed_at": diff.resumed_at,
        "world_sizes": {"run": run.world_sizes[-_EVENT_ITEMS:], "twin": twin.world_sizes[-_EVENT_ITEMS:]},
        "digests": {"run": _digests(run), "twin": _digests(twin)},
        "twin_losses": [[r, s, twin.losses[(r, s)]] for r, s in points],
        "twin_losses_total": len(twin.losses),
    }


def _digests(record: GoldenRecord) -> dict[str, str]:
    return {str(r): d for r, d in sorted(record.digests.items())[:_EVENT_ITEMS]}

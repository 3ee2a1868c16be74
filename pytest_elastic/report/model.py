"""What the drawn timeline shows, computed once from a job's events (no drawing here).

Everything is derived from ``Timeline.events()`` dicts. Node keys are opaque: today a
generated name (``"megan-0"``), tomorrow an integer index with a display label; harness
events name their victim in ``target_node`` the same way. Times are seconds from the
first event.
"""

from __future__ import annotations

import bisect
import re
import signal
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from itertools import islice
from operator import itemgetter
from typing import Any, cast

from harness.sim.schema import event_kind, kinds_where, modern_event
from harness.sim.truth.training import TrainingIndex

__all__ = ["Span", "Lane", "Fault", "Round", "Model", "build_model", "fault_latencies", "labeler",
           "fault_text", "events_of", "LASTING_FAULTS", "KILL_FAULTS", "LEAVE_FAULTS"]

# The kinds the report treats apart, each a live set over the fault rows
# (``harness.sim.schema.FAULT_KINDS``): a kind registered later is drawn by its row too, and
# an older run's retired event name (``node_kill``) as its kind.
#: faults that last until something ends them (a heal, an end event, a duration, the job's end)
LASTING_FAULTS = kinds_where(lambda row: row.lasts is not None, "lasting")
#: faults after which the target node is gone for good: killed (its agent lost with it), or
#: left (its agent ended itself: once its agent's last event is out)
KILL_FAULTS = kinds_where(lambda row: row.membership < 0 and row.lasts is None and row.agent_losing, "kills")
LEAVE_FAULTS = kinds_where(lambda row: row.membership < 0 and row.lasts is None and not row.agent_losing, "leaves")
#: fault kinds that end lasting faults instead of starting one
_ENDING_FAULTS = frozenset({"heal", "fault_end"})
_DISTURBED = frozenset({"FAILED", "STOPPED", "UNHEALTHY"})
_RECOVERED = frozenset({"HEALTHY", "SUCCEEDED"})
_REACTIONS = frozenset({"state", "worker_exit", "membership_change"})
_HARNESS = "harness"
_WORKER_STATES = frozenset({"UNKNOWN", "INIT", "HEALTHY", "UNHEALTHY", "STOPPED", "SUCCEEDED", "FAILED"})


@dataclass
class Span:
    """Something that holds from ``start`` to ``end`` (seconds from t0)."""

    start: float
    end: float
    cls: str  # what it is: a state name, a worker outcome, a fault kind
    text: str  # one line for a person
    extra: tuple[Any, ...] = ()  # small numbers the page's tooltip formats (round, rank, pid, ...)


@dataclass
class Lane:
    """One node: its group state over time and, per local rank, its worker lifetimes."""

    key: Hashable
    label: str
    states: list[Span] = field(default_factory=list)
    workers: dict[int, list[Span]] = field(default_factory=dict)
    dead_at: float | None = None
    dead_by: str = ""
    faults: list[Span] = field(default_factory=list)  # lasting faults aimed at this node


@dataclass
class Fault:
    """A fault the harness fired, with its end (lasting faults) and latencies."""

    at: float
    kind: str
    target: Hashable | None
    event: dict[str, Any]
    end: float | None = None
    detection: float | None = None
    recovery: float | None = None
    resume: float | None = None  # fault -> the first training step of a later round
    lost: dict[str, float] = field(default_factory=dict)  # seconds by category (harness.sim.truth.training)
    data_lost: list[str] = field(default_factory=list)  # a lose_unsynced crash: what each file lost


@dataclass
class Round:
    at: float
    round: Any
    world_size: Any
    nodes: int


@dataclass
class Model:
    t0: float
    duration: float
    lanes: list[Lane]
    rounds: list[Round]
    faults: list[Fault]
    steps: dict[Any, list[tuple[float, int, int]]]  # rank -> (t, step, pid), time-ordered
    max_step: int
    outcome: str
    ends: list[Fault] = field(default_factory=list)  # heals and explicit ends of lasting faults


def labeler(timeline: Any, events: list[dict[str, Any]]) -> Callable[[Hashable], str]:
    """node key -> display label: ``Timeline.label`` when it has one, else what ``node_start``
    events say, else ``str(node)``."""
    names: dict[Hashable, str] = {}
    for e in [e for e in events if e.get("kind") == "node_start"]:
        key = e.get("target_node", e.get("index"))
        name = e.get("label") or e.get("name")
        if key is not None and name:
            names[key] = str(name)
    method = getattr(timeline, "label", None)

    def label(node: Hashable) -> str:
        if node in names:
            return names[node]
        if callable(method):
            try:
                return str(method(node))
            except Exception:  # an unknown key raises there: the key itself is the label
                pass
        return str(node)

    return label


def events_of(source: Any) -> tuple[list[dict[str, Any]], Callable[[Hashable], str]]:
    """A ``Timeline`` or a plain event list (synthetic input): its events and label function."""
    events = source.events() if hasattr(source, "events") else list(source)
    return events, labeler(source, events)


def fault_latencies(events: list[dict[str, Any]]) -> list[tuple[float | None, float | None]]:
    """Per fault event, (detection, recovery) latency, as ``Timeline.faults()`` defines them
    (detection: the first agent reaction that is not HEALTHY; recovery: the first HEALTHY or
    SUCCEEDED after a disturbed state), in O(E + F log E + F * S) instead of O(F * E): the
    bench's 100 faults over 60 000 events must stay well under a second."""
    reaction_times: list[float] = []
    states: list[tuple[float, str]] = []
    faults: list[float] = []
    for e in events:
        kind = e.get("kind")
        if kind == "step":
            continue
        if kind == "fault":
            faults.append(e.get("mono", 0.0))
        elif kind in _REACTIONS and e.get("node") != _HARNESS:
            if e.get("state") != "HEALTHY":
                reaction_times.append(e.get("mono", 0.0))
            if kind == "state":
                states.append((e.get("mono", 0.0), e["state"]))
    state_times = [t for t, _ in states]
    found = []
    for start in faults:
        i = bisect.bisect_right(reaction_times, start)
        detection = reaction_times[i] - start if i < len(reaction_times) else None
        recovery = None
        disturbed = False
        for t, state in islice(states, bisect.bisect_right(state_times, start), None):  # no copy
            if state in _DISTURBED:
                disturbed = True
            elif disturbed and state in _RECOVERED:
                recovery = t - start
                break
        found.append((detection, recovery))
    return found


def _node_order(keys: Iterable[Hashable]) -> list[Hashable]:
    ordered = list(dict.fromkeys(keys))
    if all(isinstance(k, int) for k in ordered):  # indexes: in order, whatever order they spoke in
        return sorted(ordered, key=lambda k: cast(int, k))
    return ordered


def _same_node(a: Any, b: Any) -> bool:
    return a == b or (a is not None and b is not None and str(a) == str(b))


def _exit_class(code: Any) -> str:
    if code == 0:
        return "ok"
    if code in (-15, -2):
        return "stopped"  # the agent stopped it (SIGTERM) or it was interrupted
    return "failed"


def _signal_text(code: Any) -> str:
    if isinstance(code, int) and code < 0:
        try:
            return f"{code} ({signal.Signals(-code).name})"
        except ValueError:
            return str(code)
    return str(code)


def _steps(found: list[dict[str, Any]], t0: float) -> tuple[dict[Any, list[tuple[float, int, int]]], int]:
    """rank -> [(t, step, pid)] and the highest step: most of a long job's events are steps,
    so they take the C-speed path (itemgetter) unless one lacks a field."""
    try:
        rows = list(map(itemgetter("rank", "mono", "step", "pid"), found))
    except KeyError:
        rows = [(e.get("rank"), e.get("mono", t0), int(e.get("step", 0)), e.get("pid", 0)) for e in found]
    by_rank: dict[Any, list[tuple[float, int, int]]] = defaultdict(list)
    for rank, mono, step, pid in rows:
        by_rank[rank].append((mono - t0, step, pid))
    return dict(by_rank), max((r[2] for r in rows), default=0)


def _worker_extra(start: dict[str, Any], pid: Any, code: Any) -> tuple[Any, ...]:
    return (start.get("rank"), start.get("local_rank"), pid, code, start.get("round"))


def build_model(events: list[dict[str, Any]], label: Callable[[Hashable], str] = str) -> Model:
    """One pass (plus a sort of the small lists) over the job's time-ordered events."""
    if not events:
        return Model(0.0, 0.0, [], [], [], {}, 0, "no events")
    t0 = events[0].get("mono", 0.0)
    duration = max(events[-1].get("mono", 0.0) - t0, 1e-3)
    end = duration
    lanes: dict[Hashable, Lane] = {}
    open_workers: dict[tuple[Hashable, Any], tuple[float, dict[str, Any]]] = {}
    rounds: dict[Any, Round] = {}
    faults: list[Fault] = []
    results: list[str] = []

    def lane(node: Hashable) -> Lane:
        found = lanes.get(node)
        if found is None:
            found = lanes[node] = Lane(node, label(node))
        return found

    steps, max_step = _steps([e for e in events if e.get("kind") == "step"], t0)
    training = TrainingIndex(events)  # faults' costs need the steps; the rest does not
    events = [e for e in events if e.get("kind") != "step"]
    for e in events:
        kind = e.get("kind")
        t = e.get("mono", t0) - t0
        node = e.get("node")
        if kind == "fault":  # an older run's retired fault name (node_kill), in today's spelling
            e = modern_event(e)
            faults.append(Fault(t, str(e.get("fault", "?")), e.get("target_node"), e))
        elif kind == "heal":  # the harness ended a node's network faults (or every node's)
            faults.append(Fault(t, "heal", e.get("target_node"), e))
        elif kind == "storage_lost":  # after its kill: what the crash took, on that fault's line
            _attach_data_lost(faults, e)
        elif node == _HARNESS or node is None:
            continue
        elif kind == "state" and e.get("state") not in _WORKER_STATES:
            gone = lane(node)  # the harness's terminal entry for a node it killed, froze or removed
            if gone.dead_at is None:
                gone.dead_at, gone.dead_by = t, str(e.get("state")).lower()
        elif kind == "state":
            states = lane(node).states
            if states:
                states[-1].end = t
            text = f"{e['state']} (round {e.get('round', '?')}, restart {e.get('restart_count', 0)})"
            states.append(Span(t, end, str(e["state"]), text, (e.get("round"), e.get("restart_count", 0))))
        elif kind == "worker_start":
            open_workers[(node, e.get("worker_pid"))] = (t, e)
            lane(node)
        elif kind == "worker_exit":
            began = open_workers.pop((node, e.get("worker_pid")), None)
            start, first = began if began is not None else (0.0, e)
            code = e.get("exitcode")
            text = (f"rank {first.get('rank')} (local {first.get('local_rank')}), pid {e.get('worker_pid')}, "
                    f"round {first.get('round', '?')}: exit {_signal_text(code)}"
                    + (": killed by the OOM killer" if e.get("reason") == "oom" else ""))
            lane(node).workers.setdefault(e.get("local_rank", 0), []).append(
                Span(start, t, _exit_class(code), text, _worker_extra(first, e.get("worker_pid"), code)))
        elif kind == "rendezvous":
            key = (e.get("run_id"), e.get("round"))
            if key not in rounds:
                rounds[key] = Round(t, e.get("round"), e.get("world_size"), 0)
            rounds[key].nodes += 1
        elif kind == "result":
            result = e.get("result")
            results.append(str(result.get("state")) if isinstance(result, dict) else "?")
    for (node, pid), (start, first) in open_workers.items():
        text = f"rank {first.get('rank')} (local {first.get('local_rank')}), pid {pid}: still running"
        lane(node).workers.setdefault(first.get("local_rank", 0), []).append(
            Span(start, end, "running", text, _worker_extra(first, pid, None)))
    ordered = [lanes[k] for k in _node_order(lanes)]
    _place_faults(events, faults, ordered, end, training)
    outcome = ("FAILED" if "FAILED" in results else "SUCCEEDED") if results else "unfinished"
    return Model(t0, duration, ordered, sorted(rounds.values(), key=lambda r: r.at),
                 [f for f in faults if f.kind not in _ENDING_FAULTS], steps, max_step, outcome,
                 [f for f in faults if f.kind in _ENDING_FAULTS])


_DEVICE_PATH = re.compile(r"/(?:fs|backing)/((?:shared|node\d+)(?:/.*)?)$")


def _size(n: object) -> str:
    if not isinstance(n, int):
        return "?"
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def _attach_data_lost(faults: list[Fault], event: dict[str, Any]) -> None:
    """One line per file a ``lose_unsynced`` crash rolled back, on the kill that crashed it:
    the file (below its filesystem: ``shared/ckpt.pt``, ``node1/disk/x``), how much of it
    was never fsynced, what is left."""
    target = event.get("target_node")
    kill = next((f for f in reversed(faults) if f.kind == "kill_node" and f.target == target), None)
    if kill is None:
        return
    for lost in event.get("files", []):
        path = str(lost.get("path", "?"))
        device = _DEVICE_PATH.search(path)  # the job's mount (or backing) dir is noise here
        path = device.group(1) if device else path
        kept = f", {_size(lost.get('kept_torn'))} of its last write kept (torn)" if lost.get("kept_torn") else ""
        kill.data_lost.append(f"{path}: {_size(lost.get('unsynced_bytes'))} never fsynced lost, "
                              f"{_size(lost.get('size_after'))} left{kept}")


def _place_faults(events: list[dict[str, Any]], faults: list[Fault], lanes: list[Lane], end: float,
                  training: TrainingIndex) -> None:
    """Latencies and training costs, the end of every lasting fault, dead nodes."""
    t0 = events[0].get("mono", 0.0) if events else 0.0
    last_seen = {e.get("node"): e.get("mono", t0) - t0 for e in events}  # time-ordered: the last wins
    measured = [f for f in faults if f.event.get("kind") == "fault"]  # heals have no latency
    for fault, (detection, recovery) in zip(measured, fault_latencies(events), strict=True):
        fault.detection, fault.recovery = detection, recovery
        cost = training.cost(fault.event, detection)
        fault.resume, fault.lost = cost.resume_latency, cost.lost
    for i, fault in enumerate(faults):
        if fault.kind in _ENDING_FAULTS:
            fault.end = fault.at
            continue
        duration = fault.event.get("duration")
        if isinstance(duration, (int, float)):
            fault.end = min(end, fault.at + duration)
        elif fault.kind in LASTING_FAULTS:
            fault.end = _lasting_end(fault, faults[i + 1:], lanes, end)
    for fault in faults:
        target = next((ln for ln in lanes if _same_node(ln.key, fault.target)), None)
        if target is None:
            continue
        if fault.kind in KILL_FAULTS and target.dead_at is None:
            target.dead_at, target.dead_by = fault.at, fault.kind
        elif fault.kind in LEAVE_FAULTS and target.dead_at is None:
            target.dead_at, target.dead_by = max(fault.at, last_seen.get(target.key, fault.at)), fault.kind
        if fault.end is not None and fault.kind not in _ENDING_FAULTS:
            target.faults.append(Span(fault.at, fault.end, fault.kind, fault_text(fault)))
    for ln in lanes:
        if ln.dead_at is not None:
            _clip(ln, ln.dead_at)


def _lasting_end(fault: Fault, later: list[Fault], lanes: list[Lane], end: float) -> float:
    for other in later:  # a heal of this node (or of every node), or an explicit end of this fault
        if other.kind == "heal" and (other.target is None or _same_node(other.target, fault.target)):
            return other.at
        if other.kind == "fault_end" and event_kind(other.event.get("of", fault.kind)) == fault.kind \
                and _same_node(other.target, fault.target):
            return other.at
    if fault.kind == "hang_worker":  # a hung worker ends when its agent reaps it
        for lane in lanes:
            if _same_node(lane.key, fault.target):
                spans = lane.workers.get(fault.event.get("local_rank", 0), [])
                ends = [span.end for span in spans if span.end > fault.at and span.start <= fault.at]
                return min(ends, default=end)
    return end


def _clip(lane: Lane, at: float) -> None:
    """A killed node shows nothing after its death but the death itself."""
    lane.states = [s for s in lane.states if s.start < at]
    for span in lane.states:
        span.end = min(span.end, at)
    for spans in lane.workers.values():
        for span in spans:
            if span.cls == "running" and span.end > at:  # ran normally until its node died
                span.end = at
                span.text = span.text.replace("still running", f"killed with its node at {at:.2f}s")


def fault_text(fault: Fault) -> str:
    """One line: what, when, until when, how fast it was noticed and recovered from."""
    detail = {k: v for k, v in fault.event.items()
              if k not in ("ts", "mono", "node", "pid", "run_id", "kind", "fault")}
    parts = [f"{fault.kind} at {fault.at:.3f}s"]
    if fault.end is not None and fault.end > fault.at:
        parts.append(f"until {fault.end:.3f}s")
    if fault.detection is not None:
        parts.append(f"detected after {fault.detection * 1000:.0f} ms")
    if fault.recovery is not None:
        parts.append(f"recovered after {fault.recovery * 1000:.0f} ms")
    if fault.resume is not None:
        parts.append(f"training resumed after {fault.resume * 1000:.0f} ms")
    if fault.lost:
        parts.append("lost " + " + ".join(f"{k} {v * 1000:.0f} ms" for k, v in fault.lost.items()))
    parts.extend(f"{k}={v}" for k, v in detail.items())
    if fault.data_lost:
        parts.append("data lost: " + "; ".join(fault.data_lost))
    return ", ".join(parts)


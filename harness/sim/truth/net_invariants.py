"""Invariants of jobs whose network fails: no split brain, fenced nodes stop, faults healed.

Pure functions over a job's events (``Timeline.events()``), so they are tested on event
lists as well as on real partitioned jobs:

* **no split brain** -- once a newer rendezvous round has made its first training step, no
  worker of an older round makes one. A step event carries the worker's pid; the
  ``worker_start`` event of that pid (on that node) says which round the worker belongs to.
* **a node cut off from the store stops its workers** -- the workers a node had when it
  lost the store (a ``partition`` of ``peers`` "store" or "all", or its host unreachable)
  have exited within the keep-alive bound plus the stop grace, unless the cut ended first
  (a node whose host's connection was lost is not judged: ``unobserved``).
* **every network fault was healed or reported** -- ``Cluster.close`` warns about faults
  still in place (``unhealed_message``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

__all__ = ["cut_off_from_store", "split_brain", "unfenced_workers", "unhealed_message", "unobserved",
           "STORE_LOSING_PEERS"]

#: partitions that cut a node off from the rendezvous store
STORE_LOSING_PEERS = ("store", "all")


def _worker_rounds(events: Iterable[dict[str, Any]]) -> dict[tuple[Any, Any], int]:
    """(node, worker pid) -> the rendezvous round the worker was started for."""
    return {(e.get("node"), e["worker_pid"]): int(e["round"]) for e in events
            if e.get("kind") == "worker_start" and e.get("round") is not None}


def split_brain(events: list[dict[str, Any]]) -> list[str]:
    """Steps made by workers of a round older than one that is already training."""
    rounds = _worker_rounds(events)
    first_step: dict[int, float] = {}
    stepped: list[tuple[float, int, dict[str, Any]]] = []
    for event in events:
        if event.get("kind") != "step":
            continue
        round_ = rounds.get((event.get("node"), event.get("pid")))
        if round_ is None:
            continue
        stepped.append((event["mono"], round_, event))
        first_step.setdefault(round_, event["mono"])
    problems = []
    for mono, round_, event in stepped:
        newer = [r for r, t in first_step.items() if r > round_ and t < mono]
        if newer:
            r = min(newer)
            problems.append(
                f"split brain: rank {event.get('rank')} on node {event.get('node')} (round {round_}) made "
                f"step {event.get('step')} {mono - first_step[r]:.3f}s after round {r} had begun training")
    return problems[:5] + ([f"... and {len(problems) - 5} more"] if len(problems) > 5 else [])


def _store_cuts(events: list[dict[str, Any]]) -> list[tuple[Any, set[Any], float, float, bool]]:
    """Each cut from the store (a ``partition`` of ``peers`` "store" or "all", or a
    ``host_unreachable``: the store rides the lost connection): (node index, the names its
    events use -- index and label alike --, cut, its end or +inf, whether this machine lost
    sight of the node with it). A partition ends at its heal (a heal that ended no
    partition, only resource or storage faults, does not end it); an unreachable host when
    its ``host_reachable`` event says the connection was kept (else the node went with the
    connection: +inf, and the node is lost to sight)."""
    cuts = []
    for i, event in enumerate(events):
        if event.get("kind") != "fault":
            continue
        node, cut = event.get("target_node"), event["mono"]
        if event.get("fault") == "partition" and event.get("peers") in STORE_LOSING_PEERS:
            healed = next((e["mono"] for e in events[i + 1:] if e.get("kind") == "heal"
                           and e.get("target_node") in (None, node) and not _ends_no_partition(e)), float("inf"))
            lost = False
        elif event.get("fault") == "host_unreachable":
            healed = next((e["mono"] for e in events[i + 1:] if e.get("kind") == "host_reachable"
                           and e.get("target_node") == node and e.get("connection") == "kept"), float("inf"))
            lost = healed == float("inf")
        else:
            continue
        cuts.append((node, _names(events, node), cut, healed, lost))
    return cuts


def _names(events: list[dict[str, Any]], node: Any) -> set[Any]:
    """The names node ``node``'s events use: its index (int and str) and its labels."""
    return {node, str(node)} | {e.get("label") for e in events if e.get("kind") == "node_start"
                                and e.get("target_node") == node}


def unobserved(events: list[dict[str, Any]]) -> set[Any]:
    """The nodes (every name) this machine lost sight of for good: a ``host_unreachable``
    whose connection was not kept (``host_reachable`` says "reconnected" or "lost", or never
    came). What their workers did after the cut never reached the timeline, so no rule can
    be checked of it; their host's lease ended what they ran there."""
    return _lost(_store_cuts(events))


def _lost(cuts: list[tuple[Any, set[Any], float, float, bool]]) -> set[Any]:
    return {name for _node, names, _cut, _healed, lost in cuts if lost for name in names}


def unfenced_workers(events: list[dict[str, Any]], bound: float) -> list[str]:
    """Workers of a node cut off from the store still running ``bound`` seconds after the
    cut (the keep-alive bound plus the stop grace): the node did not fence itself."""
    starts: dict[Any, dict[int, float]] = defaultdict(dict)  # node -> worker pid -> started
    exits: dict[tuple[Any, int], float] = {}
    for event in events:
        if event.get("kind") == "worker_start":
            starts[event.get("node")][event["worker_pid"]] = event["mono"]
        elif event.get("kind") == "worker_exit":
            exits[(event.get("node"), event["worker_pid"])] = event["mono"]
    end = events[-1]["mono"] if events else 0.0
    problems = []
    cuts = _store_cuts(events)
    gone = _lost(cuts)
    for node, names, cut, healed, _lost_here in cuts:
        if node in gone:
            continue  # its workers' ends never reached us
        deadline = cut + bound
        if healed < deadline or end < deadline:
            continue  # healed (or the job ended) before the node had to fence
        for name in names:
            for pid, started in starts.get(name, {}).items():
                stopped = exits.get((name, pid))
                if started < cut and (stopped is None or stopped > deadline):
                    when = "never" if stopped is None else f"{stopped - cut:.2f}s after the cut"
                    problems.append(f"node {node} lost the store but its worker pid {pid} exited {when} "
                                    f"(bound {bound:.2f}s): it did not fence itself")
    return problems


#: how long after its heal a cut-off node's fence may still come: its lease ran out during
#: the cut, and its agent acts on the fence at its next monitor tick (a loaded host: late)
FENCE_AFTER_HEAL_S = 5.0


def cut_off_from_store(events: list[dict[str, Any]]) -> dict[Any, list[tuple[float, float]]]:
    """Node name (index and label alike) -> the intervals its workers were the fencing's to
    stop, not its agent's: from the partition to its heal (or +inf), or on to the node's
    ``fenced`` event when its lease ran out during the cut and it fenced after all (the
    workers are stopped by then; ``unfenced_workers`` bounds how long that may take). The
    survivors may well start a new round before the cut-off node's keep-alive bound has run
    out, or just after a heal that came as they did (``flapping_link`` heals as soon as the
    world shrinks: under load its node fenced 0.1-0.3 s later, workers stopping meanwhile)."""
    intervals: dict[Any, list[tuple[float, float]]] = defaultdict(list)
    for _node, names, cut, healed, _lost_here in _store_cuts(events):
        fenced = next((e["mono"] for e in events if e.get("kind") == "fenced" and e.get("node") in names
                       and cut <= e["mono"] <= healed + FENCE_AFTER_HEAL_S), None)
        end = healed if fenced is None else max(healed, fenced)
        for name in names:
            intervals[name].append((cut, end))
    return dict(intervals)


def _ends_no_partition(heal: dict[str, Any]) -> bool:
    """A ``heal`` that ended other faults only (resource or storage ones: its event names
    what it ended): it ended no partition."""
    healed = heal.get("healed") or []
    return bool(healed) and not any("partition" in kind for kind in healed)


def unhealed_message(open_faults: dict[int, list[str]]) -> str | None:
    """What ``Cluster.close`` warns when a test left network faults in place."""
    if not open_faults:
        return None
    parts = [f"node {node}: {', '.join(sorted(set(kinds)))}" for node, kinds in sorted(open_faults.items())]
    return ("network faults still in place when the job ended (heal them in the test, or "
            "expect their effect): " + "; ".join(parts))

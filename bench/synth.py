"""A synthetic job timeline of any size, for the report's bench and tests.

Real runs on a 2-core machine cannot reach 40 nodes for 10 minutes with 100 faults; this
writes the event stream such a job would (same kinds and fields as the agents and the
harness emit), seeded, with either node identity: generated names (``"ada-3"``, as today)
or integer indexes with ``node_start`` label events (``int_nodes=True``).
"""

from __future__ import annotations

import random
from typing import Any

__all__ = ["synthetic_events"]

_KINDS = ["worker_kill"] * 6 + ["partition", "packet_loss", "agent_kill", "node_freeze", "worker_hang"]


def synthetic_events(nodes: int = 40, nproc: int = 2, duration: float = 600.0, faults: int = 100,
                     step_period: float = 1.0, seed: int = 0, int_nodes: bool = False,
                     fail: bool = False) -> list[dict[str, Any]]:
    """Time-ordered events of a job; ``fail``: its last worker failure exhausts the restarts."""
    rng = random.Random(seed)
    keys: list[Any] = list(range(nodes)) if int_nodes else [f"node{rng.randrange(100)}-{i}" for i in range(nodes)]
    out: list[dict[str, Any]] = []
    pids = iter(range(10_000, 10_000_000))

    def emit(t: float, node: Any, kind: str, **fields: Any) -> None:
        out.append({"ts": 1.7e9 + t, "mono": 1000.0 + t, "node": node, "pid": 1, "run_id": "synthetic",
                    "kind": kind, **fields})

    live = list(keys)
    workers: dict[Any, list[tuple[int, int]]] = {}  # node -> [(pid, rank)]
    state = {"round": 0, "step": 0, "restart": 0}

    def start_round(t: float) -> None:
        world = len(live) * nproc
        for g, node in enumerate(live):
            emit(t, node, "rendezvous", round=state["round"], group_rank=g, group_world_size=len(live),
                 world_size=world, ranks=list(range(g * nproc, (g + 1) * nproc)), restart_count=state["restart"])
            workers[node] = []
            for lr in range(nproc):
                pid = next(pids)
                workers[node].append((pid, g * nproc + lr))
                emit(t + 0.02, node, "worker_start", local_rank=lr, rank=g * nproc + lr, world_size=world,
                     worker_pid=pid, restart_count=state["restart"], round=state["round"])
            emit(t + 0.03, node, "state", state="HEALTHY", restart_count=state["restart"], round=state["round"])

    def stop_all(t: float, code: int = -15, skip: Any = None) -> None:
        for node in live:
            if node == skip:
                continue
            for lr, (pid, rank) in enumerate(workers.get(node, [])):
                emit(t, node, "worker_exit", local_rank=lr, rank=rank, worker_pid=pid, exitcode=code,
                     restart_count=state["restart"], round=state["round"])
            emit(t + 0.001, node, "state", state="STOPPED" if code else "SUCCEEDED",
                 restart_count=state["restart"], round=state["round"])

    for i, node in enumerate(keys):
        if int_nodes:
            emit(0.0, "harness", "node_start", target_node=node, label=f"host-{i:02d}")
        emit(0.001, node, "state", state="INIT", restart_count=0, round=-1)
    start_round(0.2)
    times = sorted(rng.uniform(5, duration - 10) for _ in range(faults))
    t = 1.0
    for tf in times + [duration]:
        while t < tf:  # training steps up to the fault
            for node in live:
                for lr, (pid, rank) in enumerate(workers[node]):
                    out.append({"ts": 1.7e9 + t, "mono": 1000.0 + t + rank * 1e-5, "node": node, "pid": pid,
                                "run_id": "synthetic", "kind": "step", "step": state["step"], "rank": rank,
                                "local_rank": lr, "restart_count": state["restart"]})
            state["step"] += 1
            t += step_period
        if tf >= duration:
            break
        kind = rng.choice(_KINDS) if len(live) > 2 else "worker_kill"
        victim = rng.choice(live)
        target = {"target_node": victim}
        if kind == "worker_kill":
            emit(tf, "harness", "fault", fault=kind, local_rank=1 % nproc, sig=9, **target)
            pid, rank = workers[victim][1 % nproc]
            emit(tf + 0.08, victim, "worker_exit", local_rank=1 % nproc, rank=rank, worker_pid=pid, exitcode=-9,
                 restart_count=state["restart"], round=state["round"])
            emit(tf + 0.081, victim, "state", state="FAILED", restart_count=state["restart"], round=state["round"])
            workers[victim] = [w for w in workers[victim] if w[0] != pid]
            state["restart"] += 1
        elif kind in ("partition", "packet_loss"):
            emit(tf, "harness", "fault", fault=kind, peers="store", **target)
            emit(tf + rng.uniform(2, 8), "harness", "fault", fault="heal", **target)
        elif kind == "agent_kill":
            emit(tf, "harness", "fault", fault=kind, **target)
            live.remove(victim)
        elif kind == "node_freeze":
            emit(tf, "harness", "fault", fault=kind, **target)
            live.remove(victim)
        else:
            emit(tf, "harness", "fault", fault=kind, local_rank=0, **target)
            pid, rank = workers[victim][0]
            emit(tf + 1.5, victim, "timer_expired", rank=rank, restart_count=state["restart"])
            emit(tf + 1.6, victim, "worker_exit", local_rank=0, rank=rank, worker_pid=pid, exitcode=-9,
                 restart_count=state["restart"], round=state["round"])
            emit(tf + 1.601, victim, "state", state="FAILED", restart_count=state["restart"], round=state["round"])
            workers[victim] = [w for w in workers[victim] if w[0] != pid]
        for node in live:
            if node != victim:
                emit(tf + 0.1, node, "membership_change", restart_count=state["restart"], cause="membership")
        stop_all(tf + 0.2)
        state["round"] += 1
        state["step"] = max(0, state["step"] - 2)  # resumed from the last checkpoint
        start_round(tf + 0.4)
        t = tf + 1.0
    if fail:
        victim = live[0]
        pid, rank = workers[victim][0]
        emit(duration, victim, "worker_exit", local_rank=0, rank=rank, worker_pid=pid, exitcode=1,
             restart_count=state["restart"], round=state["round"])
        stop_all(duration + 0.05, skip=victim)
        for node in live:
            emit(duration + 0.1, node, "state", state="FAILED", restart_count=state["restart"], round=state["round"])
            failures = {str(rank): {"local_rank": 0, "pid": pid, "exitcode": 1, "error_file": "<N/A>",
                                    "message": "ValueError: synthetic", "timestamp_ns": 0}} if node == victim else {}
            emit(duration + 0.2, node, "result", result={"state": "FAILED", "return_values": {}, "failures": failures},
                 restart_count=state["restart"])
    else:
        stop_all(duration, code=0)
        for node in live:
            emit(duration + 0.1, node, "result", result={"state": "SUCCEEDED", "return_values": {}, "failures": {}},
                 restart_count=state["restart"])
    out.sort(key=lambda e: e["mono"])
    return out

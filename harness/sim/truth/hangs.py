"""Naming a hung job within seconds of the hang, not at the end of its timeout.

Why: a job that hangs used to cost its scenario's whole timeout (90-150 s) and said only
"nodes [0] still running"; the engineer at 3 a.m. could not tell a training script stuck
in a collective from a harness that lost track of a process. The rule here is the
runtime's own: once a node's workers have all *succeeded*, the job's training is over, and
every other node must end within the exit barrier (``exit_barrier_timeout``: how long a
finished agent waits for slower ones, torch's rule) — a node still running past that, by
``GRACE_S`` more, is hung. The same holds inside a node (a single-node job has no exit
barrier, yet its training is over as soon as one worker of the round exited 0): a worker
still alive that long after a worker of its own round exited 0 is hung. ``Job.wait`` then
raises ``JobHung`` with what each of the hung node's workers last reported and their
Python stacks (``harness.sim.truth.stacks``), and says whether the workers finished training
and did not exit (torch's teardown, or the script's end) or stopped short of the steps
their peers completed (a collective that cannot complete, the script's own wait).

A job none of whose nodes succeeds can hang too: a worker hung where nothing reaps it, and
its peers blocked in a collective with it (gloo waits 30 minutes). That is a *stall*
(``find_stall``): no event at all -- no step, no state change, no worker start or exit, no
fault, no heal -- from any node, worker or the harness for ``stall_bound`` seconds, ``STALL_STEPS``
times the job's own step time and never less than ``STALL_FLOOR_S`` (``STALL_WATCHDOG_FLOOR_S``
where the agents run the file-timer watchdog), while no scheduled fault is coming due (a heal
the test scheduled is a wait it asked for). A job that has reported no step is never called
stalled: only its timeout ends it. A stuck worker is the watchdog timer's to reap; the floor
is there for the timers' own bounds (a timer of a minute or more needs the job's own timeout),
so a job whose timer will fire is not called stalled first. ``Job.wait`` then raises ``JobHung``
naming the fault that left the job stuck and what the job lacks to survive it
(``stall_cause``).
"""

from __future__ import annotations

import os
import re
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.sim.errors import JobHung
from harness.sim.truth.timeline import Timeline
from harness.states import WorkerState
from harness.timer_env import ENABLE_FILE_TIMER_ENV

__all__ = ["GRACE_S", "STALL_FLOOR_S", "STALL_STEPS", "STALL_WATCHDOG_FLOOR_S", "Hang", "JobHung", "Stall",
           "describe_workers", "find_hang", "find_stall", "runs_watchdog", "stall_bound", "stall_cause", "step_time",
           "teardown_hint", "training_over", "TOP_LEVEL_HINT"]

#: how long past the exit barrier a node may still take to end (its own teardown: workers'
#: exit, the agent's shutdown) before it is called hung
GRACE_S = 5.0


@dataclass(frozen=True)
class Hang:
    node: int  # the hung node
    finished: str  # what finished: "node 1's workers all", "rank 0 (pid 123)"
    finished_at: float  # when (monotonic)
    finished_round: int | None
    waited: float  # seconds the hung node has run on since


#: a job is stalled after this many of its own step times without any event ...
STALL_STEPS = 50
#: ... and never sooner than this (s): a restart, a re-formed round under load
STALL_FLOOR_S = 20.0
#: ... or, where the agents run the watchdog, than this (s): a timer's bound (the bundled
#: trainer's longest is 15 s) must run out before the job is called stalled
STALL_WATCHDOG_FLOOR_S = 60.0


@dataclass(frozen=True)
class Stall:
    last_event: float  # monotonic time of the job's last event
    waited: float  # seconds without one since
    step_time: float  # the job's own step time (s)
    bound: float  # the silence it takes to be called stalled (s)


def step_time(timeline: Timeline) -> float | None:
    """The job's own step time: the median time between two steps one worker reported in a
    row; where no worker reported two, the time from a worker's start to its first step
    (None: no step reported)."""
    last: dict[object, float] = {}
    gaps: list[float] = []
    steps = timeline.events("step")
    for event in steps:
        pid = event.get("pid")
        if pid in last and event["mono"] > last[pid]:
            gaps.append(event["mono"] - last[pid])
        last[pid] = event["mono"]
    if gaps:
        return statistics.median(gaps)
    started = {e.get("worker_pid"): e["mono"] for e in timeline.events("worker_start")}
    firsts = [e["mono"] - started[e.get("pid")] for e in steps if e.get("pid") in started]
    return max(0.0, statistics.median(firsts)) if firsts else (0.0 if steps else None)


def stall_bound(seconds_per_step: float, watchdog: bool = False) -> float:
    """The silence (s) that makes a job of that step time stalled."""
    return max(STALL_STEPS * seconds_per_step, STALL_WATCHDOG_FLOOR_S if watchdog else STALL_FLOOR_S)


def find_stall(timeline: Timeline, now: float, waiting_until: float | None = None,
               watchdog: bool = False) -> Stall | None:
    """The job's stall (``Stall``) if it has had no event for its ``stall_bound`` and none is
    owed before ``waiting_until`` (a scheduled fault coming due then); None otherwise.
    ``watchdog``: the job's agents run the file-timer watchdog (its timers may be long)."""
    newest = timeline.latest()
    if newest is None:
        return None
    last = float(newest["mono"])
    quiet = now - max(last, waiting_until or 0.0)
    if quiet <= STALL_FLOOR_S:  # the cheap test first: most calls end here
        return None
    per_step = step_time(timeline)
    if per_step is None:
        return None
    bound = stall_bound(per_step, watchdog)
    if quiet <= bound:
        return None
    return Stall(last, now - last, per_step, bound)


#: what a job needs to survive a stuck worker, for the one line that names its weakness
GUARD = ("run each step under a timer (torch.distributed.elastic.timer.expires, or harness.timer.expires) "
         "with the agents' file-timer watchdog on (TORCHELASTIC_ENABLE_FILE_TIMER=1)")


def runs_watchdog(env: Mapping[str, str]) -> bool:
    """Whether agents whose environment is this process's with ``env`` over it run the
    file-timer watchdog (``TORCHELASTIC_ENABLE_FILE_TIMER=1``, read as the agent reads it)."""
    return {**os.environ, **env}.get(ENABLE_FILE_TIMER_ENV, "0") == "1"


def stall_cause(timeline: Timeline, watchdog: bool, idle: Sequence[int] = ()) -> str:
    """Why the stalled job could not go on, in one clause: a node whose agent runs no worker
    (``idle``: its peers wait for it), else the last fault and what the job lacks to survive
    it, or (no fault) what it lacks in general."""
    faults = timeline.events("fault")
    fault = faults[-1] if faults else None
    where = "" if fault is None else f"node {fault.get('target_node')}" + (
        f", local rank {fault['local_rank']}" if fault.get("local_rank") is not None else "")
    if idle:
        after = f", after {fault.get('fault')} ({where})" if fault is not None else ""
        return (f"the agent of node {', '.join(map(str, idle))} runs no worker and has not moved on (its log "
                f"ends below), and its peers wait for it{after}")
    if fault is None:
        return f"no fault was injected: a worker is stuck on its own and nothing reaps it: {GUARD}"
    kind = fault.get("fault")
    if kind == "hang_worker":
        if watchdog:
            return (f"the worker hang_worker stopped ({where}) held no timer when it was stopped, so the "
                    "agent's watchdog had nothing to expire: every moment of a step (and what runs between "
                    "steps) must be under a timer")
        return f"the worker hang_worker stopped ({where}) is reaped by nothing: {GUARD}"
    if kind == "partition":
        return (f"partition ({where}) left workers blocked in a collective that only gloo's timeout (30 "
                f"minutes) would end: {GUARD}")
    return f"the job stopped after {kind} ({where}) and nothing in it reaps a stuck worker: {GUARD}"


def training_over(timeline: Timeline) -> float | None:
    """When the job's training was first over (monotonic; None: not yet): a node's workers
    all succeeded, or a worker exited 0 (a single node's round is over as soon as one of its
    workers is: the rest finish the same steps). From then on the job is ending, and what
    holds a node back from its end (a cut link, a quota, a slow disk) only keeps it from
    ending: chaos's heals come due then (``FaultScheduler.adopt_chaos``)."""
    firsts = [event["mono"] for event in timeline.events("state")
              if event.get("state") == WorkerState.SUCCEEDED.value][:1]
    firsts += [event["mono"] for event in timeline.events("worker_exit") if event.get("exitcode") == 0][:1]
    return min(firsts, default=None)


def find_hang(timeline: Timeline, running: Iterable[int], now: float, bound: float,
              alive: Callable[[int], Iterable[int]] | None = None) -> Hang | None:
    """The first node in ``running`` still going ``bound`` seconds after another node's
    workers all succeeded, or (``alive``: a node's live worker pids) with a worker still
    alive ``bound`` seconds after a worker of its own round exited 0; None when there is
    none (yet).

    The job's wait asks at each node's exit, so the cost is kept linear in the nodes: a
    node is judged by the earliest success of another node (the earliest two are enough),
    and ``alive`` (which reads each worker's ``/proc``) is asked only once some round has
    a worker that exited 0 longer than ``bound`` ago."""
    running = list(running)
    succeeded: dict[Any, dict[str, Any]] = {}  # node -> its first SUCCEEDED
    for event in timeline.events("state"):
        if event.get("state") == WorkerState.SUCCEEDED.value:
            succeeded.setdefault(event["node"], event)
    earliest = sorted(succeeded.values(), key=lambda e: e["mono"])[:2]  # stable: ties keep event order
    if earliest and now - earliest[0]["mono"] > bound:
        for node in running:
            first = next((e for e in earliest if e["node"] != node), None)
            if first is not None and now - first["mono"] > bound:
                return Hang(node, f"node {first['node']}'s workers all", first["mono"],
                            first.get("round"), now - first["mono"])
    if alive is None:
        return None
    rounds = {e.get("worker_pid"): e.get("round") for e in timeline.events("worker_start")}
    done: dict[Any, dict[str, Any]] = {}  # round -> its first worker that exited 0
    for event in timeline.events("worker_exit"):
        if event.get("exitcode") == 0:
            done.setdefault(event.get("round", rounds.get(event.get("worker_pid"))), event)
    if not any(now - ended["mono"] > bound for ended in done.values()):
        return None
    for node in running:
        for pid in alive(node):
            ended = done.get(rounds.get(pid))
            if ended is not None and ended.get("worker_pid") != pid and now - ended["mono"] > bound:
                return Hang(node, f"rank {ended.get('rank')} (pid {ended.get('worker_pid')})",
                            ended["mono"], ended.get("round"), now - ended["mono"])
    return None


def describe_workers(timeline: Timeline, node: int, alive: dict[int, int],
                     status: dict[int, str]) -> tuple[list[str], bool]:
    """One line per live worker of ``node`` (rank, pid, state, its last step), and whether
    every one of them reached the last step any rank reported (finished training)."""
    starts = {e.get("worker_pid"): e for e in timeline.events("worker_start", node)}
    last_step: dict[int, tuple[int, float]] = {}
    top = -1
    for event in timeline.events("step"):
        step = int(event.get("step", -1))
        top = max(top, step)
        pid = event.get("pid")  # the worker that wrote it
        if isinstance(pid, int):
            last_step[pid] = (step, float(event["mono"]))
    lines, finished = [], bool(alive)
    for local_rank, pid in sorted(alive.items()):
        start = starts.get(pid, {})
        last = last_step.get(pid)
        did = f"last step {last[0]}" if last is not None else "no step reported"
        if last is None or last[0] < top:
            finished = False
        lines.append(f"rank {start.get('rank', '?')} (local {local_rank}, pid {pid}, "
                     f"{status.get(pid, 'gone')}, round {start.get('round', '?')}): {did}")
    return lines, finished and top >= 0


#: a worker whose main thread is in ``<module>`` with no frame above it, at a top-level
#: call of a function the script defines (``main()``), after its training finished: that
#: function returned, and what blocks is the C++ teardown of the objects it held (seen in the
#: main job under load: DDP's reducer and gloo's process group after
#: ``destroy_process_group()``, torch's, not the training loop)
TEARDOWN_HINT = ("the main thread is at the script's top level, on the line that called {call}(): "
                 "{call}() returned and the worker is blocked in the destructors of what it held "
                 "(torch's C++ teardown of DDP / the gloo process group after "
                 "destroy_process_group(): ~ProcessGroupGloo joins gloo's run loop with the GIL "
                 "held while that thread waits for the GIL, pytorch#56297), not in the training "
                 "loop; scenarios/scripts/train.py shows how to end without it")
#: the same place on any other line: the script's own top-level code holds it there
TOP_LEVEL_HINT = "the main thread is in the script's own top-level code, at {path} line {line}: {source}"
_MODULE_FRAME = re.compile(r'File "(?P<path>[^"]+)", line (?P<line>\d+) in <module>$')


def teardown_hint(stacks: str) -> str | None:
    """Where a finished worker's main thread (faulthandler's "Current thread") is held, when
    it is innermost in a ``<module>`` frame of the script: ``TEARDOWN_HINT`` where that line
    calls a function the script defines (its main returned), else ``TOP_LEVEL_HINT`` with
    the line itself (a loop or a wait of the script's own); None where no main thread is
    there. The script's source is read where this machine has it; without it, only the
    line's place is said (no guess)."""
    lines = stacks.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("Current thread") and i + 1 < len(lines):
            found = _MODULE_FRAME.search(lines[i + 1].strip())
            if found is None or found.group("path").startswith("<"):
                continue
            path, number = found.group("path"), int(found.group("line"))
            call, source = _top_level_call(path, number)
            if call is not None:
                return TEARDOWN_HINT.format(call=call)
            return TOP_LEVEL_HINT.format(path=path, line=number, source=source or "(its source is not here)")
    return None


def _top_level_call(path: str, number: int) -> tuple[str | None, str | None]:
    """(the function the script defines that line ``number`` of ``path`` calls at top level,
    or None; the line's source, or None where it cannot be read)."""
    import ast

    try:
        text = Path(path).read_text()
        tree = ast.parse(text)
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return None, None
    source_lines = text.splitlines()
    source = source_lines[number - 1].strip() if 0 < number <= len(source_lines) else None
    defined = {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node, "lineno", None) == number \
                and isinstance(node.func, ast.Name) and node.func.id in defined:
            return node.func.id, source
    return None, source

"""Shrinking a failing chaos schedule: the search (with a fake re-run), the replay format,
and end to end through pytest (pytester, in subprocesses)."""

from __future__ import annotations

import json
import re
import shlex

import pytest

from harness.faults import AtStep, Heal, NodeAdd, NodeKill, Partition, ScheduledFault, WorkerHang, WorkerKill
from harness.sim.faults.chaos import AfterHealthy
from pytest_elastic._replay import schedules_from_json, schedules_to_json
from pytest_elastic._settings import SCHEDULE_FAULT_KINDS, SettingError, parse_schedule
from pytest_elastic._shrink import Outcome, shrink, signature
from tests.conftest import SCRIPTS

STEPPER = str(SCRIPTS / "stepper.py")
BUG = ("call", "AssertionError", "test_x.py", 7)


def crash(local_rank: int, after: float, sig: int = 9) -> ScheduledFault:
    return ScheduledFault(WorkerKill(local_rank=local_rank, sig=sig), AfterHealthy(seconds=after))


class FakeTest:
    """A test that fails (with ``BUG``) exactly when a fault hits local rank 1 at or after
    ``not_before`` s; faults later than ``horizon`` s never fire (the job ended first)."""

    def __init__(self, not_before: float = 0.0, horizon: float = 10.0, other_bug_if_empty: bool = False):
        self.not_before, self.horizon, self.other = not_before, horizon, other_bug_if_empty
        self.runs: list[tuple] = []

    def __call__(self, schedules: tuple, seconds_left: float | None = None) -> Outcome:
        self.runs.append(schedules)
        fired = tuple(tuple(e for e in job if e.trigger.seconds <= self.horizon) for job in schedules)
        hit = any(e.fault.local_rank == 1 and e.trigger.seconds >= self.not_before
                  for job in fired for e in job)
        if not any(fired) and self.other:
            return Outcome(("call", "TimeoutError", "cluster.py", 1), schedules, fired)
        return Outcome(BUG if hit else None, schedules, fired)


def test_drops_what_is_not_needed_and_moves_the_rest_later():
    a, b, c = crash(0, 0.1), crash(1, 0.3), crash(0, 0.5)
    fake = FakeTest()
    result = shrink(Outcome(BUG, ((a, b, c),), ((a, b, c),)), fake, budget=8)
    # empty; drop c (kept); drop b (passes); drop a (kept); b twice as late (kept)
    assert [sum(map(len, r)) for r in fake.runs] == [0, 2, 1, 1, 1]
    assert result.runs == 5 and not result.exhausted
    (only,), = result.minimal
    assert only.fault == b.fault and only.trigger.seconds == 0.6
    assert [s.result.split(":")[0] for s in result.steps] == [
        "passes", "still fails", "passes", "still fails", "still fails"]


def test_same_outcomes_same_candidates():
    schedule = ((crash(0, 0.1), crash(1, 0.2)), (crash(1, 0.1), crash(0, 0.4)))
    first = Outcome(BUG, schedule, schedule)
    one, two = FakeTest(), FakeTest()
    shrink(first, one, 8)
    shrink(first, two, 8)
    assert one.runs == two.runs


def test_budget_bounds_the_reruns():
    entries = tuple(crash(r % 2, 0.1 * (i + 1)) for i, r in enumerate(range(6)))
    fake = FakeTest()
    result = shrink(Outcome(BUG, (entries,), (entries,)), fake, budget=3)
    assert len(fake.runs) == result.runs == 3 and result.exhausted
    assert shrink(Outcome(BUG, (entries,), (entries,)), FakeTest(), budget=0).minimal == (entries,)


def test_unfired_faults_are_dropped_for_free():
    a, late = crash(1, 0.1), crash(0, 50.0)
    fake = FakeTest()
    result = shrink(Outcome(BUG, ((a, late),), ((a,),)), fake, budget=8)
    assert result.steps[0].result == "free (no re-run)"
    assert result.original_count == 2 and result.minimal_count == 1
    assert all(late not in job for run in fake.runs for job in run)


def test_a_different_failure_is_not_kept():
    a, b = crash(0, 0.1), crash(1, 0.3)
    fake = FakeTest(other_bug_if_empty=True)
    result = shrink(Outcome(BUG, ((a, b),), ((a, b),)), fake, budget=8)
    assert "fails differently (TimeoutError at cluster.py:1 (call)): not kept" in [s.result for s in result.steps]
    assert result.minimal_count == 1


def test_moving_later_is_kept_only_while_it_fails():
    b = crash(1, 0.3)
    fake = FakeTest(horizon=0.5)  # 0.6 s is after the end of the job: the fault never fires
    result = shrink(Outcome(BUG, ((b,),), ((b,),)), fake, budget=8)
    assert result.minimal == ((b,),)
    assert result.steps[-1].result == "passes: not kept"


def test_the_re_runs_stop_when_their_time_is_spent():
    """Each re-run takes 10 s of a 25 s budget (a fake clock): the third starts with 5 s
    left and is given no more, and no fourth starts, whatever the re-run budget."""
    now = [0.0]
    given: list[float | None] = []

    class SlowFake(FakeTest):
        def __call__(self, schedules: tuple, seconds_left: float | None = None) -> Outcome:
            given.append(seconds_left)
            now[0] += 10.0
            return super().__call__(schedules, seconds_left)

    entries = tuple(crash(i % 2, 0.1 * i) for i in range(1, 7))
    fake = SlowFake(not_before=0.0)
    result = shrink(Outcome(BUG, (entries,), (entries,)), fake, budget=8, clock=lambda: now[0], time_budget=25.0)
    assert given == [25.0, 15.0, 5.0]
    assert result.runs == 3 and result.out_of_time and result.exhausted


def partition_then_heal(node: int, after: float) -> tuple[ScheduledFault, ScheduledFault]:
    """As chaos draws a lasting fault: the heal is chained to its partition."""
    return (ScheduledFault(Partition(node=node, peers="store"), AfterHealthy(seconds=after)),
            ScheduledFault(Heal(node=node), AfterHealthy(seconds=2.0), after_previous=True))


class PartitionBug:
    """Fails (``BUG``) while node 1 is cut off, before the heal fires; records every
    candidate so the test can check that no partition ever ran without its heal."""

    def __init__(self) -> None:
        self.runs: list[tuple] = []

    def __call__(self, schedules: tuple, seconds_left: float | None = None) -> Outcome:
        self.runs.append(schedules)
        fired = tuple(tuple(e for e in job if not isinstance(e.fault, Heal)) for job in schedules)
        hit = any(isinstance(e.fault, Partition) and e.fault.node == 1 for job in fired for e in job)
        return Outcome(BUG if hit else None, schedules, fired)


def test_a_heal_goes_with_its_partition():
    cut0, heal0 = partition_then_heal(0, 0.2)
    cut1, heal1 = partition_then_heal(1, 0.4)
    schedule = ((cut0, heal0, cut1, heal1),)
    fake = PartitionBug()
    first = fake(schedule)
    fake.runs.clear()
    result = shrink(first, fake, budget=8)
    # the failure came before either heal fired: they stay (free step drops nothing)
    assert result.steps[0].action.startswith("drop every fault")
    ((cut, heal),) = result.minimal
    assert cut.fault == cut1.fault and cut.trigger.seconds == 0.8 and heal is heal1
    for run in fake.runs:  # every candidate: each partition with its heal right after it
        entries = [e for job in run for e in job]
        for i, entry in enumerate(entries):
            if isinstance(entry.fault, Partition):
                assert entries[i + 1].fault == Heal(node=entry.fault.node)
            else:
                assert isinstance(entries[i - 1].fault, Partition)
    assert "drop job 0: " in result.steps[1].action and "with 1 chained after it" in result.steps[1].action
    # moved later: the partition's own trigger; the heal's stays 2 s after it
    assert [s.action.split(":")[0] for s in result.steps].count("move later") == 1


def test_signature_is_phase_type_and_place():
    class Crash:
        message, path, lineno = "AssertionError: rank 1 was hit\nassert 1 == 0", "/t/test_a.py", 12

    class Report:
        when, longrepr = "call", type("Repr", (), {"reprcrash": Crash})()

    assert signature(Report) == ("call", "AssertionError", "/t/test_a.py", 12)
    Report.longrepr = "scenario x: 0 restart(s), expected 1"
    assert signature(Report) == ("call", "scenario x")


# -- the replay format ------------------------------------------------------------------


def test_schedule_json_round_trip():
    schedule = ((crash(1, 0.25, sig=15), ScheduledFault(NodeKill(node=1), AfterHealthy(seconds=0.5))),
                (ScheduledFault(WorkerKill(local_rank=0, exit_code=3), AtStep(step=4, rank=1)),
                 ScheduledFault(NodeAdd(), AfterHealthy(seconds=1.0)),
                 ScheduledFault(WorkerHang(node=1), AfterHealthy(seconds=0.0))), ())
    text = schedules_to_json(schedule)
    assert json.loads(text)[0][0] == {"kind": "kill_worker", "local_rank": 1, "sig": 15, "after_healthy": 0.25}
    assert schedules_from_json(text) == schedule
    assert shlex.split(f"--elastic-schedule='{text}'") == [f"--elastic-schedule={text}"]


@pytest.mark.parametrize("text, message", [
    ("[{", "not JSON"),
    ('{"kind": "kill_worker"}', "one list of faults per job"),
    ('[[{"kind": "meteor"}]]', "job 0 fault 0: kind='meteor' must be one of kill_worker, hang_worker,"),
    ('[[], [{"kind": "kill_node", "nodes": 2}]]',
     "job 1 fault 0: kind='kill_node' takes no key(s) ['nodes']; its keys: kind, node, lose_unsynced, torn,"),
    ('[[{"kind": "add_node", "node": 1}]]', "job 0 fault 0: kind='add_node' takes no key(s) ['node']"),
    ('[[{"kind": "kill_node", "node": "1"}]]', "job 0 fault 0: node='1' must be an int >= 0"),
    ('[[{"kind": "kill_node", "after_healthy": 1, "at_step": 2}]]',
     "trigger=['after_healthy', 'at_step'] must be one of"),
    ('[[{"kind": "kill_node", "rank": 1}]]', "job 0 fault 0: rank=1 needs at_step="),
    ('[[{"kind": "kill_node", "on_state": "GREEN"}]]', "on_state='GREEN' must be one of UNKNOWN, INIT,"),
])
def test_bad_schedules_say_what_is_wrong(text, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_schedule(text)
    assert issubclass(SettingError, ValueError)


def test_schedule_kinds_match_the_harness():
    """Every kind the harness has is a schedule kind: the public ones (a class in
    ``harness.faults``) and the rows that are not (``host_unreachable``: a scenario's or a
    schedule's kind, its class made from its row)."""
    from harness import faults
    from harness.sim import schema

    kinds = {cls.kind for cls in vars(faults).values()
             if isinstance(cls, type) and issubclass(cls, faults.Fault) and cls is not faults.Fault}
    assert kinds == {row.kind for row in schema.FAULT_KINDS.values() if row.public}
    assert set(SCHEDULE_FAULT_KINDS) == set(schema.FAULT_KINDS) > kinds


def test_schedule_accepts_what_it_prints_chained_and_by_world_size():
    """The drift this replaced: --elastic-schedule rejected after_previous and on_world_size,
    which the printed specs contain."""
    from harness import WorkerState
    from harness.faults import OnState, OnWorldSize

    schedule = ((ScheduledFault(NodeKill(node=1), AtStep(step=8, rank=0)),
                 ScheduledFault(NodeAdd(), OnWorldSize(size=1), after_previous=True),
                 ScheduledFault(WorkerHang(node=2), OnState(WorkerState.HEALTHY, node=2), after_previous=True)),)
    text = schedules_to_json(schedule)
    assert '"after_previous":true' in text and '"on_world_size":1' in text
    assert parse_schedule(text) == json.loads(text)
    assert schedules_from_json(text) == schedule


def test_cluster_runs_a_given_schedule(tmp_path, warm_pool):
    from harness import Cluster, WorkerState
    from harness.sim.faults.chaos import ChaosConfig

    given = (crash(1, 0.1),)
    chaos = ChaosConfig(seed=1, schedules=(given,))
    with Cluster(pool=warm_pool, nnodes=1, nproc_per_node=2, max_restarts=1, chaos=chaos) as cluster:
        job = cluster.launch(STEPPER, "30", "0.02")
        assert job.wait(timeout=60).state == WorkerState.SUCCEEDED
        assert job.chaos_schedule == list(given) and job.chaos_schedule[0] is given[0]
        assert [f.get("local_rank") for f in job.timeline.faults()] == [1]
        second = cluster.launch(STEPPER, "1", "0")  # past the given ones: generated from the seed
        second.wait(timeout=60)
        assert second.chaos_schedule and second.chaos_schedule[0] is not given[0]


# -- end to end -------------------------------------------------------------------------

FRAGILE = f"""
import pytest
from harness import WorkerState

@pytest.mark.elastic(nnodes=1, nproc_per_node=2, max_restarts=3)
def test_rank1_fragile(elastic_cluster):
    job = elastic_cluster.launch({STEPPER!r}, "30", "0.03")  # 0.9 s: every fault lands within 0.5 s
    job.wait(timeout=90)
    assert not [f for f in job.timeline.faults() if f.get("local_rank") == 1], "rank 1 was hit"

@pytest.mark.elastic(nnodes=1, nproc_per_node=2, max_restarts=3)
def test_fine(elastic_cluster):
    job = elastic_cluster.launch({STEPPER!r}, "20", "0.01")
    assert job.wait(timeout=90).state == WorkerState.SUCCEEDED
"""
# three faults, of which only the one on rank 1 matters
SCHEDULE = json.dumps([[{"kind": "kill_worker", "local_rank": 0, "after_healthy": 0.1},
                        {"kind": "kill_worker", "local_rank": 1, "sig": 15, "after_healthy": 0.3},
                        {"kind": "kill_worker", "local_rank": 0, "after_healthy": 0.5}]])


def test_failing_chaos_test_is_shrunk_and_the_result_replays(pytester):
    pytester.makepyfile(FRAGILE)
    result = pytester.runpytest_subprocess(f"--elastic-schedule={SCHEDULE}", "--junitxml=out.xml",
                                           "-p", "xdist", "-n", "2")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([
        "*elastic chaos: minimal failing schedule*",
        "shrunk 3 fault(s) to 1 in * re-run(s) (budget 8, *s); same failure throughout: "
        "AssertionError at *test_failing_chaos_test_is_shrunk_and_the_result_replays.py:* (call)",
        "minimal failing schedule:",
        "  job 0: WorkerKill(node=0, local_rank=1, sig=15, exit_code=None) @ AfterHealthy(seconds=*)",
        "shrink steps:",
        "  drop every fault: passes: not kept",
        "replay exactly this schedule (no shrinking) with:",
        "  pytest '*::test_rank1_fragile' --elastic-chaos --elastic-seed=* --elastic-schedule='[[][[]{*}]]' "
        "--elastic-shrink-budget=0",
    ])
    result.stdout.fnmatch_lines(["shrunk: 1 failing chaos test(s), to 1 fault(s)*"])
    assert 'name="elastic_minimal_faults" value="1"' in (pytester.path / "out.xml").read_text()
    # the printed line, run as printed, fails the same way with exactly that schedule
    line = next(l.strip() for l in result.stdout.lines if "--elastic-shrink-budget=0" in l)
    replay = pytester.runpytest_subprocess(*shlex.split(line)[1:])
    replay.assert_outcomes(failed=1)
    minimal = next(l.strip() for l in result.stdout.lines if l.startswith("  job 0: WorkerKill"))
    replay.stdout.fnmatch_lines(["*AssertionError: rank 1 was hit*", "fault schedule:",
                                 f"  {minimal[len('job 0: '):]}"])
    assert "minimal failing schedule" not in replay.stdout.str()


def test_shrink_budget_zero_turns_it_off(pytester, monkeypatch):
    pytester.makepyfile(FRAGILE)
    monkeypatch.setenv("PYTEST_ELASTIC_SHRINK_BUDGET", "0")
    result = pytester.runpytest_subprocess(f"--elastic-schedule={SCHEDULE}", "-k", "fragile")
    result.assert_outcomes(failed=1)
    assert "minimal failing schedule" not in result.stdout.str()
    result.stdout.fnmatch_lines(["elastic: chaos=on seed=* faults=kill_worker shrink=off schedule=given *"])


def test_bad_shrink_budget_is_a_usage_error(pytester):
    result = pytester.runpytest_subprocess("--elastic-shrink-budget=-1")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--elastic-shrink-budget=-1 is not valid: must be >= 0*"])

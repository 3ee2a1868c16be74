"""The invariant checker catches deliberately broken timelines."""

from __future__ import annotations

import json

import pytest

from harness.agent import WorkerState as S
from harness.sim.truth.invariants import InvariantViolation, JobFacts, check_timeline
from harness.sim.truth.timeline import Timeline

FACTS = JobFacts(max_restarts=1, nproc_per_node=2)


def write(tmp_path, events):
    path = tmp_path / "events.jsonl"
    lines = []
    for i, e in enumerate(events):
        lines.append(json.dumps({"ts": i, "mono": float(i), "pid": 1, "run_id": "r", **e}))
    path.write_text("\n".join(lines) + "\n")
    return Timeline(str(path))


def state(node, s):
    return {"node": node, "kind": "state", "state": s}


def start(node, rank, rnd, pid, world=2, local=None):
    return {"node": node, "kind": "worker_start", "rank": rank, "local_rank": rank if local is None else local,
            "round": rnd, "worker_pid": pid, "world_size": world, "restart_count": rnd}


def exit_(node, pid, code=0):
    return {"node": node, "kind": "worker_exit", "worker_pid": pid, "exitcode": code}


def good_events():
    return [state("a", "INIT"), start("a", 0, 0, 10), start("a", 1, 0, 11), state("a", "HEALTHY"),
            exit_("a", 11, 1), state("a", "FAILED"), exit_("a", 10, -15), state("a", "STOPPED"),
            start("a", 0, 1, 20), start("a", 1, 1, 21), state("a", "HEALTHY"),
            exit_("a", 20), exit_("a", 21), state("a", "SUCCEEDED")]


def test_a_good_timeline_passes(tmp_path):
    assert check_timeline(write(tmp_path, good_events()), FACTS) == []


def test_illegal_transition(tmp_path):
    events = good_events()
    events.insert(4, state("a", "SUCCEEDED"))  # HEALTHY -> SUCCEEDED -> FAILED
    problems = check_timeline(write(tmp_path, events), FACTS)
    assert any("illegal transition SUCCEEDED -> FAILED" in p for p in problems)


def test_duplicate_ranks(tmp_path):
    events = [state("a", "INIT"), start("a", 0, 0, 10), start("b", 0, 0, 11)]
    problems = check_timeline(write(tmp_path, events), FACTS)
    assert any("ranks [0, 0] are not unique within 0..1" in p for p in problems)


def test_final_round_of_a_successful_job_must_be_complete(tmp_path):
    events = [state("a", "INIT"), start("a", 0, 0, 10), exit_("a", 10), state("a", "HEALTHY")]
    done = JobFacts(max_restarts=1, nproc_per_node=1, finished=True, succeeded=True)
    problems = check_timeline(write(tmp_path, events), done)
    assert any("not contiguous 0..1" in p and "sum to 1" in p for p in problems)


def test_an_abandoned_half_started_round_is_legal(tmp_path):
    """A node left right after round 0 formed, before starting its workers."""
    events = [state("a", "INIT"), start("a", 0, 0, 10), state("a", "HEALTHY"), exit_("a", 10, -15),
              state("a", "STOPPED"), start("a", 0, 1, 20, world=1), state("a", "HEALTHY")]
    done = JobFacts(max_restarts=1, nproc_per_node=1, finished=True, succeeded=True)
    assert check_timeline(write(tmp_path, events), done) == []


def test_old_round_worker_alive_when_new_round_starts(tmp_path):
    events = good_events()
    events = [e for e in events if not (e["kind"] == "worker_exit" and e["worker_pid"] == 10)]
    problems = check_timeline(write(tmp_path, events), FACTS)
    assert any("pid 10" in p and "still alive" in p for p in problems)


def test_too_many_restarts(tmp_path):
    events = good_events() + [start("a", 0, 2, 30)]
    events[-1]["restart_count"] = 2
    problems = check_timeline(write(tmp_path, events), FACTS)
    assert any("2 restarts > max_restarts=1" in p for p in problems)


def test_the_nodes_of_a_round_must_share_one_restart_count(tmp_path):
    """torch's per-agent count: node b only re-formed and kept 0 while a counted 1."""
    events = good_events() + [start("b", 2, 1, 40)]
    events[-1]["restart_count"] = 0
    problems = check_timeline(write(tmp_path, events), FACTS)
    assert any("round 1: nodes ran with different restart counts [0, 1]" in p for p in problems)


def test_the_restart_count_is_never_lowered(tmp_path):
    """A fresh agent that started again at 0 (pytorch#147064)."""
    events = good_events() + [start("a", 0, 2, 30)]
    events[-1]["restart_count"] = 0
    problems = check_timeline(write(tmp_path, events), FACTS)
    assert any("round 2: restart count 0 is below round 1's 1" in p for p in problems)


@pytest.mark.parametrize("name", ["kill_worker", "worker_kill", "worker_exit_order"])  # + an older run's names
def test_failed_job_with_restarts_left(tmp_path, name):
    events = good_events()[:6] + [{"node": "harness", "kind": "fault", "fault": name}]
    facts = JobFacts(max_restarts=3, nproc_per_node=2, finished=True, succeeded=False)
    problems = check_timeline(write(tmp_path, events), facts)
    assert any("job failed with 1 injected worker failure" in p for p in problems)


def test_violation_message_prints_the_timeline(tmp_path):
    timeline = write(tmp_path, good_events())
    error = InvariantViolation(["something broke"], timeline)
    assert "something broke" in str(error) and "worker_start" in str(error)


def harness_entry(node, s, cause="kill_node"):
    """The terminal entry the harness writes on the timeline of a node it killed or froze."""
    return {"node": node, "kind": "state", "state": s, "source": "harness", "cause": cause}


def test_the_harness_terminal_entry_is_legal_after_any_state(tmp_path):
    """A node killed while INIT, while HEALTHY, or after its agent reported FAILED: the
    harness's entry records what the harness did, not a step of the agent's state machine."""
    for before in (["INIT"], ["INIT", "HEALTHY"], ["INIT", "HEALTHY", "FAILED"]):
        events = [state("a", s) for s in before] + [harness_entry("a", "FAILED")]
        assert check_timeline(write(tmp_path, events), FACTS) == [], before


def test_agent_states_around_a_harness_entry_are_still_checked(tmp_path):
    """An agent's late line (stopped mid-write, continued at close) after the freeze entry
    is checked against the agent's own previous state: HEALTHY -> UNHEALTHY is fine,
    SUCCEEDED -> HEALTHY is not."""
    late = [state("a", "INIT"), state("a", "HEALTHY"), harness_entry("a", "FAILED", "freeze_node"),
            state("a", "UNHEALTHY")]
    assert check_timeline(write(tmp_path, late), FACTS) == []
    bad = [state("a", "INIT"), state("a", "HEALTHY"), state("a", "SUCCEEDED"),
           harness_entry("a", "FAILED"), state("a", "HEALTHY")]
    problems = check_timeline(write(tmp_path, bad), FACTS)
    assert problems == ["a: illegal transition SUCCEEDED -> HEALTHY"]


def test_integer_node_keys_labels_and_unknown_nodes(tmp_path):
    import pytest

    from harness.errors import ConfigError

    events = [{"node": "harness", "kind": "node_start", "target_node": 0, "label": "megan-0"},
              {"node": "harness", "kind": "node_start", "target_node": 1, "label": "kate-1"},
              state(0, "INIT"), state(1, "INIT"), state(1, "HEALTHY")]
    timeline = write(tmp_path, events)
    assert timeline.nodes() == [0, 1] and timeline.states(1) == [S.INIT, S.HEALTHY]
    assert timeline.label(1) == "kate-1" and timeline.labels() == {0: "megan-0", 1: "kate-1"}
    for unknown in (2, "kate-1"):
        with pytest.raises(ConfigError, match=r"is not a node of this timeline \(nodes: \[0, 1\]\)"):
            timeline.states(unknown)
    assert "1:kate-1" in timeline.format()


def _two_nodes_one_cut_off(heal_before_new_round):
    """Node b (index 1) is cut off from the store; node a starts round 1 alone while b's
    round-0 worker is still alive (its fence has not fired yet), then b's worker exits."""
    events = [state("a", "INIT"), state("b", "INIT"),  # agents name their node by label here
              {"node": "harness", "kind": "node_start", "target_node": 1, "label": "b"},
              start("a", 0, 0, 10), start("b", 1, 0, 11, local=0),
              {"node": "harness", "kind": "fault", "fault": "partition", "target_node": 1, "peers": "store"}]
    if heal_before_new_round:
        events.append({"node": "harness", "kind": "heal", "target_node": 1})
    events += [exit_("a", 10, -15), start("a", 0, 1, 20, world=1), exit_("b", 11, -15)]
    return events


def test_a_cut_off_nodes_old_worker_is_the_fencings_to_stop_not_an_overlap(tmp_path):
    problems = check_timeline(write(tmp_path, _two_nodes_one_cut_off(False)), FACTS)
    assert not any("still alive" in p for p in problems), problems


def test_once_healed_an_old_worker_alive_at_a_new_round_is_an_overlap_again(tmp_path):
    problems = check_timeline(write(tmp_path, _two_nodes_one_cut_off(True)), FACTS)
    assert any("pid 11" in p and "still alive" in p for p in problems), problems


def test_a_crash_that_cut_into_fsynced_data_is_caught(tmp_path):
    kept = {"path": "/b/shared/ckpt.pt", "synced_size": 4096, "size_before": 9000, "unsynced_bytes": 4904,
            "kept_torn": 0, "size_after": 4096}
    cut = {**kept, "path": "/b/shared/log", "size_after": 100}
    lost = {"node": "harness", "kind": "storage_lost", "target_node": 1, "torn": False, "files": [kept, cut]}
    problems = check_timeline(write(tmp_path, [*good_events(), lost]), FACTS)
    assert problems == ["node 1's crash lost fsynced data: /b/shared/log was fsynced at 4096 bytes "
                        "and has 100 after the crash"]


# -- naming a hang: where the stack says it is (harness.sim.truth.hangs) ---------------------------

def _stack(script: str, line: int) -> str:
    """A worker's stacks as faulthandler writes them, its main thread at ``script``:``line``."""
    return f"""--- node 1 (hunter-1) local_rank 1 rank 3 pid 3990
Thread 0x00007f3e2e1ff6c0 (most recent call first):
  <no Python frame>

Current thread 0x00007f3e5708bb80 (most recent call first):
  File "{script}", line {line} in <module>
  File "<frozen runpy>", line 88 in _run_code
  File "/x/harness/procs/_zygote.py", line 351 in run_as_main
"""


_TRAINS = """import time


def main():
    for step in range(3):
        time.sleep(0.01)


main()
while True:
    time.sleep(1)
"""


def test_a_finished_worker_is_placed_where_its_stack_and_its_script_say(tmp_path):
    """After training, a main thread at the top-level line that called ``main()`` is in the
    teardown of what main held (the stack of a hang of the main job); one at any other
    top-level line (a ``while True`` of the script's own, at its line 10) is said to be
    there, with the line, and no teardown is guessed; inside a function, or where the
    script's source is not on this machine, nothing is guessed either."""
    from harness.sim.truth.hangs import TEARDOWN_HINT, TOP_LEVEL_HINT, teardown_hint

    script = tmp_path / "trains.py"
    script.write_text(_TRAINS)
    assert teardown_hint(_stack(str(script), 9)) == TEARDOWN_HINT.format(call="main")
    assert teardown_hint(_stack(str(script), 10)) == TOP_LEVEL_HINT.format(
        path=script, line=10, source="while True:")
    assert "destructors" not in teardown_hint(_stack(str(script), 11))
    frame = f'File "{script}", line 9 in <module>'
    in_the_loop = _stack(str(script), 9).replace(frame, f'File "{script}", line 6 in main\n  {frame}')
    assert teardown_hint(in_the_loop) is None
    assert teardown_hint(_stack("/nowhere/train.py", 114)) == TOP_LEVEL_HINT.format(
        path="/nowhere/train.py", line=114, source="(its source is not here)")
    assert teardown_hint("(no live workers)") is None

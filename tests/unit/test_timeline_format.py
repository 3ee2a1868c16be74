"""What a failed job prints of its timeline (``Timeline.format``)."""

from __future__ import annotations

import json

from harness.sim.truth.timeline import Timeline


def test_every_event_but_the_steps_is_shown_and_only_the_last_steps(tmp_path):
    """The events that explain a red job (a fence, the worker exits, the rounds) come early;
    hundreds of steps come after them. They must not be pushed out of the text."""
    path = tmp_path / "events.jsonl"
    events = [{"mono": 0.0, "node": 1, "kind": "fenced", "reason": "no answer"}]
    events += [{"mono": 0.01 * i, "node": 0, "kind": "step", "step": i, "rank": 0} for i in range(1, 500)]
    events += [{"mono": 6.0, "node": 0, "kind": "state", "state": "SUCCEEDED"}]
    path.write_text("".join(json.dumps({"ts": e["mono"], "pid": 1, "run_id": "r", **e}) + "\n" for e in events))
    text = Timeline(str(path)).format(steps=3)
    lines = text.splitlines()
    assert lines[0] == "(496 step events not shown)"
    assert "fenced" in lines[1] and "SUCCEEDED" in lines[-1]
    assert [json.loads(line[line.index("{"):])["step"] for line in lines[1:] if " step " in line] == [497, 498, 499]
    assert len(Timeline(str(path)).format(limit=1, steps=0).splitlines()) == 2  # a count, the last state

"""A node the job has started on another thread (``add_node`` fired by the scheduler) whose
``node_start`` is not yet on the timeline: the waits ask for its workers in that window.

A chaos ``add_node`` under ``bench/flake.py`` once failed ``flapping_node`` with
``ConfigError: node=2 is not a node of this timeline``: the hang check of ``Job.wait`` read
``job.nodes`` between the new node's handle going in and its ``node_start`` being written.
Such a node has no workers yet; asking is no error.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from harness.errors import ConfigError
from harness.sim.job import Job
from harness.sim.truth.timeline import HARNESS, Timeline


def _write(path, *events):
    with open(path, "a") as fp:
        for event in events:
            fp.write(json.dumps({"ts": event["mono"], "pid": 1, "run_id": "r", **event}) + "\n")


def test_a_node_started_but_not_yet_on_the_timeline_has_no_workers(tmp_path):
    path = tmp_path / "events.jsonl"
    _write(path, {"mono": 0.0, "node": HARNESS, "kind": "node_start", "target_node": 0, "label": "a-0"},
           {"mono": 0.1, "node": 0, "kind": "worker_start", "local_rank": 0, "worker_pid": 4242})
    timeline = Timeline(str(path))
    nodes = {0: SimpleNamespace(index=0), 1: SimpleNamespace(index=1)}  # node 1: its handle in, no event yet
    job = SimpleNamespace(timeline=timeline, node=lambda n: nodes[n])
    assert not timeline.knows(1)
    with pytest.raises(ConfigError, match="is not a node of this timeline"):
        timeline.events("worker_start", 1)  # what the waits once asked, and failed on
    assert Job.worker_starts(job, 1) == {}
    assert Job.worker_starts(job, 0)[0]["worker_pid"] == 4242

    _write(path, {"mono": 0.2, "node": HARNESS, "kind": "node_start", "target_node": 1, "label": "b-1"},
           {"mono": 0.3, "node": 1, "kind": "worker_start", "local_rank": 0, "worker_pid": 4343})
    assert timeline.knows(1) and Job.worker_starts(job, 1)[0]["worker_pid"] == 4343

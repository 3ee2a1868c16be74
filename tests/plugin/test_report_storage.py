"""The report and storage faults: a node killed with ``lose_unsynced`` says, on its fault's
line, what each file lost and what is left. Hand-made events, as ``Job`` writes them."""

from __future__ import annotations

from pytest_elastic.report.model import build_model
from pytest_elastic.report.page import build_page


def _event(t: float, node, kind: str, **fields) -> dict:
    return {"ts": t, "mono": t, "node": node, "pid": 1, "run_id": "r", "kind": kind, **fields}


def _lost(path: str, synced: int, unsynced: int, after: int, torn: int = 0) -> dict:
    return {"path": f"/tmp/job_x/fs/{path}", "synced_size": synced, "size_before": synced + unsynced,
            "unsynced_bytes": unsynced, "kept_torn": torn, "size_after": after}


EVENTS = [_event(0, 0, "state", state="HEALTHY"), _event(0, 1, "state", state="HEALTHY"),
          _event(1, "harness", "fault", fault="node_kill", target_node=0),  # another node's kill (an older run's name)
          _event(2, "harness", "fault", fault="kill_node", target_node=1, lose_unsynced=True, torn=True),
          _event(2.1, "harness", "storage_lost", target_node=1, torn=True, files=[
                 _lost("shared/ckpt.pt", 0, 100 << 20, 4096, torn=4096), _lost("node1/disk/log", 1000, 500, 1000)]),
          _event(5, 1, "state", state="SUCCEEDED")]


def test_a_lose_unsynced_kill_names_what_each_file_lost():
    model = build_model(EVENTS)
    other, kill = model.faults
    assert other.data_lost == []
    assert kill.data_lost == ["shared/ckpt.pt: 100.0 MB never fsynced lost, 4.0 KB left, "
                              "4.0 KB of its last write kept (torn)",
                              "node1/disk/log: 500 B never fsynced lost, 1000 B left"]
    assert "data lost: shared/ckpt.pt: 100.0 MB never fsynced lost" in build_page("t", model, EVENTS)

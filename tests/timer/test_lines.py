"""The FIFO reader's line handling: partial, oversized and merged lines (no processes)."""

from __future__ import annotations

import json

from harness.timer._file import MAX_LINE_BYTES, _decode, _LineBuffer, _request_from

REQ = json.dumps({"version": 1, "pid": 42, "scope_id": "s", "expiration_time": 5.0, "signal": 9})


def test_lines_split_across_reads():
    buf = _LineBuffer(MAX_LINE_BYTES)
    assert buf.feed(REQ[:10].encode()) == []
    assert buf.feed(REQ[10:].encode() + b"\n" + REQ.encode()) == [(REQ.encode(), 0)]
    assert buf.pending == len(REQ)
    assert buf.feed(b"\n") == [(REQ.encode(), 0)]


def test_oversized_line_keeps_its_tail_only():
    buf = _LineBuffer(100)
    assert buf.feed(b"x" * 250) == []
    assert buf.pending == 100
    (line, dropped), = buf.feed(b"y\n")
    assert len(line) == 100 and line.endswith(b"y") and dropped == 151


def test_partial_line_merged_with_a_whole_one_is_recovered():
    merged = b'{"version": 1, "pi' + REQ.encode()
    obj, skipped = _decode(merged)
    assert obj == json.loads(REQ) and skipped == len(b'{"version": 1, "pi')


def test_garbage_is_rejected():
    assert _decode(b"not json")[0] is None
    assert _decode(b'{"a": NaN}')[0] is None  # no NaN/Infinity deadlines
    assert _decode(b"\xff\xfe{")[0] is None


def test_request_fields():
    r = _request_from(json.loads(REQ))
    assert (r.worker_id, r.scope_id, r.expiration_time, r.signal, r.version) == (42, "s", 5.0, 9, 1)
    for bad in ([1], {"pid": 1}, {**json.loads(REQ), "version": 2}):
        try:
            _request_from(bad)
        except ValueError:
            continue
        raise AssertionError(f"accepted {bad!r}")

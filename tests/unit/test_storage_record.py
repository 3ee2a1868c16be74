"""The write-back record on real files: what a crash rolls back, and what it must keep."""

from __future__ import annotations

import os

from harness.sim.storage.record import WriteBack, torn_prefix


def _key(fd):
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


def _write(wb, fd, path, node, offset, data):
    wb.before_write(_key(fd), fd, path, node, offset, len(data))
    os.pwrite(fd, data, offset)


def test_crash_keeps_fsynced_data_and_drops_the_rest(tmp_path):
    path = str(tmp_path / "f")
    fd = os.open(path, os.O_CREAT | os.O_RDWR)
    wb = WriteBack()
    _write(wb, fd, path, 1, 0, b"A" * 100)
    os.fsync(fd)
    wb.synced(_key(fd))
    _write(wb, fd, path, 1, 100, b"B" * 50)  # appended, never fsynced
    _write(wb, fd, path, 1, 10, b"C" * 20)  # overwrote fsynced bytes, never fsynced
    [lost] = wb.crash(1)
    os.close(fd)
    with open(path, "rb") as fp:
        assert fp.read() == b"A" * 100
    assert (lost.synced_size, lost.size_before, lost.unsynced_bytes, lost.size_after) == (100, 150, 70, 100)
    assert wb.dirty() == []


def test_crash_of_another_node_loses_nothing(tmp_path):
    path = str(tmp_path / "f")
    fd = os.open(path, os.O_CREAT | os.O_RDWR)
    wb = WriteBack()
    _write(wb, fd, path, 0, 0, b"x" * 10)
    assert wb.crash(1) == []
    assert os.path.getsize(path) == 10
    os.close(fd)


def test_torn_keeps_half_the_last_write_page_aligned(tmp_path):
    path = str(tmp_path / "f")
    fd = os.open(path, os.O_CREAT | os.O_RDWR)
    wb = WriteBack()
    _write(wb, fd, path, 2, 0, b"a" * 1000)
    _write(wb, fd, path, 2, 1000, b"b" * 10_000)
    [lost] = wb.crash(2, torn=True)
    os.close(fd)
    with open(path, "rb") as fp:
        data = fp.read()
    assert data == b"\0" * 1000 + b"b" * 4096  # the first write gone (a hole), half of the last
    assert lost.kept_torn == 4096 == torn_prefix(10_000)
    assert torn_prefix(100) == 50


def test_truncate_is_durable(tmp_path):
    path = str(tmp_path / "f")
    fd = os.open(path, os.O_CREAT | os.O_RDWR)
    wb = WriteBack()
    _write(wb, fd, path, 0, 0, b"z" * 100)
    os.fsync(fd)
    wb.synced(_key(fd))
    os.ftruncate(fd, 0)  # torch.save's open("wb"): the old content is gone for good
    wb.truncated(_key(fd), 0)
    _write(wb, fd, path, 0, 0, b"n" * 40)
    wb.crash(0)
    os.close(fd)
    assert os.path.getsize(path) == 0  # ext4's zero-length file after a crash

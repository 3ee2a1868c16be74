"""The zygote reads a worker's cgroups and its agent's on every fork; the mount table they
are resolved against is parsed again only when it changed, with real mounts."""

from __future__ import annotations

import os
import subprocess

import pytest

from harness.procs._cgroup import _MountTable, cgroup_mounts


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_the_mount_table_is_parsed_again_only_after_a_mount_or_an_unmount(tmp_path, request):
    """The zygote reads cgroups on every fork: the mount table is parsed again only when the
    kernel says it changed (POLLPRI on mountinfo), and then it is."""
    table = _MountTable()
    request.addfinalizer(table.close)
    first = table.get()
    assert first == cgroup_mounts()
    assert not table._changed(), "nothing mounted since"
    point = tmp_path / "mnt"
    point.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "pe-mount-table", str(point)], check=True)
    try:
        assert table._changed(), "a mount is news"
        assert table.get() == first  # read again: no cgroup hierarchy among the new mounts
        assert not table._changed()
    finally:
        subprocess.run(["umount", str(point)], check=True)
    assert table._changed(), "so is an unmount"

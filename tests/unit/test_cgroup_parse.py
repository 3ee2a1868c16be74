"""Which cgroup directory a process is in, from the kernel's own texts (``/proc/self/mountinfo``
and ``/proc/<pid>/cgroup``) as they read on the machines the runtime meets: cgroup v2 alone,
v1 with co-mounted controllers, a hybrid, a container that mounts a subtree. Pure parsing:
the runtime's OOM verdict and the zygote's cgroup move rest on it."""

from __future__ import annotations

from harness.procs._cgroup import parse_cgroup, parse_mountinfo

V2 = "30 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"
V1 = ("32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct\n"
      "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
      "40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd\n"
      "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
      "22 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw\n")


def test_cgroup_v2_alone():
    mounts = parse_mountinfo(V2)
    assert mounts == {"": ("/sys/fs/cgroup", "/")}
    assert parse_cgroup("0::/user.slice/user-0.slice/session-1.scope\n", mounts) == {
        "": "/sys/fs/cgroup/user.slice/user-0.slice/session-1.scope"}


def test_cgroup_v1_co_mounted_controllers_named_hierarchies_and_the_hybrid_unified_one():
    mounts = parse_mountinfo(V1)
    assert mounts["cpu"] == mounts["cpuacct"] == ("/sys/fs/cgroup/cpu,cpuacct", "/")
    assert set(mounts) == {"cpu", "cpuacct", "memory", "name=systemd", ""}  # rw and xattr are no controllers
    text = "4:memory:/job/a\n3:cpu,cpuacct:/\n1:name=systemd:/init.scope\n0::/\n2:blkio:/\n"
    assert parse_cgroup(text, mounts) == {
        "memory": "/sys/fs/cgroup/memory/job/a", "cpu": "/sys/fs/cgroup/cpu,cpuacct",
        "cpuacct": "/sys/fs/cgroup/cpu,cpuacct", "name=systemd": "/sys/fs/cgroup/systemd/init.scope",
        "": "/sys/fs/cgroup/unified"}  # blkio: not mounted here, left out


def test_a_container_mounting_a_subtree_and_an_escaped_mount_point():
    mounts = parse_mountinfo("50 40 0:30 /docker/abc /sys/fs/cgroup/memory ro - cgroup cgroup rw,memory\n"
                             "51 40 0:31 / /mnt/my\\040cgroups rw - cgroup2 cgroup2 rw\n")
    assert mounts["memory"] == ("/sys/fs/cgroup/memory", "/docker/abc")
    assert mounts[""] == ("/mnt/my cgroups", "/")
    assert parse_cgroup("9:memory:/docker/abc/worker\n0::/x\n", mounts) == {
        "memory": "/sys/fs/cgroup/memory/worker", "": "/mnt/my cgroups/x"}
    assert parse_cgroup("9:memory:/docker/abc\ngarbage\n", mounts) == {"memory": "/sys/fs/cgroup/memory"}

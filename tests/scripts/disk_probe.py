"""Every 0.1 s, write and fsync one byte to two files on the node's disk (``HARNESS_NODE_DISK``),
``probe.bin`` and ``shard.distcp``, and report the step with what each write failed with
(``plain``, ``distcp``: an errno, 0 for none): a storage fault on the disk shows in the next
steps. ``disk_probe.py [STEPS [DIR]]`` (default: until killed; DIR: instead of the disk, the
files named for the worker's rank there)."""

import os
import sys
import time

from harness import report_step

disk = sys.argv[2] if len(sys.argv) > 2 else os.environ["HARNESS_NODE_DISK"]
steps = int(sys.argv[1]) if len(sys.argv) > 1 else 1 << 30
tag = os.environ.get("RANK", "") if len(sys.argv) > 2 else ""  # a dir the nodes share: a name per rank


def write(name: str) -> int:
    try:
        fd = os.open(os.path.join(disk, name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, b"x")
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as e:
        return e.errno or -1
    return 0


for step in range(steps):
    report_step(step, plain=write(f"probe{tag}.bin"), distcp=write(f"shard{tag}.distcp"))
    time.sleep(0.1)

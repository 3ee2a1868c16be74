"""A worker that leaves files of both kinds on the shared filesystem and its node's disk:
``synced_<rank>`` (written and fsynced), ``unsynced_<rank>`` (written, never fsynced), and
on its node disk ``disk_<rank>`` (unsynced); then, with ``--rename``, writes
``ckpt_<rank>.tmp`` and renames it to ``ckpt_<rank>`` (the naive save); then ``ready_<rank>``
and it sleeps until killed."""

import os
import sys
import time

shared = os.environ["HARNESS_SHARED_DIR"]
disk = os.environ["HARNESS_NODE_DISK"]
rank = os.environ["RANK"]
with open(os.path.join(shared, f"synced_{rank}"), "wb") as fp:
    fp.write(b"S" * 100_000)
    fp.flush()
    os.fsync(fp.fileno())
with open(os.path.join(shared, f"unsynced_{rank}"), "wb") as fp:
    fp.write(b"U" * 100_000)
with open(os.path.join(disk, f"disk_{rank}"), "wb") as fp:
    fp.write(b"D" * 10_000)
with open(os.path.join(shared, f"torn_{rank}"), "wb") as fp:
    fp.write(b"T" * 65_536)
    fp.flush()
    os.fsync(fp.fileno())
    fp.write(b"t" * 65_536)
if "--rename" in sys.argv:
    tmp = os.path.join(shared, f"ckpt_{rank}.tmp")
    with open(tmp, "wb") as fp:
        fp.write(b"C" * 1000)
    os.rename(tmp, os.path.join(shared, f"ckpt_{rank}"))
open(os.path.join(shared, f"ready_{rank}"), "w").close()
time.sleep(120)

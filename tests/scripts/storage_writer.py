"""A worker (one per node) that leaves files of both kinds on the shared filesystem and its
node's disk, named for its node index ``<n>`` (which rank a node gets is the rendezvous's
choice): ``synced_<n>`` (written and fsynced), ``unsynced_<n>`` (written, never fsynced), on
its node disk ``disk_<n>`` (unsynced), ``torn_<n>`` (64 KiB fsynced, then 64 KiB not); then,
with ``--rename``, writes ``ckpt_<n>.tmp`` and renames it to ``ckpt_<n>`` (the naive save);
then ``ready_<n>`` and it sleeps until killed."""

import os
import random
import sys
import time

shared = os.environ["HARNESS_SHARED_DIR"]
disk = os.environ["HARNESS_NODE_DISK"]
rank = os.environ["HARNESS_NODE"]  # the node index
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
with open(os.path.join(shared, f"big_{rank}"), "wb") as fp:
    fp.write(b"0123456789" + random.Random(int(rank)).randbytes(3 << 20))
    fp.flush()
    os.fsync(fp.fileno())
with open(os.path.join(shared, f"log_{rank}"), "ab") as fp:
    fp.write(b"A" * 1000)
    fp.flush()
    os.fsync(fp.fileno())
    fp.write(b"a" * 500)
if "--rename" in sys.argv:
    tmp = os.path.join(shared, f"ckpt_{rank}.tmp")
    with open(tmp, "wb") as fp:
        fp.write(b"C" * 1000)
    os.rename(tmp, os.path.join(shared, f"ckpt_{rank}"))
open(os.path.join(shared, f"ready_{rank}"), "w").close()
time.sleep(120)

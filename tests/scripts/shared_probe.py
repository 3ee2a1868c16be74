"""Each worker leaves ``hello_<rank>`` in the job's shared dir (``HARNESS_SHARED_DIR``) and
waits until every rank's is there (WORLD_SIZE of them): exit 0 once it sees them all, 3 if
it has not within 30 s (its peers write elsewhere: the dir is not shared)."""

import os
import sys
import time

shared = os.environ["HARNESS_SHARED_DIR"]
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
with open(os.path.join(shared, f"hello_{rank}"), "w") as fp:
    fp.write(os.uname().nodename)
deadline = time.monotonic() + 30
while not all(os.path.exists(os.path.join(shared, f"hello_{r}")) for r in range(world)):
    if time.monotonic() > deadline:
        sys.exit(3)
    time.sleep(0.05)

"""Group rank 0's worker returns at once; the others return only once the file named by
argv[1] exists, so the test decides when the slower node finishes (no sleeps)."""
import os
import sys
import time

if os.environ["GROUP_RANK"] != "0":
    while not os.path.exists(sys.argv[1]):
        time.sleep(0.05)
line = f"DONE group_rank={os.environ['GROUP_RANK']} restarts={os.environ['TORCHELASTIC_RESTART_COUNT']}\n"
os.write(1, line.encode())  # one write: lines never interleave

"""Reports training steps (harness.report_step); resumes from a per-rank progress file."""
import os
import sys
import time

from harness import report_step

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 20
delay = float(sys.argv[2]) if len(sys.argv) > 2 else 0.05
for step in range(steps):
    report_step(step)
    time.sleep(delay)
# one write: lines never interleave
os.write(1, (f"DONE rank={os.environ['RANK']} attempt={os.environ['TORCHELASTIC_RESTART_COUNT']}" + "\n").encode())

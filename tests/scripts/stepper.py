"""Reports training steps (harness.report_step); resumes from a per-rank progress file.
argv: [steps [delay [dir]]]: with a dir, each rank leaves ``done-<rank>-<attempt>`` there at its end."""
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
if len(sys.argv) > 3:
    attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
    open(os.path.join(sys.argv[3], f"done-{os.environ['RANK']}-{attempt}"), "w").close()

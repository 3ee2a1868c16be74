"""Prints the restart count this worker was started with (one line), then reports steps
like stepper.py. ``--fail-first``: a worker started with count 0 exits 3 at once."""
import os
import sys
import time

from harness import report_step

args = [a for a in sys.argv[1:] if a != "--fail-first"]
steps = int(args[0]) if args else 20
delay = float(args[1]) if len(args) > 1 else 0.05
count = os.environ["TORCHELASTIC_RESTART_COUNT"]
# one write: lines of concurrent workers never interleave
os.write(1, (f"COUNT rank={os.environ['RANK']} pid={os.getpid()} count={count}" + "\n").encode())
if "--fail-first" in sys.argv and count == "0":
    raise SystemExit(3)
for step in range(steps):
    report_step(step)
    time.sleep(delay)

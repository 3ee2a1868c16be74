"""Local rank 0 allocates (and touches) ``mb`` MiB a step until the OOM killer or the step
count stops it: ``hog.py MB STEPS [--always]``.

Only the first attempt allocates (a restarted one trains on normally), so a job under
``memory_limit`` shows one OOM kill and a restart that succeeds; ``--always``: every attempt."""
import os
import sys
import time

from harness import report_step

mb = int(sys.argv[1]) if len(sys.argv) > 1 else 50
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 40
hog = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0" or "--always" in sys.argv
held = []
for step in range(steps):
    if hog and int(os.environ.get("LOCAL_RANK", "0")) == 0:
        held.append(bytearray(os.urandom(1)) * (mb << 20))  # touched: charged to the cgroup
    report_step(step)
    time.sleep(0.02)

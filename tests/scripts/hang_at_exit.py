"""Reports its steps, then the rank named in argv[2] never exits (as a worker stuck in its
teardown would): what ``Job.wait`` must name as a hang, with this frame in its stack."""
import sys
import time

from harness import report_step

steps, stuck_rank = int(sys.argv[1]), int(sys.argv[2])
import os  # noqa: E402

for step in range(steps):
    report_step(step)
    time.sleep(0.02)


def linger_after_training() -> None:
    time.sleep(300)


if int(os.environ["RANK"]) == stuck_rank:
    linger_after_training()

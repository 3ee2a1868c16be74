"""Burns CPU in a loop, reporting a step per slice of work; exits after ``steps`` steps."""
import sys

from harness import report_step

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
work = int(sys.argv[2]) if len(sys.argv) > 2 else 200_000
for step in range(steps):
    x = 0
    for i in range(work):
        x += i
    report_step(step)

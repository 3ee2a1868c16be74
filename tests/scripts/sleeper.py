"""Print the pid, then sleep (a worker that only dies when killed)."""
import os
import time

os.write(1, (f"PID {os.getpid()} RANK {os.environ.get('RANK')}" + "\n").encode())  # one write: lines never interleave
time.sleep(120)

"""Print the pid, then sleep (a worker that only dies when killed)."""
import os
import time

print(f"PID {os.getpid()} RANK {os.environ.get('RANK')}", flush=True)
time.sleep(120)

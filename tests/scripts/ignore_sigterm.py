"""Ignores SIGTERM and sleeps: the agent must SIGKILL it after the grace."""
import os
import signal
import sys
import time

signal.signal(signal.SIGTERM, signal.SIG_IGN)
os.write(1, (f"READY pid={os.getpid()}" + "\n").encode())  # one write: lines never interleave
if os.environ.get("RANK") == "0":
    time.sleep(0.5)
    sys.exit(5)
time.sleep(60)

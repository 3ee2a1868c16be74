"""Rank 1 gets stuck inside a 0.5 s timer scope on the first attempt.

argv[1] picks the client: "ours" (harness.timer) or "torch" (torch's own FileTimerClient).
"""
import os
import sys
import time

if sys.argv[1] == "torch":
    from torch.distributed.elastic.timer import FileTimerClient, configure, expires
else:
    from harness.timer import FileTimerClient, configure, expires

configure(FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"]))
attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
with expires(after=0.5, scope="train_step"):
    if attempt == "0" and os.environ["LOCAL_RANK"] == "1":
        time.sleep(60)  # stuck: only the watchdog can end this
os.write(1, f"DONE rank={os.environ['RANK']} attempt={attempt}\n".encode())

"""torch's own TCPStore server, alone in a process: the store torchrun's agents join in
bench/network.py (``--rdzv-conf=is_host=false``), hosted in the store namespace exactly as
ours is, so a partition from "the store" means the same thing to both runtimes.

``python torch_store.py HOST``: prints ``PORT <n>`` once it listens and serves until its
stdin closes (the bench holds the other end: if the bench dies, so does the store).
"""
import os
import sys

from torch.distributed import TCPStore

store = TCPStore(sys.argv[1], 0, is_master=True, wait_for_workers=False)
os.write(1, f"PORT {store.port}\n".encode())
sys.stdin.read()

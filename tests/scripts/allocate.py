"""Allocates and touches ``mb`` MiB at once (no torch, no harness: any program does this)."""
import sys

block = bytearray(int(sys.argv[1]) << 20)
for i in range(0, len(block), 4096):
    block[i] = 1
print("allocated", flush=True)

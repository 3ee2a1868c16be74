"""Writes half an error file and exits 1 (torch's agent crashes reading it)."""
import os
import sys

# one write: lines never interleave
os.write(1, (f"ATTEMPT {os.environ['TORCHELASTIC_RESTART_COUNT']}" + "\n").encode())
with open(os.environ["TORCHELASTIC_ERROR_FILE"], "w") as fp:
    fp.write('{"message": {"message": "trunc')
sys.exit(1)

"""Writes half an error file and exits 1 (torch's agent crashes reading it)."""
import os
import sys

os.write(1, (f"ATTEMPT {os.environ['TORCHELASTIC_RESTART_COUNT']}" + "\n").encode())  # one write: lines never interleave
with open(os.environ["TORCHELASTIC_ERROR_FILE"], "w") as fp:
    fp.write('{"message": {"message": "trunc')
sys.exit(1)

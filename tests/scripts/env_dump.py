"""Print this worker's elastic environment and argv as one JSON line, then exit."""
import json
import os
import sys

KEYS = ("LOCAL_RANK", "RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "LOCAL_WORLD_SIZE",
        "WORLD_SIZE", "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
        "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
        "TORCHELASTIC_USE_AGENT_STORE", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
        "TORCHELASTIC_ERROR_FILE", "OMP_NUM_THREADS")
line = "ENV " + json.dumps({"env": {k: os.environ.get(k) for k in KEYS}, "argv": sys.argv[1:]})
os.write(1, (line + "\n").encode())  # one write: lines of concurrent workers never interleave

"""Always fails with a recorded exception on rank 0, exit 0 elsewhere after a moment."""
import os
import time

from harness.errors import record


@record
def main() -> None:
    os.write(1, f"ATTEMPT rank={os.environ['RANK']} attempt={os.environ['TORCHELASTIC_RESTART_COUNT']}\n".encode())
    if os.environ["RANK"] == "0":
        raise RuntimeError("always broken")
    time.sleep(30)


main()

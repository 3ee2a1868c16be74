"""A worker using torch's own @record: rank 1 raises."""
import os

from torch.distributed.elastic.multiprocessing.errors import record


@record
def main() -> None:
    if os.environ["RANK"] == "1":
        raise ValueError("torch-recorded boom")


main()

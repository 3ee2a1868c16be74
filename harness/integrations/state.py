"""What every framework's hook hands the fault-free twin besides the framework's own state
dicts: the process's RNG states, which a resume must give back for the run to go on as it
would have (one definition, so the frameworks' verdicts compare the same generators)."""

from __future__ import annotations

import random
from typing import Any

__all__ = ["rng_states"]


def rng_states() -> dict[str, Any]:
    """torch's, Python's and numpy's global generator states, as the digest reads them."""
    import numpy
    import torch

    return {"torch": torch.get_rng_state(), "python": repr(random.getstate()),
            "numpy": repr(numpy.random.get_state())}

"""The pytest11 entry point. Imports neither torch nor the harness at import time."""

from __future__ import annotations

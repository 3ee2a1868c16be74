"""The fenced code blocks of README.md and the docs, as examples a test runs.

Every ```python and ```bash block of a page is run, in page order, in one directory of the
page's own: a Python block in a fresh interpreter (this checkout's, ``python -``), a shell
block with ``bash -e``, this checkout's interpreter and scripts first on ``PATH``. A line
``<!-- example: file NAME -->`` right before a block writes the block to ``NAME`` in that
directory instead (a test file a later block runs, a hosts file); ``<!-- example: skip WHY
-->`` leaves it out, saying why (an install from the network, a real cluster's address).
Other languages (``toml``, ``yaml``, ``text``) are text to read, not run.

Standard library only; ``tests/docs/test_examples.py`` runs them.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Block", "RUN", "blocks", "run_block"]

#: the languages whose blocks run
RUN = {"python": "python", "py": "python", "bash": "bash", "sh": "bash", "shell": "bash"}
_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>```+)(?P<lang>[\w+-]*)\s*$")
_DIRECTIVE = re.compile(r"^\s*<!--\s*example:\s*(?P<verb>file|skip)\s+(?P<arg>.*?)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    """One fenced block of a page: where it starts, its language, its text, and what the
    line before it says to do with it (``run``, ``file`` NAME, ``skip`` WHY)."""

    page: Path
    line: int
    lang: str
    text: str
    verb: str = "run"
    arg: str = ""

    @property
    def where(self) -> str:
        return f"{self.page.name}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The fenced blocks of ``page``, in order."""
    lines = page.read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opened = _FENCE.match(lines[i])
        if opened is None:
            i += 1
            continue
        indent, fence, lang = len(opened["indent"]), opened["fence"], opened["lang"].lower()
        start, body = i + 1, []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i][indent:] if lines[i][:indent].strip() == "" else lines[i])
            i += 1
        i += 1  # past the closing fence
        before = lines[start - 2] if start >= 2 else ""
        directive = _DIRECTIVE.match(before)
        verb, arg = (directive["verb"], directive["arg"]) if directive else ("run", "")
        found.append(Block(page, start, lang, "\n".join(body) + "\n", verb, arg))
    return found


def run_block(block: Block, directory: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    """Run ``block`` in ``directory`` (it must be a language of ``RUN``); its outcome."""
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
           "PYTHONUNBUFFERED": "1"}
    env.pop("PYTEST_XDIST_WORKER", None)
    env.pop("PYTEST_CURRENT_TEST", None)
    if RUN[block.lang] == "python":
        argv = [sys.executable, "-"]
    else:
        argv = ["bash", "-e", "-o", "pipefail", "-s"]
    return subprocess.run(argv, input=block.text, cwd=directory, env=env, capture_output=True, text=True,
                          timeout=timeout, start_new_session=True)

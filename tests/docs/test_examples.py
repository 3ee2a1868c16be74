"""Every example in README.md and the docs runs as written (``tests/docs/examples.py``): a
page's blocks in order, in a directory of its own; a block that cannot run here says why.

The examples start real jobs and pytest sessions, so they are ``slow``: CI runs them in a
step of their own, after the default run."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs.examples import RUN, blocks, run_block

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: seconds one block may take (a chaos run with its shrinking is the longest)
BLOCK_TIMEOUT = 240


def test_every_block_that_does_not_run_says_why():
    """A skipped block names its reason; a file block names its file; every runnable
    language runs (a typo'd directive would leave a block silently unrun)."""
    problems = []
    for page in PAGES:
        for block in blocks(page):
            if block.verb in ("skip", "file") and not block.arg:
                problems.append(f"{block.where}: example: {block.verb} with nothing after it")
            if block.verb == "file" and ("/" in block.arg or block.arg.startswith(".")):
                problems.append(f"{block.where}: example: file {block.arg!r} must be a plain file name")
    assert problems == []


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.relative_to(ROOT).as_posix())
def test_every_example_of_the_page_runs(page: Path, tmp_path: Path):
    ran = 0
    for block in blocks(page):
        if block.verb == "skip" or (block.verb == "run" and block.lang not in RUN):
            continue
        if block.verb == "file":
            (tmp_path / block.arg).write_text(block.text)
            continue
        try:
            done = run_block(block, tmp_path, BLOCK_TIMEOUT)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{block.where}: the {block.lang} block did not finish within {BLOCK_TIMEOUT} s:\n{block.text}")
        ran += 1
        assert done.returncode == 0, (f"{block.where}: the {block.lang} block exited {done.returncode}:\n"
                                      f"{block.text}\n--- its output ---\n{(done.stdout + done.stderr)[-4000:]}")
    if ran == 0:
        pytest.skip(f"{page.name} has no example to run")


def test_the_site_builds_strict_with_no_broken_link_or_anchor(tmp_path: Path):
    """``mkdocs build --strict``: a link to a page or an anchor that is not there fails."""
    if importlib.util.find_spec("mkdocs") is None:
        pytest.skip("no mkdocs installed (pip install -e '.[test]' installs it)")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "site" / "reference" / "faults" / "index.html").exists()

"""The docs site, looked at: built with ``mkdocs build`` and opened in headless Chromium
(``tests/browser.py``), the getting-started page shows the install and a first marked
test, and the faults reference shows every fault kind with where it runs. Skipped, saying
why, where mkdocs or Chromium is missing."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from tests.browser import CHROMIUM

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.skipif(CHROMIUM is None, reason="no chromium installed (.ci/run installs Debian's)"),
              pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None,
                                 reason="no mkdocs installed (pip install -e '.[test]' installs it)")]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    built = tmp_path_factory.mktemp("site")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--site-dir", str(built)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return built


def _text(browser, page: Path) -> str:
    browser.open(page)
    return str(browser.js("document.querySelector('article') ? document.querySelector('article').innerText "
                          ": document.body.innerText"))


def test_the_getting_started_page_shows_the_install_and_a_first_test(site: Path, browser):
    text = _text(browser, site / "getting-started" / "index.html")
    assert "pip install torch==2.13.0" in text
    assert "@pytest.mark.elastic" in text
    assert "--elastic-chaos" in text
    assert browser.js("document.querySelectorAll('nav a').length") > 5  # the site's navigation is there
    assert browser.js("document.title").startswith("Getting started")


def test_the_faults_reference_shows_every_kind_and_where_it_runs(site: Path, browser):
    from harness.sim.schema import FAULT_KINDS

    text = _text(browser, site / "reference" / "faults" / "index.html")
    for row in FAULT_KINDS.values():
        assert row.kind in text and row.cls in text, row.kind
    rows = browser.js("[...document.querySelectorAll('table')[0].querySelectorAll('tbody tr')]"
                      ".map(r => [...r.cells].map(c => c.innerText))")
    by_kind = {cells[0]: cells for cells in rows}
    assert by_kind["kill_node"][4] == "this machine, SSH hosts, Slurm"
    assert by_kind["down_node"][4] == "Slurm (capabilities slurm_admin)"

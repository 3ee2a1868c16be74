"""The report in a real browser: headless Chromium (Debian's, installed by ``.ci/run``)
driven over the DevTools protocol on ``--remote-debugging-pipe`` with the stdlib only.

Fails on any console error or uncaught exception; checks that lanes, markers and rounds
are in the DOM, that hovering a lane and clicking a fault show details, that zooming along
time keeps node labels in view and tooltips right, that the index sorts; saves screenshots.
Skipped, saying why, where no Chromium is installed.
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from bench.synth import synthetic_events
from pytest_elastic.report.index import COLUMNS, write_index
from pytest_elastic.report.page import write_html

CHROMIUM = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium installed (.ci/run installs Debian's)")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--remote-debugging-pipe"]


class Browser:
    """Chromium over a CDP pipe: commands on its fd 3, replies and events on its fd 4."""

    def __init__(self, profile: Path, width: int = 1400, height: int = 1000):
        to_child, self._out = os.pipe()
        self._in, from_child = os.pipe()

        def wire() -> None:  # in the child: its fds 3 and 4 are the pipe ends (dup2 clears CLOEXEC)
            read, write = os.dup(to_child), os.dup(from_child)  # out of the way of 3 and 4 first
            os.dup2(read, 3)
            os.dup2(write, 4)

        self.proc = subprocess.Popen(  # close_fds would close 3 and 4 after wire() ran
            [str(CHROMIUM), *FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}", "about:blank"],
            preexec_fn=wire, close_fds=False, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        os.close(to_child)
        os.close(from_child)
        self._buffer = b""
        self._id = 0
        self.events: list[dict] = []
        targets = self.call("Target.getTargets")["targetInfos"]
        page = next(t for t in targets if t["type"] == "page")
        self.session = self.call("Target.attachToTarget", targetId=page["targetId"], flatten=True)["sessionId"]

    def _read(self, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._in], [], [], left)[0]:
                raise TimeoutError(f"chromium sent nothing for {timeout:g}s")
            chunk = os.read(self._in, 1 << 20)
            if not chunk:
                raise ConnectionError(f"chromium closed its pipe (exit {self.proc.poll()})")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def call(self, method: str, session: bool = False, timeout: float = 30, **params: Any) -> dict:
        self._id += 1
        message: dict[str, Any] = {"id": self._id, "method": method, "params": params}
        if session:
            message["sessionId"] = self.session
        os.write(self._out, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._read(timeout)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def page(self, method: str, **params: Any) -> dict:
        return self.call(method, session=True, **params)

    def open(self, path: Path) -> None:
        for domain in ("Runtime.enable", "Log.enable", "Page.enable"):
            self.page(domain)
        self.page("Page.navigate", url=path.as_uri())
        deadline = time.monotonic() + 30
        while not any(e.get("method") == "Page.loadEventFired" for e in self.events):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{path} did not load within 30s")
            self.events.append(self._read(30))

    def js(self, expression: str) -> Any:
        result = self.page("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise AssertionError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def errors(self) -> list[str]:
        """Uncaught exceptions, console.error/assert calls and error-level log entries so far."""
        found = []
        for e in self.events:
            method, params = e.get("method"), e.get("params", {})
            if method == "Runtime.exceptionThrown":
                found.append(json.dumps(params["exceptionDetails"])[:400])
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                found.append(json.dumps(params.get("args"))[:400])
            elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
                found.append(params["entry"].get("text", "")[:400])
        return found

    def screenshot(self, path: Path) -> None:
        data = self.page("Page.captureScreenshot", format="png", captureBeyondViewport=False)["data"]
        path.write_bytes(base64.b64decode(data))

    def mouse(self, kind: str, x: float, y: float) -> None:
        self.page("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left" if kind != "mouseMoved" else "none",
                  clickCount=1 if kind != "mouseMoved" else 0)

    def close(self) -> None:
        try:
            self.call("Browser.close", timeout=10)
        except (TimeoutError, ConnectionError, RuntimeError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        finally:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)  # helpers (zygote, renderers) left behind
            except ProcessLookupError:
                pass
            os.close(self._out)
            os.close(self._in)


@pytest.fixture
def browser(tmp_path):
    b = Browser(tmp_path / "profile")
    try:
        yield b
    finally:
        b.close()


def _centre(browser: Browser, selector: str) -> tuple[float, float]:
    box = browser.js(f"(()=>{{const r=document.querySelector({json.dumps(selector)}).getBoundingClientRect();"
                     "return [r.x+r.width/2,r.y+r.height/2];})()")
    return box[0], box[1]


def test_page_in_chromium_has_lanes_markers_and_working_details(browser, tmp_path):
    page = tmp_path / "job.html"
    events = synthetic_events(nodes=40, nproc=2, duration=600, faults=100, int_nodes=True)
    write_html(str(page), "40 nodes, 10 minutes, 100 faults", events, nproc=2)
    browser.open(page)
    counts = browser.js("({lanes:document.querySelectorAll('svg#timeline .lane').length,"
                        "markers:document.querySelectorAll('svg#timeline .fault-marker').length,"
                        "rounds:document.querySelectorAll('svg#timeline .round').length,"
                        "dead:document.querySelectorAll('svg#timeline .dead').length,"
                        "steps:document.querySelectorAll('svg#steps .step-line').length,"
                        "legend:!!document.getElementById('legend')})")
    faults = sum(1 for e in events if e["kind"] == "fault" and e["fault"] != "heal")
    assert counts["lanes"] == 40 and counts["markers"] == faults and counts["legend"]
    assert counts["rounds"] > 50 and counts["dead"] >= 1 and counts["steps"] == 80
    x, y = _centre(browser, "svg#timeline .lane rect.row")
    browser.mouse("mouseMoved", x, y)
    tip = browser.js("(()=>{const t=document.getElementById('tip');return [t.style.display,t.textContent];})()")
    assert tip[0] == "block" and "host-00" in tip[1], tip
    x, y = _centre(browser, "svg#timeline .fault-marker")
    browser.mouse("mousePressed", x, y)
    browser.mouse("mouseReleased", x, y)
    assert '"fault":' in browser.js("document.getElementById('details').textContent")
    browser.screenshot(tmp_path / "report.png")
    assert (tmp_path / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    x, y = _centre(browser, ".zoomctl button[data-z='8']")
    browser.mouse("mousePressed", x, y)
    browser.mouse("mouseReleased", x, y)
    zoomed = browser.js("(()=>{const s=document.getElementById('timeline'),b=s.parentNode;b.scrollLeft=3000;"
                        "b.dispatchEvent(new Event('scroll'));return [s.getAttribute('width'),"
                        "s.querySelector('g.labels').getAttribute('transform'),"
                        "s.querySelector('.fault-marker').getAttribute('transform')];})()")
    assert zoomed[0] == str(150 + 1200 * 8 + 20) and zoomed[1].startswith("translate(3000") and zoomed[2], zoomed
    _, y = _centre(browser, "svg#timeline .lane rect.row")
    browser.mouse("mouseMoved", 700, y)  # still a tooltip for what is under the mouse, zoomed and scrolled
    assert "host-00" in browser.js("document.getElementById('tip').textContent")
    browser.screenshot(tmp_path / "report-zoomed.png")
    assert browser.errors() == []


def test_index_in_chromium_sorts_and_links(browser, tmp_path):
    class Settings:
        chaos, seed = True, 7

    stats = [{"elastic_test": f"t.py::test_{n}", "elastic_outcome": outcome, "elastic_fault_count": faults,
              "elastic_faults": "worker_kill", "elastic_restarts": faults, "elastic_detection_latencies": [0.1],
              "elastic_recovery_latencies": [0.3 * faults], "elastic_seed": 7, "elastic_replay": "pytest x",
              "elastic_pages": [f"test_{n}.job0.html"]}
             for n, outcome, faults in (("b", "passed", 3), ("a", "failed", 1), ("c", "passed", 2))]
    index = Path(write_index(str(tmp_path), stats, ["elastic tests: 3"], Settings()))
    browser.open(index)
    first = "document.querySelector('#tests tbody tr td a').textContent"
    assert browser.js(first) == "t.py::test_a"  # failed first
    x, y = _centre(browser, f"th[data-k='{COLUMNS.index('faults')}']")
    browser.mouse("mousePressed", x, y)
    browser.mouse("mouseReleased", x, y)
    assert browser.js(first) == "t.py::test_a"  # fewest faults first
    browser.mouse("mousePressed", x, y)
    browser.mouse("mouseReleased", x, y)
    assert browser.js(first) == "t.py::test_b"
    browser.screenshot(tmp_path / "index.png")
    assert browser.errors() == []

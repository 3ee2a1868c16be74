"""Headless Chromium (Debian's, installed by ``.ci/run``) driven over the DevTools protocol
on ``--remote-debugging-pipe`` with the standard library only: what the tests of the HTML
report and of the docs site open their pages in. ``CHROMIUM`` is None where none is
installed (the tests then skip, saying why); the ``browser`` fixture is in
``tests/conftest.py``.
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

CHROMIUM = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
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

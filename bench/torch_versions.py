"""The torch versions we claim, checked: a venv per version, the main job and the differential
tests run in each, against torchrun of the same version.

``pyproject.toml`` claims ``torch>=2.4``; the suite runs on one version. This builds (once,
then reuses) a venv per version under ``--venvs``, installs that torch and this checkout
into it (``pip install -e '.[test]'``: the torch already there satisfies the claim, so pip
keeps it), and runs in it:

* **the main job**, as README.md gives it: the bundled scenarios with every chaos kind;
* **the differential tests**: everything marked ``torchrun`` (the same script under torch's
  ``torchrun`` of that venv and under ``elastic-run``, compared), and the tests that speak
  torch's own wire and files (``tests/rendezvous``: the TCPStore client and server against
  torch's; ``tests/timer``: the expiration timers' FIFO both ways).

It prints one row per version and step: passed, failed, skipped, seconds, and the first
failures' lines (each step's whole output is kept beside the venvs). The default versions
are the oldest the claim admits (its newest patch release) and the newest the package index
serves; ``--with-current`` adds this interpreter's own environment.

    python bench/torch_versions.py                       # 2.4.1 and the newest served
    python bench/torch_versions.py --versions 2.9.1      # any others
    python bench/torch_versions.py --steps differential  # one step

A torch from PyPI is a CUDA build (its NVIDIA libraries come with it, several GB a venv); it
runs on the CPU. A machine whose pip caps torch (a ``constraint`` in its pip config) refuses
a newer one: run with ``PIP_CONFIG_FILE=/dev/null`` to install from the index as is.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import print_table  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
OLDEST_CLAIMED = "2.4.1"  # pyproject.toml: torch>=2.4, its newest patch release
STEPS = {
    "main": ["scenarios", "--elastic-chaos", "--elastic-faults=all", "-n", "2"],
    "differential": ["-m", "torchrun or not slow", "tests/differential", "tests/rendezvous", "tests/timer",
                     "tests/runtime/test_oom.py", "-n", "2"],
}
SUMMARY = re.compile(r"^=*\s*(\d+ (?:passed|failed|skipped|errors?|deselected|xfailed|xpassed|warnings?)\b.*?) in "
                     r"([\d.]+)s", re.MULTILINE)  # pytest's last line: "3 passed, 1 skipped in 9.1s"


def newest_served(python: str) -> str:
    """The newest torch release the package index lists (``pip index versions torch``)."""
    out = subprocess.run([python, "-m", "pip", "index", "versions", "torch"], capture_output=True, text=True,
                         check=True).stdout
    match = re.search(r"torch \(([^)]+)\)", out)
    if not match:
        raise SystemExit(f"torch_versions: pip index versions torch printed no version: {out.strip()[:200]}")
    return match.group(1)


def venv_for(version: str, venvs: Path) -> Path:
    """The venv of ``version``, made and filled once (a second run reuses it)."""
    home = venvs / f"torch-{version}"
    python = home / "bin" / "python"
    ready = home / ".pytest-elastic-ready"
    if ready.exists():
        return python
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(home)], check=True)
    for what in ([f"torch=={version}", "numpy"], ["-e", f"{REPO}[test]"]):
        started = time.monotonic()
        print(f"torch {version}: pip install {' '.join(what)}", file=sys.stderr, flush=True)
        done = subprocess.run([str(python), "-m", "pip", "install", "-q", *what], capture_output=True, text=True)
        if done.returncode != 0:
            last = [line for line in done.stderr.splitlines() if line.strip() and "WARNING: Location" not in line]
            raise SystemExit(f"torch_versions: torch {version}: pip install {' '.join(what)} failed: "
                             f"{last[-1] if last else done.returncode}")
        print(f"torch {version}: installed in {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    installed = subprocess.run([str(python), "-c", "import torch; print(torch.__version__)"], capture_output=True,
                               text=True, check=True).stdout.strip()
    if installed.split("+")[0] != version:
        raise SystemExit(f"torch_versions: the venv for {version} has torch {installed} (pip replaced it)")
    ready.write_text(installed + "\n")
    return python


def run_step(python: Path, step: str, timeout: float, log: Path) -> tuple[str, str, str, str, str]:
    """(passed, failed, skipped, seconds, first failures) of one step in one venv; its whole
    output goes to ``log``."""
    started = time.monotonic()
    env = {**os.environ, "PATH": f"{python.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    try:
        done = subprocess.run([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                               *STEPS[step]], cwd=REPO, capture_output=True, text=True, timeout=timeout, env=env)
        out = done.stdout + done.stderr
    except subprocess.TimeoutExpired as e:
        out = f"{e.stdout or ''}\ntimed out after {timeout:.0f} s"
    seconds = f"{time.monotonic() - started:.0f}"
    log.write_text(out)
    counts = dict.fromkeys(("passed", "failed", "skipped", "error"), 0)
    summary = SUMMARY.findall(out)
    for count, what in re.findall(r"(\d+) (passed|failed|skipped|errors?)", summary[-1][0] if summary else ""):
        counts["error" if what.startswith("error") else what] += int(count)
    failures = [line for line in out.splitlines() if line.startswith(("FAILED ", "ERROR "))]
    shown = "; ".join(line[:160] for line in failures[:3]) + (f" (+{len(failures) - 3})" if len(failures) > 3 else "")
    if not summary:
        shown = out.strip().splitlines()[-1][:200] if out.strip() else "no output"
    return (str(counts["passed"]), str(counts["failed"] + counts["error"]), str(counts["skipped"]), seconds,
            shown or "-")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--versions", nargs="+", help=f"torch versions (default: {OLDEST_CLAIMED} and the newest "
                        "the index serves)")
    parser.add_argument("--venvs", type=Path, default=Path.home() / ".cache" / "pytest-elastic" / "torch-venvs",
                        help="where the venvs are made and kept (default: %(default)s)")
    parser.add_argument("--steps", nargs="+", choices=sorted(STEPS), default=["main", "differential"])
    parser.add_argument("--timeout", type=float, default=1200.0, help="seconds a step may take (default 1200)")
    parser.add_argument("--with-current", action="store_true",
                        help="run the steps in this interpreter's environment too (the torch it has)")
    opts = parser.parse_args()
    versions = opts.versions or [OLDEST_CLAIMED, newest_served(sys.executable)]
    opts.venvs.mkdir(parents=True, exist_ok=True)
    pythons = [(version, venv_for(version, opts.venvs)) for version in versions]
    if opts.with_current:
        current = subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__)"],
                                 capture_output=True, text=True, check=True).stdout.strip()
        pythons.append((current, Path(sys.executable)))
    rows = []
    for version, python in pythons:
        for step in opts.steps:
            print(f"torch {version}: {step} ...", file=sys.stderr, flush=True)
            log = opts.venvs / f"torch-{version}-{step}.log"
            passed, failed, skipped, seconds, first = run_step(python, step, opts.timeout, log)
            rows.append([version, step, passed, failed, skipped, seconds, first])
            print(f"torch {version}: {step}: {passed} passed, {failed} failed in {seconds} s (output: {log})",
                  file=sys.stderr, flush=True)
    print_table(["torch", "step", "passed", "failed", "skipped", "s", "first failures"], rows)
    sys.exit(1 if any(row[3] != "0" for row in rows) else 0)


if __name__ == "__main__":
    main()

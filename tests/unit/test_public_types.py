"""``py.typed`` promises types: a user's file that uses the public API is checked by mypy.

With ``harness.Cluster`` resolved only by a module ``__getattr__``, a type checker saw
``Any`` and passed every misuse; the package's ``TYPE_CHECKING`` imports fix that. The test
runs mypy as a user would, on a file outside the repo, against the installed package: the
good file passes, and the same file with one misuse fails on exactly that line.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("mypy", reason="mypy is in the test extra; install it to check the public types")

USER_FILE = textwrap.dedent("""\
    import harness
    from harness import Cluster, ElasticError, JobResult, WorkerState
    from harness.faults import AtStep, WorkerCrash

    def run(script: str) -> bool:
        try:
            with Cluster(nnodes="1:2", nproc_per_node=2, max_restarts=1) as cluster:
                job = cluster.launch(script, "--steps", "5")
                job.inject(WorkerCrash(node=0, local_rank=1), AtStep(step=2, rank=1))
                job.kill_worker(node=0, local_rank=1)
                job.partition(node=1, peers="store")
                added: int = job.add_node()
                result: JobResult = job.wait(timeout=60)
                return result.state == WorkerState.SUCCEEDED
        except ElasticError:
            return False

    pool: harness.WarmPool | None = None
    """)

MISUSE = "    cluster_count: int = Cluster.no_such_thing\n"
#: the public fault methods are the parts' own, handed on: typed as written there
FAULT_MISUSE = "    harness.Job.kill_worker(job, node=0, local_rank=1)\n    job.slow_node(node=0, cpu='a lot')\n"


def _mypy(tmp_path: Path, source: str) -> subprocess.CompletedProcess[str]:
    """mypy on ``source`` as a file of the user's, seeing the ``harness`` this interpreter imports.

    An editable install is found through an import hook mypy cannot follow, so the package's
    parent directory is given as ``MYPYPATH`` (a regular install is found in site-packages).
    ``harness`` must be found: no ``--ignore-missing-imports`` for it, or Any would pass all.
    """
    import harness

    user = tmp_path / "user_job.py"
    user.write_text(source)
    env = {**os.environ, "MYPYPATH": str(Path(harness.__file__).parent.parent)}
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--no-error-summary", "--cache-dir", str(tmp_path / ".mypy_cache"),
         "--follow-imports=silent", "--python-version=3.10", str(user)],
        capture_output=True, text=True, cwd=tmp_path, timeout=240, env=env,
    )


def test_a_user_file_is_type_checked_against_the_real_classes(tmp_path):
    good = _mypy(tmp_path, USER_FILE)
    assert good.returncode == 0, good.stdout + good.stderr
    bad = _mypy(tmp_path, USER_FILE + "\n\ndef misuse(job: harness.Job) -> None:\n" + MISUSE + FAULT_MISUSE)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert '"type[Cluster]" has no attribute "no_such_thing"' in bad.stdout, bad.stdout
    assert 'Argument "cpu" has incompatible type "str"; expected "float"' in bad.stdout, bad.stdout
    assert bad.stdout.count("error:") == 2, bad.stdout  # the class-level call, typed, is fine

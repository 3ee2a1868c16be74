"""``harness.run.main(argv)`` from Python behaves like ``torch.distributed.run.main``;
``elastic-run`` (``harness.run.cli``) keeps one-line errors; ``--logs-specs`` plugins and
torch-shaped ``LogsSpecs`` objects work."""

from __future__ import annotations

import os
import sys
import textwrap

import pytest

import harness.run as ours
from harness.errors import ChildFailedError
from tests.conftest import SCRIPTS, run_elastic


@pytest.mark.parametrize("argv", [
    ["--no-python", "--module", "x"],
    ["--nproc-per-node=unknown", str(SCRIPTS / "sleeper.py")],
    ["--nnodes=2:20:30", str(SCRIPTS / "sleeper.py")],
])
def test_bad_input_raises_what_torch_raises(argv):
    import torch.distributed.run as theirs

    with pytest.raises(Exception) as torch_error:
        theirs.main(argv)
    with pytest.raises(type(torch_error.value)):
        ours.main(argv)


def test_failed_workers_raise_child_failed_error():
    with pytest.raises(ChildFailedError) as e:
        ours.main(["--standalone", "--nproc-per-node=1", str(SCRIPTS / "always_fail.py")])
    assert len(e.value.failures) == 1


def test_console_script_keeps_one_line_errors():
    out = run_elastic("--nproc-per-node=unknown", str(SCRIPTS / "sleeper.py"))
    assert out.returncode == 1
    assert out.stderr.strip().splitlines()[-1].startswith("elastic-run: error: nproc_per_node=")
    assert "Traceback" not in out.stderr


def test_malformed_endpoint_is_one_line_for_single_node_c10d():
    out = run_elastic("--nnodes=1", "--rdzv-backend=c10d", "--rdzv-endpoint=notaport:xyz",
                      str(SCRIPTS / "sleeper.py"))
    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == [
        line for line in out.stderr.strip().splitlines() if "OMP_NUM_THREADS" in line
    ] + ["elastic-run: error: rdzv_endpoint='notaport:xyz' port 'xyz' in 'notaport:xyz' is not in "
         "0..65535 (from --rdzv-endpoint)"]


PLUGIN = '''
from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs


class MarkedLogs(DefaultLogsSpecs):
    """torch's default layout, plus a marker file that proves it was used."""

    def reify(self, envs):
        dest = super().reify(envs)
        with open(self.root_log_dir + "/plugin_was_used", "w") as fp:
            fp.write(envs[0]["TORCHELASTIC_RUN_ID"])
        return dest
'''


@pytest.fixture
def logs_plugin(tmp_path):
    """An installed ``torchrun.logs_specs`` entry point named ``marked`` (a dist-info dir
    on the path: what ``pip install`` of a plugin leaves)."""
    site = tmp_path / "site"
    info = site / "marked_logs-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: marked-logs\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[torchrun.logs_specs]\nmarked = marked_logs:MarkedLogs\n")
    (site / "marked_logs.py").write_text(textwrap.dedent(PLUGIN))
    return {"PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}


def test_logs_specs_entry_point_is_loaded(tmp_path, logs_plugin):
    log_dir = tmp_path / "logs"
    out = run_elastic("--standalone", "--nproc-per-node=2", "--redirects=3", f"--log-dir={log_dir}",
                      "--logs-specs=marked", str(SCRIPTS / "env_dump.py"), env=logs_plugin)
    assert out.returncode == 0, out.stderr
    assert (log_dir / "plugin_was_used").exists()
    (run_dir,) = (p for p in log_dir.iterdir() if p.is_dir())
    for rank in (0, 1):
        assert "ENV " in (run_dir / "attempt_0" / str(rank) / "stdout.log").read_text()


def test_unknown_logs_specs_is_one_line(logs_plugin):
    out = run_elastic("--standalone", "--logs-specs=nosuch", str(SCRIPTS / "sleeper.py"), env=logs_plugin)
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("elastic-run: error: logs_specs='nosuch' is not a 'torchrun.logs_specs'")
    assert "marked" in last


def test_torch_default_logs_specs_object_works_with_our_agent(tmp_path):
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std

    from harness.run import LaunchConfig, launch_agent

    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=2, rdzv_backend="c10d",
                          rdzv_endpoint="localhost:0", run_id="logs", max_restarts=0,
                          logs_specs=DefaultLogsSpecs(log_dir=str(tmp_path), redirects=Std.ALL))
    launch_agent(config, sys.executable, ["-c", "import os; print('hello', os.environ['RANK'])"])
    (run_dir,) = tmp_path.iterdir()
    for rank in (0, 1):
        assert (run_dir / "attempt_0" / str(rank) / "stdout.log").read_text() == f"hello {rank}\n"

"""Each environment variable name is defined once in the runtime and the simulation
("one of each"): a module-level ``NAME = "HARNESS_..."`` (or ``TORCHELASTIC_``,
``PET_``, ``TORCH_``) string constant appears in one module only; others import it.

``pytest_elastic`` is left out on purpose: importing the plugin loads nothing of the engine
but the error root, so it spells ``HARNESS_STACK_DUMP_DIR`` itself, pinned equal to the
runtime's by ``tests/plugin/test_timeout.py``."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from pytest_elastic._reference import environment_variables

ROOT = Path(__file__).resolve().parents[2]


def env_constants(root: Path) -> dict[str, set[str]]:
    """Env-variable name -> the modules that define a module-level constant with it."""
    found: dict[str, set[str]] = defaultdict(set)
    for name, module, _ in environment_variables(root):
        found[name].add(module)
    return found


def test_each_environment_variable_name_is_defined_once():
    twice = {name: sorted(modules) for name, modules in env_constants(ROOT / "harness").items() if len(modules) > 1}
    assert twice == {}


def test_the_check_sees_a_second_definition(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text('X_ENV = "HARNESS_THING"\n')
    (tmp_path / "pkg" / "b.py").write_text('Y = "HARNESS_THING"\nZ = "not an env name"\n')
    assert {k: len(v) for k, v in env_constants(tmp_path / "pkg").items()} == {"HARNESS_THING": 2}

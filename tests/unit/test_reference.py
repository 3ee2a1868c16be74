"""The reference pages under ``docs/reference/`` are generated from the code
(``pytest_elastic._reference``) and committed: a page that differs from what the code
generates now fails here, naming the command that brings it back in line."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_elastic._reference import PAGES, generate

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "reference"


@pytest.mark.parametrize("name", sorted(PAGES))
def test_the_committed_reference_is_what_the_code_generates(name):
    committed = (REFERENCE / name).read_text() if (REFERENCE / name).exists() else ""
    assert committed == generate()[name], (
        f"docs/reference/{name} is not what the code says: run python -m pytest_elastic._reference")


def test_the_reference_names_every_setting_keyword_and_fault_kind():
    """Each row of the code's tables is on its page (a generator that dropped one would
    still equal its own output)."""
    from harness.sim import schema
    from pytest_elastic._options import OPTIONS

    pages = generate()
    for row in OPTIONS:
        assert f"`{row.flag}` | `{row.env}`" in pages["options.md"]
    for key in schema.MARKER_OPTIONS:
        assert f"| `{key.name}` |" in pages["options.md"]
    for key in (*schema.SCENARIO_JOB_OPTIONS, *schema.EXPECT_KEYS):
        assert f"| `{key.name}` |" in pages["scenarios.md"]
    for row in schema.FAULT_KINDS.values():
        assert f"## `{row.kind}`" in pages["faults.md"] and f"`{row.cls}`" in pages["faults.md"]
        for param in row.params:
            assert f"| `{param.name}` |" in pages["faults.md"]


def test_every_environment_variable_of_the_runtime_says_what_it_is():
    """Each is a module-level constant with a ``#:`` comment above it (or one after it):
    the reference's row is that comment."""
    from pytest_elastic._reference import environment_variables

    found = environment_variables()
    assert {"HARNESS_SHARED_DIR", "TORCHELASTIC_ENABLE_FILE_TIMER"} <= {name for name, _, _ in found}
    assert [name for name, _, what in found if not what] == []

"""What a user reads tells them about the code as it is: no journal words in the code, its
docs or its messages (a tracker's issue number, a "slice" of the work, a "session N"), the
history kept in ``CHANGELOG.md`` alone; and the license the metadata names is a file in
the repository and in the distribution."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[2]

#: the words of a work journal, not of the code: a tracker's issue number ("issue 26",
#: "issues 18 and 28"), a numbered session, a stage of the work ("the second slice")
JOURNAL = re.compile(r"\bissues? \d+|\bsession \d+\b|\b(?:this|next|first|second|third|last|previous|earlier|"
                     r"later) slices?\b|\bslices? \d", re.IGNORECASE)
#: where the history belongs
HISTORY = {"CHANGELOG.md"}
SUFFIXES = {".py", ".md", ".toml", ".txt", ".cfg", ".yml", ".yaml", ".sh", ".html", ".js", ".css"}


def _tracked() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    return [ROOT / name for name in listed if name and (ROOT / name).is_file()
            and (Path(name).suffix in SUFFIXES or name == ".ci/run") and name not in HISTORY]


def test_no_journal_words_in_the_code_its_docs_or_its_messages():
    found = []
    for path in _tracked():
        if path.resolve() == Path(__file__).resolve():
            continue  # the words' own examples
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            match = JOURNAL.search(line)
            if match:
                found.append(f"{path.relative_to(ROOT)}:{number}: {match.group(0)!r} in {line.strip()[:100]}")
    assert found == [], "journal words (the history goes to CHANGELOG.md):\n" + "\n".join(found)


@pytest.mark.parametrize("line, journal", [
    ("a fix (issue 26) for the lease", True),
    ("Issues 18 and 28 asked for these", True),
    ("measured in session 9", True),
    ("what the second slice provides", True),
    ("each node gets a GPU slice of its own", False),
    ("a slice of the file replaced by garbage", False),
    ("an issue with the store", False),
])
def test_the_journal_words_are_told_from_the_codes_own(line, journal):
    assert bool(JOURNAL.search(line)) is journal


def test_the_license_the_metadata_names_is_a_file_here_and_in_the_distribution():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "BSD-3-Clause" and project["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("BSD 3-Clause License") and "Neither the name of the copyright holder" in text
    metadata = importlib.metadata.metadata("pytest-elastic")
    assert metadata["License-Expression"] == "BSD-3-Clause"
    assert "LICENSE" in (metadata.get_all("License-File") or [])
    assert (ROOT / "CHANGELOG.md").read_text().startswith("# Changelog")

"""The fuzz targets' counts travel as the report's user_properties ("fuzz"), so they
reach the xdist controller; ``tests/conftest.py`` (loaded there, unlike this file) shows
them in the terminal summary: every run says how many inputs it tried, with which seed."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

from tests.fuzz._bad import SUMMARY


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: Any) -> Generator[None, Any, None]:
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and SUMMARY:
        report.user_properties.extend(("fuzz", line) for line in SUMMARY)
        SUMMARY.clear()

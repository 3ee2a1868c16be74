"""Repo-level test setup: pytester for plugin tests."""

pytest_plugins = ["pytester"]

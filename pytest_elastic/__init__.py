"""pytest-elastic: the pytest face of the harness (marker, fixtures, chaos, scenarios)."""

__all__: list[str] = []

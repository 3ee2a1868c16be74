"""The etcd server of tests/rendezvous, shared with the upstream-derived tests."""

from tests.rendezvous.conftest import etcd_endpoint  # noqa: F401  (a fixture)

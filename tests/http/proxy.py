"""The proxy moved to tests/proxy.py (the cluster tests use it too); kept importable here."""

from tests.proxy import Proxy

__all__ = ["Proxy"]

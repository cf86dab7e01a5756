"""The cluster tests' fixtures (``spawn``, ``records_path``) live in tests/conftest.py."""

from __future__ import annotations

from tests.conftest import Spawn

__all__ = ["Spawn"]

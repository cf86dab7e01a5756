"""Benchmarks: ``python -m bench.run`` (docs/explanation/benchmark.md)."""

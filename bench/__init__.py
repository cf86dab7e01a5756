"""Benchmarks: ``python -m bench.run`` (README, "Benchmark")."""

"""Benchmark scripts, each run as `python -m bench.<name>`; figures go to BENCHMARKS.md."""

"""Benchmarks: each `bench_*.py` module measures us against a peer in the same run."""

"""Benchmarks. Each `bench_*.py` module measures us against a peer in the same run and prints ratios."""

"""Benchmarks: scaling sweeps (bench.run, bench.scaling) and side-by-side peers (bench.textbook_sparse)."""

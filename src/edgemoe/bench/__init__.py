"""Benchmarks: JSON results and PNG plots under bench/results/."""

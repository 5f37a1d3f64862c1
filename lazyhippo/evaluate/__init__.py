"""Measuring the index: the graph audit, quality measures behind the asset checks, and the benchmarks."""

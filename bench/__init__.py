"""Benchmarks: side-by-side measurements printed as ratios (never timed test assertions)."""

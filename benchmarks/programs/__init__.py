"""Child programs the benchmarks start as separate processes."""

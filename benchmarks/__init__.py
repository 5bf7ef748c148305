"""Benchmarks for the sidecar: idle cost, trigger latency, save stall, registry scale.

Run them all with `bin/bench` (or `python -m benchmarks.run`); each module also
runs alone: `python -m benchmarks.overhead --quick`. Every number is a median
over repeats, next to a baseline measured in the same run; nothing asserts a
time. See benchmarks/run.py for the table.
"""

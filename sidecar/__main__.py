"""`python -m sidecar ...` is the `cosmos-profiler` CLI."""

from sidecar.cli import main

main(prog_name="cosmos-profiler")

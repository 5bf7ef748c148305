"""The one CLI of the project (`cosmos-profiler`, `python -m sidecar`).

    app      the click group and its commands: parse, call one library function, render
    params   click plumbing: the commands' error handling, the rank-list type, the shared options
    errors   which library error becomes which exit code and JSON `code`; CliError
    render   tables, `--json` and each command's lines; render_traces (saved traces) and
             render_hang (`profile hang`) the same for theirs; render_refusal what a refusal
             says and what to do next

The Cosmos-RL stand-in's `cosmos_rl/cli/cli.py` is a face over this same
`cosmos` group. Importing this package never imports torch.
"""

from sidecar.cli.app import cosmos, main
from sidecar.cli.render import format_table

__all__ = ["cosmos", "format_table", "main"]

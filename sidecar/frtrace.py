"""torch's own flight recorder analysis over one dump folder, as one JSON object on stdout.

    python -m sidecar.frtrace DIR

DIR holds one flight recorder pickle per rank (`<replica>_fr_trace/<request>/<recorder>/`,
written by `sidecar.rank.flightrec.write_fr_trace`). This runs what
`python -m torch.distributed.flight_recorder.fr_trace DIR --allow-incomplete-ranks` runs,
imported from torch (`components.loader.read_dir`, `components.builder.build_db`), never copied:
it matches each rank's collectives across ranks per process group (coalesced groups, p2p, and
the first collective where not every rank joined or where the ranks disagree). Its own report
(the lines fr_trace prints) is kept under "printed".

`sidecar.fleet.torch_fr` runs this in a process of its own: the CLI never imports torch. The
answer is {"available": false, "reason"} on a torch without `torch.distributed.flight_recorder`;
{"available": true, "ok": false, "error"} when torch's analysis failed; else "ranks" (those
with a dump), "matched" (collectives every member joined alike) and "findings", one per
collective fr_trace flags. Never raises, exits 0.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import sys
from typing import Any

MAX_PRINTED_CHARS = 20000


def analyze_dir(trace_dir: str) -> dict[str, Any]:
    """torch's fr_trace on `trace_dir` (see the module docstring). Never raises."""
    try:
        from torch.distributed.flight_recorder.components.builder import build_db
        from torch.distributed.flight_recorder.components.config_manager import JobConfig
        from torch.distributed.flight_recorder.components.loader import read_dir
    except ImportError as exc:
        return {"available": False, "reason": f"this torch ({_torch_version()}) has no "
                                              f"torch.distributed.flight_recorder: {exc}"}
    printed = io.StringIO()
    handler = logging.StreamHandler(printed)
    handler.setFormatter(logging.Formatter("%(message)s"))
    fr_log = logging.getLogger("Flight Recorder")
    fr_log.addHandler(handler)
    try:
        with contextlib.redirect_stdout(printed):
            fr_log.propagate = False
            for other in list(fr_log.handlers):  # fr_trace's own handler writes to stderr: ours says it once
                if other is not handler:
                    fr_log.removeHandler(other)
            args = JobConfig().parse_args([trace_dir, "--allow-incomplete-ranks"])
            details, version = read_dir(args)
            ranks = sorted(int(d["rank"]) for d in details.values())
            db = build_db(details, args, version)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - torch's analysis failing is an answer too
        return {"available": True, "ok": False, "error": f"{type(exc).__name__}: {exc}",
                "printed": printed.getvalue()[-MAX_PRINTED_CHARS:]}
    findings = [_finding(c) for c in db.collectives if c.missing_ranks or c.mismatch_collectives or not c.pass_check]
    return {"available": True, "ok": True, "version": version, "ranks": ranks,
            "matched": len(db.collectives) - len(findings), "findings": findings,
            "printed": printed.getvalue()[-MAX_PRINTED_CHARS:]}


def _finding(c: Any) -> dict[str, Any]:
    name, _, desc = str(c.pg_desc).partition(":")
    mismatched = sorted(int(r) for r in (c.mismatch_collectives or {}))
    return {"process_group": name, "desc": desc, "seq": c.collective_seq_id, "p2p_seq": c.p2p_seq_id,
            "op": c.collective_name, "input_sizes": _plain(c.input_sizes), "output_sizes": _plain(c.output_sizes),
            "expected_ranks": sorted(c.expected_ranks or ()), "missing_ranks": sorted(c.missing_ranks or ()),
            "mismatched_ranks": mismatched, "mismatch": str(c.type_of_mismatch) if c.type_of_mismatch else None,
            "state": c.collective_state}


def _plain(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def _torch_version() -> str:
    try:
        import torch

        return str(torch.__version__)
    except ImportError:
        return "not installed"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(json.dumps({"available": False, "reason": "usage: python -m sidecar.frtrace DIR"}))
        return 0
    print(json.dumps(analyze_dir(args[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main())

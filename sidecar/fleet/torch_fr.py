"""torch's flight recorder analysis (fr_trace) for `profile hang`, run beside ours.

Each rank that answers a hang request also writes its recorders as torch's fr_trace reads them
(`sidecar.rank.flightrec.write_fr_trace`), one folder per request and recorder. Here that
folder is handed to `python -m sidecar.frtrace` (torch's loader and builder, imported there:
this side never imports torch) with the CLI's own Python, and the answer is read back:
per collective that fr_trace flags, the ranks that did not join it and the ranks that
disagree. `sidecar.fleet.hang` takes the suspects from it where it names them.

Where this Python has no torch, or a torch without `torch.distributed.flight_recorder`, nothing
is run and `TorchAnalysis.reason` says why; `profile hang` then works from its own analysis.
Standard library only.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FR_TRACE_MODULE = "torch.distributed.flight_recorder.fr_trace"
RUNNER_MODULE = "sidecar.frtrace"
# Importing torch takes seconds on a loaded machine; fr_trace over 2000 entries a rank, a few more.
DEFAULT_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class TorchFinding:
    """One collective torch's fr_trace flags: not every member joined it, or the members disagree."""

    recorder: str  # "cpu" | "nccl"
    process_group: str  # the pg name, as ours: "0"
    desc: str
    seq: int
    op: str
    missing_ranks: list[int]  # members with a dump that did not join
    mismatched_ranks: list[int]  # members that joined another collective (type, sizes, dtypes, state)
    mismatch: str | None  # fr_trace's words for what disagrees
    input_sizes: Any = None

    @property
    def key(self) -> str:
        """Our process group key: "<recorder>:<pg name>"."""
        return f"{self.recorder}:{self.process_group}"

    @property
    def ranks(self) -> list[int]:
        return sorted(set(self.missing_ranks) | set(self.mismatched_ranks))


@dataclass
class TorchAnalysis:
    """What torch's fr_trace said on this request's dumps, or why it was not run."""

    ran: bool  # fr_trace ran and answered
    reason: str = ""  # why not, when it did not run or failed
    commands: list[str] = field(default_factory=list)  # to run it by hand on the same dumps
    directories: dict[str, str] = field(default_factory=dict)  # recorder -> the folder
    ranks: dict[str, list[int]] = field(default_factory=dict)  # recorder -> the ranks with a dump there
    matched: int = 0  # collectives every member joined alike
    findings: list[TorchFinding] = field(default_factory=list)
    printed: str = ""  # fr_trace's own report

    def finding(self, key: str, seq: int) -> TorchFinding | None:
        return next((f for f in self.findings if f.key == key and f.seq == seq), None)


def unavailable() -> str | None:
    """Why this Python cannot run torch's fr_trace, without importing torch; None when it can."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return f"torch is not installed in this Python ({sys.executable}), so torch's fr_trace was not run"
    base = Path(next(iter(spec.submodule_search_locations)))
    if not (base / "distributed" / "flight_recorder" / "components" / "builder.py").is_file():
        return (f"the torch in {base} has no torch.distributed.flight_recorder, "
                "so torch's fr_trace was not run")
    return None


def fr_trace_command(directory: str, incomplete: bool) -> str:
    """The command a person runs on the same dumps."""
    extra = " --allow-incomplete-ranks" if incomplete else ""
    return f"python -m {FR_TRACE_MODULE} {shlex.quote(directory)}{extra}"


def directories(files: Mapping[int, Mapping[str, str]]) -> tuple[dict[str, str], str]:
    """Per recorder, the one folder the ranks' fr_trace files are in ({rank: {recorder: file}});
    or why there is none ("" when there is)."""
    found: dict[str, set[str]] = {}
    for per_rank in files.values():
        for recorder, path in per_rank.items():
            found.setdefault(recorder, set()).add(str(Path(path).parent))
    split = {r: sorted(d) for r, d in found.items() if len(d) > 1}
    if split:
        recorder, dirs = next(iter(split.items()))
        return {}, (f"the ranks wrote their {recorder} dumps to {len(dirs)} folders ({', '.join(dirs)}): "
                    "fr_trace reads one; copy them into one folder and run it by hand")
    if not found:
        return {}, "no rank wrote a dump for torch's fr_trace (no flight recorder data, or an older sidecar)"
    return {r: next(iter(d)) for r, d in sorted(found.items())}, ""


def analyze(files: Mapping[int, Mapping[str, str]], members: set[int], timeout: float = DEFAULT_TIMEOUT_S,
            python: str | None = None) -> TorchAnalysis:
    """Run torch's fr_trace on each recorder's folder of this request ({rank: {recorder: file}});
    `members` are the ranks asked (a rank missing from a folder makes the command
    `--allow-incomplete-ranks`). Never raises."""
    dirs, why = directories(files)
    result = TorchAnalysis(False, why, directories=dirs)
    for recorder, directory in dirs.items():
        have = {rank for rank, per_rank in files.items() if recorder in per_rank}
        result.commands.append(fr_trace_command(directory, bool(members - have)))
    if why:
        return result
    reason = unavailable()
    if reason is not None:
        result.reason = reason
        return result
    reasons = []
    for recorder, directory in dirs.items():
        answer = _run(directory, timeout, python or sys.executable)
        if not answer.get("available") or not answer.get("ok"):
            reasons.append(f"{recorder}: " + str(answer.get("reason") or answer.get("error") or "no answer"))
            continue
        result.ran = True
        result.ranks[recorder] = [int(r) for r in answer.get("ranks") or []]
        result.matched += int(answer.get("matched") or 0)
        result.printed += str(answer.get("printed") or "")
        result.findings += [_finding(recorder, f) for f in answer.get("findings") or [] if isinstance(f, dict)]
    result.reason = "; ".join(reasons)
    return result


def _run(directory: str, timeout: float, python: str) -> dict[str, Any]:
    env = dict(os.environ)
    here = str(Path(__file__).resolve().parents[2])  # the folder that holds the sidecar package
    env["PYTHONPATH"] = os.pathsep.join([here, *filter(None, [env.get("PYTHONPATH")])])
    try:
        done = subprocess.run([python, "-m", RUNNER_MODULE, directory], capture_output=True, text=True,
                              timeout=timeout, env=env, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return {"available": True, "ok": False, "error": f"torch's fr_trace took more than {timeout:g}s"}
    except OSError as exc:
        return {"available": False, "reason": f"{python} could not be run: {exc}"}
    try:
        answer = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        return {"available": True, "ok": False, "error": f"exit {done.returncode}: {tail[0]}"}
    return answer if isinstance(answer, dict) else {"available": True, "ok": False, "error": "not an object"}


def _finding(recorder: str, f: dict[str, Any]) -> TorchFinding:
    return TorchFinding(recorder, str(f.get("process_group")), str(f.get("desc") or ""), int(f.get("seq") or 0),
                        str(f.get("op") or "?"), [int(r) for r in f.get("missing_ranks") or []],
                        [int(r) for r in f.get("mismatched_ranks") or []], f.get("mismatch"), f.get("input_sizes"))

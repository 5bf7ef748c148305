"""The dumps that say where a rank is: every thread's stacks, and torch.distributed's flight recorder.

Three things write them, all through here: a "stacks" request (the stacks), a "hang" request (both,
`rank.intake`) and a stall (both, `rank.stall`). So every dump carries one header (`dump_header`:
replica, rank, host, pid, step, state, request, then `last_step_at` or `source` where known): the
stacks file's first line (`sidecar.common.stackdump.format_stacks`) and the flight recorder's `cosmos_profiler`
object (`flightrec.render`); `sidecar.fleet.hang` reads `step` and `last_step_at` from either.

Names, in the rank's trace dir (`sidecar.common.layout`), claimed on disk so no file is ever replaced:

- `<n>_stacks.txt`: the next free number of its kind (`Saver.write_now`).
- `<n>_flight_recorder.json`: the number of the stacks dump it goes with, so that `3_stacks.txt`
  and `3_flight_recorder.json` are one moment's pair. A flight recorder dumped alone
  (`write_flight_recorder` without its stacks, or with stacks that could not be written) takes the next free
  number; when one of those has already taken the stacks dump's number or a higher one, the
  pair's flight recorder takes the next free number too. Readers never derive one name from
  the other: the record names each file (`history[].stacks` / `flight_recorder`,
  `stall.stacks_path` / `flightrec_path`).
- `<replica>_fr_trace/<request>/<recorder>/rank_<k>` beside the rank dirs: the same recorders for
  torch's fr_trace (`flightrec.write_fr_trace`), one folder per request; the flight recorder file
  names them under `cosmos_profiler.fr_trace` (`{recorder: path}`) and says why not under
  `cosmos_profiler.fr_trace_errors`.

Nothing here raises, and nothing here imports torch: the flight recorder is read only in a
process that imported torch already (importing it from a side thread is not ours to do).
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sidecar.common import layout
from sidecar.common.identity import RankIdentity
from sidecar.common.stackdump import fault_dump_as_stacks, format_stacks, thread_names
from sidecar.rank.saver import Saver, describe

NO_TORCH = "torch is not imported"


def dump_header(identity: RankIdentity, step: int, state: str, request: str | None,
                last_step_at: float | None = None, source: str | None = None) -> dict[str, Any]:
    """Who dumped, at which step, in which capture state, for which request (a request id,
    `stall-<step>`, or None); then when the last step ended and what took the dump, where known."""
    header: dict[str, Any] = {"replica": identity.replica, "rank": identity.rank, "host": identity.host,
                              "pid": identity.pid, "step": step, "state": state, "request": request}
    if last_step_at is not None:
        header["last_step_at"] = round(last_step_at, 3)
    if source is not None:
        header["source"] = source
    return header


@dataclass(frozen=True)
class StacksDump:
    """A stacks dump: its file, or (`error`) the name it would have had and why it has not."""

    path: Path
    error: str = ""  # the OS's words (`saver.describe`); "" when the file was written


@dataclass(frozen=True)
class FlightRecorderDump:
    """A flight recorder dump: its file (None: none was written) and why it holds no data ("" when it does)."""

    path: Path | None
    reason: str = ""

    @property
    def ok(self) -> bool:
        """The file was written and holds flight recorder data."""
        return self.path is not None and not self.reason


def write_stacks(saver: Saver, header: dict[str, Any], fault_text: str = "") -> StacksDump:
    """Every thread's stacks but the caller's, `header` first, to the rank's next `<n>_stacks.txt`;
    with `fault_text` (faulthandler's dump, taken while a C call held the GIL) that dump, with
    thread names. Never raises."""
    fields = {k: f"{v:.3f}" if k == "last_step_at" else v for k, v in header.items()}
    try:
        if fault_text:
            text = fault_dump_as_stacks(fault_text, fields, thread_names(), threading.main_thread().ident)
        else:
            text = format_stacks(fields)
        return StacksDump(saver.write_now(text.encode(), layout.STACKS_TEMPLATE))
    except Exception as exc:  # noqa: BLE001 - said in the answer, never raised
        return StacksDump(saver.first_guess(layout.STACKS_TEMPLATE), describe(exc))


def write_flight_recorder(saver: Saver, header: dict[str, Any], stacks: StacksDump | None = None,
                          **extra: Any) -> FlightRecorderDump:
    """This process's flight recorders (`flightrec.render`), `header` and `extra` as their
    `cosmos_profiler`, to `<n>_flight_recorder.json`: paired with `stacks` when it was written
    (see the module docstring). The file is written when the recorder holds nothing too,
    with the reason. Never raises."""
    if "torch" not in sys.modules:
        return FlightRecorderDump(None, NO_TORCH)
    first = _number(stacks.path) if stacks is not None and not stacks.error else 0
    try:
        from sidecar.rank import flightrec

        request = header.get("request")
        if isinstance(request, str) and request and not request.startswith("."):
            written, errors = flightrec.write_fr_trace(saver.trace_dir, str(header["replica"]), int(header["rank"]),
                                                       request)
            extra = {**extra, "fr_trace": written, **({"fr_trace_errors": errors} if errors else {})}
        data, _, reason = flightrec.render({**header, **extra})
        path = saver.write_now(data, layout.FLIGHT_RECORDER_TEMPLATE, first=first)
    except Exception as exc:  # noqa: BLE001 - said in the answer, never raised
        return FlightRecorderDump(None, f"flight recorder not written: {describe(exc)}")
    return FlightRecorderDump(path, reason)


def _number(path: Path) -> int:
    """The n of a `<n>_<kind>` file the saver named."""
    return int(path.name.split("_", 1)[0])

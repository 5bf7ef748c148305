"""12. The save on kineto's on-demand path against the Python path, side by side in one run.

Two processes, one per path (benchmarks/programs/ondemand_child.py: the on-demand one prepares kineto's
environment before importing torch, as `sidecar.run` does; the Python one runs with
COSMOS_PROFILER_ONDEMAND=off), each installing a real Sidecar. Each capture is a request with no start
step (what a signal asks), `Trainer("deep")` steps with record_shapes + with_stack, warmup 1 and N active
steps (N from a calibration capture, for ~1, 10, 100 MB of JSON), then `Trainer("work")` steps until the
file is saved, plus 3. Per capture:

  stall           the finalizing step's excess over an idle deep step, plus every later work step's excess
                  until the file is saved (+3), plus the excess of a gc.collect() after over one before
  slowdown        mean work step while the save is in flight over the idle work median, minus 1
  request->first  the request to the start of the first recorded step (the Python path starts at the next
                  step; the on-demand path waits for kineto's next 1 s poll, and a margin)
  last step->file the window's last boundary to the saver's "saved"
  idle CPU        each process asleep for 20 s with its sidecar: the on-demand one also runs the responder
                  and kineto's poll thread (one poll a second)
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.common import PROGRAMS, PYTHON, ROOT, Row, child_env, main, median
from benchmarks.models import describe

BENCH = "14. save on kineto's on-demand path"
LABELS = {"python": "Python path (ours before)", "ondemand": "on-demand path"}


def _child(path: str, actives: tuple[int, ...] = (), idle_s: float = 0.0) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix=f"bench-ondemand-{path}-"))
    done = subprocess.run([PYTHON, str(PROGRAMS / "ondemand_child.py"), "--path", path,
                           "--actives", ",".join(map(str, actives)), "--tmp", str(tmp), "--idle-s", str(idle_s)],
                          capture_output=True, text=True, env=child_env(), cwd=ROOT, timeout=1500)
    if done.returncode != 0:
        raise RuntimeError(f"{path} child failed ({done.returncode}): {done.stderr.strip()[-1500:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


NOTE = (f"Two processes, one per path, each with a real Sidecar: a request with no start step, {describe('deep')} "
        f"steps (record_shapes + with_stack, warmup 1, N active), then {describe('work')} steps until the file is "
        "saved (+3). Stall = excess of the finalizing step + every later step + a gc.collect() after over one "
        "before. Slowdown = mean work step while the save is in flight over the idle median. Shared 2-core "
        "machine: kineto's writer thread takes CPU from training there.")


def _med(rs: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rs if r.get(key) is not None]
    return median(values) if values else None


def run(quick: bool) -> list[Row]:
    sizes = (1, 10) if quick else (1, 10, 100)
    repeats = 2 if quick else 3
    idle_s = 10.0 if quick else 30.0
    # Idle CPU and the calibration first; then each capture in a fresh process, the two paths alternating
    # (this machine's load drifts: one long process per path compares two different moments).
    idle = {path: _child(path, idle_s=idle_s) for path in ("python", "ondemand")}
    per_step = idle["python"]["json_per_step"]
    actives = {size: max(1, min(2000, round(size * 1e6 / per_step))) for size in sizes}
    results: dict[str, dict[str, Any]] = {path: {"idle_cpu": idle[path]["idle_cpu"], "sizes": {},
                                                 "idle_cpu_by_thread": idle[path]["idle_cpu_by_thread"]}
                                          for path in ("python", "ondemand")}
    for r in range(repeats):
        for size in sizes:
            for path in (("python", "ondemand") if r % 2 == 0 else ("ondemand", "python")):
                results[path]["sizes"].setdefault(str(size), []).extend(_child(path, (actives[size],))["captures"])
    rows: list[Row] = []
    for size in sizes:
        py, od = results["python"]["sizes"][str(size)], results["ondemand"]["sizes"][str(size)]
        json_mb = _med(od, "json_bytes") / 1e6
        label = f"~{size} MB trace ({json_mb:.1f} MB JSON, {od[0]['active']} active steps)"
        wrong = [r for r in od if r["path"] != "ondemand"]
        stall_py, stall_od = _med(py, "stall_s") * 1000, _med(od, "stall_s") * 1000
        big = size == max(sizes)
        rows.append(Row(BENCH, f"{label}: {LABELS['python']}, training-thread stall", stall_py, "ms",
                        samples=[r["stall_s"] * 1000 for r in py], note=NOTE, extra={"results": py}))
        rows.append(Row(BENCH, f"{label}: {LABELS['ondemand']}, training-thread stall", stall_od, "ms",
                        baseline=stall_py, baseline_label="Python path",
                        delta=f"{stall_py / max(stall_od, 1e-9):.1f}x below (finalizing step "
                              f"{_med(od, 'finalize_s') * 1000:+.1f}, later steps {_med(od, 'later_s') * 1000:+.0f}, "
                              f"gc {_med(od, 'gc_s') * 1000:+.0f} ms)"
                              + (f"; {len(wrong)} of {len(od)} fell back to the Python path" if wrong else ""),
                        samples=[r["stall_s"] * 1000 for r in od], note=NOTE, extra={"results": od}))
        fin_py, fin_od = _med(py, "finalize_s") * 1000, _med(od, "finalize_s") * 1000
        rows.append(Row(BENCH, f"{label}: the finalizing step alone (the training thread's own cost), on-demand",
                        fin_od, "ms", baseline=fin_py, baseline_label="Python path",
                        delta=f"{fin_py / max(fin_od, 1e-3):.0f}x below", samples=[r["finalize_s"] * 1000 for r in od],
                        note=NOTE, target="<= 5 ms" if big else "", met=(fin_od <= 5) if big else None))
        for path, rs in (("python", py), ("ondemand", od)):
            slow = [r["slowdown"] * 100 for r in rs if r["slowdown"] is not None]
            if slow:
                rows.append(Row(BENCH, f"{label}: {LABELS[path]}, work-step slowdown while saving", median(slow), "%",
                                baseline=_med(rs, "work_base_s") * 1000, baseline_unit="ms",
                                baseline_label="idle work step", delta=f"over {_med(rs, 'window_steps'):.0f} steps",
                                samples=slow, note=NOTE,
                                target="< 5%" if path == "ondemand" and big else "",
                                met=(median(slow) < 5) if path == "ondemand" and big else None))
        for key, what in (("request_to_first_s", "request to first captured step"),
                          ("last_step_to_file_s", "last step to file on disk")):
            rows.append(Row(BENCH, f"{label}: {what}", _med(od, key), "s", baseline=_med(py, key),
                            baseline_label="Python path", samples=[r[key] for r in od if r.get(key) is not None],
                            note=NOTE))
    idle_py, idle_od = results["python"]["idle_cpu"] * 100, results["ondemand"]["idle_cpu"] * 100
    threads = results["ondemand"].get("idle_cpu_by_thread") or {}
    top = ", ".join(f"{name} {share * 100:.3f}%" for name, share in sorted(threads.items(), key=lambda x: -x[1])[:4])
    rows.append(Row(BENCH, "idle CPU, sidecar + responder + kineto's poll thread", idle_od, "% of a core",
                    baseline=idle_py, baseline_label="Python path",
                    delta=f"{idle_od - idle_py:+.3f} points (threads, on-demand: {top})",
                    note=f"Each process asleep for {idle_s:g} s with its sidecar installed (process CPU time over "
                         "wall time: every thread).", target="< +0.01 points", met=(idle_od - idle_py) < 0.01))
    return rows


if __name__ == "__main__":
    main(run)

"""9. Trace analysis against the anchor, HolisticTraceAnalysis, on the same captures.

Two captures of one training loop (`Trainer("deep")` under torch.profiler, CPU activity, the
same number of active steps, gzip'd as the sidecar saves them; about 100 MB of JSON each, 10 MB
with --quick): base, and new, whose step also multiplies two 768x768 matrices (aten::mm grows by tens of ms a step).

- `profile diff base new --json` against HTA's `TraceDiff.compare_traces` of the same two folders
  over every iteration (CPU ops): wall time and peak memory as ratios (HTA / ours), and whether the
  top changes agree (HTA ranks ops by the change of their total inclusive time, we by self time per
  step; ProfilerStep#N annotations left out of HTA's list, as they are one name per step).
- `profile summary new --json` against HTA's trace load (`TraceAnalysis(trace_dir=new)`: parse and
  align), the first thing every HTA analysis does.

Each tool runs in a fresh interpreter, one after the other (ours, HTA, ours, ..., ours three times
and HTA once in a full run: an HTA diff of two 100 MB captures takes minutes); wall time is the
command's (timed by a small launcher), peak memory the command's ru_maxrss (the launcher's
RUSAGE_CHILDREN; HTA parses one rank per folder in-process). Where HTA is not installed the rows
say so.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity

from benchmarks.common import PYTHON, ROOT, Row, child_env, main, median, missing_row
from benchmarks.models import Trainer

BENCH = "9 trace analysis vs HTA"
MB = 1e6
EXTRA = 768  # the matmul the new capture adds to each step (tens of ms: above the load's noise)
TOP = 5

_HTA_DIFF = """
import json, sys
from hta.trace_diff import DeviceType, LabeledTrace, TraceDiff
base, new = LabeledTrace("base", trace_dir=sys.argv[1]), LabeledTrace("new", trace_dir=sys.argv[2])
df = TraceDiff.compare_traces(base, new, control_iteration=base.iterations(), test_iteration=new.iterations(),
                              device_type=DeviceType.CPU)
df = df[~df.index.str.startswith("ProfilerStep#")].sort_values("diff_duration", ascending=False)
print(json.dumps({"top": [str(n) for n in df.index[:TOP]]}))
""".replace("TOP", str(TOP))

_HTA_LOAD = """
import json, sys
from hta.trace_analysis import TraceAnalysis
analyzer = TraceAnalysis(trace_dir=sys.argv[1])
print(json.dumps({"events": int(sum(len(df) for df in analyzer.t.traces.values()))}))
"""


def _capture(folder: Path, steps: int, extra: bool) -> dict[str, float]:
    """`steps` profiled steps of the deep loop (plus the matmul if `extra`) as <folder>/rank0.json.gz."""
    trainer = Trainer("deep")
    m = torch.ones(EXTRA, EXTRA)

    def step() -> None:
        trainer.step()
        if extra:
            torch.mm(m, m)

    for _ in range(3):
        step()
    prof = torch.profiler.profile(activities=[ProfilerActivity.CPU],
                                  schedule=torch.profiler.schedule(wait=0, warmup=1, active=steps, repeat=1))
    prof.start()
    for _ in range(steps + 1):
        step()
        prof.step()
    prof.stop()
    folder.mkdir(parents=True, exist_ok=True)
    raw = folder / "rank0.json"
    prof.export_chrome_trace(str(raw))
    json_bytes = raw.stat().st_size
    with open(raw, "rb") as src, gzip.open(folder / "rank0.json.gz", "wb", compresslevel=1) as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
    raw.unlink()
    return {"json_bytes": json_bytes, "gz_bytes": (folder / "rank0.json.gz").stat().st_size}


# Each command runs under this small launcher (no torch): it times the command and reports the peak
# RSS of its children (RUSAGE_CHILDREN). Measured from the bench process itself, a child's ru_maxrss
# would start at the bench's own RSS: exec keeps the high-water mark of the address space it replaces.
_LAUNCHER = """
import json, resource, subprocess, sys, time
t0 = time.perf_counter()
rc = subprocess.call(sys.argv[1:])
wall = time.perf_counter() - t0
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
print("MEASURED " + json.dumps({"wall_s": wall, "peak_bytes": peak}), file=sys.stderr)
sys.exit(rc)
"""


def measured(cmd: list[str], timeout: float = 1800.0) -> dict[str, Any]:
    """Run `cmd` under the launcher; its wall time, peak RSS and JSON stdout."""
    done = subprocess.run([PYTHON, "-c", _LAUNCHER, *cmd], capture_output=True, text=True, env=child_env(), cwd=ROOT,
                          timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])} ... exited {done.returncode}: {done.stderr.strip()[-800:]}")
    line = next(x for x in reversed(done.stderr.splitlines()) if x.startswith("MEASURED "))
    try:
        data = json.loads(done.stdout)  # ours: one JSON object
    except ValueError:
        data = json.loads(done.stdout.strip().splitlines()[-1])  # HTA's children: logs, then one JSON line
    return {**json.loads(line[len("MEASURED "):]), "data": data}


def _ours(*args: str) -> list[str]:
    return [PYTHON, "-m", "sidecar", "profile", *args, "--json"]


def run(quick: bool) -> list[Row]:
    size_mb = 10 if quick else 100
    ours_repeats, hta_repeats = (1, 1) if quick else (3, 1)
    tmp = Path(tempfile.mkdtemp(prefix="bench-hta-"))
    try:
        calib = _capture(tmp / "calib", 4, extra=False)
        steps = max(2, min(2000, round(size_mb * MB / (calib["json_bytes"] / 4))))
        shutil.rmtree(tmp / "calib")
        sizes = {side: _capture(tmp / side, steps, extra=side == "new") for side in ("base", "new")}
        label = (f"2 captures of ~{sizes['base']['json_bytes'] / MB:.0f} MB JSON ({steps} steps; "
                 f"{sizes['base']['gz_bytes'] / MB:.1f} MB gz)")
        base, new = str(tmp / "base"), str(tmp / "new")
        has_hta = importlib.util.find_spec("hta") is not None
        cases = {
            "diff": (_ours("diff", base, new), [PYTHON, "-c", _HTA_DIFF, base, new]),
            "summary": (_ours("summary", new), [PYTHON, "-c", _HTA_LOAD, new]),
        }
        runs: dict[str, dict[str, list[dict[str, Any]]]] = {c: {"ours": [], "hta": []} for c in cases}
        for case, (ours_cmd, hta_cmd) in cases.items():
            for i in range(max(ours_repeats, hta_repeats)):
                for who, cmd, repeats in (("ours", ours_cmd, ours_repeats), ("hta", hta_cmd, hta_repeats)):
                    if i < repeats and (who == "ours" or has_hta):
                        got = measured(cmd)
                        runs[case][who].append(got)
                        # in the log as it comes: a run cut short still tells what it measured
                        print(f"[{case}] {who}: {got['wall_s']:.2f} s, peak {got['peak_bytes'] / MB:.0f} MB",
                              file=sys.stderr, flush=True)
        return _rows(label, runs, has_hta)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _rows(label: str, runs: dict[str, dict[str, list[dict[str, Any]]]], has_hta: bool) -> list[Row]:
    rows = []
    what = {"diff": ("profile diff", "HTA TraceDiff.compare_traces"),
            "summary": ("profile summary (1 capture)", "HTA trace load (TraceAnalysis)")}
    for case, got in runs.items():
        ours_name, hta_name = what[case]
        ours_wall = median([r["wall_s"] for r in got["ours"]])
        ours_peak = median([r["peak_bytes"] for r in got["ours"]]) / MB
        extra: dict[str, Any] = {who: [{k: r[k] for k in ("wall_s", "peak_bytes")} for r in got[who]]
                                 for who in ("ours", "hta")}
        if not has_hta:
            rows.append(missing_row(BENCH, f"{label}: {ours_name} vs {hta_name}", target=">= 10x faster",
                                    status="n/a (HolisticTraceAnalysis not installed)"))
            continue
        hta_wall = median([r["wall_s"] for r in got["hta"]])
        hta_peak = median([r["peak_bytes"] for r in got["hta"]]) / MB
        speed = hta_wall / ours_wall
        mem = hta_peak / ours_peak
        agree = ""
        met = speed >= 10
        if case == "diff":
            ours_top = [o["name"] for o in got["ours"][0]["data"]["ops"][:TOP]]
            hta_top = got["hta"][0]["data"]["top"]
            same_first = bool(ours_top) and bool(hta_top) and ours_top[0] == hta_top[0]
            overlap = len(set(ours_top) & set(hta_top))
            agree = (f"; top change: ours {ours_top[0] if ours_top else '-'}, HTA {hta_top[0] if hta_top else '-'}"
                     f" ({'same' if same_first else 'DIFFERENT'}); top {TOP} overlap {overlap}/{TOP}")
            extra.update(ours_top=ours_top, hta_top=hta_top)
            met = met and same_first
        rows.append(Row(
            BENCH, f"{label}: {ours_name} vs {hta_name}, wall", ours_wall, "s", baseline=hta_wall,
            baseline_label="HTA", delta=f"{speed:.1f}x faster; peak memory {ours_peak:.0f} MB vs {hta_peak:.0f} MB "
                                        f"({mem:.1f}x less){agree}",
            samples=[r["wall_s"] for r in got["ours"]], target=">= 10x faster" + (", same top change"
                                                                                  if case == "diff" else ""),
            met=met, extra=extra,
            note=("Ours: `python -m sidecar profile diff ... --json` or `python -m sidecar profile summary ... --json` in a fresh interpreter; HTA: "
                  "TraceDiff.compare_traces over every iteration (CPU ops) or TraceAnalysis(trace_dir), in a fresh "
                  "interpreter. Wall time of the command; peak memory its ru_maxrss. Ratios = HTA / ours. "
                  "HTA ranks changes by total inclusive time, ours by self time per step; the added matmul runs "
                  "at the top of the step, so both should name aten::mm first. Median of the runs (ours 3, HTA 1 "
                  "in a full run)."),
        ))
    return rows


if __name__ == "__main__":
    main(run)

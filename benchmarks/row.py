"""One result row of a benchmark, and how a number is written in the table."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

CLI_MISSING = "n/a (CLI missing)"


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile, q in [0, 100]."""
    data = sorted(values)
    if not data:
        raise ValueError("no values")
    if len(data) == 1:
        return data[0]
    pos = (len(data) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


@dataclass
class Row:
    """One line of the table. `value` is the median of `samples`."""

    benchmark: str
    case: str
    value: float | None
    unit: str
    baseline: float | None = None
    baseline_unit: str | None = None  # defaults to `unit`
    baseline_label: str = ""
    delta: str = ""  # the "overhead / ratio" column, already formatted
    samples: list[float] = field(default_factory=list)
    target: str = ""
    met: bool | None = None
    note: str = ""
    status: str = ""  # set when the row could not be measured (e.g. CLI missing)
    extra: dict[str, Any] = field(default_factory=dict)
    spread_q: float = 0.0  # 0: min-max of the samples; 5: their 5th-95th percentiles

    @property
    def spread(self) -> str:
        if len(self.samples) < 2:
            return ""
        if self.spread_q:
            lo, hi = percentile(self.samples, self.spread_q), percentile(self.samples, 100 - self.spread_q)
            kind = f"p{self.spread_q:g}-p{100 - self.spread_q:g}, "
        else:
            lo, hi, kind = min(self.samples), max(self.samples), ""
        return f"{fmt(lo, self.unit)} – {fmt(hi, self.unit)} ({kind}n={len(self.samples)})"

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["spread"] = self.spread
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Row:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def missing_row(benchmark: str, case: str, target: str = "", status: str = CLI_MISSING, note: str = "") -> Row:
    return Row(benchmark, case, None, "", target=target, status=status, note=note)


def fmt(value: float | None, unit: str) -> str:
    """A compact number with its unit: 3 significant digits, no exponent."""
    if value is None:
        return ""
    if unit in ("x",):
        return f"{value:.2f}x" if abs(value) < 100 else f"{value:.0f}x"
    mag = abs(value)
    if mag == 0:
        text = "0"
    elif mag >= 100:
        text = f"{value:.0f}"
    elif mag >= 10:
        text = f"{value:.1f}"
    elif mag >= 1:
        text = f"{value:.2f}"
    elif mag >= 0.01:
        text = f"{value:.3f}"
    else:
        text = f"{value:.2g}"
    return f"{text} {unit}" if unit else text

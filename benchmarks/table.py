"""Render rows as one markdown table, with the notes as numbered footnotes."""

from __future__ import annotations

from collections.abc import Sequence

from benchmarks.row import Row, fmt

HEADERS = ["benchmark", "case", "value (median)", "baseline", "overhead / ratio", "spread (min – max unless noted)", "target", "met?"]


def _met(row: Row) -> str:
    if row.status:
        return "n/a"
    if row.met is None:
        return "–"
    return "yes" if row.met else "**NO**"


def _cells(row: Row, note_ref: str) -> list[str]:
    if row.status:
        value = row.status
    else:
        value = fmt(row.value, row.unit)
    baseline = ""
    if row.baseline is not None:
        baseline = fmt(row.baseline, row.baseline_unit or row.unit)
        if row.baseline_label:
            baseline = f"{baseline} ({row.baseline_label})"
    elif row.baseline_label:
        baseline = row.baseline_label
    case = row.case + (f" [{note_ref}]" if note_ref else "")
    return [row.benchmark, case, value, baseline, row.delta, row.spread, row.target, _met(row)]


def render_markdown(rows: Sequence[Row]) -> str:
    notes: list[str] = []
    lines = ["| " + " | ".join(HEADERS) + " |", "|" + "|".join("---" for _ in HEADERS) + "|"]
    for row in rows:
        ref = ""
        if row.note:
            if row.note not in notes:
                notes.append(row.note)
            ref = str(notes.index(row.note) + 1)
        cells = [c.replace("|", "\\|") for c in _cells(row, ref)]
        lines.append("| " + " | ".join(cells) + " |")
    if notes:
        lines.append("")
        lines.extend(f"[{i}] {note}" for i, note in enumerate(notes, 1))
    return "\n".join(lines)

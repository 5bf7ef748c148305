"""The CLI's plain tables (sidecar.cli.render.format_table), made a column at a time: the same text as
a row at a time, whatever the cells hold (None and "" as "-", numbers, text with spaces at its end)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sidecar.cli.render import format_table

SETTINGS = settings(derandomize=True, database=None, deadline=None, max_examples=300,
                    suppress_health_check=[HealthCheck.too_slow])
cells = st.none() | st.just("") | st.integers(-5, 10**6) | st.floats(allow_nan=False, width=32) | st.booleans() \
    | st.text(alphabet="ab -/:()", max_size=12)


def _row_at_a_time(headers, rows) -> str:
    """format_table as it was: every row's cells as text, each left-justified to its column's width."""
    text = [[str(h) for h in headers]] + [["-" if c is None or c == "" else str(c) for c in row] for row in rows]
    widths = [max(map(len, column)) for column in zip(*text, strict=True)]
    line = "  ".join(f"%-{w}s" for w in widths)
    return "\n".join([(line % tuple(row)).rstrip() for row in text])


@SETTINGS
@given(st.integers(1, 6).flatmap(lambda n: st.tuples(
    st.lists(st.text(alphabet="ABC ", min_size=1, max_size=6), min_size=n, max_size=n),
    st.lists(st.lists(cells, min_size=n, max_size=n), max_size=8))))
def test_a_table_made_a_column_at_a_time_reads_as_one_made_a_row_at_a_time(table):
    headers, rows = table
    assert format_table(headers, rows) == _row_at_a_time(headers, rows)

"""The report's rows as Markdown, CSV or JSON: text for piping into other tools."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence

from runner.report.rows import DISPLAY_COLUMNS, UNITS_NOTE, Row

FORMATS = ("md", "csv", "json")


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def to_markdown(rows: Sequence[Row]) -> str:
    """A Markdown table of the display columns, with each failed or unfinished cell's error below."""
    headers = [c.header for c in DISPLAY_COLUMNS]
    lines = [
        "| " + " | ".join(headers) + " |",
        "|" + "|".join("---:" if c.numeric else "---" for c in DISPLAY_COLUMNS) + "|",
    ]
    lines += ["| " + " | ".join(_md_cell(c.show(r)) for c in DISPLAY_COLUMNS) + " |" for r in rows]
    lines += ["", UNITS_NOTE]
    moved = [r for r in rows if r.layouts]
    if moved:  # the row's figures are its last layout's
        lines += ["", "Cells resumed onto another layout:", ""]
        lines += [f"- `{r.cell_id}`: {_md_cell(r.layouts or '')}" for r in moved]
    errors = [r for r in rows if r.error]
    if errors:
        lines += ["", "Cells that did not complete:", ""]
        lines += [f"- `{r.cell_id}` ({r.status}): {_md_cell(r.error or '')}" for r in errors]
    return "\n".join(lines) + "\n"


def to_csv(rows: Sequence[Row]) -> str:
    """CSV with one line per cell and the flat fields (units in the column names)."""
    buffer = io.StringIO()
    flats = [r.flat() for r in rows]
    fields = list(flats[0]) if flats else list(Row("", "", "", None, "").flat())
    writer = csv.DictWriter(buffer, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    for flat in flats:
        writer.writerow({k: "" if v is None else v for k, v in flat.items()})
    return buffer.getvalue()


def to_json(rows: Sequence[Row]) -> str:
    """A JSON list of the flat rows (null where unknown; MFU as a fraction, memory in GB = 1e9 bytes)."""
    return json.dumps([r.flat() for r in rows], indent=2) + "\n"


def render_text(rows: Sequence[Row], fmt: str) -> str:
    """The rows in one of FORMATS."""
    renderers = {"md": to_markdown, "csv": to_csv, "json": to_json}
    return renderers[fmt](rows)

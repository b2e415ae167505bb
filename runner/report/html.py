"""The report as one self-contained HTML file: inline CSS, inline SVG charts, a few lines of inline JS.

It opens with no network: a Content-Security-Policy forbids every fetch, so a stray external
reference would show as a console error rather than a silent request. The inline script only
checks the page: it counts each chart's rendered marks and writes the result into
``#report-status`` (data-state="done"), which the browser test reads.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from html import escape
from pathlib import Path
from typing import Any

from runner.report.charts import (
    Chart,
    LegendItem,
    loss_chart,
    memory_chart,
    scaling_chart,
    spread_chart,
    time_chart,
    wall_chart,
)
from runner.report.collect import Cell
from runner.report.compare import EVAL_LOSS, ConfigDiff, LossAgreement, config_diff
from runner.report.rows import BEST_MEANING, DISPLAY_COLUMNS, MARKED_COLUMN, UNITS_NOTE, Row

CSP = "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:"

STYLE = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", "DejaVu Sans", sans-serif; color: #222;
       margin: 0 auto; padding: 16px 24px 40px; max-width: 1560px; background: #fff; }
h1 { font-size: 22px; margin: 4px 0 2px; } h2 { font-size: 17px; margin: 28px 0 8px;
     border-bottom: 1px solid #ddd; padding-bottom: 3px; }
.meta, .note, figcaption { color: #555; font-size: 12.5px; }
.verdict { padding: 8px 12px; border-radius: 4px; margin: 6px 0; font-weight: 600; }
.verdict.ok { background: #e8f5e9; border-left: 5px solid #2e7d32; }
.verdict.bad { background: #fdecea; border-left: 5px solid #c62828; }
.verdict.none { background: #fff8e1; border-left: 5px solid #f9a825; }
.scroll { overflow-x: auto; }
table { border-collapse: collapse; font-size: 12.5px; }
th, td { padding: 3px 8px; border-bottom: 1px solid #e6e6e6; white-space: nowrap; }
/* The cells' table wraps its headers and its cells at their spaces rather than run past the page:
   "est / meas" over two lines, overrides one per line, and a word longer than its column (a path,
   a run's name, a header) anywhere in it; numbers stay whole. Only a window too narrow for every column's
   widest number scrolls it. */
#cells { font-size: 12px; }
#cells th, #cells td { white-space: normal; vertical-align: top; padding: 3px 4px; }
#cells td:not(.num), #cells th { overflow-wrap: anywhere; }
#cells td.num { text-align: right; }
td.noisy { background: #fff3cd; font-weight: 700; }
th { background: #f4f4f4; text-align: left; }
th.group { text-align: center; border-bottom: 1px solid #ccc; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
td.best { background: #e3f2e5; font-weight: 700; }
tr.failed td, tr.missing td { background: #fdf0ef; }
tr.unfinished td, tr.running td, tr.interrupted td { background: #fffaeb; }
tr.planned td { background: #eef6fc; }
td.status-completed { color: #2e7d32; }
td.status-failed, td.status-missing { color: #c62828; font-weight: 700; }
.charts { display: grid; grid-template-columns: repeat(auto-fill, minmax(640px, 1fr)); gap: 18px; }
figure.chart { margin: 0; border: 1px solid #e2e2e2; border-radius: 6px; padding: 10px 12px; }
figure.chart h3 { font-size: 14px; margin: 0 0 6px; }
figure.chart > svg { width: 100%; height: auto; display: block; }
ul.legend { list-style: none; padding: 0; margin: 6px 0; display: flex; flex-wrap: wrap; gap: 4px 14px;
            font-size: 12px; }
ul.legend svg { vertical-align: middle; margin-right: 4px; }
ul.errors li { margin: 3px 0; } code { font-size: 12px; background: #f4f4f4; padding: 0 3px; }
#report-status { font-size: 11px; color: #777; }
"""

# Runs after load: count each chart's rendered marks (elements with a non-empty box) and report.
SCRIPT = """
(function () {
  var errors = [];
  window.addEventListener("error", function (e) { errors.push(String(e.message)); });
  function check() {
    var status = document.getElementById("report-status");
    var figures = document.querySelectorAll("figure.chart");
    var rendered = 0, empty = [];
    figures.forEach(function (figure) {
      var visible = 0;
      figure.querySelectorAll(".mark").forEach(function (mark) {
        var box = mark.getBBox();
        if (box.width > 0 || box.height > 0) { visible += 1; }
      });
      figure.dataset.visibleMarks = String(visible);
      if (visible > 0) { rendered += 1; } else { empty.push(figure.dataset.chart); }
    });
    status.dataset.charts = String(figures.length);
    status.dataset.rendered = String(rendered);
    status.dataset.empty = empty.join(" ");
    status.dataset.errors = String(errors.length);
    status.dataset.state = "done";
    status.textContent = "page check: " + rendered + " of " + figures.length + " charts rendered" +
      (empty.length ? " (empty: " + empty.join(", ") + ")" : "") +
      (errors.length ? "; script errors: " + errors.join("; ") : "");
  }
  window.addEventListener("load", check);
})();
"""


def _legend(items: Sequence[LegendItem]) -> str:
    parts = []
    for item in items:
        if item.kind == "box":
            swatch = f'<rect x="1" y="1" width="14" height="10" fill="{item.color}"/>'
        else:
            dash = f' stroke-dasharray="{item.dash}"' if item.dash else ""
            swatch = f'<line x1="0" x2="22" y1="6" y2="6" stroke="{item.color}" stroke-width="3"{dash}/>'
        parts.append(
            f'<li><svg width="24" height="12" aria-hidden="true">{swatch}</svg>{escape(item.name)}</li>'
        )
    return f'<ul class="legend">{"".join(parts)}</ul>'


def _figure(chart: Chart) -> str:
    return (
        f'<figure class="chart" data-chart="{chart.key}" data-empty="{str(chart.empty).lower()}">'
        f"<h3>{escape(chart.title)}</h3>{chart.svg}{_legend(chart.legend)}"
        f"<figcaption>{escape(chart.caption)}</figcaption></figure>"
    )


def _breakable(header: str) -> str:
    """A header that may wrap after each slash too (``tokens/s/device``)."""
    return escape(header).replace("/", "/<wbr>")


def _table_head() -> str:
    # Two header rows: grouped columns (memory) under one spanning header, the others span both.
    top: list[str] = []
    under: list[str] = []
    for group, members in itertools.groupby(DISPLAY_COLUMNS, key=lambda c: c.group):
        columns = list(members)
        if group:
            top.append(f'<th colspan="{len(columns)}" class="group">{escape(group)}</th>')
            under += [f"<th>{_breakable(c.short)}</th>" for c in columns]
        else:
            top += [f'<th rowspan="2">{_breakable(c.header)}</th>' for c in columns]
    return f"<tr>{''.join(top)}</tr><tr>{''.join(under)}</tr>"


def _rows_table(rows: Sequence[Row]) -> str:
    head = _table_head()
    body = []
    for row in rows:
        marked = {MARKED_COLUMN[m] for m in row.best}
        cells = []
        for column in DISPLAY_COLUMNS:
            classes = ["num"] if column.numeric else []
            if column.header in marked:
                classes.append("best")
            if column.header == "status":
                classes.append(f"status-{escape(row.status)}")
            if column.header == "step IQR %" and row.noisy:
                classes.append("noisy")
            value = column.show(row)
            if column.header == "best" and value:
                value = "★ " + value
            cells.append(f'<td class="{" ".join(classes)}">{escape(value)}</td>')
        title = f' title="{escape(row.error)}"' if row.error else ""
        body.append(f'<tr class="{escape(row.status)}"{title}>{"".join(cells)}</tr>')
    table = f'<table id="cells"><thead>{head}</thead><tbody>{"".join(body)}</tbody></table>'
    return f'<div class="scroll">{table}</div>'


def _errors(rows: Sequence[Row]) -> str:
    failed = [r for r in rows if r.error]
    if not failed:
        return '<p class="note">Every cell completed.</p>'
    items = "".join(
        f"<li><code>{escape(r.cell_id)}</code> <b>{escape(r.status)}</b>: {escape(r.error or '')}</li>"
        for r in failed
    )
    return f'<h3>Cells that did not complete</h3><ul class="errors">{items}</ul>'


def _layout_changes(rows: Sequence[Row]) -> str:
    moved = [r for r in rows if r.layouts]
    if not moved:
        return ""
    items = "".join(f"<li><code>{escape(r.cell_id)}</code>: {escape(r.layouts or '')}</li>" for r in moved)
    note = '<p class="note">Their figures are the last layout\'s.</p>'
    return f"<h3>Cells resumed onto another layout</h3>{note}<ul>{items}</ul>"


def _verdicts(agreements: Sequence[LossAgreement]) -> str:
    if not agreements:
        return '<p class="verdict none">No cell logged a loss: nothing to compare.</p>'
    parts = []
    for agreement in agreements:
        kind = {True: "ok", False: "bad", None: "none"}[agreement.coincide]
        parts.append(f'<p class="verdict {kind}" data-coincide="{kind}">{escape(agreement.verdict())}</p>')
    return "".join(parts)


def _best_summary(rows: Sequence[Row]) -> str:
    lines = []
    for mark, meaning in BEST_MEANING.items():
        show = MARKED_COLUMN[mark]
        column = next(c for c in DISPLAY_COLUMNS if c.header == show)
        winners = [r for r in rows if mark in r.best]
        if winners:
            who = ", ".join(f"<code>{escape(r.cell_id)}</code> {escape(r.label)}" for r in winners)
            lines.append(
                f"<li>★ {escape(meaning)}: {who} ({escape(show)} {escape(column.show(winners[0]))})</li>"
            )
    return f"<ul>{''.join(lines)}</ul>" if lines else ""


def _value(value: Any) -> str:
    if value is None:
        return "null"
    return str(value)


def _config_table(diff: ConfigDiff, labels: dict[str, str]) -> str:
    if not diff.cell_ids:
        return '<p class="note">No cell has a composed config (.hydra/config.yaml).</p>'
    note = f"{diff.same} keys are the same in all {len(diff.cell_ids)} cells with a composed config."
    if diff.without_config:
        note += " Without .hydra/config.yaml: " + ", ".join(diff.without_config) + "."
    if not diff.differing:
        return f'<p class="note">The composed configs are identical. {escape(note)}</p>'
    head = "<th>key</th>" + "".join(
        f'<th title="{escape(labels.get(c, ""))}">{escape(c)}</th>' for c in diff.cell_ids
    )
    body = []
    for key, values in diff.differing.items():
        cells = "".join(
            f"<td>{escape(_value(values[c])) if c in values else '<i>absent</i>'}</td>" for c in diff.cell_ids
        )
        body.append(f"<tr><th>{escape(key)}</th>{cells}</tr>")
    return (
        f'<div class="scroll"><table id="config-diff"><thead><tr>{head}</tr></thead>'
        f'<tbody>{"".join(body)}</tbody></table></div><p class="note">{escape(note)}</p>'
    )


def _notes(cells: Sequence[Cell]) -> str:
    facts: dict[str, set[str]] = {}
    for cell in cells:
        summary = cell.summary
        recorded = (
            ("accelerator", summary.accelerator),
            ("peak_flops_source", summary.peak_flops_source),
            ("peak_memory_measure", summary.peak_memory_measure),
        )
        for key, value in recorded:
            if value:
                facts.setdefault(key, set()).add(str(value))
    items = [f"<li>{escape(UNITS_NOTE)}</li>"]
    names = {
        "accelerator": "accelerator",
        "peak_flops_source": "peak FLOP/s for MFU",
        "peak_memory_measure": "peak memory is",
    }
    items += [f"<li>{names[k]}: {escape('; '.join(sorted(v)))}</li>" for k, v in facts.items()]
    problems = [f"{c.cell_id}: {p}" for c in cells for p in c.problems]
    items += [f"<li>read problem: {escape(p)}</li>" for p in problems]
    return f'<ul class="note">{"".join(items)}</ul>'


def render_html(
    cells: Sequence[Cell], rows: Sequence[Row], agreements: Sequence[LossAgreement], *, sources: Sequence[str]
) -> str:
    """The whole page as one string."""
    order = [r.cell_id for r in rows]
    labels = {r.cell_id: r.label for r in rows}
    by_id = {c.cell_id: c for c in cells}
    ordered = [by_id[cid] for cid in order if cid in by_id]
    charts = [
        memory_chart(rows),
        time_chart(rows),
        wall_chart(rows),
        scaling_chart(rows, metric="mfu"),
        scaling_chart(rows, metric="tokens"),
        loss_chart(cells, order, labels),
        spread_chart(agreements),
    ]
    held_out = loss_chart(cells, order, labels, metric=EVAL_LOSS)
    if not held_out.empty:  # some cell was evaluated (train.eval_every)
        charts.insert(-1, held_out)
    counts: dict[str, int] = {}
    for row in rows:
        counts[row.status] = counts.get(row.status, 0) + 1
    tally = ", ".join(f"{n} {status}" for status, n in counts.items())
    figures = "".join(_figure(c) for c in charts)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{CSP}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
<title>ladder report: {len(rows)} cells</title>
<style>{STYLE}</style>
<script>{SCRIPT}</script>
</head><body>
<h1>ladder report</h1>
<p class="meta">{len(rows)} cells ({escape(tally)}) from {escape(", ".join(sources))}</p>
<h2>Is it the same experiment?</h2>
{_verdicts(agreements)}
<h2>Cells</h2>
{_best_summary(rows)}
{_rows_table(rows)}
{_errors(rows)}
{_layout_changes(rows)}
<h2>Charts</h2>
<div class="charts">{figures}</div>
<h2>What differs between the cells' configs</h2>
{_config_table(config_diff(ordered), labels)}
<h2>Notes</h2>
{_notes(cells)}
<p id="report-status" data-state="pending">page check: pending (needs JavaScript)</p>
</body></html>
"""


def write_html(path: Path, page: str) -> None:
    """Write the page to ``path`` (UTF-8)."""
    path.write_text(page, encoding="utf-8")

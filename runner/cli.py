"""The ``ladder`` console script: subcommands around training runs (training itself is ``python train.py``).

ladder report PATH...                      a table of every cell, best cells marked
ladder report PATH... --format md|csv|json text for piping
ladder report PATH... --html out.html      one self-contained page with charts
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

EXIT_USAGE = 2  # bad input: a missing path, a path with no run in it (argparse uses 2 too)


def _report(args: argparse.Namespace) -> int:

    # Deferred: the report's tables load only where they are printed (start-up time).
    from runner.report.collect import ReportInputError, collect
    from runner.report.compare import EVAL_LOSS, loss_agreement
    from runner.report.html import render_html, write_html
    from runner.report.rows import build_rows
    from runner.report.terminal import output_console, print_report
    from runner.report.text import render_text

    if args.html is not None and not args.html.parent.is_dir():
        print(f"ladder report: no such directory for --html: {args.html.parent}", file=sys.stderr)
        return EXIT_USAGE
    try:
        cells = collect(args.paths)
    except ReportInputError as error:
        print(f"ladder report: {error}", file=sys.stderr)
        return EXIT_USAGE
    rows = build_rows(cells)
    agreements = loss_agreement(cells, tolerance=args.loss_tol)
    agreements += loss_agreement(cells, tolerance=args.loss_tol, metric=EVAL_LOSS)
    sources = [str(p) for p in args.paths]
    if args.format == "table":
        console = output_console(piped_width=200 if args.wide else 120)
        title = f"ladder report: {', '.join(sources)}"
        print_report(rows, agreements, console=console, title=title, wide=args.wide)
    else:
        sys.stdout.write(render_text(rows, args.format))
    if args.html is not None:
        write_html(args.html, render_html(cells, rows, agreements, sources=sources))
        print(f"ladder report: wrote {args.html} ({len(rows)} cells)", file=sys.stderr)
    return 0


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand."""
    parser = argparse.ArgumentParser(prog="ladder", description="Review ladder runs and sweeps.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    report = commands.add_parser(
        "report",
        help="compare the cells of runs and sweeps",
        description=(
            "Compare cells side by side: layout, memory per term (GB = 1e9 bytes), tokens/s per device, "
            "MFU, final loss and status. Failed and unfinished cells are listed with their error."
        ),
    )
    report.add_argument(
        "paths", nargs="+", type=Path, metavar="PATH", help="a run directory or a multirun directory"
    )
    report.add_argument(
        "--format",
        choices=("table", "md", "csv", "json"),
        default="table",
        help="table (default, for the terminal), or md, csv, json for piping",
    )
    report.add_argument(
        "--wide",
        action="store_true",
        help="the table with every column (layout, step phases, memory per term, wall time's parts); "
        "by default the most telling ones, in 120 columns",
    )
    report.add_argument("--html", type=Path, metavar="OUT", help="also write one self-contained HTML page")
    report.add_argument(
        "--loss-tol",
        type=_positive,
        default=None,
        metavar="TOL",
        help="largest |loss difference| across cells at a step that still counts as coinciding "
        "(default 1e-3 for fp32, 5e-2 when a cell trains in 16-bit)",
    )
    report.set_defaults(handler=_report)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``ladder``; returns the exit code."""
    args = build_parser().parse_args(argv)
    return int(args.handler(args))


if __name__ == "__main__":
    sys.exit(main())

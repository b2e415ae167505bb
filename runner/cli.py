"""The ``ladder`` console script: subcommands around training runs (training itself is ``python train.py``).

ladder report PATH...                      a table of every cell, best cells marked
ladder report PATH... --format md|csv|json text for piping
ladder report PATH... --html out.html      one self-contained page with charts
ladder export RUN_DIR OUT_DIR [--step N]   a checkpoint as a Hugging Face model directory
ladder tokenize --tokenizer DIR INPUT... --out PATH
                                           text, JSON Lines or Parquet to the token file data.path reads
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from runner.exit_codes import ExitCode


def _report(args: argparse.Namespace) -> ExitCode:

    # Deferred: the report's tables load only where they are printed (start-up time).
    from runner.report.collect import ReportInputError, collect
    from runner.report.compare import EVAL_LOSS, loss_agreement
    from runner.report.html import render_html, write_html
    from runner.report.rows import build_rows
    from runner.report.terminal import output_console, print_report
    from runner.report.text import render_text

    if args.html is not None and not args.html.parent.is_dir():
        print(f"ladder report: no such directory for --html: {args.html.parent}", file=sys.stderr)
        return ExitCode.REFUSED
    try:
        cells = collect(args.paths)
    except ReportInputError as error:
        print(f"ladder report: {error}", file=sys.stderr)
        return ExitCode.REFUSED
    for cell in cells:  # one malformed summary does not hide the other cells
        if cell.summary_error is not None:
            print(
                f"ladder report: skipped the summary of {cell.cell_id}: {cell.summary_error}", file=sys.stderr
            )
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
    return ExitCode.OK


def _export(args: argparse.Namespace) -> ExitCode:
    # Deferred: the hardware probes load only for the subcommand that needs them (start-up time).
    from runner.hardware.cuda_devices import select_accelerator

    # DeepSpeed, imported next, picks its accelerator at import and, unnamed on a host without
    # CUDA, logs "Setting accelerator to CPU ..."; the conversion's child process inherits the name.
    select_accelerator()
    # Deferred: DeepSpeed loads only for the subcommand that needs it, after its accelerator is named.
    from runner.checkpoint.hf_export import ExportError, export

    try:
        result = export(
            args.run_dir,
            args.out_dir,
            step=args.step,
            force=args.force,
            max_shard_bytes=args.max_shard_bytes,
            tokenizer=args.tokenizer,
            with_tokenizer=not args.no_tokenizer,
        )
    except ExportError as error:
        print(f"ladder export: {error}", file=sys.stderr)
        return ExitCode.REFUSED
    print(
        f"ladder export: wrote {result.out_dir} from {result.tag}: {result.tensors} tensors in "
        f"{result.shards} shard(s), the largest shard {result.largest_shard_bytes / 1e9:.3f} GB, the "
        f"largest tensor {result.largest_tensor_bytes / 1e9:.3f} GB; peak host memory "
        f"{result.peak_host_bytes / 1e9:.3f} GB (GB = 1e9 bytes)"
        + (
            f", the conversion to the universal format in its own process "
            f"{result.conversion_peak_host_bytes / 1e9:.3f} GB"
            if result.conversion_peak_host_bytes
            else ""
        )
    )
    return ExitCode.OK


def _byte_size(text: str) -> int:
    units = {"KB": 10**3, "MB": 10**6, "GB": 10**9}
    unit = text[-2:].upper()
    try:
        value = int(float(text[:-2]) * units[unit]) if unit in units else int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a size like 5GB, 500MB or a byte count, got {text}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _tokenize(args: argparse.Namespace) -> ExitCode:

    # Deferred: rich's progress and the document readers load only for this command.
    from rich.console import Console

    from runner.data.text_documents import DocumentOptions, input_problems
    from runner.data.tokenize_progress import PREFIX, result_lines, tokenize_progress
    from runner.data.tokenize_text import TOKENIZER_KEY, tokenize_to_file
    from runner.data.tokenizer_dir import tokenizer_dir_problem

    options = DocumentOptions(split=args.split, field=args.field, column=args.column)
    problems = input_problems(args.inputs, options)
    problems.append(tokenizer_dir_problem(args.tokenizer, key=TOKENIZER_KEY) or "")
    if not args.out.parent.is_dir():
        problems.append(f"--out={args.out}: no such directory {args.out.parent}; create it first")
    problems = [problem for problem in problems if problem]
    if problems:
        print("\n".join(f"{PREFIX}: {problem}" for problem in problems), file=sys.stderr)
        return ExitCode.REFUSED
    console = Console(stderr=True)
    total = sum(path.stat().st_size for path in args.inputs)
    try:
        with tokenize_progress(total, console) as progress:
            result = tokenize_to_file(
                args.inputs,
                args.out,
                args.tokenizer,
                options=options,
                eos=args.eos,
                workers=args.workers,
                progress=progress,
            )
    except ValueError as error:  # a document or tokenizer the checks above could not see
        print(f"{PREFIX}: {error}; nothing written to {args.out}", file=sys.stderr)
        return ExitCode.REFUSED
    except KeyboardInterrupt:
        print(f"{PREFIX}: interrupted; nothing written to {args.out}", file=sys.stderr)
        return ExitCode.CTRL_C_AT_COMMAND
    print("\n".join(result_lines(result, str(args.tokenizer), args.workers)))
    return ExitCode.OK


def _at_least_one(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text}")
    return value


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand."""
    parser = argparse.ArgumentParser(
        prog="ladder",
        description=(
            "ladder's commands besides training (python train.py): compare runs and sweeps, export a "
            "run as a Hugging Face model, tokenize text for data.path."
        ),
    )
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
    _add_export(commands)
    _add_tokenize(commands)
    return parser


def _add_export(commands: Any) -> None:
    """``ladder export``'s arguments."""
    export = commands.add_parser(
        "export",
        help="write a run's checkpoint as a Hugging Face model directory",
        description=(
            "Write config.json and safetensors shards that transformers' "
            "AutoModelForCausalLM.from_pretrained(OUT_DIR) loads, from a checkpoint of any layout."
        ),
    )
    export.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="the run directory")
    export.add_argument("out_dir", type=Path, metavar="OUT_DIR", help="an empty or new directory")
    export.add_argument(
        "--step",
        type=int,
        default=None,
        metavar="N",
        help="the checkpoint after N steps (default: the newest)",
    )
    export.add_argument("--force", action="store_true", help="replace a non-empty OUT_DIR")
    export.add_argument(
        "--max-shard-size",
        dest="max_shard_bytes",
        type=_byte_size,
        default="5GB",
        metavar="SIZE",
        help="largest safetensors shard, as transformers' save_pretrained (default 5GB, GB = 1e9 bytes)",
    )
    export.add_argument(
        "--tokenizer",
        type=Path,
        default=None,
        metavar="DIR",
        help="where the run's tokenizer is now (default: the data.tokenizer summary.json records)",
    )
    export.add_argument(
        "--no-tokenizer", action="store_true", help="export the weights without the run's tokenizer"
    )
    export.set_defaults(handler=_export)


def _add_tokenize(commands: argparse._SubParsersAction) -> None:
    """``ladder tokenize``'s arguments."""
    from runner.data.text_documents import TXT_SPLITS  # deferred: start-up time of the other commands

    tokenize = commands.add_parser(
        "tokenize",
        help="turn text into the token file data.path reads",
        description=(
            "Tokenize plain text (.txt), JSON Lines (.jsonl, .json) or Parquet (.parquet) with the Hugging "
            "Face tokenizer in DIR, offline, into one llm.c token shard (uint16 ids when the vocabulary "
            "fits, else uint32): each document followed by the tokenizer's end-of-text token. Written "
            "to a temporary file and renamed: a failed run leaves no output."
        ),
    )
    tokenize.add_argument("inputs", nargs="+", type=Path, metavar="INPUT", help="text, JSON Lines or Parquet")
    tokenize.add_argument(
        "--tokenizer", required=True, type=Path, metavar="DIR", help="a directory holding tokenizer.json"
    )
    tokenize.add_argument("--out", required=True, type=Path, metavar="PATH", help="the token file to write")
    tokenize.add_argument(
        "--split",
        choices=TXT_SPLITS,
        default="file",
        help="a .txt file's documents: the whole file (default), each line, or paragraphs between "
        "blank lines",
    )
    tokenize.add_argument("--field", default="text", help="JSON Lines: the field holding the text (text)")
    tokenize.add_argument("--column", default="text", help="Parquet: the column holding the text (text)")
    tokenize.add_argument(
        "--eos", metavar="TOKEN", help="the end-of-text token; default: the tokenizer's eos_token"
    )
    tokenize.add_argument(
        "--workers",
        type=_at_least_one,
        default=os.cpu_count() or 1,
        help="processes that encode (default: this host's cores)",
    )
    tokenize.set_defaults(handler=_tokenize)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``ladder``; returns the exit code."""
    args = build_parser().parse_args(argv)
    return int(args.handler(args))


if __name__ == "__main__":
    sys.exit(main())

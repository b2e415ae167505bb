"""The longest sequence that trains one step on this host, before and after the long-context rung.

One run, one table. A Llama-style model from a Hugging Face config.json this script writes
(vocabulary 32,000, 256 wide, 2 layers, 4 query and 2 key/value heads), fp32, synthetic tokens,
2 CPU ranks under ZeRO-3, one optimizer step per attempt (``python train.py ... train.steps=1``):

- before: ``parallel.sp=1`` (dp 2, micro 1, global 2), no recomputation, the whole logits
  (``model.loss_tiles=1``), the MLP whole;
- after: ``parallel.sp=2`` (dp 1, each rank holds half of every sample's tokens, global 1), full
  recomputation, the head and loss in ``--loss-tiles`` pieces, each MLP in ``--mlp-tiles`` pieces
  (DeepSpeed's TiledMLP).

An attempt fits when it completes its step and each rank's high-water RSS (summary.json
``host_memory.measured_per_rank_gb``, the most over ranks) times the 2 ranks stays within
``--cap-gib``. While it runs, the script sums the resident memory of the run's processes every
50 ms and kills them above the cap, so the host is never pushed into its OOM killer; a killed
attempt does not fit. Before: the length doubles from ``--start`` until an attempt does not fit,
then ``--bisect`` halvings of the gap, on multiples of ``--step``. After: 8 times the before
length, then doubling while it fits, up to ``--max-seq`` (attention's time grows with the square
of the length: a CPU step at 32K tokens takes minutes).

Then one step time at sp 1 beside sp 2 with the after's recomputation and tiling, at the same
global batch (2) and ``--compare-seq`` tokens, with each step's phases (summary.json ``final``
``time/*``; comm: ``time/comm_exposed_s``, the seconds blocked in DeepSpeed's collectives).

    python bench/long_context.py [--cap-gib 4] [--start 512] [--max-seq 32768]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GIB = 2**30  # the cap is in GiB (2^30 bytes); summary.json's memory is in GB (1e9 bytes)
GB = 1e9
RANKS = 2
POLL_S = 0.05
# A Llama-style config.json (docs/hugging-face.md lists what ladder maps): a 32K vocabulary,
# heads divisible by sp = 2, positions far beyond any length tried here.
HF_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 688,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 32000,
    "max_position_embeddings": 1048576,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
}
COMMON = (
    "gpus=2",
    "parallel=zero3",
    "precision=fp32",
    "data=synthetic",
    "batch.micro_size=1",
    "logger=none",
    "train.steps=1",
    "train.save_final=false",
    f"model.max_seq_len={HF_CONFIG['max_position_embeddings']}",
)
BEFORE = ("parallel.sp=1", "batch.global_size=2", "model.activation_checkpointing=none", "model.loss_tiles=1")


def after_overrides(*, sp: int, global_size: int, loss_tiles: int, mlp_tiles: int) -> tuple[str, ...]:
    """The long-context rung: sequence parallelism, full recomputation, the loss and MLP in pieces."""
    return (
        f"parallel.sp={sp}",
        f"batch.global_size={global_size}",
        "model.activation_checkpointing=full",
        f"model.loss_tiles={loss_tiles}",
        f"model.mlp_tiles={mlp_tiles}",
    )


@dataclass(frozen=True)
class Attempt:
    """What one ``train.steps=1`` run left: whether it fit, its peaks and its step's phases."""

    seq: int
    status: str  # fits, over cap, killed at cap, failed
    measured_gb: float = float("nan")  # high-water RSS per rank, the most over ranks
    planned_gb: float = float("nan")  # plan's host memory per rank (steady phase)
    planned_device_gb: float = float("nan")  # plan's device peak per rank
    step_s: float = float("nan")
    forward_s: float = float("nan")
    backward_s: float = float("nan")
    optimizer_s: float = float("nan")
    comm_s: float = float("nan")
    wall_s: float = float("nan")
    error: str = ""

    @property
    def fits(self) -> bool:
        """Completed its step within the cap."""
        return self.status == "fits"


def _tree_rss(root: int) -> int:
    """Resident bytes of ``root`` and every process below it (from /proc)."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the process ended while being read
        pid, ppid = int(entry.name), int(fields[1])
        children.setdefault(ppid, []).append(pid)
        rss[pid] = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")  # stat(5) field 24: rss in pages
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += rss.get(pid, 0)
        todo.extend(children.get(pid, []))
    return total


def run_one(seq: int, overrides: tuple[str, ...], *, config: Path, run_dir: Path, cap_bytes: int) -> Attempt:
    """Train one step at ``seq`` tokens under the cap; read the run's summary.json."""
    cmd = [
        sys.executable,
        str(ROOT / "train.py"),
        "model=hf",
        f"model.hf_config={config}",
        *COMMON,
        *overrides,
        f"data.seq_len={seq}",
        f"hydra.run.dir={run_dir}",
    ]
    start = time.perf_counter()
    with open(run_dir.with_suffix(".log"), "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        killed = False
        while proc.poll() is None:
            if _tree_rss(proc.pid) > cap_bytes:
                os.killpg(proc.pid, signal.SIGKILL)  # the run's own session: its launcher and ranks
                killed = True
                proc.wait()
                break
            time.sleep(POLL_S)
    wall = time.perf_counter() - start
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    host, device = summary.get("host_memory", {}), summary.get("device_memory_plan", {})
    planned = {
        "planned_gb": host.get("planned_per_rank_gb", float("nan")),
        "planned_device_gb": device.get("planned_peak_gb", float("nan")),
    }
    if killed:
        return Attempt(seq, "killed at cap", wall_s=wall, **planned)
    if proc.returncode != 0 or summary.get("status") != "completed":
        lines = run_dir.with_suffix(".log").read_text().strip().splitlines() or ["no output"]
        return Attempt(seq, "failed", wall_s=wall, error=lines[-1][:160], **planned)
    final = summary["final"]
    measured = host["measured_per_rank_gb"]
    return Attempt(
        seq,
        "fits" if measured * GB * RANKS <= cap_bytes else "over cap",
        measured_gb=measured,
        step_s=final["time/step_s"],
        forward_s=final["time/forward_s"],
        backward_s=final["time/backward_s"],
        optimizer_s=final["time/optimizer_s"],
        comm_s=final["time/comm_exposed_s"],
        wall_s=wall,
        **planned,
    )


def _round(seq: float, step: int) -> int:
    """``seq`` rounded down to a multiple of ``step`` (at least ``step``)."""
    return max(step, int(seq) // step * step)


def longest_before(try_seq: Callable[[int], Attempt], *, start: int, step: int, bisect: int) -> list[Attempt]:
    """Double from ``start`` until an attempt does not fit, then halve the gap ``bisect`` times."""
    attempts = [try_seq(start)]
    while attempts[-1].fits:
        attempts.append(try_seq(attempts[-1].seq * 2))
    fitting = [a.seq for a in attempts if a.fits]
    low, high = (fitting[-1] if fitting else 0), attempts[-1].seq
    for _ in range(bisect):
        mid = _round((low + high) / 2, step)
        if mid <= low or mid >= high:
            break
        attempts.append(try_seq(mid))
        low, high = (mid, high) if attempts[-1].fits else (low, mid)
    return attempts


def longest_after(try_seq: Callable[[int], Attempt], *, first: int, max_seq: int) -> list[Attempt]:
    """``first`` tokens, then doubling while each fits and stays within ``max_seq``."""
    attempts = [try_seq(first)]
    while attempts[-1].fits and attempts[-1].seq * 2 <= max_seq:
        attempts.append(try_seq(attempts[-1].seq * 2))
    return attempts


def _print_attempts(label: str, attempts: list[Attempt]) -> None:
    """One line per attempt, in the order tried."""
    print(f"{label}")
    print(f"  {'seq':>7}  {'status':<14}{'meas GB':>8}{'plan GB':>8}{'dev GB':>8}{'step s':>8}{'wall s':>8}")
    for a in attempts:
        print(
            f"  {a.seq:>7,}  {a.status:<14}{a.measured_gb:>8.2f}{a.planned_gb:>8.2f}"
            f"{a.planned_device_gb:>8.2f}{a.step_s:>8.1f}{a.wall_s:>8.0f}  {a.error}"
        )


def _phases(label: str, a: Attempt) -> str:
    """One attempt's step time by phase."""
    return (
        f"  {label:<26}{a.seq:>7,}{a.step_s:>8.2f}{a.forward_s:>8.2f}{a.backward_s:>8.2f}"
        f"{a.optimizer_s:>8.3f}{a.comm_s:>8.2f}{a.measured_gb:>8.2f}"
    )


def _summary_line(label: str, a: Attempt) -> str:
    """The longest length of one search and its peaks."""
    return f"  {label:<10}{a.seq:>12,}{a.measured_gb:>9.2f}{a.planned_gb:>9.2f}{a.step_s:>8.1f}"


def main() -> None:
    """Search both lengths, time sp 1 against sp 2, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cap-gib", type=float, default=4.0, help="host memory for both ranks together")
    parser.add_argument("--start", type=int, default=512)
    parser.add_argument("--step", type=int, default=256, help="lengths are multiples of this")
    parser.add_argument("--bisect", type=int, default=2)
    parser.add_argument("--max-seq", type=int, default=32768)
    parser.add_argument("--loss-tiles", type=int, default=8)
    parser.add_argument("--mlp-tiles", type=int, default=8)
    parser.add_argument("--compare-seq", type=int, default=2048)
    args = parser.parse_args()
    cap = int(args.cap_gib * GIB)
    tiles = {"loss_tiles": args.loss_tiles, "mlp_tiles": args.mlp_tiles}
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "config.json"
        config.write_text(json.dumps(HF_CONFIG))

        def trier(name: str, overrides: tuple[str, ...]) -> Callable[[int], Attempt]:
            def try_seq(seq: int) -> Attempt:
                attempt = run_one(
                    seq, overrides, config=config, run_dir=Path(tmp) / f"{name}-{seq}", cap_bytes=cap
                )
                print(
                    f"  {name} seq {seq:,}: {attempt.status} ({attempt.wall_s:.0f} s)",
                    file=sys.stderr,
                    flush=True,
                )
                return attempt

            return try_seq

        before = longest_before(trier("before", BEFORE), start=args.start, step=args.step, bisect=args.bisect)
        best_before = max((a for a in before if a.fits), key=lambda a: a.seq)
        after_run = trier("after", after_overrides(sp=2, global_size=1, **tiles))
        after = longest_after(after_run, first=8 * best_before.seq, max_seq=args.max_seq)
        fitting_after = [a for a in after if a.fits]
        compare = {
            sp: trier(f"compare-sp{sp}", after_overrides(sp=sp, global_size=2, **tiles))(args.compare_seq)
            for sp in (1, 2)
        }

    print(f"cap: {args.cap_gib:g} GiB of host memory, the 2 ranks and their launcher ({cap / GB:.2f} GB)")
    print("GB = 1e9 bytes. meas GB: high-water RSS per rank (most over ranks); plan GB: the plan's host")
    print("memory per rank; dev GB: the plan's device peak per rank (tensors only)")
    _print_attempts("before: sp 1, recompute none, loss_tiles 1, mlp_tiles 1 (dp 2, global 2)", before)
    tiled = f"loss_tiles {args.loss_tiles}, mlp_tiles {args.mlp_tiles}"
    _print_attempts(f"after: sp 2, recompute full, {tiled} (dp 1, global 1)", after)
    print()
    print(f"  {'':<10}{'longest seq':>12}{'meas GB':>9}{'plan GB':>9}{'step s':>8}")
    print(_summary_line("before", best_before))
    if fitting_after:
        best_after = max(fitting_after, key=lambda a: a.seq)
        stopped = after[-1].fits  # the search ended at --max-seq, not at a failed attempt
        note = f"  (search stopped at --max-seq {args.max_seq:,}: not a limit)" if stopped else ""
        print(_summary_line("after", best_after) + note)
        print(f"  ratio {best_after.seq / best_before.seq:.1f}x")
    else:
        first = after[0]
        print(f"  after: 8 x {best_before.seq:,} = {first.seq:,} tokens: {first.status} {first.error}")
    print()
    print(f"step time at global batch 2, seq {args.compare_seq:,}, recompute full, {tiled} (seconds):")
    print(f"  {'':<26}{'seq':>7}{'step':>8}{'fwd':>8}{'bwd':>8}{'opt':>8}{'comm':>8}{'meas GB':>8}")
    print(_phases("sp 1 (dp 2, accum 1)", compare[1]))
    print(_phases("sp 2 (dp 1, accum 2)", compare[2]))


if __name__ == "__main__":
    main()

"""The files of a run directory that ranks read back: the composed config and DeepSpeed's config.

.hydra/config.yaml       the composed config (Hydra writes it)
deepspeed_config.json    build_deepspeed_config's output (the launcher writes it)
failure_rank<N>.json     a failed rank's error (the rank writes it)
earlier_attempts/<n>/    what an attempt that started over found there (keep_earlier_attempt)
"""

from __future__ import annotations

import json
import shutil
import time
import traceback
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from runner.config import TrainConfig, _unlocked_node, to_train_config
from runner.layout import Layout, resolve_layout
from runner.rundir.summary import write_json_atomic

DEEPSPEED_CONFIG_FILE = "deepspeed_config.json"


def write_deepspeed_config(run_dir: Path, ds_config: dict[str, Any]) -> None:
    """Keep the exact DeepSpeed config of the run beside its results."""
    write_json_atomic(run_dir / DEEPSPEED_CONFIG_FILE, ds_config)


def load_config(run_dir: Path) -> TrainConfig:
    """The typed config of a run from the composed config Hydra saved."""
    composed = OmegaConf.load(run_dir / ".hydra" / "config.yaml")
    node = OmegaConf.merge(_unlocked_node(TrainConfig), composed)
    assert isinstance(node, DictConfig)
    return to_train_config(node)


def layout_of(config: TrainConfig, ds_config: dict[str, Any], *, gpus: int) -> Layout:
    """The layout that a DeepSpeed config encodes, re-derived through the batch contract."""
    return resolve_layout(
        gpus=gpus,
        tp=config.parallel.tp,
        pp=config.parallel.pp,
        global_size=config.batch.global_size,
        micro_size=int(ds_config["train_micro_batch_size_per_gpu"]),
    )


def load_run(run_dir: Path) -> tuple[TrainConfig, Layout, dict[str, Any]]:
    """Config, layout and DeepSpeed config of a prepared run directory."""
    config = load_config(run_dir)
    with (run_dir / DEEPSPEED_CONFIG_FILE).open() as handle:
        ds_config: dict[str, Any] = json.load(handle)
    return config, layout_of(config, ds_config, gpus=config.gpus), ds_config


def add_note(error: BaseException, words: str) -> None:
    """``error.add_note(words)`` (PEP 678) by hand: ``add_note`` itself is Python 3.11+."""
    notes = getattr(error, "__notes__", None)
    if notes is None:
        notes = []
        error.__notes__ = notes  # type: ignore[attr-defined]
    notes.append(words)


def with_notes(error: BaseException) -> str:
    """``Type: message``, then the error's notes (PEP 678: runner/diagnose/out_of_memory.py,
    runner/diagnose/peer_loss.py)."""
    notes = getattr(error, "__notes__", None) or []
    return "; ".join([f"{type(error).__name__}: {error}", *notes])


def write_failure(run_dir: Path, *, rank: int, error: BaseException, trace: str | None = None) -> None:
    """Record why a rank failed, for the launcher's summary."""
    write_json_atomic(
        run_dir / f"failure_rank{rank}.json",
        {
            "rank": rank,
            "time": time.time(),
            "error": with_notes(error),
            "traceback": trace or "".join(traceback.format_exception(error)),
        },
    )


def read_failures(run_dir: Path) -> list[dict[str, Any]]:
    """Every failure record of the run, first failure first.

    The rank that failed first is the cause; the others then fail on a collective whose
    peer has gone ("Connection closed by peer").
    """
    records = []
    for path in sorted(run_dir.glob("failure_rank*.json")):
        with path.open() as handle:
            records.append(json.load(handle))
    return sorted(records, key=lambda r: (float(r.get("time", 0.0)), int(r["rank"])))


# What an attempt leaves in its run directory, besides checkpoints (none, when it starts
# over), Hydra's train.log (appended to) and wandb/ (one folder per wandb run).
ATTEMPT_FILES = ("metrics.jsonl", "summary.json", DEEPSPEED_CONFIG_FILE, "profile")


def keep_earlier_attempt(run_dir: Path) -> Path | None:
    """Move an earlier attempt's results to ``earlier_attempts/<n>/`` before this one starts over.

    ``train.resume=auto`` (or a requeued job) with no checkpoint to continue from trains from
    step 0 in the same directory: the earlier attempt's metrics, summary, DeepSpeed config,
    failure records and profile move aside with the Hydra config it ran with (set aside by
    launchers/hydra_files.py), so a finished run resumed by mistake is not replaced. Returns the
    folder, or None when there was nothing to keep.
    """
    found = [run_dir / name for name in ATTEMPT_FILES if (run_dir / name).exists()]
    found += sorted(run_dir.glob("failure_rank*.json"))
    if not found:
        return None
    from launchers.hydra_files import ASIDE, EARLIER_ATTEMPTS, HYDRA_DIR

    earlier = run_dir / EARLIER_ATTEMPTS
    number = 1 + sum(1 for path in earlier.iterdir() if path.is_dir()) if earlier.is_dir() else 1
    folder = earlier / str(number)
    folder.mkdir(parents=True)
    for path in found:
        path.rename(folder / path.name)
    hydra = run_dir / HYDRA_DIR / ASIDE
    if hydra.is_dir():
        shutil.copytree(hydra, folder / HYDRA_DIR)
    return folder

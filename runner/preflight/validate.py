"""Checks before launch: each value against its key's range in the schema (runner/config.py), then
what needs more than a schema; each problem names the key, the value and the fix. The rules a
plan shares (heads, tp's split, offload's stages, the pipeline's) are runner/rules/'s, asked here
and by runner/plan/planner.py alike.

Everything here runs in the launching process, before any rank starts and before the
run directory gets any file of the runner's.
"""

from __future__ import annotations

import difflib
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from runner.config import DataName, Precision, RopeScaling, TrainConfig
from runner.data.text_corpus import builtin_held_out_text
from runner.data.token_file import TOKEN_DTYPES, llmc_tokenizer_sha256, token_file_problem, token_files
from runner.data.tokenizer_dir import (
    TokenizerError,
    load_tokenizer,
    tokenizer_sha256,
    tokenizer_shas,
    vocab_size,
)
from runner.errors import ConfigError
from runner.hardware.cuda_devices import cuda_available
from runner.hardware.host_allocator import allocator_problem
from runner.hardware.host_ranks import host_ranks
from runner.layout import LayoutError, parse_micro_size, resolve_layout
from runner.preflight.schema_keys import SchemaKey, schema_keys, spell, value_at
from runner.preflight.wandb_credentials import credentials_problems
from runner.rules import config_layout_problems, head_problems, pipeline_engine_problems, tp_node_problems
from runner.step_time.measured.figures import file_problem as calibration_file_problem


def host_ranks_available() -> tuple[int, str]:
    """How many ranks the local launcher places on this host (runner/hardware/host_ranks.py), in words."""
    count, cuda = host_ranks()
    if cuda:
        return count, f"{count} CUDA device(s)"
    return count, f"no CUDA device and {count} CPU core(s) (one rank per core)"


def value_problem(key: SchemaKey, value: Any) -> str | None:
    """Why ``value`` is not one of ``key``'s values (its enum, its range), or None."""
    if value is None:
        return None if key.optional else f"{key.path}=null: must be set; e.g. {key.example()}"
    if key.is_enum:
        try:
            key.kind(value)
        except ValueError:
            options = [str(member.value) for member in key.kind]
            close = difflib.get_close_matches(str(value), options, n=1)
            hint = f"; did you mean {key.path}={close[0]}?" if close else ""
            return f"{key.path}={value}: must be one of {', '.join(options)} ({key.meaning}){hint}"
        return None
    if isinstance(value, float) and not math.isfinite(value):
        # inf and nan pass every range check written as a comparison (nan fails none), and
        # torch refuses them only inside a rank, with a traceback.
        return f"{key.path}={spell(value)}: must be a finite number ({key.meaning}); e.g. {key.example()}"
    if key.valid is None or not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    if key.valid.holds(value):
        return None
    null = ", or null" if key.optional else ""
    return (
        f"{key.path}={spell(value)}: must be {key.valid.words()}{null} ({key.meaning}); e.g. {key.example()}"
    )


def range_problems(config: TrainConfig) -> list[str]:
    """Every key whose value lies outside the range (or the enum) the schema gives it."""
    problems = []
    for key in schema_keys():
        if not key.is_section:
            problem = value_problem(key, value_at(config, key.path))
            if problem is not None:
                problems.append(problem)
    return problems


def _problems(config: TrainConfig) -> list[str]:
    """The checks that combine keys, or look beyond the config; each key is in its range by now."""
    problems: list[str] = []
    model, data = config.model, config.data

    def need(ok: bool, message: str) -> None:
        if not ok:
            problems.append(message)

    need(
        data.seq_len <= model.max_seq_len,
        f"data.seq_len={data.seq_len} exceeds model.max_seq_len={model.max_seq_len} of model "
        f"{model.name}; lower data.seq_len or raise model.max_seq_len",
    )
    need(data.dtype in TOKEN_DTYPES, f"data.dtype={data.dtype!r}: use uint8, uint16 or uint32")
    need(
        model.name != "hf" or model.hf_config is not None,
        "model=hf needs model.hf_config=PATH: a Hugging Face config.json, or the model directory holding one",
    )
    need(
        model.rope_scaling != RopeScaling.llama3 or model.rope_high_freq_factor > model.rope_low_freq_factor,
        f"model.rope_high_freq_factor={model.rope_high_freq_factor} must exceed model.rope_low_freq_factor="
        f"{model.rope_low_freq_factor}: llama3 scaling blends the wavelengths between original/high and "
        "original/low (Llama 3.1: 4 and 1)",
    )
    problems += head_problems(d_model=model.d_model, n_head=model.n_head, n_kv_head=model.n_kv_head)
    if config.cluster.name == "local" and config.cluster.calibration:
        unreadable = calibration_file_problem(config.cluster.calibration)
        need(
            unreadable is None,
            f"{unreadable}; record one with python bench/calibrate_device.py, or leave it null (unset "
            "LADDER_CALIBRATION) to measure this host",
        )
    if data.name == DataName.text and data.path is None:
        need(
            model.vocab_size >= 256,
            f"model.vocab_size={model.vocab_size}: the built-in text is bytes (ids 0-255); set "
            f"model.vocab_size=256 or more, or give your own tokens with data.path",
        )
    if data.name == DataName.text and data.path is not None:
        problem = _token_path_problem(
            config, "data.path", data.path, "leave data.path unset for the built-in text"
        )
        need(problem is None, problem or "")
    if data.tokenizer is not None:
        problems += _tokenizer_problems(config)
    _check_evaluation(config, need)
    problems += config_layout_problems(config)
    train = config.train
    need(
        train.profile_step < train.steps,
        f"train.profile_step={train.profile_step}: must be a step of the run, 0 to "
        f"train.steps - 1 = {train.steps - 1} (e.g. train.profile_step={min(2, train.steps - 1)}, "
        f"after the first steps' warm-up), or -1 for none",
    )
    if config.model.init_from is not None:
        # Deferred: its tensor names come from a model on the meta device, and a refusal
        # answers before torch is imported (tests/e2e/test_refusals.py).
        from runner.model.hf_weights import init_from_problems

        problems += init_from_problems(config.model)
    return problems


def _tokenizer_problems(config: TrainConfig) -> list[str]:
    """data.tokenizer: a tokenizer directory whose ids fit model.vocab_size, and the one that
    wrote data.path where ladder tokenize recorded it in the file's header."""
    data, vocab = config.data, config.model.vocab_size
    key = f"data.tokenizer={data.tokenizer}"
    if data.name != DataName.text or data.path is None:
        return [
            f"{key} names the tokenizer of data.path's tokens, and data.path is unset; give data.path "
            f"(a token file from ladder tokenize) or unset data.tokenizer"
        ]
    assert data.tokenizer is not None
    try:
        tokenizer = load_tokenizer(data.tokenizer, key="data.tokenizer")
    except TokenizerError as error:
        return [str(error)]
    ids = vocab_size(tokenizer)
    if ids > vocab:
        return [
            f"{key} produces ids up to {ids - 1} ({ids:,} in its vocabulary), more than "
            f"model.vocab_size={vocab}; set model.vocab_size={ids} (or more), or pick a model preset "
            f"whose vocabulary holds {ids:,} ids"
        ]
    sha256, answers_to = tokenizer_sha256(data.tokenizer), tokenizer_shas(data.tokenizer)
    for file in token_files(data.path):
        written_by = llmc_tokenizer_sha256(file) if file.is_file() else None
        if written_by is not None and written_by not in answers_to:
            return [
                f"data.path={file} was tokenized with another tokenizer (sha256 {written_by[:12]}) than "
                f"{key} (sha256 {sha256[:12]}); point data.tokenizer at the tokenizer that wrote it, or "
                f"tokenize the text again: ladder tokenize --tokenizer {data.tokenizer} ... --out {file}"
            ]
    return []


def _check_evaluation(config: TrainConfig, need: Callable[[bool, str], None]) -> None:
    """train.eval_every's held-out tokens: data.val_path, or the built-in text's held-out corpus."""
    train, data = config.train, config.data
    if data.val_path is not None and data.name != DataName.text:
        need(False, f"data.val_path={data.val_path}: held-out tokens are for data=text; unset it")
        return
    if train.eval_every <= 0 or data.name != DataName.text:
        return  # synthetic data is evaluated on synthetic tokens of its own stream
    if data.val_path is None:
        need(
            data.path is None,
            f"train.eval_every={train.eval_every} with data.path={data.path}: give the held-out "
            f"tokens as data.val_path (e.g. llm.c's fineweb_val_000000.bin), in the same forms as "
            f"data.path; ladder holds none of your tokens out itself",
        )
        held_out = len(builtin_held_out_text()) if data.path is None else data.seq_len + 1
        need(
            held_out >= data.seq_len + 1,
            f"train.eval_every={train.eval_every}: this Python has no test-suite sources to hold out of "
            f"the built-in text ({held_out} bytes; Debian ships them as libpython3.X-testsuite); give "
            f"held-out tokens as data.val_path, or set train.eval_every=0",
        )
        return
    problem = _token_path_problem(config, "data.val_path", data.val_path, "unset data.val_path")
    need(problem is None, problem or "")


def _token_path_problem(config: TrainConfig, key: str, path: str, otherwise: str) -> str | None:
    """What is wrong with the token files ``key`` names (data.path, data.val_path): none there, or
    their size, ids against model.vocab_size and length against data.seq_len; None if nothing."""
    files = token_files(path)
    if not files or not all(file.is_file() for file in files):
        return (
            f"{key}={path}: {'matches no file' if not files else 'no such file'}; give a token file (a raw "
            f"array of data.dtype, a .npy, an llm.c shard) or a glob of them, or {otherwise}"
        )
    if config.data.dtype not in TOKEN_DTYPES:
        return None  # said once, of data.dtype
    data = config.data
    return token_file_problem(path, data.dtype, config.model.vocab_size, data.seq_len, key=key)


def batch_contract_problems(config: TrainConfig) -> list[str]:
    """The batch contract with every micro-batch allowed (auto's memory fit is checked later)."""
    if config.gpus < 1:
        return []  # no layout to speak of; the config's own check names gpus
    try:
        resolve_layout(
            gpus=config.gpus,
            tp=config.parallel.tp,
            pp=config.parallel.pp,
            sp=config.parallel.sp,
            global_size=config.batch.global_size,
            micro_size=parse_micro_size(config.batch.micro_size),
        )
    except LayoutError as error:
        return [str(error)]
    return []


def fp16_supported() -> bool:
    """Whether DeepSpeed trains in fp16 on this host: on CUDA, or where its CPU accelerator says so.

    DeepSpeed 0.19.8's CPU accelerator (accelerator/cpu_accelerator.py ``is_fp16_supported``)
    asks oneDNN for fp16 kernels: true on CPUs with AVX512-FP16 or AMX-FP16. Asked only for
    ``precision=fp16`` on a host without CUDA (it imports DeepSpeed, about a second).
    """
    if cuda_available():
        return True
    # Deferred: DeepSpeed loads in a rank only, once its accelerator is chosen (it picks one at import).
    from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator

    return bool(CPU_Accelerator().is_fp16_supported())


def cuda_launch_problems(config: TrainConfig, environ: dict[str, str] | None = None) -> list[str]:
    """On a host where CUDA is visible: what would fail every rank after it built its model.

    DeepSpeed takes its accelerator from DS_ACCELERATOR when it is imported; ``cpu`` would
    put the engine on the host beside the model's CUDA tensors. MFU divides by the device's
    dense datasheet peak, known by name (runner/hardware/peak_flops.py) unless the cluster gives one
    (runner/hardware/mfu_peak.py resolve_peak).
    """
    if not cuda_available():
        return []
    problems = []
    chosen = (os.environ if environ is None else environ).get("DS_ACCELERATOR", "")
    if chosen not in ("", "cuda"):
        problems.append(
            f"DS_ACCELERATOR={chosen} but a CUDA device is visible, which ladder trains on: unset "
            "DS_ACCELERATOR, or hide the devices (CUDA_VISIBLE_DEVICES=) to train on the CPU"
        )
    # Deferred: the peak's module loads torch; only a launch on CUDA devices reaches this check.
    from runner.hardware.mfu_peak import resolve_peak
    from runner.hardware.peak_flops import UnknownDeviceError

    try:  # the peak the ranks will divide by, resolved as they resolve it
        resolve_peak(config.cluster, config.precision.name, accelerator="cuda")
    except UnknownDeviceError as error:
        problems.append(str(error))
    return problems


DEVICE_MEMORY_TOLERANCE = 0.15  # CUDA's total memory against the datasheet's: 150.7e9 B on an H200 (141 GB)


def named_device_problems(config: TrainConfig) -> list[str]:
    """A named GPU cluster launched on this host: this host must have such a device.

    Without one the ranks would train on whatever is here (the CPU) and report MFU against the
    named device's peak. The device is recognised by its memory, the one figure every cluster
    file gives (conf/cluster/<name>.yaml ``device_memory_gb``), within DEVICE_MEMORY_TOLERANCE.
    """
    cluster = config.cluster
    if cluster.name == "local" or cluster.device_memory_gb is None:
        return []
    wanted = cluster.device_memory_gb * 1e9
    found = "no CUDA device"
    if cuda_available():
        # Deferred: torch loads only where a CUDA device is there to ask.
        import torch

        props = torch.cuda.get_device_properties(0)
        if abs(props.total_memory - wanted) <= DEVICE_MEMORY_TOLERANCE * wanted:
            return []
        found = f"a {props.name} with {props.total_memory / 1e9:.0f} GB"
    return [
        f"cluster={cluster.name}: the local launcher trains on this host, which has {found}, not "
        f"cluster {cluster.name}'s device ({cluster.device_memory_gb:g} GB). Size it without launching: "
        f"python train.py cluster={cluster.name} plan=true ...; or run it on such a cluster: "
        f"python train.py -m hydra/launcher=slurm cluster={cluster.name} ..."
    ]


def _launch_problems(config: TrainConfig, *, launcher: str) -> list[str]:
    """Problems only a real launch has (planning skips them)."""
    problems = batch_contract_problems(config)
    if config.precision.name == Precision.fp16 and not fp16_supported():
        problems.append(
            "precision=fp16: this host has no CUDA device and its CPU no fp16 kernels (DeepSpeed's CPU "
            "accelerator needs AVX512-FP16 or AMX-FP16); use precision=bf16 (same memory, fp32's range) "
            "or precision=fp32"
        )
    par = config.parallel
    problems += pipeline_engine_problems(
        pp=par.pp,
        zero_stage=par.zero_stage,
        offload_optimizer=par.offload_optimizer,
        offload_param=par.offload_param,
    )
    problems += cuda_launch_problems(config)
    problems += credentials_problems(config.logger)
    if launcher == "local":
        problems += named_device_problems(config)
        allocator = allocator_problem(config.train.host_allocator)
        if allocator:
            problems.append(allocator)
        available, what = host_ranks_available()
        if config.gpus > available:
            problems.append(
                f"gpus={config.gpus}: the local launcher starts ranks on this host, which has {what}. "
                f"Submit to a cluster instead: python train.py -m hydra/launcher=slurm gpus={config.gpus} "
                f"...; or size it without launching: python train.py gpus={config.gpus} plan=true"
            )
        if config.cluster.gpus_per_node is None:
            # cluster=local: a tensor-parallel group must fit the ranks this host runs.
            problems += tp_node_problems(
                config.parallel.tp, ranks_per_node=available, where=f"this host ({what})"
            )
    return problems


def _plan_problems(config: TrainConfig) -> list[str]:
    """Problems only a plan has: the filesystem it is asked to weigh for the checkpoints."""
    storage = config.cluster.storage_path
    if storage is None or Path(storage).is_dir():
        return []
    return [
        f"cluster.storage_path={storage}: no such directory here; name a directory on the cluster's "
        f"checkpoint filesystem as it is mounted where you plan, or leave it null"
    ]


def validate(config: TrainConfig, *, launcher: str | None) -> None:
    """Raise ConfigError listing every problem; ``launcher=None`` checks for planning only.

    Values outside their schema's range are refused first, alone: the checks that combine
    keys (a divisor, a layout) would trip over them or say the same mistake twice.
    """
    problems = range_problems(config)
    if not problems:
        problems = _problems(config)
        problems += (
            _plan_problems(config) if launcher is None else _launch_problems(config, launcher=launcher)
        )
    if problems:
        raise ConfigError("\n".join(f"  - {p}" for p in problems))

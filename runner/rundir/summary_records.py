"""The records nested in summary.json, typed: what each key of ``RunSummary`` (runner/rundir/summary.py)
holds, as the module named at each record writes it.

TypedDicts, not dataclasses: each writer builds its record as the JSON object it is, and the bytes of
summary.json stay those its writers made. summary.json's reader checks these keys as JSON objects
(runner/rundir/json_types.py ``holds``); the keys inside are its writers' own, typed here for the code
that reads them.
"""

from __future__ import annotations

from typing import TypedDict


class SlurmRecord(TypedDict):
    """``slurm``: the enclosing SLURM job (launchers/slurm/job.py ``slurm_job_record``)."""

    job_id: str
    array_job_id: str | None
    array_task_id: int | None
    job_name: str | None
    partition: str | None
    nodes: int | None
    nodelist: str | None
    tasks: int | None
    tasks_per_node: int | None
    restarts: int  # requeues so far


class TokenizerRecord(TypedDict, total=False):
    """``tokenizer``: which tokenizer trained the run (runner/data/tokenizer_dir.py
    ``run_tokenizer_record``); ``eos_token`` only where the token files name one."""

    path: str
    sha256: str
    files: list[str]
    eos_token: str
    eos_named_sha256: str  # ladder export's copy in which it named eos_token (runner/data/tokenizer_dir.py)


class HostMemoryRecord(TypedDict, total=False):
    """``host_memory``: one rank's host memory, planned at launch (launchers/run_record.py
    ``host_plan_record``) and measured at the attempt's end (runner/train/attempt_end.py)."""

    planned_per_rank_gb: float
    planned_phase: str
    ranks_per_node: int
    measured_per_rank_gb: float | None
    measured: str


class CpuCalibration(TypedDict, total=False):
    """One CPU's matmul calibration, as runner/hardware/mfu_peak.py keeps it in its cache (an entry
    an earlier ladder kept may lack the later keys, ``fp32_matmul`` among them)."""

    flops: float  # the peak taken: the statistic's FLOP/s
    statistic: str
    rounds: list[float]
    spread: float
    others_cores: float | None  # CPUs other processes kept busy meanwhile (None: unknown)
    busy: bool
    settled: bool
    tries: int  # quiet calibrations so far
    threads: int
    precision: str
    fp32_matmul: bool
    cpu: str
    torch: str
    calibrated_at: str


class PeakCalibrationRecord(CpuCalibration, total=False):
    """``peak_flops_calibration``: the calibration a CPU run's MFU divides by, and the run's ranks x
    threads (runner/hardware/mfu_peak.py ``Peak.calibration_record``)."""

    ranks: int
    threads_per_rank: int
    threads_in_all: int


class DeviceMemoryPlan(TypedDict):
    """``device_memory_plan``: the peak the plan puts on each device (launchers/run_record.py)."""

    planned_peak_gb: float
    fits: bool
    loss_tiles: int


class StepTimeRecord(TypedDict, total=False):
    """``step_time``: the plan's predicted step (launchers/run_record.py ``step_time_plan_record``) and
    the attempt's measured one beside it (runner/train/attempt_end.py ``measured_step_time``)."""

    predicted_s: float | None
    predicted_is_lower_bound: bool
    terms_s: dict[str, float]
    comm_exposed_s: float | None
    limit: str | None
    bound_s: float | None
    calibration: str | None
    measured_s: float
    measured_steps: int
    error: float | None


class StepTimeSpread(TypedDict):
    """``step_time_spread``: how steady the steps were (runner/metrics/step_spread.py)."""

    iqr_over_median: float
    noisy: bool
    steps: int
    warmup_steps: int
    noisy_above: float


class MemoryRecord(TypedDict, total=False):
    """``memory``: the ledger, estimated beside measured (runner/train/attempt_end.py
    ``memory_summary``; GB = 1e9 bytes). ``estimated`` and ``measured`` hold ``<term>_gb`` figures
    and a ``residual`` of named lines; ``measured`` and the errors only where it was measured."""

    unit: str
    estimated: dict[str, float | dict[str, float]]
    textbook: dict[str, float]
    offloaded_to_host: dict[str, float]
    measured_at: str
    measured: dict[str, float | dict[str, float]]
    rel_error: dict[str, float | None]
    host_rel_error: dict[str, float | None]


class InitFromRecord(TypedDict):
    """``model_build.init_from``: the weights read in (runner/model/hf_weights.py ``init_from_record``)."""

    path: str
    tensors: int
    bytes: int


class ModelBuild(TypedDict):
    """What building the model cost a rank (runner/engine/build.py ``build_measured``)."""

    method: str
    params: int
    num_params: int
    host_peak_gb: float
    device_peak_gb: float | None
    init_from: InitFromRecord | None


class ModelBuildRecord(ModelBuild):
    """``model_build``: rank 0's :class:`ModelBuild`, its rank first."""

    rank: int


class CompileRecord(TypedDict):
    """``compile``: the blocks torch.compile compiled and its graph breaks
    (runner/engine/compile_blocks.py)."""

    blocks: int
    graph_breaks: int
    top_break_reasons: list[str]


class NoiseScaleRecord(TypedDict):
    """``noise_scale``: the gradient noise scale B_simple (runner/metrics/noise_scale.py)."""

    simple: float | None
    simple_tokens: float | None
    unit: str
    small_batch: int | None
    big_batch: int | None
    ema: float
    updates: int
    unmeasured: str | None
    source: str


class CommExposedRecord(TypedDict, total=False):
    """``comm_exposed``: the seconds a step blocked in collectives (runner/metrics/step_probes.py),
    with the plan's beside them (runner/train/attempt_end.py)."""

    seconds_per_step: float
    definition: str
    unmeasured: str | None
    planned_seconds_per_step: float | None


class StepProbesRecord(TypedDict):
    """What runner/metrics/step_probes.py measured, for summary.json's two keys."""

    noise_scale: NoiseScaleRecord
    comm_exposed: CommExposedRecord


class PipelineRecord(TypedDict):
    """``pipeline``: the split, schedule and bubble of a pipelined run (runner/train/pipeline_hooks.py)."""

    stages: int
    layers_per_stage: list[int]
    blocks_per_stage: list[int]
    schedule: str
    micro_batches: int
    bubble_fraction_predicted: float
    bubble_share_of_step_predicted: float
    p2p_share_of_step_measured: float | None
    measured_step_s: float | None


class SkippedStepsRecord(TypedDict):
    """``skipped_steps``: the non-finite policy and the steps it skipped (runner/train/nonfinite.py)."""

    policy: str
    count: int
    steps: list[int]


class LossScaleRecord(TypedDict):
    """``fp16_loss_scale``: the final loss scale and the steps it skipped
    (runner/engine/fixes/fp16_stage0_loss_scale.py)."""

    final_scale: float
    overflow_steps: list[int]


class Evaluated(TypedDict):
    """The latest held-out loss of an attempt and its step (runner/train/trainer.py)."""

    loss: float | None
    step: int | None


class EvalRecord(Evaluated):
    """``eval``: the latest held-out loss and what it was measured on (runner/train/evaluation.py)."""

    every: int
    sequences: int
    tokens: int
    source: str


class GoodputAttempt(TypedDict, total=False):
    """One attempt of ``goodput``'s ``attempts`` (runner/metrics/goodput.py ``_attempt``); ``account``
    adds the steps and seconds kept and lost."""

    attempt: int
    status: str
    launcher: str | None
    started: float
    ended: float
    wall_s: float
    from_step: int
    to_step: int
    steps_s: float
    parts: dict[str, float]
    unrecorded_s: float
    steps_kept: int
    steps_lost: int
    kept_s: float
    lost_s: float


class GoodputRecord(TypedDict):
    """``goodput``: every attempt, the steps and time kept and lost, and the ratios
    (runner/metrics/goodput.py ``account``)."""

    attempts: list[GoodputAttempt]
    wall_s: float
    parts_s: dict[str, float]
    startup_s: float
    unrecorded_s: float
    between_attempts_s: float
    conversion_s: float
    conversion_between_attempts_s: float
    kept_s: float
    lost_s: float
    steps_lost: int
    goodput: float | None
    goodput_elapsed: float | None
    measured: str


__all__ = [
    "CommExposedRecord",
    "CompileRecord",
    "DeviceMemoryPlan",
    "EvalRecord",
    "Evaluated",
    "GoodputAttempt",
    "GoodputRecord",
    "HostMemoryRecord",
    "InitFromRecord",
    "LossScaleRecord",
    "MemoryRecord",
    "ModelBuild",
    "ModelBuildRecord",
    "NoiseScaleRecord",
    "PipelineRecord",
    "SkippedStepsRecord",
    "SlurmRecord",
    "StepProbesRecord",
    "StepTimeRecord",
    "StepTimeSpread",
    "TokenizerRecord",
]

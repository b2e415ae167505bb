"""The plan as text: one table per layout, and the ladder's rungs. Units are always spelled out.

Memory is shown in decimal GB (1e9 bytes, the ZeRO paper's and the memory/*_gb metrics'
unit) and in GiB (2**30 bytes, what CUDA tools print); bandwidths in GB/s (1e9 bytes/s);
compute in TFLOP/s (1e12 FLOP/s).
"""

from __future__ import annotations

import re
from pathlib import Path

from runner.checkpoint.size import DiskNeed, saved_bytes_per_param
from runner.config import OffloadPlacement, Precision, TrainConfig
from runner.memory_model.peak import OFFLOADED_ACTIVATIONS, MemoryTerms
from runner.memory_model.peak_lines import ALLREDUCE_FLAT, TIED_HEAD_GRADIENT
from runner.memory_model.states import bytes_per_param
from runner.memory_model.units import GB, GiB, gb
from runner.parallel.pipeline_split import rank_param_numels
from runner.plan.ladder import NEAR_FASTEST, OFFLOAD_MARK, SHOWN, Candidate, Ladder
from runner.plan.planner import Plan, ResumePlan
from runner.rundir.checkpoint_record import own_layout
from runner.rundir.run_files import CHECKPOINT_DIR
from runner.step_time.device_figures import Figure
from runner.step_time.estimate import causal_share

# MemoryTerms.host's offloaded terms (model.offload_activations' too); other keys are buffers
_OFFLOADED_TERMS = ("params", "grads", "optimizer", OFFLOADED_ACTIVATIONS)

_W = 38  # width of the label column

# Residual lines computed outside runner.memory.deepspeed_residuals, by the function that does.
_RESIDUAL_SOURCES = {
    "reduce_bucket (in backward)": (
        "runner.memory.zero12_backward_buckets, where live (runner.memory_model.peak)"
    ),
    TIED_HEAD_GRADIENT: (
        "autograd holds it through backward (runner.memory_model.peak_lines.tied_head_gradient_bytes)"
    ),
    "reduce_bucket (at boundary)": "a pipeline's ZeRO-1 second bucket, beyond the freed activations",
    ALLREDUCE_FLAT: "ZeRO-0's flat gradient copy, beyond the freed activations (runner.memory_model.peak)",
}


def _row(label: str, num_bytes: float, note: str = "") -> str:
    # A label wider than its column (DeepSpeed's buffer names) gets a line of its own.
    head = f"  {label}\n" if len(label) > _W else ""
    label = "" if head else label
    return f"{head}  {label:<{_W}}{num_bytes / GB:>10.2f} {num_bytes / GiB:>10.2f}  {note}".rstrip()


def _split_words(tp: int, pp: int) -> str:
    """Which rank's parameters the formula counts, when tp or pp split them."""
    parts = [f"1/{tp} of each block matrix and of the vocabulary"] if tp > 1 else []
    if pp > 1:
        parts.append(f"the fullest of {pp} stages")
    return f" ({', '.join(parts)})" if parts else ""


def _states_formula(plan: Plan) -> str:
    """ZeRO's per-device formula for this stage in bytes per parameter (arXiv 1910.02054, Fig. 1).

    ZeRO-1 reads as ZeRO-2: DeepSpeed's stage 1 keeps only its gradient partition after the
    step's reduce-scatter (runner/metrics/ledger.py), which is what the plan counts. ``=`` when the
    formula gives the planned bytes; ``~`` when the fullest rank holds more (ZeRO-1/2 keep
    whole the gradients of tensors straddling its partition's edges; padding).
    """
    w, k, lay, m = plan.workload, plan.knobs, plan.layout, plan.memory
    if k.spec.offload != OffloadPlacement.none:
        return f"= ZeRO-{int(k.spec.zero_stage)} with {k.spec.offload.value} offloaded to the host"
    wb, gb_, ob = bytes_per_param(w.precision, w.optimizer)
    n = lay.dp
    per_param = {
        0: (f"{wb + gb_ + ob} B", wb + gb_ + ob),
        1: (f"({wb} + {gb_ + ob}/{n}) B", wb + (gb_ + ob) / n),
        2: (f"({wb} + {gb_ + ob}/{n}) B", wb + (gb_ + ob) / n),
        3: (f"{wb + gb_ + ob}/{n} B", (wb + gb_ + ob) / n),
    }[k.spec.zero_stage]
    formula, bytes_each = per_param
    local = sum(rank_param_numels(w.model, tp=lay.tp, pp=lay.pp))
    exact = abs(bytes_each * local - m.model_states) <= 1e-3 * m.model_states
    split = _split_words(lay.tp, lay.pp)
    return f"{'=' if exact else '~'} ZeRO-{int(k.spec.zero_stage)}: {formula} x {local:,} params{split}"


def nominal_params(model_name: str) -> float | None:
    """The size a model's name announces ('llama_70b' -> 70e9, 'gpt2_124m' -> 124e6), or None."""
    match = re.search(r"(\d+(?:\.\d+)?)([bm])$", model_name.lower())
    if match is None:
        return None
    return float(match.group(1)) * (1e9 if match.group(2) == "b" else 1e6)


def _nominal_states(plan: Plan) -> str:
    """Model states at the name's round size, beside the exact count (papers quote the round one)."""
    w, k = plan.workload, plan.knobs
    nominal = nominal_params(w.model.name)
    if (
        nominal is None
        or k.spec.offload != OffloadPlacement.none
        or abs(nominal - w.num_params) < 0.005 * nominal
    ):
        return ""
    at_nominal = plan.memory.model_states * nominal / w.num_params  # every term is linear in P
    return (
        f"(the exact count {w.num_params / 1e9:.2f}e9 gives this; the nominal {nominal / 1e9:g}e9 of "
        f"the name {w.model.name!r} would give {at_nominal / GB:.2f} GB)"
    )


def _figure(fig: Figure, scale: float, unit: str) -> str:
    if fig.value is None:
        return f"unknown  [{fig.source}]"
    return f"{fig.value / scale:g} {unit}  [{fig.source}]"


def _host_lines(plan: Plan) -> list[str]:
    """A node's host memory: each phase per rank, times the ranks, against the node's RAM."""
    h, w = plan.host, plan.workload
    per_node = w.device.per_node
    lines = [
        f"host memory per node: {h.ranks_per_node} rank{'s' if h.ranks_per_node > 1 else ''} "
        f"(gpus {w.gpus}, {per_node} per node), "
        f"model built {h.build_method}",
        f"  {'':<{_W}}{'GB':>10} {'GiB':>10}",
    ]
    lines += [_row(f"build: {name}", size, "per rank") for name, size in h.build.items()]
    lines.append(_row(f"build per node (x {h.ranks_per_node})", h.build_per_node, "runner/engine/build.py"))
    offloaded = sum(v for k, v in h.steady.items() if k in plan.memory.host)
    if offloaded:
        lines.append(_row("steady: offloaded and host buffers", offloaded, "per rank (the lines above)"))
    lines += [
        _row(f"steady: {name}", size, "per rank")
        for name, size in h.steady.items()
        if name not in plan.memory.host
    ]
    lines.append(_row(f"steady per node (x {h.ranks_per_node})", h.steady_per_node))
    lines.append(_row("host RAM per node", h.ram_bytes, f"[{h.ram_source}]"))
    lines.append(_row(f"usable (headroom {h.headroom:g})", h.usable_bytes))
    lines.append(f"  => {h.verdict()}")
    lines += [f"     fix: {fix}" for fix in h.fixes]
    return lines


def format_plan(plan: Plan) -> str:
    """One layout's table: layout, device, memory terms against the usable memory, traffic, time."""
    lines = [
        *_layout_lines(plan),
        *_device_lines(plan),
        *_memory_lines(plan),
        *_fit_lines(plan),
        *_host_lines(plan),
        *_traffic_lines(plan),
        *_time_lines(plan),
        *_checkpoint_lines(plan),
    ]
    return "\n".join(lines)


def _layout_lines(plan: Plan) -> list[str]:
    """The plan's head: model, knobs and run; the layout's arithmetic and how the micro-batch was chosen."""
    w, k, lay = plan.workload, plan.knobs, plan.layout
    lines = [
        f"plan: {w.model.name} ({w.num_params:,} params, counted analytically), {k.describe()}, "
        f"{w.precision.value} {w.optimizer.value}, seq {w.seq_len}, gpus {w.gpus} on cluster {w.cluster}"
        + ("  [PLAN ONLY]" if plan.plan_only else ""),
        "  nothing launched, nothing allocated",
        *_unusual_lines(plan),
        f"layout     {lay.split_words().replace('; ', ';  ')}",
    ]
    if plan.contract_error is not None:
        lines.append(f"  ! batch contract NOT met for the configured global {w.global_size}:")
        lines.append(f"    {plan.contract_error}")
        lines.append(f"    planned instead at global {lay.global_size}: this layout cannot run as configured")
    lines.append(f"  {plan.micro_choice}")
    return lines


# Above UNUSUAL_PARAMS parameters, published pretraining runs train in 16-bit at a context of
# UNUSUAL_SEQ tokens or more (GPT-3 2,048, Llama 2 4,096, Llama 3 8,192: the papers conf/model/
# cites). A plan outside that is most often a published model planned with train.py's defaults,
# which are the tiny model's (fp32, data.seq_len=128): one line says so.
UNUSUAL_PARAMS = 1e9
UNUSUAL_SEQ = 1024


def _unusual_lines(plan: Plan) -> list[str]:
    """One line where a model above UNUSUAL_PARAMS is planned in fp32 or below UNUSUAL_SEQ tokens."""
    w = plan.workload
    if w.num_params <= UNUSUAL_PARAMS:
        return []
    unusual = [
        words
        for words, odd in (
            ("fp32", w.precision == Precision.fp32),
            (f"seq {w.seq_len}", w.seq_len < UNUSUAL_SEQ),
        )
        if odd
    ]
    if not unusual:
        return []
    return [
        f"  note: {w.num_params / 1e9:.1f}B parameters in {' at '.join(unusual)} is unusual: such models "
        f"train in bf16 at {UNUSUAL_SEQ:,} tokens and more (precision=bf16 data.seq_len=4096, say); "
        "train.py's defaults are the tiny model's"
    ]


def _device_lines(plan: Plan) -> list[str]:
    """The device's figures, each with its source."""
    w = plan.workload
    dev = w.device
    memory_bytes = float(dev.memory_bytes.value or 0.0)
    return [
        f"device     memory {memory_bytes / GB:.1f} GB = {memory_bytes / GiB:.1f} GiB"
        f"  [{dev.memory_bytes.source}]",
        f"           peak ({w.precision.value}, dense) {_figure(dev.peak_flops, 1e12, 'TFLOP/s')}",
        f"           {dev.per_node} gpus per node  [{dev.gpus_per_node.source}]",
        f"           links: intra-node {_figure(dev.intra_node_bytes_per_s, GB, 'GB/s')}; "
        f"inter-node {_figure(dev.inter_node_bytes_per_s, GB, 'GB/s')}",
    ]


def _memory_lines(plan: Plan) -> list[str]:
    """The memory terms per device, DeepSpeed's residuals, the host lines, and the total."""
    k, lay, m = plan.knobs, plan.layout, plan.memory
    lines = [
        f"memory per device{'':<{_W - 17}}{'GB':>10} {'GiB':>10}",
        _row("params", m.params),
        _row("grads", m.grads),
        _row("optimizer", m.optimizer),
        _row(
            "activations",
            m.activations,
            f"micro {lay.micro_size}, recompute {k.spec.recompute.value}, tp {lay.tp}"
            + (f"; {m.activation_note}" if m.activation_note else ""),
        ),
    ]
    lines += _residual_lines(m)
    if m.grads_after_peak:
        why = "one micro-batch a step (runner.memory_model.peak_lines.grads_after_activation_peak)"
        if m.activation_note:  # a pipeline's first stage
            why = "first stage's first backward (runner.memory_model.peak_lines.first_stage_grads_after_peak)"
        lines.append(_row("grads made after the activation peak", -m.grads_after_peak, why))
    lines.append(_row("total", m.total))
    if m.step:
        where = "the peak: " if m.step > m.total else ""
        why = f"{where}states + fp32 grad copies (plan_memory.optimizer_step_bytes)"
        lines.append(_row("in the optimizer step", m.step, why))
    if m.build:
        lines.append(_row("building: zero.Init 1/dp + a weight", m.build, "before AutoTP cuts the shards"))
    return lines


def _residual_lines(m: MemoryTerms) -> list[str]:
    """DeepSpeed's named residuals, each with the function that counts it, then the host lines."""
    if m.residuals:
        lines = [
            _row(f"residual: {name}", size, _RESIDUAL_SOURCES.get(name, "runner.memory.deepspeed_residuals"))
            for name, size in m.residuals.items()
        ]
    else:
        lines = [
            f"  {'residuals':<{_W}}{'none':>10} {'':>10}  runner.memory.deepspeed_residuals: none measured"
        ]
    where = "counted on the device: the CPU is the device" if m.host_counts_on_device else "host RAM"
    lines += [
        _row(
            f"offloaded {name} (per rank)" if name in _OFFLOADED_TERMS else f"host buffer: {name}",
            size,
            where,
        )
        for name, size in m.host.items()
    ]
    return lines


def _fit_lines(plan: Plan) -> list[str]:
    """The usable memory, the verdict with its margin, and the model states against ZeRO's formula."""
    w, m = plan.workload, plan.memory
    memory_bytes = float(w.device.memory_bytes.value or 0.0)
    lines = [_row(f"usable (headroom {w.headroom:g})", w.usable_bytes)]
    margin = w.usable_bytes - m.peak
    if plan.fits:
        lines.append(
            f"  => FITS, {gb(margin)} to spare ({100 * m.peak / memory_bytes:.0f}% of device memory)"
        )
    else:
        lines.append(
            f"  => DOES NOT FIT by {gb(-margin)}: needs {gb(m.peak)}, {gb(w.usable_bytes)} usable; "
            f"largest term {m.largest()[0]} (planner.recommend=true finds a layout that fits)"
        )
    lines.append(f"  model states {m.model_states / GB:.2f} GB per device {_states_formula(plan)}")
    nominal = _nominal_states(plan)
    if nominal:
        lines.append(f"    {nominal}")
    return lines


def _traffic_lines(plan: Plan) -> list[str]:
    """Each parallel group's bytes per step, its link and its time at full bandwidth."""
    lines = ["communication per step per device (ring; bytes sent = bytes received)"]
    for g in plan.traffic:
        bw = "unknown bandwidth: no time predicted" if g.seconds is None else f"{g.seconds:.3g} s"
        speed = "" if g.bandwidth is None else f" at {g.bandwidth / GB:g} GB/s"
        lines.append(f"  {g.group:<4}{g.bytes / GB:>10.2f} GB  {g.link}{speed}: {bw}  ({g.detail})")
    return lines


# How the plan names the roofline wherever it shows it (runner/step_time/estimate.py roofline).
BOUND_WORDS = "bound (roofline: compute at peak, links at full bandwidth)"
# Where attention is more than a fifth of a token's FLOPs (its causal half then moves MFU by a tenth
# and more), the plan prints MFU with the causal count beside PaLM's.
CAUSAL_SHOWN_BELOW = 0.9


def _time_lines(plan: Plan) -> list[str]:
    """The predicted step (its terms, the term that limits it, the calibration) beside the roofline
    bound; evaluations; and what is not timed."""
    w, k = plan.workload, plan.knobs
    if plan.time.calibration:
        lines = ["time per step (predicted: named terms on the device's measured rates; the bound beside it)"]
        lines += _predicted_lines(plan)
    else:
        lines = ["time per step (no calibration: only the bound, compute at peak, links at full bandwidth)"]
        lines += _step_lines(plan)
    if plan.eval_s is not None and plan.eval_share is not None:
        lines.append(
            f"  held-out evaluation every {w.eval_every} steps: {w.eval_batches} global batches forward "
            f"only, {plan.eval_s:.3g} s each, {100 * plan.eval_share:.1f}% on top of the steps' time"
        )
    if k.spec.offload != OffloadPlacement.none:
        lines.append(
            "  not in this time: offload's host<->device copies and the CPU optimizer step "
            "(no PCIe or host figures in the cluster config)"
        )
    if moved := plan.memory.host.get(OFFLOADED_ACTIVATIONS):
        lines.append(
            f"  not in this time: model.offload_activations' copies, {moved / GB:.3g} GB to the host in "
            "forward and back in backward per micro-batch on DeepSpeed's side stream "
            "(no PCIe or host figures in the cluster config)"
        )
    lines += [f"  plan only: {reason}" for reason in plan.plan_only]
    return lines


def _overlap_words(plan: Plan) -> str:
    return (
        "overlapped with compute"
        if plan.knobs.spec.overlap_comm
        else "not overlapped (parallel.overlap_comm=false)"
    )


def _hypothetical(plan: Plan) -> str:
    return "" if plan.fits and plan.host.fits else "  (hypothetical: it does not fit)"


def _step_lines(plan: Plan) -> list[str]:
    """The roofline's parts and its step, MFU and tokens/s, labelled as the bound (a lower bound on
    the step where communication is unknown)."""
    t, lay = plan.time, plan.layout
    if t.compute_s is None:
        return ["  not predicted: the peak FLOP/s is unknown (set cluster.peak_tflops)"]
    comm = "unknown" if t.comm_s is None else f"{t.comm_s:.3g} s"
    lines = [
        f"  compute {t.compute_s:.3g} s + pipeline bubble {t.bubble_s or 0:.3g} s"
        f" ((pp-1)/accum = {lay.pp - 1}/{lay.accum_steps}) + comm {comm}, dp {_overlap_words(plan)}"
    ]
    assert t.step_s is not None and t.mfu is not None and t.tokens_per_s is not None
    if t.complete:
        lines.append(
            f"  {BOUND_WORDS}: step {t.step_s:.3g} s, MFU {100 * t.mfu:.1f}%, {t.tokens_per_s:,.0f} tokens/s"
            + _hypothetical(plan)
        )
    else:
        lines.append(f"  step >= {t.step_s:.3g} s, MFU <= {100 * t.mfu:.1f}% (communication time unknown)")
    return lines


def _predicted_lines(plan: Plan) -> list[str]:
    """The calibrated step: one line per term with its share, the limiting term, the step's time,
    tokens/s and MFU, the roofline bound beside it, and where the figures came from."""
    t = plan.time
    assert t.step_s is not None and t.mfu is not None and t.tokens_per_s is not None
    lines = [f"  {'term':<18}{'seconds':>10} {'share':>6}  what it counts; dp comm {_overlap_words(plan)}"]
    for term in t.terms:
        share = term.seconds / t.step_s if t.step_s else 0.0
        lines.append(f"  {term.name:<18}{term.seconds:>10.3g} {100 * share:>5.1f}%  {term.words}")
        for part in term.parts:  # the step's passes over gradients and weights, one by one
            share = part.seconds / t.step_s if t.step_s else 0.0
            lines.append(f"    - {part.name:<40}{part.seconds:>10.3g} {100 * share:>5.1f}%  {part.words}")
    limit = next((term for term in t.terms if term.name == t.limit), None)
    if limit is not None and t.step_s:
        lines.append(f"  limited by {limit.name}: {100 * limit.seconds / t.step_s:.0f}% of the step")
    if t.complete:
        lines.append(
            f"  => predicted step {t.step_s:.3g} s, MFU {100 * t.mfu:.1f}%, {t.tokens_per_s:,.0f} tokens/s"
            + _hypothetical(plan)
        )
    else:
        lines.append(
            f"  => predicted step >= {t.step_s:.3g} s, MFU <= {100 * t.mfu:.1f}%, "
            f"{t.tokens_per_s:,.0f} tokens/s at most (communication time unknown)"
        )
    w = plan.workload
    share = causal_share(w.model, num_params=w.num_params, seq_len=w.seq_len)
    if share < CAUSAL_SHOWN_BELOW:
        lines.append(
            f"  MFU counts attention whole (PaLM's count, as published MFUs do); the causal mask computes "
            f"half of it: {100 * t.mfu * share:.1f}% with that half (the run's throughput/mfu_causal)"
        )
    if t.bound_step_s is not None and t.bound_mfu is not None:
        lines.append(f"  {BOUND_WORDS}: step {t.bound_step_s:.3g} s, MFU {100 * t.bound_mfu:.1f}%")
    lines.append(f"  calibration: {t.calibration}")
    return lines


def _checkpoint_lines(plan: Plan) -> list[str]:
    """One checkpoint's bytes on disk, per parameter, and its save time."""
    w, k, lay = plan.workload, plan.knobs, plan.layout
    weight, state = saved_bytes_per_param(w.precision, w.optimizer, k.spec.zero_stage, pp=lay.pp)
    copies = []
    if lay.tp > 1:
        copies.append(f"the norm gains on each of tp {lay.tp}")
    if lay.pp > 1 and w.model.tie_embeddings:
        copies.append("the tied embedding's state on both ends of the pipeline")
    saved = f"{weight} B of {w.precision.value} weights + " if weight else ""
    extra = f"; beyond it, {' and '.join(copies)}" if copies else ""
    return [
        "checkpoint on disk (every rank's files; runner/checkpoint/size.py)",
        f"  one checkpoint {plan.checkpoint_bytes / GB:.2f} GB = {saved}{state} B of fp32 optimizer state "
        f"per parameter{extra}",
        _save_time_line(plan),
    ]


def _save_time_line(plan: Plan) -> str:
    """One save's time at the storage's write speed, and its share of the steps' time."""
    if plan.checkpoint_s is None:
        return "  its save time: unknown (set cluster.storage_gb_per_s, the filesystem's write speed)"
    speed = plan.checkpoint_bytes / plan.checkpoint_s / GB
    line = f"  one save {plan.checkpoint_s:.3g} s at cluster.storage_gb_per_s={speed:g}"
    every = plan.workload.checkpoint_every
    if plan.checkpoint_share is not None:
        line += f"; every {every} steps: {100 * plan.checkpoint_share:.1f}% on top of the steps' time"
    return line


def resume_lines(resume: ResumePlan, run_dir: Path, storage_bytes_per_s: float | None) -> list[str]:
    """train.resume=auto: the checkpoint the run continues, on which layout it was saved, and what
    moving it onto this one writes and takes before the first step."""
    record = resume.record
    if record is None:
        where = run_dir / CHECKPOINT_DIR
        return [f"  train.resume=auto: no complete checkpoint in {where}: the run starts at step 0"]
    lines = [
        f"  train.resume=auto: continues {record['tag']} ({record['completed_steps']} steps done, "
        f"{resume.saved_bytes / GB:.3f} GB), saved on {own_layout(record)}"
    ]
    conversion = resume.disk.conversion
    if resume.refusal is not None:
        lines.append(f"    REFUSED before launch: {resume.refusal}")
    elif conversion is None:
        lines.append("    this layout loads it as it is: nothing to convert")
    else:
        seconds = resume.conversion_s(storage_bytes_per_s)
        if seconds is None or not storage_bytes_per_s:
            speed = "its time: unknown (set cluster.storage_gb_per_s, the filesystem's speed)"
        else:
            speed = (
                f"at least {seconds:.3g} s at cluster.storage_gb_per_s={storage_bytes_per_s / GB:g} "
                f"(reading it and writing the copies; the conversion's compute not counted)"
            )
        written = f"{conversion.stays / GB:.3f} GB of copies beside it"
        if conversion.peak > conversion.stays:
            written += f", {conversion.peak / GB:.3f} GB at the most while written"
        lines.append(f"    this layout converts it first, before its ranks load it: {written}; {speed}")
    return lines


def checkpoint_disk_line(need: DiskNeed, config: TrainConfig) -> str:
    """Whether the run's checkpoints fit on its directory's filesystem, in one line."""
    every = config.train.checkpoint_every
    verdict = "FITS" if need.fits else "DOES NOT FIT"
    final = " train.save_final=true" if config.train.save_final else ""
    if not every and not final:
        beside = "" if need.conversion is None else f", beside {need.conversion.words()}"
        return (
            f"  train.checkpoint_every=0: one checkpoint at a stop{beside}; {need.free / GB:.2f} GB free "
            f"on the filesystem of {need.where} => {verdict}"
        )
    return f"  train.checkpoint_every={every}{final}: {need.arithmetic()} => {verdict}"


def _ranked_line(place: int, candidate: Candidate, recommended: bool) -> str:
    """One ranked candidate: its layout, predicted tokens/s, step, MFU and limiting term."""
    plan = candidate.plan
    t, lay = plan.time, plan.layout
    head = f"  {place}. {plan.knobs.describe()}, micro {lay.micro_size} x accum {lay.accum_steps}"
    if plan.knobs.spec.offload != OffloadPlacement.none:
        text = f"{head}: {OFFLOAD_MARK}"
    elif t.tokens_per_s is None or t.step_s is None or t.mfu is None:
        text = f"{head}: no step-time prediction (peak unknown)"
    else:
        bound = "" if t.complete else " (comm unknown: bound)"
        text = (
            f"{head}: {t.tokens_per_s:,.0f} tokens/s, step {t.step_s:.3g} s, MFU {100 * t.mfu:.1f}%{bound}, "
            f"limit {t.limit or 'n/a (roofline)'}"
        )
    if plan.plan_only:
        text += " [plan only]"
    return text + ("  <- recommended" if recommended else "")


def format_ladder(ladder: Ladder) -> str:
    """The rungs, cheapest first, each with its verdict; the fastest five that fit; the winner's command."""
    w = ladder.workload
    lines = [
        f"recommend: {w.model.name} on {w.gpus} x {w.cluster}, global {w.global_size}, "
        f"{w.precision.value} {w.optimizer.value}, seq {w.seq_len}; {gb(w.usable_bytes)} usable per device, "
        f"{gb(w.headroom * float(w.device.host_memory_bytes.value or 0.0))} usable host RAM per node",
    ]
    for i, rung in enumerate(ladder.rungs, 1):
        verdict = f"no    {rung.reason}"
        if rung.fits:
            verdict = f"FITS  {rung.fitting} fit, cheapest: {rung.reason}"
        lines.append(f"  {i:>2}. {rung.name:<36} {verdict}")
    winner = ladder.winner
    if winner is None:
        lines.append("  nothing fits: add gpus, shorten data.seq_len, or lower batch.global_size")
        return "\n".join(lines)
    first = next(rung for rung in ladder.rungs if rung.fits)
    source = winner.plan.time.calibration or "the roofline bound (no calibration for this device)"
    lines.append(
        f"cheapest rung that fits: {first.name}; {len(ladder.ranking)} layouts fit, fastest first by "
        f"predicted tokens/s ({source}):"
    )
    place = ladder.ranking.index(winner) + 1
    for i, candidate in enumerate(ladder.ranking[:SHOWN], 1):
        lines.append(_ranked_line(i, candidate, candidate is winner))
    if place > SHOWN:
        lines.append(_ranked_line(place, winner, True))
    why = "the fastest" if place == 1 else f"the cheapest within {NEAR_FASTEST:.0%} of #1's tokens/s"
    lines.append(
        f"recommended: #{place}, {winner.name} ({why})" + ("  [PLAN ONLY]" if winner.plan.plan_only else "")
    )
    lines.append(f"  {ladder.command}")
    return "\n".join(lines)


__all__ = ["format_ladder", "format_plan"]

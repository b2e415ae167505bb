"""A rank that runs out of memory says where: its step, the plan's terms beside the last measured peak.

torch raises ``torch.OutOfMemoryError`` when the CUDA caching allocator cannot serve a request
(c10/cuda/CUDACachingAllocator.cpp), and a RuntimeError whose text holds "can't allocate memory"
when the host allocator's request fails (c10/core/impl/alloc_cpu.cpp): a memory limit such as
``ulimit -v``, or ``vm.overcommit_memory=2``. Python's MemoryError is the same want. A rank the
kernel's out-of-memory killer ends raises nothing: runner/diagnose/oom_killer.py tells it from the
kernel's counts and log, and :func:`killed_words` says what the plan put on the host.

The words go on the error as a note (PEP 678), so the failure record, summary.json's
``error`` and the launching process's last line carry them.
"""

from __future__ import annotations

import resource
from pathlib import Path

from runner.config import TrainConfig
from runner.memory_model.units import gb
from runner.plan.planner import Plan, knobs_from_config, plan_layout, workload_from_config
from runner.rundir.metrics_file import metrics_path, read_records
from runner.rundir.run_files import add_note

CPU_ALLOCATOR_WORDS = "can't allocate memory"  # c10/core/impl/alloc_cpu.cpp, DefaultCPUAllocator


def is_out_of_memory(error: BaseException) -> bool:
    """True for an allocator's refusal, device or host."""
    if isinstance(error, MemoryError):
        return True
    # Deferred: torch loads only where tensors are made; the launching process and the plan stay light.
    import torch

    return isinstance(error, torch.OutOfMemoryError) or (
        isinstance(error, RuntimeError) and CPU_ALLOCATOR_WORDS in str(error)
    )


def last_measured(run_dir: Path) -> tuple[int, float] | None:
    """(step, ``memory/peak_gb``) of the run's last step in metrics.jsonl, or None before any."""
    records, _ = read_records(metrics_path(run_dir))  # a line cut short by a killed attempt: skipped
    last = None
    for record in records:
        if "memory/peak_gb" in record and "step" in record:
            last = (int(record["step"]), float(record["memory/peak_gb"]))
    return last


def address_space_limit() -> int | None:
    """This process's address-space cap in bytes (``ulimit -v``, RLIMIT_AS), or None if uncapped."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    return None if soft == resource.RLIM_INFINITY else soft


def _terms(plan: Plan) -> str:
    m = plan.memory
    terms = [
        f"parameters {gb(m.params, 2)}",
        f"gradients {gb(m.grads, 2)}",
        f"optimizer states {gb(m.optimizer, 2)}",
        f"activations {gb(m.activations, 2)} at micro {plan.layout.micro_size}",
    ]
    if residuals := sum(m.residuals.values()):
        terms.append(f"DeepSpeed's buffers {gb(residuals, 2)}")
    return ", ".join(terms)


def out_of_memory_words(plan: Plan, measured: tuple[int, float] | None) -> str:
    """Where the run ran out, what the plan put on each device, and what to do."""
    if measured is None:
        where = "before its first step ended (building the model, the engine, or step 0)"
        seen = ""
    else:
        step, peak_gb = measured
        where = f"after step {step}"
        seen = f"; step {step} measured a peak of {peak_gb:.2f} GB"
    usable = plan.workload.usable_bytes
    if (cap := address_space_limit()) is not None:
        verdict = (
            f"this process's address space is capped at {gb(cap, 2)} (ulimit -v): raise or remove the cap"
        )
    elif plan.fits:
        verdict = (
            "the plan said it fits, so the device had less than planned: another process on it, "
            "a memory limit (ulimit -v, a cgroup, SLURM's --mem) or a term the plan misses"
        )
    else:
        verdict = "the plan had warned that it would not fit"
    return (
        f"out of memory {where}: the plan puts {gb(plan.memory.peak, 2)} on each device "
        f"({_terms(plan)}), of its {gb(usable, 2)} usable{seen}; {verdict}. "
        "planner.recommend=true finds the cheapest layout that fits; plan=true shows every term"
        f"{_activation_fix(plan)}"
    )


def killed_words(plan: Plan, measured: tuple[int, float] | None) -> str:
    """After the kernel's out-of-memory killer ended a rank: the plan's host memory, the last
    measured peak, and what to do."""
    host = plan.host
    seen = "before its first step ended" if measured is None else f"step {measured[0]} measured a peak "
    seen += "" if measured is None else f"of {measured[1]:.2f} GB on rank 0"
    verdict = (
        "the plan said it fits, so the memory went to what the plan does not count: another process "
        "in the run's memory cgroup or on this host, or a term the plan misses"
        if host.fits and plan.fits
        else "the plan had said it would not fit"
    )
    device = _activation_fix(plan) if plan.workload.device.is_host else ""
    return (
        f"the plan: {host.verdict()} [{host.ram_source}]; {seen}; {verdict}. planner.recommend=true "
        f"finds the cheapest layout that fits; fewer ranks on this host or ZeRO-3 shrink each rank's "
        f"share{device}"
    )


def _activation_fix(plan: Plan) -> str:
    """What shrinks the activations from this layout: recompute them, or a smaller micro-batch."""
    smaller = "a smaller batch.micro_size" if plan.layout.micro_size > 1 else ""
    recompute = "model.activation_checkpointing=full" if plan.knobs.spec.recompute != "full" else ""
    fixes = " or ".join(fix for fix in (recompute, smaller) if fix)
    return f"; {fixes} shrinks the activations" if fixes else ""


def explain(error: BaseException, config: TrainConfig, run_dir: Path) -> None:
    """Add the out-of-memory words to ``error`` as a note, if it is one; nothing otherwise."""
    if not is_out_of_memory(error):
        return
    try:
        plan = plan_layout(workload_from_config(config, with_peak=False), knobs_from_config(config))
        words = out_of_memory_words(plan, last_measured(run_dir))
    except Exception as unplanned:  # the words help; they must not hide the error itself
        words = f"out of memory (the plan could not be made to say where: {unplanned})"
    add_note(error, words)

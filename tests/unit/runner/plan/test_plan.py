"""The planner: memory per device against published figures, the auto micro-batch, the ladder, plan.json."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from train_helpers import ROOT, compose_config, memory_case, plan_json

from launchers.plan_job import plan_job
from runner.checkpoint.size import disk_need
from runner.comm import allgather_bytes, reduce_scatter_bytes, zero_step_bytes
from runner.config import ClusterConfig, Offload, Precision, TrainConfig
from runner.errors import ConfigError
from runner.layout import LayoutError, divisors
from runner.memory_model.units import GB
from runner.model.shape import param_numels
from runner.plan.ladder import NEAR_FASTEST, recommend
from runner.plan.micro_fit import memory_at
from runner.plan.planner import (
    ResumePlan,
    layout_for_config,
    offload_mode,
    plan_config,
    workload_from_config,
)
from runner.preflight.validate import validate
from runner.report.plan_table import format_plan, nominal_params
from runner.rundir.plan_record import PLAN_SCHEMA_VERSION, load_plan
from runner.step_time.device_figures import resolve_device
from runner.step_time.zero3_reuse import regathered

pytestmark = [pytest.mark.unit, pytest.mark.usefixtures("no_cpu_calibration")]

LLAMA_70B_PARAMS = 68_976_648_192  # config.json of meta-llama/Llama-2-70b-hf
LAYOUT_KEYS = {"gpus", "dp", "tp", "pp", "sp", "micro_size", "accum_steps", "global_size"}


def _config(*overrides: str) -> TrainConfig:
    config: TrainConfig = compose_config(*overrides)
    return config


def _70b(*overrides: str) -> TrainConfig:
    return _config("model=llama_70b", "cluster=h100_sxm", "precision=bf16", *overrides)


def _terms(model: Any = None, **knobs: Any) -> Any:
    """runner.memory_model.peak.memory_terms for the tiny model (or ``model``): fp32 AdamW, ZeRO-0,
    one rank, seq 128, micro 4, accum 2, unless ``knobs`` say otherwise."""
    from runner.config import ModelConfig
    from runner.memory_model.peak import memory_terms

    defaults: dict[str, Any] = dict(
        precision="fp32",
        optimizer="adamw",
        zero_stage=0,
        offload="none",
        recompute="none",
        seq_len=128,
        micro_size=4,
        dp=1,
        tp=1,
        pp=1,
        accum_steps=2,
    )
    return memory_terms(memory_case(model=model or ModelConfig(), **{**defaults, **knobs}))


def test_llama_70b_zero3_on_64_gpus_holds_17_2_gb_of_model_states():
    """ZeRO (arXiv 1910.02054): 16 B/param / 64 ranks; 17.5 GB at a round 70e9, 17.2 GB at the exact count."""
    plan = plan_config(_70b("parallel=zero3", "gpus=64", "batch.global_size=64"))
    assert plan.workload.num_params == LLAMA_70B_PARAMS
    states = plan.memory.model_states
    assert states == pytest.approx(16 * LLAMA_70B_PARAMS / 64, abs=16)  # ceil-padded partitions
    assert round(states / GB, 1) == 17.2
    table = format_plan(plan)
    assert "model states 17.24 GB per device = ZeRO-3: 16/64 B x 68,976,648,192 params" in table
    assert "nominal 70e9" in table and "17.50 GB" in table
    assert "inter-node" in table  # 64 gpus > 8 per node


def test_a_published_model_planned_with_the_tiny_models_defaults_says_it_is_unusual():
    """model=llama_7b plan=true alone plans fp32 at seq 128: one line says so, and how to plan it."""
    (note,) = [
        line for line in format_plan(plan_config(_config("model=llama_7b"))).splitlines() if "note:" in line
    ]
    assert (
        "6.7B parameters in fp32 at seq 128 is unusual" in note and "precision=bf16 data.seq_len=4096" in note
    )
    as_trained = _config("model=llama_7b", "precision=bf16", "data.seq_len=4096", "batch.micro_size=1")
    assert "is unusual" not in format_plan(plan_config(as_trained))
    assert "is unusual" not in format_plan(plan_config(_config()))  # the tiny model: its own defaults


def test_ddp_on_8_gpus_does_not_fit_80_gb_and_says_by_how_much():
    plan = plan_config(_70b("parallel=ddp", "gpus=8"))
    usable = 0.9 * 80e9
    assert not plan.fits
    assert plan.memory.model_states == 16 * LLAMA_70B_PARAMS  # DDP: every rank holds all 16P
    # Its peak is the optimizer step: FP16_UnfusedOptimizer copies every bf16 gradient to fp32.
    assert plan.memory.step == plan.memory.peak == 20 * LLAMA_70B_PARAMS
    over = plan.memory.peak - usable
    table = format_plan(plan)
    assert f"DOES NOT FIT by {over / GB:.1f} GB" in table
    assert "largest term optimizer step (fp32 copies of the gradients)" in table
    assert "72.0 GB usable" in table
    assert "intra-node" in table  # 8 gpus <= 8 per node


def _tiny_totals(config: TrainConfig) -> dict[int, int]:
    workload = workload_from_config(config, with_peak=False)
    from runner.plan.planner import knobs_from_config

    knobs = knobs_from_config(config)
    per_rank = config.batch.global_size // config.gpus
    return {
        m: memory_at(workload, knobs, micro_size=m, dp=config.gpus, accum_steps=per_rank // m).total
        for m in divisors(per_rank)
    }


def test_auto_micro_takes_the_largest_divisor_that_fits_a_small_device():
    base = ("batch.global_size=32", "gpus=2", "cluster.gpus_per_node=8")
    totals = _tiny_totals(_config(*base, "cluster.device_memory_gb=1000"))
    assert sorted(totals) == [1, 2, 4, 8, 16]
    # A device whose usable memory (x 0.9) lies between micro 4's and micro 8's needs.
    device_gb = (totals[4] + totals[8]) / 2 / 0.9 / GB
    # planner.objective=memory: the largest that fits (speed would weigh the predicted steps).
    config = _config(*base, f"cluster.device_memory_gb={device_gb}", "planner.objective=memory")
    choice = layout_for_config(config)
    layout, why = choice.layout, choice.reason
    assert (layout.micro_size, layout.accum_steps, layout.dp) == (4, 4, 2)
    assert why is not None
    assert why.startswith(f"micro 4: {totals[4] / GB:.1f} GB of ")
    assert f"micro 8 would need {totals[8] / GB:.1f} GB" in why
    # The planner (plan=true) makes the same choice as the runner.
    assert plan_config(config).layout.micro_size == 4


def test_auto_micro_refuses_when_nothing_fits_with_the_numbers():
    config = _config("batch.global_size=16", "cluster.device_memory_gb=0.001")
    with pytest.raises(LayoutError) as info:
        layout_for_config(config)
    text = str(info.value)
    assert "batch.micro_size=auto: not even micro 1 fits" in text
    assert "0.0 GB usable (0.0 GB x headroom 0.9)" in text
    assert "plan=true" in text


def test_a_plan_where_nothing_fits_does_not_tell_the_user_to_plan():
    """plan=true already prints each term: its refusal points at planner.recommend=true alone."""
    plan = plan_config(_config("batch.global_size=16", "cluster.device_memory_gb=0.001"))
    text = format_plan(plan)
    assert "batch.micro_size=auto: not even micro 1 fits" in text
    assert "run with plan=true" not in text
    assert "planner.recommend=true finds the cheapest layout that fits" in text


def test_a_fixed_micro_size_is_kept_and_no_memory_is_planned():
    choice = layout_for_config(_config("batch.micro_size=2", "cluster.device_memory_gb=0.001"))
    assert (choice.layout.micro_size, choice.reason) == (2, None)


def test_recommend_plans_every_rung_says_why_each_cheaper_one_failed_and_ranks_by_speed():
    workload = workload_from_config(_70b("gpus=64", "batch.global_size=512", "data.seq_len=4096"))
    ladder = recommend(workload)
    assert ladder.winner is not None
    names = [r.name for r in ladder.rungs]
    assert names[0].startswith("ddp, micro 8") and names[1] == "ddp, smaller micro + accumulation"
    first = next(i for i, rung in enumerate(ladder.rungs) if rung.fits)
    assert ladder.rungs[first].name == "zero3"  # the cheapest rung that fits, as the walk found it
    for rung in ladder.rungs[:first]:
        assert not rung.fits
        assert "GB > 72.0 GB usable (" in rung.reason, rung.reason
    # DDP's and ZeRO-1's cheapest failures are dominated by model states, not activations.
    assert "(optimizer " in ladder.rungs[1].reason
    # Every rung after it is planned too, and what fits is ranked fastest first.
    assert len(ladder.rungs) > first + 1 and ladder.rungs[-1].name.startswith("pp ")
    speeds = [c.tokens_per_s for c in ladder.ranking]
    assert speeds == sorted(speeds, reverse=True) and speeds[-1] > 0
    win = ladder.winner.plan
    assert win.fits and win.host.fits and win.contract_error is None
    assert win.memory.peak <= workload.usable_bytes
    assert ladder.winner.tokens_per_s >= (1 - NEAR_FASTEST) * speeds[0]
    assert f"parallel={win.knobs.parallel}" in ladder.overrides
    assert f"batch.micro_size={win.layout.micro_size}" in ladder.overrides
    assert ladder.command.startswith("python train.py model=llama_70b cluster=h100_sxm gpus=64")


def test_tensor_and_pipeline_parallel_together_are_planned_and_run():
    config = _70b(
        "gpus=64",
        "parallel.tp=8",
        "parallel.pp=4",
        "parallel=zero1",
        "batch.global_size=64",
        "batch.micro_size=1",
    )
    plan = plan_config(config)
    assert (plan.layout.dp, plan.layout.accum_steps) == (2, 32)
    # bf16 weights of the fullest rank: the last stage's 20 blocks, their matrices split 8
    # ways, the final norm and 1/8 of the output head (split by vocabulary).
    model = plan.workload.model
    h, v = model.d_model, model.vocab_size
    kv = model.n_kv_head * (h // model.n_head)
    block = 2 * h + (2 * h * h + 2 * h * kv + 3 * h * model.ffn_hidden) // 8
    assert plan.memory.params == 2 * (20 * block + h + v * h // 8)
    assert plan.memory.params > 2 * math.ceil(LLAMA_70B_PARAMS / 32)  # not P / (tp x pp)
    assert not plan.plan_only and "PLAN ONLY" not in format_plan(plan)
    # The stage is cut on the meta device before it is allocated (runner/parallel/pipeline_tensor.py):
    # no build phase holds more than the shard.
    assert plan.memory.build == 0 and "  building: " not in format_plan(plan)
    # DeepSpeed's pipeline engine still takes ZeRO 0-1 only: ZeRO-3 under it is planned, not run.
    zero3 = plan_config(
        _70b("gpus=64", "parallel.tp=8", "parallel.pp=4", "parallel=zero3", "batch.global_size=64")
    )
    assert zero3.plan_only and "PLAN ONLY" in format_plan(zero3)
    # Narayanan et al. 2021: bubble = (p - 1) / m of the ideal time.
    assert plan.time.compute_s is not None and plan.time.bubble_s is not None
    assert plan.time.bubble_s == pytest.approx(plan.time.compute_s * 3 / 32)
    assert {t.group for t in plan.traffic} == {"dp", "tp", "pp"}
    # 1F1B: the first stage holds min(pp, accum) micro-batches in flight.
    four = plan.memory.activations
    one = plan_config(_70b("gpus=64", "parallel.tp=8", "parallel.pp=4", "batch.global_size=2")).memory
    assert four > 3.5 * one.activations


def test_compiled_blocks_are_planned_with_what_their_graphs_save():
    """train.compile=true: ZeRO 0-2 plan one compiled graph's items; ZeRO-3 and tp, split graphs', between."""

    def activations(*overrides: str) -> int:
        common = ("model=llama_1b", "cluster=h100_sxm", "precision=bf16", "gpus=8", "batch.micro_size=2")
        return plan_config(_config(*common, *overrides)).memory.activations

    def saved(*layout: str) -> float:
        return 1 - activations(*layout, "train.compile=true") / activations(*layout)

    for layout in (("parallel=zero1",), ("parallel=zero2",)):
        assert saved(*layout) > 0.1, layout
    # A pipeline's last stage also holds a micro-batch's logits, which stay eager.
    assert saved("parallel=ddp", "parallel.pp=2") > 0.05
    # Split graphs keep silu's output: less saved than in one graph, more than eager.
    assert 0 < saved("parallel=zero3") < saved("parallel=zero2")
    assert saved("parallel=zero1", "parallel.tp=2") > 0


def test_zero2_and_zero3_reduce_every_micro_batch():
    def dp_bytes(parallel: str, micro: int) -> float:
        plan = plan_config(
            _70b(f"parallel={parallel}", "gpus=8", "batch.global_size=64", f"batch.micro_size={micro}")
        )
        return next(t.bytes for t in plan.traffic if t.group == "dp")

    p = LLAMA_70B_PARAMS
    once = zero_step_bytes(p, zero_stage=2, dp=8)
    assert dp_bytes("zero2", 8) == pytest.approx(once)
    assert dp_bytes("zero2", 1) == pytest.approx(once + 7 * reduce_scatter_bytes(2 * p, 8))
    # ZeRO-3 gathers in backward only what DeepSpeed released after forward (runner/step_time/zero3_reuse.py)
    model = _70b().model
    again, _ = regathered(param_numels(model), 10 * model.d_model, tied=False)
    zero3 = zero_step_bytes(p, zero_stage=3, dp=8) - allgather_bytes(2 * p, 8) + allgather_bytes(2 * again, 8)
    assert 0.9 * p < again < p
    assert dp_bytes("zero3", 1) == pytest.approx(8 * zero3)
    assert dp_bytes("zero1", 1) == pytest.approx(zero_step_bytes(p, zero_stage=1, dp=8))


def test_offload_enums_map_to_the_estimators_strings():
    assert offload_mode(Offload.none, Offload.none) == "none"
    assert offload_mode(Offload.cpu, Offload.none) == "optimizer"
    assert offload_mode(Offload.cpu, Offload.cpu) == "optimizer+params"
    with pytest.raises(ConfigError, match=r"parallel\.offload_optimizer=cpu"):
        offload_mode(Offload.none, Offload.cpu)
    plan = plan_config(_70b("parallel=zero3", "gpus=8", "parallel.offload_optimizer=cpu"))
    assert plan.memory.optimizer == 0 and plan.memory.grads == 0
    assert plan.memory.host["optimizer"] > 0


@pytest.mark.parametrize(("stage", "offload"), [(2, "optimizer"), (3, "optimizer+params")])
def test_offload_plan_holds_the_ledgers_host_buffers(stage, offload):
    """The planner's host memory is the ledger's line for line (one rank: no partition boundary to bound)."""
    from runner.config import ModelConfig, OptimizerName, ParallelConfig
    from runner.metrics.ledger import RankBatch, deepspeed_estimate

    tiny = ModelConfig()
    common: dict[str, Any] = dict(micro_size=4, seq_len=128, host_is_device=True)
    planned = _terms(tiny, zero_stage=stage, offload=offload, **common)
    parallel = ParallelConfig(
        zero_stage=stage,
        offload_optimizer=Offload.cpu,
        offload_param=Offload.cpu if stage == 3 else Offload.none,
    )
    ledger = deepspeed_estimate(
        model=tiny,
        parallel=parallel,
        precision=Precision.fp32,
        optimizer=OptimizerName.adamw,
        batch=RankBatch(dp=1, micro_size=4, seq_len=128, accum_steps=2),
        host_is_device=True,
    )
    assert planned.host == ledger.host and len(planned.host) > 3  # terms and DeepSpeed's buffers


def test_zero12_plans_the_gradients_of_the_fullest_rank():
    """Each ZeRO-1/2 rank keeps whole the gradients its partition touches; the plan fits the fullest."""
    from runner.config import ModelConfig
    from runner.model.shape import num_params

    def grads(model: ModelConfig, *, stage: int, dp: int, precision: str) -> int:
        return _terms(model, precision=precision, zero_stage=stage, dp=dp).grads

    # The tiny model on 2 ranks in fp32: what the 2-rank ledger measured on rank 1, to the byte.
    assert grads(ModelConfig(), stage=2, dp=2, precision="fp32") == 7_033_856
    assert grads(ModelConfig(), stage=1, dp=2, precision="bf16") == 3_516_928
    # Llama-2 70B on 8 ranks: above the textbook 2P/dp by less than two of its largest tensors.
    llama = _70b().model
    textbook = 2 * -(-num_params(llama) // 8)
    largest = llama.vocab_size * llama.d_model
    assert textbook < grads(llama, stage=2, dp=8, precision="bf16") < textbook + 2 * 2 * largest


def test_a_global_batch_dp_cannot_split_is_planned_at_the_next_multiple_and_flagged():
    plan = plan_config(_70b("parallel=zero3", "gpus=64"))  # the default global batch, 16
    assert plan.contract_error is not None and "16 / 64 is not whole" in plan.contract_error
    assert plan.layout.global_size == 64 and not plan.runnable
    assert "batch contract NOT met" in format_plan(plan)


def test_local_cpu_device_is_detected_and_unknown_links_predict_no_comm_time():
    import torch

    if torch.cuda.is_available():
        pytest.skip("checks the CPU detection")
    device = resolve_device(ClusterConfig(), Precision.bf16, gpus=1)
    assert device.memory_bytes.source.startswith("detected: host")
    assert device.peak_flops.source.startswith("measured")
    assert device.intra_node_bytes_per_s.value is None
    plan = plan_config(_config("gpus=4", "parallel=zero2", "cluster.gpus_per_node=2"))
    assert plan.time.comm_s is None and not plan.time.complete
    assert "unknown bandwidth: no time predicted" in format_plan(plan)
    assert "communication time unknown" in format_plan(plan)


def test_plan_json_carries_the_layout_record(tmp_path, capsys):
    record = plan_job(_70b("parallel=zero3", "gpus=64", "batch.global_size=128"), run_dir=tmp_path)
    written = plan_json(tmp_path)
    assert written == record.to_dict() and written["schema"] == PLAN_SCHEMA_VERSION
    assert load_plan(tmp_path) == record  # read back through its schema, typed
    assert set(written["layout"]) == LAYOUT_KEYS
    assert written["layout"]["gpus"] == 64 and written["layout"]["global_size"] == 128
    assert set(written["memory_bytes"]) >= {
        "params",
        "grads",
        "optimizer",
        "activations",
        "residuals",
        "total",
    }
    assert written["fits"] is True
    assert "memory per device" in capsys.readouterr().out


def _saved_on_two_ranks_zero1(tmp_path) -> dict[str, Any]:
    """A run directory whose latest checkpoint (step 2) was saved by ZeRO-1 on 2 ranks, files faked."""
    checkpoints = tmp_path / "checkpoints"
    (checkpoints / "step_00000002").mkdir(parents=True)
    (checkpoints / "step_00000002" / "model.pt").write_bytes(b"\0" * 1000)
    record = {
        "tag": "step_00000002",
        "completed_steps": 2,
        "zero_stage": 1,
        "layout": {"gpus": 2, "dp": 2, "tp": 1, "pp": 1, "global_size": 16},
    }
    (checkpoints / "latest.json").write_text(json.dumps(record))
    return record


def test_a_plan_of_a_resume_says_what_it_continues_and_what_its_move_writes_and_takes(tmp_path, capsys):
    from runner.checkpoint.size import Conversion

    config = _config("train.resume=auto", "cluster.storage_gb_per_s=2")
    nothing = plan_job(config, run_dir=tmp_path, resume=ResumePlan(disk_need(config, tmp_path)))
    assert nothing.resume == {"from": None}
    assert "no complete checkpoint in" in capsys.readouterr().out
    record = _saved_on_two_ranks_zero1(tmp_path)
    moved = Conversion(tag="step_00000002", stays=3 * 10**9, peak=5 * 10**9, own_layout="gpus=2")
    need = disk_need(config, tmp_path, done_steps=2, on_disk=1, conversion=moved)
    planned = plan_job(config, run_dir=tmp_path, resume=ResumePlan(need, record, saved_bytes=10**9))
    out = capsys.readouterr().out
    assert "continues step_00000002 (2 steps done, 1.000 GB), saved on gpus=2 parallel.zero_stage=1" in out
    # reading 1 GB and writing 3 GB at 2 GB/s
    assert "3.000 GB of copies beside it, 5.000 GB at the most while written; at least 2 s at " in out
    assert "one checkpoint at a stop, beside 3.000 GB of step_00000002 converted for this layout" in out
    assert planned.resume is not None and planned.resume["conversion_s_at_least"] == 2.0
    refused = ResumePlan(disk_need(config, tmp_path), record, refusal="a different global batch")
    plan_job(config, run_dir=tmp_path, resume=refused)
    assert "REFUSED before launch: a different global batch" in capsys.readouterr().out


def test_plan_true_of_a_resume_weighs_it_as_the_run_does(tmp_path, capsys):
    from launchers.resume import resume_plan

    config = _config("train.resume=auto", "gpus=2", "parallel=zero1")
    assert resume_plan(_config(), tmp_path) is None  # not a resume: the plan weighs a new run
    assert resume_plan(config, tmp_path) == ResumePlan(disk_need(config, tmp_path))
    _saved_on_two_ranks_zero1(tmp_path)
    same = resume_plan(config, tmp_path)
    assert same is not None and same.refusal is None and same.disk.conversion is None
    assert same.saved_bytes == 1000 and same.disk.on_disk == 1
    other_batch = resume_plan(_config("train.resume=auto", "gpus=2", "batch.global_size=32"), tmp_path)
    assert other_batch is not None and other_batch.refusal is not None
    assert "batch.global_size=16, this run asks 32" in other_batch.refusal
    no_fit = resume_plan(_config("train.resume=auto", "model=llama_70b"), tmp_path)
    assert no_fit is not None and no_fit.refusal is not None
    assert no_fit.refusal.startswith("batch.micro_size=auto: not even micro 1 fits")


def test_nominal_size_from_the_model_name():
    assert nominal_params("llama_70b") == 70e9
    assert nominal_params("gpt2_124m") == 124e6
    assert nominal_params("tiny") is None


@pytest.mark.parametrize(("stage", "precision"), [(0, "fp32"), (1, "fp32"), (1, "bf16")])
def test_a_pipeline_plan_counts_the_fullest_stage_as_the_ledger_does(stage, precision):
    """Under a pipeline the plan's model states are the fullest stage's, term for term the ledger's."""
    from runner.config import ModelConfig, OptimizerName, ParallelConfig
    from runner.metrics.ledger import RankBatch, deepspeed_estimate

    tiny = ModelConfig()
    planned = _terms(tiny, precision=precision, zero_stage=stage, pp=2, accum_steps=4, host_is_device=True)
    ledger = deepspeed_estimate(
        model=tiny,
        parallel=ParallelConfig(zero_stage=stage, pp=2),
        precision=Precision(precision),
        optimizer=OptimizerName.adamw,
        host_is_device=True,
        batch=RankBatch(dp=1, micro_size=4, seq_len=128, accum_steps=4),
    )
    for term in ("params", "grads", "optimizer"):
        assert getattr(planned, term) == ledger.terms[term], term
    # The last stage (2 blocks, the final norm and the tied head), measured on 2 ranks: 1,647,872
    # parameters, not half the model's 3,229,952.
    assert planned.params == (4 if precision == "fp32" else 2) * 1_647_872


def test_a_pipelines_first_stage_in_bf16_at_zero0_has_its_gradients_from_the_start():
    """bf16 stage 0 under a pipeline is DeepSpeed's BF16_Optimizer, whose gradient buffer is made
    with the engine: the first stage's first backward holds it whole (tiny, m = 2 on 2 stages,
    measured 0.0813 GB; planned 0.0777 discounting it, 0.0810 counting it). fp32 and ZeRO-1 make
    their gradients in that backward."""
    from runner.config import ModelConfig
    from runner.memory_model.peak_lines import BF16_PARAM_GRADS

    tiny = ModelConfig()
    shape = {"pp": 2, "micro_size": 8, "seq_len": 128}
    first_backward = _terms(tiny, precision="bf16", zero_stage=0, accum_steps=2, **shape)
    assert first_backward.grads_after_peak == 0 and BF16_PARAM_GRADS not in first_backward.residuals
    assert 0.0809e9 < first_backward.total < 0.0811e9
    for precision, stage in (("fp32", 0), ("bf16", 1)):
        made_in_backward = _terms(tiny, precision=precision, zero_stage=stage, accum_steps=2, **shape)
        assert made_in_backward.grads_after_peak == made_in_backward.grads, (precision, stage)
    # With more micro-batches than stages the first stage peaks at a later backward, beside the
    # parameters' own bf16 gradients, which BF16_Optimizer adds into its buffer and keeps:
    # measured 0.0843 GB at m = 4.
    later_backward = _terms(tiny, precision="bf16", zero_stage=0, accum_steps=4, **shape)
    assert later_backward.residuals[BF16_PARAM_GRADS] == later_backward.grads
    assert 0.0842e9 < later_backward.total < 0.0844e9


def test_zero3_with_tp_plans_the_build_where_it_holds_more_than_the_steps():
    """zero.Init holds 1/dp of the whole model before AutoTP cuts 1/tp of it: the peak at tp 8, fp32."""
    from runner.memory_model.peak_lines import zero3_tp_build_bytes

    plan = plan_config(_70b("parallel=zero3", "parallel.tp=8", "precision=fp32", "gpus=8"))
    model = plan.workload.model
    assert plan.memory.build == zero3_tp_build_bytes(model, precision="fp32", dp=1)
    assert plan.memory.build == 4 * (LLAMA_70B_PARAMS + model.vocab_size * model.d_model)
    assert plan.memory.build > plan.memory.total and not plan.fits
    assert plan.memory.largest()[0].startswith("build")
    assert "building: zero.Init 1/dp + a weight" in format_plan(plan)
    # In bf16 over 8 data-parallel ranks the build is a fraction of the steps' bytes.
    wide = plan_config(_70b("parallel=zero3", "parallel.tp=8", "gpus=64", "batch.global_size=64"))
    assert 0 < wide.memory.build < wide.memory.total
    assert plan_config(_70b("parallel=zero3", "gpus=8")).memory.build == 0  # no AutoTP: nothing to cut


def test_zero12s_backward_bucket_counts_where_it_is_live():
    """The bucket comes at the first parameter gradient, after the loss's tensors are freed
    (runner.memory_model.peak_lines.beyond_activations_after_head): the tiny model's 256-entry vocabulary
    frees little, so most of its 12.9 MB fp32 bucket adds to the peak; gpt2_124m's loss frees
    0.62 GB at micro 8, more than its 0.49 GB bucket, which then adds nothing at ZeRO-2.
    ZeRO-1 keeps the bucket to the step's boundary: with accumulation all of it adds."""
    name = "reduce_bucket (in backward)"
    tiny_bucket = 4 * 3_229_952
    tiny = _terms(zero_stage=2, micro_size=8, reduce_bucket_size=3_229_952)
    assert 0.7 * tiny_bucket < tiny.residuals[name] < tiny_bucket
    doubled = _terms(zero_stage=2, micro_size=8, reduce_bucket_size=3_229_952, overlap_comm=True)
    assert doubled.residuals[name] == tiny.residuals[name] + tiny_bucket  # two with overlap_comm
    no_accumulation = _terms(zero_stage=1, micro_size=8, accum_steps=1, reduce_bucket_size=3_229_952)
    assert no_accumulation.residuals[name] == tiny.residuals[name]
    assert _terms(zero_stage=1, micro_size=8, reduce_bucket_size=3_229_952).residuals[name] == tiny_bucket
    gpt2 = compose_config("model=gpt2_124m").model
    assert name not in _terms(gpt2, zero_stage=2, micro_size=8, reduce_bucket_size=123_551_232).residuals
    gpt2_zero1 = _terms(gpt2, zero_stage=1, micro_size=8, reduce_bucket_size=123_551_232)
    assert gpt2_zero1.residuals[name] == 4 * 123_551_232
    # ZeRO-3 holds its bucket from initialize on (ipg_buckets).
    assert name not in _terms(zero_stage=3, micro_size=8, reduce_bucket_size=3_229_952).residuals
    # Under a pipeline ZeRO-1 holds it from the first backward to the boundary, where it
    # allocates one more after the activations are freed: that one adds only beyond them.
    piped = _terms(zero_stage=1, pp=2, micro_size=8, reduce_bucket_size=3_229_952)
    assert piped.residuals[name] == tiny_bucket and "reduce_bucket (at boundary)" not in piped.residuals
    short = _terms(zero_stage=1, pp=2, micro_size=1, seq_len=8, reduce_bucket_size=3_229_952)
    assert short.residuals["reduce_bucket (at boundary)"] == tiny_bucket - short.activations > 0


def test_zero3s_plan_holds_the_whole_tensors_deepspeed_is_given():
    """ZeRO-3 keeps tensors of at most stage3_param_persistence_threshold elements whole on
    every rank (DeepSpeed's ``<=``); the plan counts them as runner.engine.deepspeed_config gives
    the threshold. llama_7b in bf16 on 8 devices: 10h keeps the 65 norms' gains whole; a
    threshold of exactly h^2 keeps the 128 h x h matrices whole too."""
    h, norms = 4096, 65 * 4096
    base = ("model=llama_7b", "parallel=zero3", "precision=bf16", "cluster=h100_sxm")
    whole = "zero3_full_params (persistent or gathered)"
    assert plan_config(_config(*base, "gpus=8")).memory.residuals[whole] == 2 * norms
    users = plan_config(_config(*base, "gpus=8", f"parallel.param_persistence_threshold={h * h}"))
    assert users.memory.residuals[whole] == 2 * (norms + 32 * 4 * h * h)
    assert whole not in plan_config(_config(*base, "gpus=1")).memory.residuals  # one rank partitions nothing


def test_a_tied_heads_gradient_counts_where_it_outlasts_the_loss():
    """Autograd holds a tied head's weight gradient (V x h) from the head's backward to the
    embedding's (runner.memory_model.peak_lines.tied_head_gradient_bytes). It adds to the peak only
    beyond what the loss frees: gpt2_124m at ZeRO-2 (micro 8, seq 128), whose loss frees
    more than its 0.49 GB bucket alone, but not more than the bucket and the 0.15 GB
    gradient together (measured 1.981 GB above the step's start, planned 1.980 with the
    final norm's backward working set, which comes after the head's)."""
    import dataclasses

    from runner.memory_model.peak_lines import (
        TIED_HEAD_GRADIENT,
        beyond_activations_after_head,
        tied_head_gradient_bytes,
    )

    gpt2 = compose_config("model=gpt2_124m").model
    tied = 4 * 50257 * 768
    assert tied_head_gradient_bytes(gpt2, tp=1, pp=1, precision="fp32") == tied
    assert tied_head_gradient_bytes(gpt2, tp=2, pp=1, precision="bf16") == 2 * 25129 * 768  # ceil(V/2) rows
    assert tied_head_gradient_bytes(gpt2, tp=1, pp=2, precision="fp32") == 0  # two copies, one per end
    untied = dataclasses.replace(gpt2, tie_embeddings=False)
    assert tied_head_gradient_bytes(untied, tp=1, pp=1, precision="fp32") == 0

    zero2 = _terms(gpt2, zero_stage=2, micro_size=8, reduce_bucket_size=123_551_232)
    assert "reduce_bucket (in backward)" not in zero2.residuals
    assert 0.03e9 < zero2.residuals[TIED_HEAD_GRADIENT] < 0.05e9
    assert 1.97e9 < zero2.grads + zero2.activations + zero2.residuals[TIED_HEAD_GRADIENT] < 1.99e9
    # Kept 15 (the loss's 3, the head's input and the final norm's output 1 each), 5 more at
    # the loss: 10 stay after the head's backward, 12 with the final norm's working set.
    items = {"blocks": 10, "loss.log_probs_fp32": 3, "transient.loss_grads_fp32": 5}
    items.update({"output.input": 1, "final_norm.normed": 1, "transient.final_norm_backward": 2})
    items.update({"transient.logits": 0, "transient.logits_fp32": 0, "transient.recompute_layer": 0})
    assert [beyond_activations_after_head(items, allocated=a) for a in (8, 9, 12)] == [0, 1, 4]
    # Without the bucket (ZeRO-0, ZeRO-3; ZeRO-1 with accumulation, whose bucket is counted
    # whole) the loss frees more than the gradient alone: nothing adds.
    for stage in (0, 1, 3):
        assert TIED_HEAD_GRADIENT not in _terms(gpt2, zero_stage=stage, micro_size=8).residuals
    assert TIED_HEAD_GRADIENT not in _terms(untied, zero_stage=2, micro_size=8).residuals


def test_one_micro_batch_a_step_makes_its_gradients_after_the_activation_peak():
    """ZeRO 0-2 start a step without gradients; backward makes them as it frees the
    activations, so with one micro-batch a step the plan's peak holds the larger of the two
    (runner.memory_model.peak_lines.grads_after_activation_peak): gpt2_124m at micro 8, seq 128 drops its
    0.49 GB of fp32 gradients from the total (measured 2.929 GB at ZeRO-0, planned 2.928).
    ZeRO-3's gradient partitions persist, and with accumulation the first micro-batch's
    gradients are live at the next one's loss: there all of them count."""
    gpt2 = compose_config("model=gpt2_124m").model
    grads = 4 * 123_551_232
    for stage in (0, 1, 2):
        one = _terms(gpt2, zero_stage=stage, micro_size=8, accum_steps=1, reduce_bucket_size=123_551_232)
        two = _terms(gpt2, zero_stage=stage, micro_size=8, accum_steps=2, reduce_bucket_size=123_551_232)
        assert one.grads == two.grads == grads
        assert one.grads_after_peak == grads and two.grads_after_peak == 0
        terms = one.model_states + one.activations + sum(one.residuals.values())
        assert one.total == terms - grads
    zero3 = _terms(gpt2, zero_stage=3, micro_size=8, accum_steps=1, reduce_bucket_size=123_551_232)
    assert zero3.grads_after_peak == 0
    assert 2.92e9 < _terms(gpt2, micro_size=8, accum_steps=1).total < 2.94e9
    # Gradients that outgrow the activation peak (with its bucket and tied head lines) peak at
    # backward's end, whole with the bucket: only what the activation peak hides drops out.
    short = _terms(gpt2, zero_stage=2, micro_size=1, seq_len=8, accum_steps=1, reduce_bucket_size=123_551_232)
    in_backward = sum(v for k, v in short.residuals.items() if k != "fp32_master_copy")
    assert 0 < short.grads_after_peak == short.activations + in_backward - grads < grads


def test_zero0s_flat_allreduce_copy_counts_where_it_outgrows_the_activations():
    """ZeRO-0 all-reduces its gradients at the boundary through one flat copy (up to 5e8
    elements and a tensor; runner.memory_model.peak_lines.allreduce_flat_bytes), after the activations
    are freed: at micro 8, seq 128 gpt2_124m's activations hide it; at micro 1, seq 16 the
    plan adds what it needs beyond them, with one micro-batch a step or more."""
    from runner.memory_model.peak_lines import ALLREDUCE_FLAT, allreduce_flat_bytes

    gpt2 = compose_config("model=gpt2_124m").model
    grads = 4 * 123_551_232
    assert allreduce_flat_bytes(123_551_232, largest=38_597_376, precision="fp32") == grads
    assert allreduce_flat_bytes(10**9, largest=10**6, precision="bf16") == 2 * (500_000_000 + 10**6)
    assert ALLREDUCE_FLAT not in _terms(gpt2, micro_size=8).residuals
    for accum in (1, 2):
        short = _terms(gpt2, micro_size=1, seq_len=16, accum_steps=accum)
        in_backward = short.residuals.get("tied head grad (in backward)", 0)
        assert short.residuals[ALLREDUCE_FLAT] == grads - short.activations - in_backward > 0
        # At the boundary: the weights, the optimizer, the gradients and their flat copy.
        assert short.total == short.params + short.optimizer + 2 * grads
    assert ALLREDUCE_FLAT not in _terms(gpt2, zero_stage=1, micro_size=1, seq_len=16).residuals
    # Under a pipeline: the fullest stage's gradients, beyond its activations.
    piped = _terms(gpt2, pp=2, micro_size=1, seq_len=16)
    assert piped.residuals[ALLREDUCE_FLAT] == piped.grads - piped.activations > 0


@pytest.mark.parametrize(
    ("precision", "zero_stage", "per_param"),
    [
        # Measured with bench/step_peak.py, tiny, micro 1, seq 16, one CPU rank: 20.2, 20.1,
        # 22.2 B per parameter in bf16; fp32 ZeRO 0-2 within 0.4% of the plan.
        ("bf16", 1, 2 + 2 + 12 + 4),  # states and the partition's fp32 copy, written in one pass
        ("bf16", 2, 2 + 2 + 12 + 4),
        ("bf16", 0, 2 + 2 + 12 + 4),  # FP16_UnfusedOptimizer: an fp32 copy of every gradient
        ("bf16", 3, 2 + 2 + 12 + 2 + 4),  # and ZeRO-3's gradient bucket (reduce_bucket_size P)
        ("fp32", 1, 4 + 4 + 8 + 4 + 4),  # the fp32 master copy, and one flat copy: .to(fp32) copies nothing
        ("fp32", 0, 0),  # torch's fused AdamW steps in place: no step line
    ],
)
def test_the_optimizer_step_holds_the_states_and_the_gradients_copies(precision, zero_stage, per_param):
    from runner.config import ModelConfig
    from runner.parallel.pipeline_split import rank_param_numels

    model = ModelConfig()
    params = sum(rank_param_numels(model, tp=1, pp=1))
    knobs = {"precision": precision, "zero_stage": zero_stage, "micro_size": 1, "seq_len": 16}
    terms = _terms(model, **knobs, accum_steps=1, reduce_bucket_size=params)
    assert terms.step == per_param * params
    if precision == "bf16":  # a short sequence's activations are far below what its step holds
        assert terms.peak == terms.step > terms.total


def test_a_pipelines_bf16_stage_0_steps_with_its_gradients_cast_to_fp32():
    """BF16_Optimizer: its bf16 gradient buffer cast to fp32, beside the parameters' bf16 gradients
    (measured 22.2 B a parameter of the stage, bench/step_peak.py --pp 2, micro 1, seq 16)."""
    from runner.config import ModelConfig
    from runner.parallel.pipeline_split import rank_param_numels

    model = ModelConfig()
    stage = sum(rank_param_numels(model, tp=1, pp=2))
    for accum in (2, 4):
        terms = _terms(model, precision="bf16", pp=2, micro_size=1, seq_len=16, accum_steps=accum)
        assert terms.step == (2 + 2 + 12 + 2 + 4) * stage


def test_the_plan_prices_the_held_out_evaluation_as_forward_passes():
    """train.eval_every: each evaluation is eval_batches global batches forward only, the step's
    forward terms with nothing recomputed, plus a pipeline's bubble; its share is over the steps."""
    common = ("model=llama_1b", "cluster=h100_sxm", "precision=bf16", "gpus=8", "batch.global_size=64")
    plain = plan_config(_config(*common, "parallel=zero1"))
    assert plain.eval_s is None and plain.record().time.eval_s is None
    every = ("train.eval_every=100", "train.eval_batches=6")
    evaluated = plan_config(_config(*common, "parallel=zero1", *every))
    compute, forward = evaluated.time.compute_s, evaluated.time.forward_s
    assert compute is not None and forward is not None and evaluated.time.step_s is not None
    assert forward < compute / 2  # the forward GEMMs are a third of the step's
    assert evaluated.eval_s == pytest.approx(6 * forward)
    assert evaluated.eval_share == pytest.approx(evaluated.eval_s / (100 * evaluated.time.step_s))
    assert evaluated.record().time.eval_share == evaluated.eval_share
    assert "held-out evaluation every 100 steps: 6 global batches forward only" in format_plan(evaluated)
    # Recomputed blocks make the step dearer, not the evaluation: a smaller part of the step.
    recomputed = plan_config(
        _config(*common, "parallel=zero1", "model.activation_checkpointing=full", *every)
    )
    assert recomputed.time.compute_s is not None and recomputed.time.compute_s > compute
    assert recomputed.eval_s == pytest.approx(evaluated.eval_s)
    piped = plan_config(_config(*common, "parallel=pp2", "batch.micro_size=2", *every))
    assert piped.time.forward_s is not None
    assert piped.eval_s == pytest.approx(6 * piped.time.forward_s * (1 + 1 / piped.layout.accum_steps))


def test_the_plan_times_a_save_at_the_storages_write_speed():
    """cluster.storage_gb_per_s: one checkpoint's bytes at that speed, and the saves' share of the
    steps' time at train.checkpoint_every; unknown (and said so) without it."""
    common = ("model=llama_70b", "cluster=h100_sxm", "precision=bf16", "gpus=64", "parallel=zero3")
    common += ("batch.global_size=256", "model.activation_checkpointing=full")
    unknown = plan_config(_config(*common, "train.checkpoint_every=100"))
    assert unknown.checkpoint_s is None and unknown.record().checkpoint_s is None
    assert "its save time: unknown (set cluster.storage_gb_per_s" in format_plan(unknown)
    timed = plan_config(_config(*common, "train.checkpoint_every=100", "cluster.storage_gb_per_s=2"))
    assert timed.checkpoint_s == pytest.approx(timed.checkpoint_bytes / 2e9)  # 827.72 GB: 414 s
    assert timed.time.step_s is not None
    assert timed.checkpoint_share == pytest.approx(timed.checkpoint_s / (100 * timed.time.step_s))
    assert timed.record().checkpoint_share == timed.checkpoint_share
    assert "one save 414 s at cluster.storage_gb_per_s=2; every 100 steps:" in format_plan(timed)
    with pytest.raises(ConfigError, match=r"cluster.storage_gb_per_s=0: must be positive"):
        validate(_config(*common, "cluster.storage_gb_per_s=0"), launcher=None)


def test_each_zero_stage_is_named_for_the_parallel_option_that_sets_it():
    """runner.config.ZeroStage's names are conf/parallel's options for that stage alone: the ladder
    tries each stage as ``parallel=<name>`` and its overrides run what it planned."""
    import yaml

    from runner.config import ZeroStage

    options = ROOT / "conf" / "parallel"
    for stage in ZeroStage:
        assert yaml.safe_load((options / f"{stage.name}.yaml").read_text()) == {
            "name": stage.name,
            "zero_stage": stage.value,
        }


def test_the_plan_spells_its_enums_as_their_values_in_words_and_json():
    """Knobs hold runner.config's enums; the table, the ladder's overrides and plan.json show the values."""
    from runner.plan.ladder import overrides_for

    plan = plan_config(_70b("parallel=zero3_offload", "gpus=64", "model.activation_checkpointing=full"))
    assert plan.knobs.describe() == "zero3_offload + full recompute + offload optimizer+params"
    knobs = json.loads(json.dumps(plan.record().to_dict()))["knobs"]
    assert (knobs["zero_stage"], knobs["recompute"], knobs["offload"]) == (3, "full", "optimizer+params")
    assert "= ZeRO-3 with optimizer+params offloaded to the host" in format_plan(plan)
    overrides = overrides_for(plan)
    assert "optimizer=adamw" in overrides and "model.activation_checkpointing=full" in overrides


def test_the_memory_terms_take_the_enums_or_their_plain_values():
    from runner.config import OffloadPlacement, OptimizerName, Recompute, ZeroStage

    plain = _terms(precision="bf16", optimizer="adamw", zero_stage=3, offload="optimizer", recompute="full")
    typed = _terms(
        precision=Precision.bf16,
        optimizer=OptimizerName.adamw,
        zero_stage=ZeroStage.zero3,
        offload=OffloadPlacement.optimizer,
        recompute=Recompute.full,
    )
    assert plain == typed and plain.host
    with pytest.raises(ValueError, match="Precision"):
        _terms(precision="fp64")


def test_a_recommendation_for_a_gpu_cluster_planned_elsewhere_says_where_it_runs(tmp_path, capsys):
    """Pasted on a host without the cluster's devices the command would be refused: the plan says
    to run it on the cluster's hosts, or gives it submitted to SLURM, the plan's overrides carried."""
    config = _config("cluster=h100_sxm", "gpus=8", "precision=bf16", "planner.recommend=true")
    given = ["cluster=h100_sxm", "gpus=8", "precision=bf16", "cluster.inter_node_gbps=100"]
    plan_job(config, run_dir=tmp_path, given=given, elsewhere=True)
    out = capsys.readouterr().out
    command = plan_json(tmp_path)["recommendation"]["command"]
    assert "cluster.inter_node_gbps=100" in command
    assert "this host has no device of cluster h100_sxm: run it on one of the cluster's hosts" in out
    assert command.replace("python train.py ", "python train.py -m hydra/launcher=slurm ", 1) in out
    plan_job(config, run_dir=tmp_path, given=given)  # on the cluster's own host: the command alone
    assert "this host has no device" not in capsys.readouterr().out


@pytest.mark.parametrize(
    ("cluster", "overrides", "ring_gb_s", "p2p_gb_s"),
    [
        ("h100_sxm", [], 400, 50),  # 8 rails x 50 GB/s, under NVLink's 450
        ("a100_80g", [], 200, 25),  # 8 rails x 25 GB/s, under NVLink's 300
        ("h100_sxm", ["cluster.nics_per_node=1"], 50, 6.25),  # one port for the whole node
        ("h100_sxm", ["cluster.inter_node_gbps=100"], 450, 100),  # the network outruns NVLink
    ],
)
def test_a_ring_across_nodes_runs_over_every_rail_of_its_node(cluster, overrides, ring_gb_s, p2p_gb_s):
    """NCCL's rings leave each node through all its ports at once; a pipeline's send through one's share."""
    config = _config(f"cluster={cluster}", "gpus=16", "precision=bf16", *overrides)
    device = plan_config(config).workload.device
    assert device.inter_node_bytes_per_s.value == pytest.approx(ring_gb_s * GB)
    assert device.inter_node_p2p_bytes_per_s.value == pytest.approx(p2p_gb_s * GB)
    assert "rails" in device.inter_node_bytes_per_s.source


def test_llama_3_1_8b_keeps_its_speed_per_gpu_from_one_node_to_sixteen():
    """torchtitan's FSDP case (docs/performance.md: micro 2, seq 8192; 3% slower per GPU from 8 to 128
    H100s): the reduction overlapped and priced over 8 rails, the plan's per-GPU speed stays within 1%.
    Exposed, NCCL's per-step latency costs the 128-GPU ring 5-15%; one port per node (the figure
    before rails) made it 24% slower."""

    def per_gpu(gpus: int, *more: str) -> float:
        config = _config(
            "model=llama3_1_8b",
            "cluster=h100_sxm",
            f"gpus={gpus}",
            "parallel=zero3",
            "precision=bf16",
            "batch.micro_size=2",
            f"batch.global_size={2 * gpus}",
            "data.seq_len=8192",
            "model.activation_checkpointing=full",
            *more,
        )
        time = plan_config(config).time
        assert time.step_s is not None
        return 2 * 8192 / time.step_s

    assert per_gpu(128) == pytest.approx(per_gpu(8), rel=0.01)
    # Exposed, the bytes over 8 rails cost the same per GPU; NCCL's ring latency does not: a ring
    # of 128 ranks takes 127 steps per gather where one of 8 takes 7, for each of ZeRO-3's gathers.
    exposed = ("parallel.overlap_comm=false", "cluster.inter_node_step_us=null")
    assert per_gpu(128, *exposed) == pytest.approx(per_gpu(8, *exposed), rel=0.01)
    latency = per_gpu(128, "parallel.overlap_comm=false") / per_gpu(8, "parallel.overlap_comm=false")
    assert 0.85 < latency < 0.95
    one_port = per_gpu(128, *exposed, "cluster.nics_per_node=1") / per_gpu(8, *exposed)
    assert one_port < 0.8


def test_a_borrowed_calibration_moves_memory_bound_work_at_the_borrowers_memory_bandwidth():
    """a100_80g and h100_sxm plan from the H200's figures: copies and the optimizer at their own HBM
    bandwidth (2.0 and 3.35 TB/s against 4.8), the source saying so; the H200 as recorded."""
    rates = {}
    for cluster in ("h200", "h100_sxm", "a100_80g"):
        device = plan_config(_config(f"cluster={cluster}", "gpus=1", "precision=bf16")).workload.device
        calibration = device.calibration
        assert calibration is not None
        rates[cluster] = (calibration.copy_rate(2**28), calibration.adamw_rate(2**25))
        if cluster != "h200":
            assert "memory-bound figures scaled by" in calibration.source
    for cluster, hbm in (("h100_sxm", 3350), ("a100_80g", 2039)):
        for theirs, h200s in zip(rates[cluster], rates["h200"], strict=True):
            assert theirs == pytest.approx(h200s * hbm / 4800)


def test_a_compiled_runs_ladder_tries_the_attention_core_in_selectives_place():
    """train.compile=true: op-level selective recompute is refused (runner/rules/recompute.py), so
    the ladder's partial-recompute candidates are the attention core's; without compile, op-level."""
    from runner.config import Recompute
    from runner.plan.ladder import rungs

    for compiled, partial in ((True, Recompute.attention), (False, Recompute.selective)):
        config = _config(
            "model=llama_1b", "cluster=h100_sxm", "gpus=8", "precision=bf16", f"train.compile={compiled}"
        )
        ladder = rungs(plan_config(config).workload)
        modes = {knobs.spec.recompute for _, candidates in ladder for knobs in candidates}
        assert modes == {Recompute.none, partial, Recompute.full}
        assert f"ddp + {partial.value} recompute" in [name for name, _ in ladder]


def test_max_seq_finds_the_longest_sequence_each_recompute_mode_fits(tmp_path):
    """planner.max_seq=true: for the planned layout, the largest data.seq_len that fits, in each mode;
    one token more does not. Llama-3.1-8B on 8 H100s under ZeRO-3 at micro 1: full recompute with
    the loss in pieces reaches 106K tokens, no recompute 7K."""
    import dataclasses

    from runner.plan.max_seq import longest_sequences

    given = ("model=llama3_1_8b", "cluster=h100_sxm", "gpus=8", "parallel=zero3", "precision=bf16")
    config = _config(*given, "batch.micro_size=1", "batch.global_size=8", "planner.max_seq=true")
    assert config.planning  # planner.max_seq implies plan=true
    plan = plan_config(config)
    longest = longest_sequences(plan.workload, plan.knobs, plan.layout)
    assert set(longest) == {"none", "selective", "attention", "full"}
    assert longest["none"] < longest["attention"] < longest["selective"] < longest["full"]
    assert longest["full"] > 100_000 and longest["none"] > 7_000
    for mode, tokens in longest.items():
        assert tokens is not None
        for seq, fits in ((tokens, True), (tokens + 1, False)):
            model = dataclasses.replace(
                config.model, activation_checkpointing=mode, max_seq_len=max(seq, 131072)
            )
            at = dataclasses.replace(config, model=model, data=dataclasses.replace(config.data, seq_len=seq))
            assert plan_config(at).fits == fits, (mode, seq)
    record = plan_job(config, run_dir=tmp_path)
    assert record.max_seq == longest


def test_smaller_gradient_buckets_pay_more_collective_latency():
    """DeepSpeed reduces ZeRO-2's gradients a bucket at a time: 10x smaller buckets, 10x the
    reduce-scatters, each paying NCCL's ring latency (64 ranks on 8 nodes: 8.4 + 56 x 3.4 + 7 x 14 us)."""

    def dp_comm(*more: str) -> tuple[float, str]:
        config = _config(
            "model=llama_7b",
            "cluster=h100_sxm",
            "gpus=64",
            "parallel=zero2",
            "precision=bf16",
            "batch.micro_size=2",
            "batch.global_size=128",
            "data.seq_len=4096",
            *more,
        )
        term = next(t for t in plan_config(config).time.terms if t.name == "dp comm")
        return term.seconds, term.words

    big, big_words = dp_comm()
    small, small_words = dp_comm("parallel.reduce_bucket_size=50000000")
    assert big_words.startswith("15 collectives") and small_words.startswith("136 collectives")
    per_reduce_scatter = (8.4 + 56 * 3.4 + 7 * 14) * 1e-6
    assert small - big == pytest.approx((135 - 14) * per_reduce_scatter)
    unpriced, words = dp_comm("cluster.inter_node_step_us=null")
    assert unpriced < big and "NCCL" not in words


def test_a_sequence_too_long_for_a_rank_is_recommended_sequence_parallelism():
    """Llama-3.1-8B on one 8 x H100 node at 131,072 tokens: no layout that keeps whole sequences on
    a rank fits without offload (ZeRO-3 with full recompute plans its activations above the device),
    the ladder's sequence-parallel rungs do, and the fastest of them is recommended: the command
    carries parallel.sp."""
    config = _config(
        "model=llama3_1_8b",
        "cluster=h100_sxm",
        "gpus=8",
        "precision=bf16",
        "batch.global_size=8",
        "data.seq_len=131072",
        "model.max_seq_len=131072",
    )
    ladder = recommend(workload_from_config(config))
    whole_sequences = [rung for rung in ladder.rungs if not rung.name.startswith(("sp ", "tp "))]
    assert not any(r.fits for r in whole_sequences if "offload" not in r.name)
    assert all(r.fits for r in ladder.rungs if r.name.startswith("sp "))
    assert ladder.winner is not None and ladder.winner.plan.knobs.spec.sp > 1
    assert f"parallel.sp={ladder.winner.plan.knobs.spec.sp}" in ladder.command


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_a_sequence_parallel_rank_holds_the_activations_of_its_share_and_zero_spans_dp_x_sp(recompute):
    """Under sp each rank runs seq/sp tokens of every sample (attention over the whole sequence at
    heads/sp holds as many elements), and ZeRO partitions over the data- and sequence-parallel ranks
    together: sp 4 at seq 512 on 4 ranks plans seq 128's activations and ZeRO-3 over 4."""
    split = _terms(zero_stage=3, recompute=recompute, seq_len=512, sp=4, dp=1)
    share = _terms(zero_stage=3, recompute=recompute, seq_len=128, sp=1, dp=4)
    assert split.activations == share.activations
    assert (split.params, split.grads, split.optimizer) == (share.params, share.grads, share.optimizer)

"""plan=true's time section: the calibrated prediction term by term, the term that limits the step,
where the figures came from, and the roofline beside it as the bound; plan=true without a
calibration shows the bound alone, as the bound."""

from __future__ import annotations

import re

import pytest
from train_helpers import compose_config

from launchers.run_record import step_time_plan_record
from runner.config import OffloadPlacement, Precision, ZeroStage
from runner.plan.planner import Plan, plan_config
from runner.report.plan_table import format_plan
from runner.step_time.measured import figures as calibrations
from runner.step_time.optimizer_step_passes import step_copies

pytestmark = [pytest.mark.unit, pytest.mark.usefixtures("no_cpu_calibration")]

BOUND = "bound (roofline: compute at peak, links at full bandwidth): step "
# A CPU that reaches half its peak (the no_cpu_calibration fixture's 1e11 FLOP/s) in every GEMM:
# fixed figures, so the test measures nothing on a shared host.
FIGURES = {
    "device": "cpu test",
    "gemms": {"1024,128,128": [5e10, 5e10, 5e10]},
    "attention": {"4,4,128,32": [1e-4, 2e-4]},
    "copies": {"1048576": 1e10},
    "op_s": 1e-5,
    "adamw_bytes_per_s": 1e10,  # the first calibration's one figure; later ones keep one by size
    "adamw": {"4194304": 1e10},
    "allreduce": [1e-4, 1e9],
}


@pytest.fixture
def fixed_calibration(monkeypatch, measured_calibration):
    """This host's calibration is FIGURES, not a measurement."""
    record = calibrations.from_record(FIGURES, source="test figures: half the peak in every GEMM")
    monkeypatch.setattr("runner.step_time.device_figures._measure_here", lambda *args, **kwargs: record)


def _time_section(plan: Plan) -> str:
    text = format_plan(plan)
    return text[text.index("time per step") : text.index("checkpoint on disk")]


def test_a_calibrated_plan_predicts_below_the_bound_names_its_terms_and_what_limits_it(fixed_calibration):
    plan = plan_config(compose_config())  # tiny on cluster=local
    section = _time_section(plan)
    predicted = re.search(r"=> predicted step ([\d.]+) s, MFU ([\d.]+)%", section)
    assert predicted is not None, section
    assert float(predicted.group(2)) < 100
    assert float(predicted.group(2)) == pytest.approx(100 * plan.time.mfu, abs=0.05)
    bound = re.search(re.escape(BOUND) + r"([\d.]+) s, MFU ([\d.]+)%", section)
    assert bound is not None and float(bound.group(2)) == pytest.approx(100.0)  # the roofline's MFU
    assert float(bound.group(1)) < float(predicted.group(1))
    assert "limited by gemm:" in section  # half the peak in every GEMM: they take most of the step
    for term in plan.time.terms:
        assert re.search(rf"^  {re.escape(term.name)} +[\d.e+-]+ +[\d.]+%  ", section, re.MULTILINE)
    assert "calibration: test figures: half the peak in every GEMM" in section


def test_without_a_calibration_the_plan_shows_the_roofline_as_the_bound(monkeypatch):
    monkeypatch.setattr("runner.step_time.device_figures._calibration", lambda *args, **kwargs: None)
    plan = plan_config(compose_config())
    section = _time_section(plan)
    assert "no calibration: only the bound" in section
    assert f"  {BOUND}{plan.time.step_s:.3g} s, MFU 100.0%" in section
    assert "predicted step" not in section and "limited by" not in section
    record = step_time_plan_record(plan)
    assert record["predicted_s"] == record["bound_s"] == plan.time.step_s
    assert record["calibration"] is None and record["terms_s"] == {} and record["limit"] is None


def test_a_named_cluster_plan_shows_the_terms_of_its_calibration_file():
    if not calibrations.cluster_file("h200").is_file():
        pytest.skip("conf/cluster/calibration/h200.json is not there yet")
    plan = plan_config(
        compose_config("model=llama_7b", "cluster=h200", "precision=bf16", "parallel=zero3", "gpus=8")
    )
    section = _time_section(plan)
    assert plan.time.terms and f"limited by {plan.time.limit}:" in section
    assert "  gemm " in section and "  dp comm " in section
    assert "calibration: calibration file conf/cluster/calibration/h200.json" in section
    assert BOUND in section


def test_the_summary_record_carries_the_plans_prediction_terms_limit_and_bound(fixed_calibration):
    plan = plan_config(compose_config())
    record = step_time_plan_record(plan)
    assert record["predicted_s"] == plan.time.step_s and record["predicted_s"] > record["bound_s"]
    assert record["terms_s"] == {term.name: term.seconds for term in plan.time.terms}
    assert sum(record["terms_s"].values()) == pytest.approx(record["predicted_s"])
    assert record["limit"] == "gemm" and record["calibration"].startswith("test figures")
    assert record["predicted_is_lower_bound"] is False


def _parts(plan: Plan, term: str) -> dict[str, float]:
    found = next(t for t in plan.time.terms if t.name == term)
    return {part.name: part.seconds for part in found.parts}


def test_the_plan_lists_each_pass_over_the_gradients_under_the_term_it_costs(fixed_calibration):
    """runner/step_time/optimizer_step_passes.py: a reader sees which copies the step makes and what
    each costs; under ZeRO ladder's step has no clip pass of its own (runner/engine/lean_zero_step.py), the
    plain all-reduce keeps DeepSpeed's."""
    zero1 = plan_config(compose_config("parallel=zero1", "gpus=2"))
    ddp = plan_config(compose_config("parallel=ddp", "gpus=2"))
    section = _time_section(zero1)
    for term in ("optimizer", "zero grads"):
        parts = _parts(zero1, term)
        assert sum(parts.values()) == pytest.approx(
            next(t.seconds for t in zero1.time.terms if t.name == term)
        )
        for name in parts:
            assert re.search(rf"^    - {re.escape(name)} +[\d.e+-]+ +[\d.]+%  [\d.e+-]+ GB", section, re.M)
    optimizer = _parts(zero1, "optimizer")
    assert list(optimizer)[:2] == ["fused AdamW", "gradient norm"]
    assert "partition written as fp32 gradients" in optimizer
    assert "clip: fp32 gradients scaled" not in optimizer
    assert "clip: fp32 gradients scaled" in _parts(ddp, "optimizer")
    assert set(_parts(ddp, "grad flatten")) == {
        "gradients flattened for the all-reduce",
        "all-reduced gradients copied back",
    }


@pytest.mark.parametrize("stage", [ZeroStage.zero1, ZeroStage.zero2, ZeroStage.zero3])
def test_a_16_bit_zero_step_writes_its_fp32_gradients_once_and_scales_them_in_the_kernel(stage):
    """2 B read and 4 B written per stepped element: no 16-bit flat copy before the cast, and no
    clip pass (DeepSpeed's own step makes both; offloaded, its clip stays)."""
    common = {"precision": Precision.bf16, "dp": 2, "accum_steps": 2, "local": 1000}
    lean = {c.name: c for c in step_copies(zero_stage=stage, offload=OffloadPlacement.none, **common)}
    fp32 = lean["partition written as fp32 gradients"]
    assert (fp32.read, fp32.written) == (2 * 500, 4 * 500)
    assert not any(name.startswith("clip") for name in lean)
    offloaded = step_copies(zero_stage=stage, offload=OffloadPlacement.optimizer, **common)
    assert any(c.name.startswith("clip") for c in offloaded)


def _term(plan: Plan, name: str):
    return next(t for t in plan.time.terms if t.name == name)


@pytest.fixture
def measured_parts(monkeypatch, measured_calibration):
    """FIGURES plus a block's non-GEMM part (eager twice the compiled), its dispatch floor and the loss."""
    floor = calibrations._key(*calibrations.floor_shape(4, 4))
    record = {
        **FIGURES,
        "rest": {floor: 1e-4, "8,128,256,4,4,688": 4e-3},
        "rest_compiled": {floor: 1e-4, "8,128,256,4,4,688": 2e-3},
        "cross_entropy": {"1024,512": 1e-3},
    }
    calibration = calibrations.from_record(record, source="test figures with measured parts")
    monkeypatch.setattr("runner.step_time.device_figures._measure_here", lambda *args, **kwargs: calibration)


def test_a_compiled_run_is_predicted_from_its_compiled_block_faster_than_eager(measured_parts):
    eager = plan_config(compose_config())
    compiled = plan_config(compose_config("train.compile=true"))
    assert compiled.time.step_s < eager.time.step_s
    assert _term(compiled, "elementwise").seconds < _term(eager, "elementwise").seconds
    assert "non-GEMM part eager, recorded" in _term(eager, "elementwise").words
    assert "non-GEMM part compiled, recorded" in _term(compiled, "elementwise").words
    assert "cross-entropy recorded" in _term(eager, "elementwise").words
    assert "trivial shape" in _term(eager, "dispatch").words
    assert "non-GEMM part compiled" in _time_section(compiled)


def test_a_calibration_without_the_measured_parts_says_which_terms_it_guesses(fixed_calibration):
    plan = plan_config(compose_config("train.compile=true"))
    words = _term(plan, "elementwise").words
    assert "compiled: each op's tensors read and written once in the compute dtype" in words
    assert "the block's non-GEMM part (compiled) and the cross-entropy not measured on this device" in words
    assert "not measured at this shape" in _term(plan, "dispatch").words


def test_without_the_measured_parts_eager_is_priced_by_its_kernels_traffic_above_compiled(fixed_calibration):
    """runner/step_time/eager_traffic.py: in bf16 eager's kernels also run RMSNorm and RoPE in fp32 and
    cast back, and autograd sums the gradients; a compiled block reads and writes each op's tensors
    once in bf16."""
    eager = plan_config(compose_config("precision=bf16"))
    compiled = plan_config(compose_config("precision=bf16", "train.compile=true"))
    assert re.search(r"eager: \d+ kernels' bytes, counted", _term(eager, "elementwise").words)
    assert _term(compiled, "elementwise").seconds < _term(eager, "elementwise").seconds
    assert compiled.time.step_s < eager.time.step_s


def test_a_datasheet_cluster_whose_file_lacks_the_parts_states_it():
    if not calibrations.cluster_file("h200").is_file():
        pytest.skip("conf/cluster/calibration/h200.json is not there yet")
    plan = plan_config(compose_config("model=llama_1b", "cluster=h200", "precision=bf16", "gpus=1"))
    if calibrations.load_cluster("h200").rest:  # type: ignore[union-attr]
        pytest.skip("h200.json records the non-GEMM parts")
    assert "not measured on this device (NVIDIA H200" in _term(plan, "elementwise").words
    assert "not measured on this device" in _time_section(plan)


def test_a_rank_on_jemalloc_pays_no_page_faults_for_its_large_tensors(monkeypatch, measured_calibration):
    """runner/hardware/host_allocator.py: on the C library's malloc each micro-batch's logits (here
    1024 tokens x 65,536 = 268 MB) are fresh pages, at the page-fault rate; jemalloc hands the
    freed pages back warm, so the plan drops that term and prices the flatten at the copy rate."""
    figures = {**FIGURES, "fresh_bytes_per_s": 1e9}
    record = calibrations.from_record(figures, source="test figures")
    monkeypatch.setattr("runner.step_time.device_figures._measure_here", lambda *args, **kwargs: record)
    monkeypatch.setattr("runner.hardware.host_allocator.jemalloc_installed", lambda: True)
    overrides = ("model.vocab_size=65536", "parallel=ddp", "gpus=1")
    system = plan_config(compose_config(*overrides, "train.host_allocator=system"))
    jemalloc = plan_config(compose_config(*overrides, "train.host_allocator=auto"))
    assert "fresh memory" in [t.name for t in system.time.terms]
    assert "fresh memory" not in [t.name for t in jemalloc.time.terms]
    assert jemalloc.time.step_s < system.time.step_s


def test_the_mlp_in_pieces_is_priced_as_its_forward_once_more(fixed_calibration):
    """model.mlp_tiles=4: TiledMLP runs every block's w1, w3, w2 and SwiGLU forward again in backward;
    the step grows by exactly the ``mlp pieces`` term, at least the three GEMMs' forward FLOPs at the
    calibration's one rate (5e10 FLOP/s) and at most that and the blocks' whole memory-bound forward."""
    whole = plan_config(compose_config())
    tiled = plan_config(compose_config("model.mlp_tiles=4"))
    term = _term(tiled, "mlp pieces")
    assert "in 4 pieces (TiledMLP)" in term.words
    assert not any(t.name == "mlp pieces" for t in whole.time.terms)
    assert tiled.time.step_s - whole.time.step_s == pytest.approx(term.seconds, rel=1e-9)
    model, layout = tiled.workload.model, tiled.layout
    tokens = layout.micro_size * tiled.workload.seq_len
    gemms = model.n_layer * 3 * 2.0 * tokens * model.d_model * model.ffn_hidden / 5e10
    elementwise = _term(whole, "elementwise").seconds / 3  # forward's share: backward twice the bytes
    assert gemms * layout.accum_steps < term.seconds < (gemms + elementwise) * layout.accum_steps

#!/usr/bin/env bash
# GPU evidence in one run: the gpu-marked tests, llama_1b in bf16 under ddp/zero1/zero3 for
# 20 steps (tokens/s, MFU against the detected device's dense peak, peak memory against the
# ledger and its estimate, the held-out loss after the last step), the largest model (and its
# largest micro-batch) plan says fits on one device, run for 10 steps, the plans beside the
# measurements, and zero1 again with each block compiled. Results land in one folder (default
# gpu_check/), with a table on stdout and results.json. Every run's row has the calibrated
# step-time model's predicted step beside its measured median step and the error (summary.json
# step_time), and the table ends with the model's median and largest error over the runs.
#
#   bench/gpu_check.sh [OUT_DIR]
#
# GPU_CHECK_PARTS picks the parts (comma-separated; default: tests,layouts,largest,compiled):
# tests, layouts (ddp/zero1/zero3 and their plans), largest, compiled, and four more that
# measure speed rather than prove paths, opt-in (the default parts take about 420 s of the
# 460 s budget on one H200: docs/benchmarks.md): peer (bench/peer_gpu.py: ladder beside a plain
# PyTorch loop), calibrate (bench/calibrate_device.py: the step-time model's calibration record
# at the models' shapes, into OUT_DIR/calibration.json, and on an H200 in full mode into
# conf/cluster/calibration/h200.json too), recommend (plan=true planner.recommend=true for
# llama_7b on one device, then the recommended layout for 5 steps as run_recommended: about
# 2 minutes on an H200), zero3_micro1 (llama_7b under ZeRO-3 at micro 1) and copies
# (bench/lean_zero_step_speed.py: llama_1b's ZeRO-1 and ZeRO-3 optimizer step as DeepSpeed runs it
# beside ladder's, which skips three copies of the gradients), and timemodel: every GPU figure the
# step-time model needs in one call (GPU_CHECK_PARTS=timemodel GPU_CHECK_BUDGET_S=420: about 5
# minutes on one H200, under 7 with the install): bench/calibrate_device.py's micro-benchmarks
# (unless calibrate runs too) with ZeRO-3's hooks per tensor visited and its gather per gathered
# tensor, then a few measured steps (run_tm_*: llama_1b zero1 eager and compiled, zero3 with the
# derived persistence threshold and with every tensor persistent, llama_7b zero3 micro 1 all
# persistent; reduced mode: tiny, eager and the two zero3 runs; the eager and compiled llama_1b
# runs profile step 6, whose operator table, profile/rank0_step6_ops.txt, says where a GPU
# step's time goes kernel by kernel), and
# bench/time_model_gpu_table.py's table of them beside their predictions (time_model.txt).
#
# Without a CUDA device it runs the same steps in a reduced mode (tiny model, fp32, 3 steps)
# so the script is known to work before GPU time is spent.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-gpu_check}"
# Its runs never reuse a run directory, so an earlier check's folder would leave its old
# figures in the table: refuse it, and leave it as it is.
if [ -e "$out" ] && [ -n "$(ls -A "$out" 2>/dev/null)" ]; then
  echo "gpu_check: $out already holds an earlier check's results; give another folder" \
    "(bench/gpu_check.sh OUT_DIR) or move that one away" >&2
  exit 2
fi
# The project's .venv (make run / make test create it) unless PYTHON names another.
default_python=python3
[ -x .venv/bin/python ] && default_python=.venv/bin/python
python=${PYTHON:-$default_python}
# Before any run: a missing requirement would fail every run below, one log at a time.
if ! missing=$("$python" -c "import deepspeed, hydra, omegaconf, submitit, rich, psutil, yaml" 2>&1); then
  echo "gpu_check: $python cannot run ladder: ${missing##*$'\n'}" >&2
  echo "gpu_check: install ladder into it (pip install -e .), name another with PYTHON=, or, with no" \
    "network, carry its wheels over (scripts/offline_wheels.py)" >&2
  exit 2
fi
if [ -n "${GPU_CHECK_BUDGET_S:-}" ] && ! [[ "$GPU_CHECK_BUDGET_S" =~ ^[0-9]+$ ]]; then
  echo "gpu_check: GPU_CHECK_BUDGET_S=$GPU_CHECK_BUDGET_S is not a whole number of seconds;" \
    "give one (e.g. GPU_CHECK_BUDGET_S=460), or unset it for the default" >&2
  exit 2
fi
parts=",${GPU_CHECK_PARTS:-tests,layouts,largest,compiled},"
for part in ${GPU_CHECK_PARTS:+${GPU_CHECK_PARTS//,/ }}; do
  case "$part" in
    tests | layouts | largest | compiled | peer | calibrate | recommend | zero3_micro1 | copies | timemodel) ;;
    *)
      echo "gpu_check: GPU_CHECK_PARTS names no part '$part'; the parts are tests, layouts," \
        "largest, compiled, peer, calibrate, recommend, zero3_micro1, copies, timemodel" >&2
      exit 2
      ;;
  esac
done
wanted() { [[ "$parts" == *",$1,"* ]]; }
mkdir -p "$out"

# The CUDA device's name ("" without one): the calibrate part names the cluster file by it.
device_name=$("$python" -c "import torch; print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')")
if [ -n "$device_name" ]; then
  mode=full model=llama_1b precision=bf16 steps=20 big_steps=10 extra="data.seq_len=2048 batch.global_size=16"
  candidates="llama_70b llama_7b llama_1b"  # largest first
else
  mode=reduced model=tiny precision=fp32 steps=3 big_steps=2 extra="data.seq_len=128 batch.global_size=16"
  candidates="gpt2_124m tiny"
fi
echo "gpu_check: mode=$mode model=$model precision=$precision device=${device_name:-cpu}"
# Each run's time limit: a hung run (a collective waits 10 minutes before it gives up) costs
# its row, not the whole check. Full mode's runs take 1-2 minutes on one H100/H200-class GPU.
if [ "$mode" = full ]; then run_limit=300 plan_limit=120; else run_limit=900 plan_limit=300; fi
# The whole check's budget in seconds (GPU_CHECK_BUDGET_S; full mode: 8 minutes, less what the
# table takes): each part runs under what is left of it, and a part that would start with
# under 20 seconds left is skipped, so the table and results.json always come out, with the
# parts that did not run marked missing. The parts run in order of what they prove.
if [ "$mode" = full ]; then default_budget=460; else default_budget=3600; fi
budget=${GPU_CHECK_BUDGET_S:-$default_budget}
exec 3>&2  # the script's own stderr, for what timed says while a part's output goes to its log
# Runs a command under its time limit (or what is left of the budget, if less) and records
# its wall seconds and exit status in timings.tsv: what each part of the check costs, to size
# the next one. A part skipped for want of time is recorded with the status "skipped".
timed() {
  local name=$1 limit=$2 start=$SECONDS rc=0 left=$((budget - SECONDS))
  shift 2
  if [ "$left" -lt 20 ]; then
    echo "gpu_check: $name skipped: ${left}s of the ${budget}s budget left (GPU_CHECK_BUDGET_S)" >&3
    printf '%s\t0\tskipped\n' "$name" >> "$out/timings.tsv"
    return 124
  fi
  [ "$left" -lt "$limit" ] && limit=$left
  timeout -k 10 "$limit" "$@" || rc=$?
  printf '%s\t%s\t%s\n' "$name" "$((SECONDS - start))" "$rc" >> "$out/timings.tsv"
  return "$rc"
}
if ! "$python" -c "import pytest" 2>/dev/null; then
  echo "gpu_check: WARNING: $python has no pytest: the gpu tests will not run (pip install pytest)" >&2
fi

if wanted tests; then
  timed gpu_tests "$run_limit" "$python" -m pytest -m gpu tests/gpu -q -p no:cacheprovider 2>&1 \
    | tee "$out/pytest.log" || true
fi

base="precision=$precision data=synthetic logger=none $extra"
common="model=$model $base"
layouts="ddp zero1 zero3"
wanted layouts || layouts=""
# Each plan before its run: plan=true measures this device's calibration at the layout's shapes
# (cached in ~/.cache/ladder), and a run's launcher predicts its step from cached figures only,
# so on a fresh machine a run before its plan would have no predicted step in its row.
for parallel in $layouts; do
  # shellcheck disable=SC2086  # $common holds several overrides on purpose
  timed "plan_$parallel" "$plan_limit" "$python" train.py $common parallel=$parallel plan=true \
    "hydra.run.dir=$out/plan_$parallel" \
    > "$out/plan_$parallel.log" 2>&1 || echo "plan $parallel failed: see $out/plan_$parallel.log"
  # shellcheck disable=SC2086
  timed "run_$parallel" "$run_limit" "$python" train.py $common parallel=$parallel train.steps=$steps \
    train.eval_every=$steps train.eval_batches=1 "hydra.run.dir=$out/run_$parallel" \
    > "$out/run_$parallel.log" 2>&1 || echo "run $parallel failed: see $out/run_$parallel.log"
done
# The largest model the planner says fits on one device, under ZeRO-1, else ZeRO-3 (whose
# optimizer step copies one sub-group's gradients at a time, not the whole partition's),
# with micro-batch auto (the largest that fits); its plan, then 10 steps of it.
largest="" largest_parallel=""
wanted largest || candidates=""
for candidate in $candidates; do
  for parallel in zero1 zero3; do
    # shellcheck disable=SC2086
    timed "plan_${candidate}_$parallel" "$plan_limit" "$python" train.py $base model=$candidate \
      parallel=$parallel batch.micro_size=auto plan=true "hydra.run.dir=$out/plan_${candidate}_$parallel" \
      > "$out/plan_${candidate}_$parallel.log" 2>&1 || continue
    if "$python" -c "import json, sys; sys.exit(0 if json.load(open(sys.argv[1]))['fits'] else 1)" \
      "$out/plan_${candidate}_$parallel/plan.json"; then
      largest=$candidate largest_parallel=$parallel
      break 2
    fi
  done
done
if ! wanted largest; then
  :
elif [ -n "$largest" ]; then
  echo "gpu_check: largest model that plan says fits: $largest under $largest_parallel"
  cp -r "$out/plan_${largest}_$largest_parallel" "$out/plan_largest"
  # shellcheck disable=SC2086
  timed run_largest "$run_limit" "$python" train.py $base model=$largest parallel=$largest_parallel \
    batch.micro_size=auto train.steps=$big_steps "hydra.run.dir=$out/run_largest" \
    > "$out/run_largest.log" 2>&1 || echo "largest run failed"
else
  echo "gpu_check: no plan of $candidates says it fits, or none ran (timings.tsv)"
fi

# Then the extra: zero1 again with each block compiled (train.compile=true), for what
# torch.compile adds to the eager MFU above, and its plan (compiled blocks save less).
if wanted compiled; then
  # shellcheck disable=SC2086
  timed run_zero1_compiled "$run_limit" "$python" train.py $common parallel=zero1 train.compile=true \
    train.steps=$steps "hydra.run.dir=$out/run_zero1_compiled" \
    > "$out/run_zero1_compiled.log" 2>&1 || echo "compiled run failed"
  # shellcheck disable=SC2086
  timed plan_zero1_compiled "$plan_limit" "$python" train.py $common parallel=zero1 train.compile=true \
    plan=true "hydra.run.dir=$out/plan_zero1_compiled" \
    > "$out/plan_zero1_compiled.log" 2>&1 || echo "compiled plan failed"
fi
# Speed rather than paths: what the device reaches on the models' own GEMMs, attention, copies,
# AdamW, op dispatch and ZeRO-3 hooks, as the step-time model's calibration record; on an H200
# in full mode also as the h200 cluster's file (the record to commit is calibration.json here)...
if wanted calibrate; then
  cluster_file=()
  [ "$mode" = full ] && [[ "$device_name" == *H200* ]] && cluster_file=(--cluster h200)
  timed calibrate "$run_limit" "$python" bench/calibrate_device.py --out "$out/calibration.json" \
    "${cluster_file[@]}" > "$out/calibrate.log" 2>&1 || echo "calibration failed: see $out/calibrate.log"
fi
# ...what planner.recommend ranks fastest for llama_7b on this one device (tiny in reduced mode),
# then that layout run for 5 steps: its row shows the predicted step beside the measured one.
if wanted recommend; then
  rec_model=llama_7b
  [ "$mode" = full ] || rec_model=tiny
  # shellcheck disable=SC2086
  timed plan_recommend "$plan_limit" "$python" train.py $base model=$rec_model cluster=local gpus=1 \
    plan=true planner.recommend=true "hydra.run.dir=$out/plan_recommend" \
    > "$out/plan_recommend.log" 2>&1 || echo "recommend plan failed: see $out/plan_recommend.log"
  # The winner's overrides (model, cluster, gpus, precision, seq, global batch, layout, micro),
  # one a line, less plan=true (a plan-only winner is run anyway: its row says whether it could).
  if recommended=$("$python" -c 'import json, sys
overrides = (json.load(open(sys.argv[1])).get("recommendation") or {}).get("overrides") or []
print("\n".join(o for o in overrides if o != "plan=true"))
sys.exit(0 if overrides else 1)' "$out/plan_recommend/plan.json" 2> /dev/null); then
    mapfile -t rec_overrides <<< "$recommended"
    echo "gpu_check: recommended: ${rec_overrides[*]}"
    timed run_recommended "$run_limit" "$python" train.py "${rec_overrides[@]}" data=synthetic logger=none \
      train.steps=5 "hydra.run.dir=$out/run_recommended" \
      > "$out/run_recommended.log" 2>&1 || echo "recommended run failed: see $out/run_recommended.log"
  else
    echo "gpu_check: no recommendation in $out/plan_recommend/plan.json (see $out/plan_recommend.log)"
  fi
fi
# ...ladder beside a plain PyTorch loop of the same model and batch, eager and compiled...
if wanted peer; then
  timed peer "$run_limit" "$python" bench/peer_gpu.py --rounds 1 --out-json "$out/peer.json" \
    > "$out/peer.log" 2>&1 || echo "peer bench failed: see $out/peer.log"
fi
# ...and llama_7b under ZeRO-3 at micro 1 (what micro_size=auto picks on one H200): a step
# of many small micro-batches, each gathering and releasing every block's parameters.
if wanted zero3_micro1; then
  big=llama_7b
  [ "$mode" = full ] || big=tiny
  # shellcheck disable=SC2086
  timed run_zero3_micro1 "$run_limit" "$python" train.py $base model=$big parallel=zero3 \
    batch.micro_size=1 train.steps=5 "hydra.run.dir=$out/run_zero3_micro1" \
    > "$out/run_zero3_micro1.log" 2>&1 || echo "zero3 micro 1 run failed"
fi
# ...and ZeRO's optimizer step as DeepSpeed runs it beside ladder's (the optimizer phase of each).
if wanted copies; then
  copies_args=(--model llama_1b --stages 1,3 --micro 4 --seq 2048 --rounds 2 --steps 3)
  [ "$mode" = full ] || copies_args=(--model tiny --stages 1,3 --micro 2 --seq 64 --rounds 2 --steps 2)
  timed copies "$run_limit" env PYTHONPATH=. "$python" bench/lean_zero_step_speed.py "${copies_args[@]}" \
    > "$out/copies.log" 2>&1 || echo "copies bench failed: see $out/copies.log"
fi
# ...and every figure the step-time model needs from this device: its calibration (ZeRO-3's hook
# split included) and measured steps to set beside the model's predictions.
if wanted timemodel; then
  if ! wanted calibrate; then
    timed calibrate "$run_limit" "$python" bench/calibrate_device.py --out "$out/calibration.json" \
      > "$out/calibrate.log" 2>&1 || echo "calibration failed: see $out/calibrate.log"
  fi
  persistent="parallel.param_persistence_threshold=10000000000"  # every tensor whole: hooks, no gathers
  if [ "$mode" = full ]; then
    # name|steps|overrides
    tm_cases=(
      "eager|8|model=$model parallel=zero1 batch.micro_size=8 train.profile_step=6"
      "compiled|8|model=$model parallel=zero1 batch.micro_size=8 train.compile=true train.profile_step=6"
      "zero3|8|model=$model parallel=zero3 batch.micro_size=8"
      "zero3_persistent|8|model=$model parallel=zero3 batch.micro_size=8 $persistent"
      "zero3_7b_micro1_persistent|4|model=llama_7b parallel=zero3 batch.micro_size=1 $persistent"
    )
  else
    tm_cases=(
      "eager|3|model=$model parallel=zero1 batch.micro_size=8"
      "zero3|3|model=$model parallel=zero3 batch.micro_size=8"
      "zero3_persistent|3|model=$model parallel=zero3 batch.micro_size=8 $persistent"
    )
  fi
  for case in "${tm_cases[@]}"; do
    IFS='|' read -r name tm_steps tm_overrides <<< "$case"
    # shellcheck disable=SC2086  # the case's overrides, several on purpose
    timed "run_tm_$name" "$run_limit" "$python" train.py $base train.steps=$tm_steps $tm_overrides \
      "hydra.run.dir=$out/run_tm_$name" > "$out/run_tm_$name.log" 2>&1 || echo "time model run $name failed"
  done
  tm_cluster=()
  [ "$mode" = full ] && [[ "$device_name" == *H200* ]] && tm_cluster=(--cluster h200)
  "$python" bench/time_model_gpu_table.py --runs "$out" "${tm_cluster[@]}" --json "$out/time_model.json" \
    > "$out/time_model.txt" 2>&1 \
    || echo "time model table failed: see $out/time_model.txt"
fi

"$python" bench/gpu_check_table.py "$out" --mode "$mode"

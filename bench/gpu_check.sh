#!/usr/bin/env bash
# GPU evidence in one run: the gpu-marked tests, llama_1b in bf16 under ddp/zero1/zero3 for
# 20 steps (tokens/s, MFU against the detected device's dense peak, peak memory against the
# ledger and its estimate), the largest micro-batch plan says fits, run for 10 steps, and the
# plans beside the measurements. Results land in one folder (default gpu_check/), with a
# table on stdout and results.json.
#
#   bench/gpu_check.sh [OUT_DIR]
#
# Without a CUDA device it runs the same steps in a reduced mode (tiny model, fp32, 3 steps)
# so the script is known to work before GPU time is spent.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-gpu_check}"
mkdir -p "$out"
python=${PYTHON:-python}

if "$python" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  mode=full model=llama_1b precision=bf16 steps=20 big_steps=10 extra="data.seq_len=2048 batch.global_size=16"
else
  mode=reduced model=tiny precision=fp32 steps=3 big_steps=2 extra="batch.global_size=16"
fi
echo "gpu_check: mode=$mode model=$model precision=$precision"

"$python" -m pytest -m gpu tests/gpu -q -p no:cacheprovider 2>&1 | tee "$out/pytest.log" || true

common="model=$model precision=$precision data=synthetic logger=none $extra"
for parallel in ddp zero1 zero3; do
  # shellcheck disable=SC2086  # $common holds several overrides on purpose
  "$python" train.py $common parallel=$parallel train.steps=$steps "hydra.run.dir=$out/run_$parallel" \
    > "$out/run_$parallel.log" 2>&1 || echo "run $parallel failed: see $out/run_$parallel.log"
  # shellcheck disable=SC2086
  "$python" train.py $common parallel=$parallel plan=true "hydra.run.dir=$out/plan_$parallel" \
    > "$out/plan_$parallel.log" 2>&1 || echo "plan $parallel failed: see $out/plan_$parallel.log"
done
# The largest micro-batch the planner says fits (micro auto), over the whole batch on one device.
# shellcheck disable=SC2086
"$python" train.py $common parallel=zero1 batch.micro_size=auto train.steps=$big_steps \
  "hydra.run.dir=$out/run_largest" > "$out/run_largest.log" 2>&1 || echo "largest run failed"
# shellcheck disable=SC2086
"$python" train.py $common parallel=zero1 batch.micro_size=auto plan=true "hydra.run.dir=$out/plan_largest" \
  > "$out/plan_largest.log" 2>&1 || echo "largest plan failed"

"$python" bench/gpu_check_table.py "$out" --mode "$mode"

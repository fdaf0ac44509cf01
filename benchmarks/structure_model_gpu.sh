#!/usr/bin/env bash
# The structural model's leave-one-out validation (benchmarks/structure_model.py) on a CUDA device, in one call
# within a time budget: the device profile of the Triton kernels (synthetic shapes only), then each model's measured
# and predicted bench at n = 1..9 (B = 1: the Triton kernels take up to 16 tokens a pass) while the budget lasts, most
# informative first, then the error table. Each step's output is kept as it finishes.
#
#     benchmarks/structure_model_gpu.sh OUT_DIR [BUDGET_S] [REPS]
#
# A model is started only with MODEL_S seconds of the budget left; python3 is the machine's (PYTHON overrides).
set -u
out=${1:?usage: structure_model_gpu.sh OUT_DIR [BUDGET_S] [REPS]}
budget=${2:-420}
reps=${3:-5}
python=${PYTHON:-python3}
MODEL_S=50
models="olmoe-1b-7b qwen3-30b-a3b gpt-oss-20b heldout-3072x1536 deepseek-v2-lite mixtral-8x7b heldout-1536x512 pair"
mkdir -p "$out"
start=$(date +%s)
step() { echo "== $* ($(( $(date +%s) - start )) s)"; }
step profile
$python benchmarks/structure_model.py profile --device cuda --reps "$reps" --out "$out" || exit 1
for model in $models; do
    left=$(( budget - ($(date +%s) - start) ))
    if [ "$left" -lt "$MODEL_S" ]; then
        step "skipped $model: ${left} s of the budget left"
        continue
    fi
    step "model $model"
    timeout "$left" $python benchmarks/structure_model.py model "$model" --batches 1 --out "$out" \
        || echo "model $model failed or ran out of time"
done
step table
$python benchmarks/structure_model.py table --out "$out"
step done

#!/usr/bin/env bash
# issue 15: a plan for the q8_0 GGUF of the demo's model from ggml's own kernels at q8_0, scored against llama.cpp
set -euo pipefail
cd /work/scratch/l15
M=/work/main/.venv/bin/moespec
run() { echo "+ $*"; "$@"; }
date -u
run $M bench --model olmoe-L2-q8_0.gguf --layers 0,1 --trace trace-llama-q8_0.npz --out q8/bench-q8_0.json --plot q8/fig2-q8_0.png
run $M run --engine llama.cpp --gguf olmoe-L2-q8_0.gguf --no-throughput --out q8/verify-q8_0.json
run $M plan --bench q8/bench-q8_0.json --trace trace-llama-q8_0.npz --runs q8/verify-q8_0.json --for llama.cpp --out q8/plan-q8_0.json
sleep 1
run $M run --engine llama.cpp --gguf olmoe-L2-q8_0.gguf --plan q8/plan-q8_0.json --out q8/scored-q8_0.json
run $M score --plan q8/plan-q8_0.json --runs q8/scored-q8_0.json --json > q8/score-prediction.json || true
run $M score --plan q8/plan-q8_0.json --runs q8/scored-q8_0.json --version calibrated --json > q8/score-calibrated.json || true
date -u

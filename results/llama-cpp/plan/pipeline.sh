#!/usr/bin/env bash
# moespec on llama.cpp, the demo's model (OLMoE-1B-7B shapes, 2 layers, random weights seed 0, vocab 32768)
set -euo pipefail
M=/work/main/.venv/bin/moespec
run() { echo "+ $*"; "$@"; }
date -u
run $M run --engine llama.cpp --gguf olmoe-L2-bf16.gguf --draft-gguf olmoe-L2-q8_0.gguf --out draft-cal.json
run $M plan --bench bench.json --trace trace-llama.npz --runs verify-llama.json --draft-time draft-cal.json --for llama.cpp --out plan-draft.json
sleep 1
run $M run --engine llama.cpp --gguf olmoe-L2-bf16.gguf --draft-gguf olmoe-L2-q8_0.gguf --plan plan-draft.json --out draft-scored.json
run $M score --plan plan-draft.json --runs draft-scored.json
run $M score --plan plan-draft.json --runs draft-scored.json --version calibrated
run $M trace --gguf olmoe-L2-q8_0.gguf --text /work/shared/data/wikitext-2/wiki.test.raw --max-tokens 20000 --out trace-llama-q8_0.npz
run $M run --engine llama.cpp --gguf olmoe-L2-q8_0.gguf --out runs-q8_0.json
run $M staircase --runs runs-q8_0.json --for llama.cpp
date -u

"""The index of results/: one row per result file (one per folder of raw rounds) with its claim, the command that
made it, the commit, the machine and the date, written into results/README.md between its two index markers.

    .venv/bin/python scripts/results_index.py            # print the table
    .venv/bin/python scripts/results_index.py --write    # rewrite the table in results/README.md
    .venv/bin/python scripts/results_index.py --check    # exit 1 if a file is not indexed or the table is stale

Command, commit, machine and date come from a JSON file's `provenance` (command, git.commit, device and host,
timestamp). A file without provenance (a figure, a write-up, a score printed to a file) takes them from the file
named as its `source` below, or from what is written here. The claims are curated here: one line each."""

from __future__ import annotations

import argparse
import functools
import json
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "results"
README = RESULTS / "README.md"
START, END = "<!-- index:start -->", "<!-- index:end -->"
NO_COMMIT = "not recorded"
CPU = "this project's 2-core AMD EPYC, shared host"


@dataclass(frozen=True)
class Entry:
    claim: str
    source: str | None = None  # a file (relative to results/) whose provenance this one shares
    command: str | None = None  # where neither this file nor its source records one
    machine: str | None = None
    date: str | None = None


# Files made before provenance recorded the git commit: the commit that added each to results/ (`git log --follow
# --diff-filter=A`); the code that made it is that commit's parent, with the changes the commit brought.
ADDED_IN: dict[str, str] = {
    "sweep/presets.toml": "c64c577",
    "adaptive-draft/HISTORY.md": "40c90c3",
    "adaptive-draft/README.md": "1649112",
    "adaptive-draft/adaptive-draft-confidence-16.json": "227dc8a",
    "adaptive-draft/adaptive-draft-fixedV-16.json": "227dc8a",
    "adaptive-draft/adaptive-draft-level-48.json": "1e1eb59",
    "adaptive-draft/adaptive-draft-mean-24.json": "681c1a2",
    "adaptive-draft/adaptive-draft-median-16.json": "227dc8a",
    "adaptive-draft/adaptive-draft-optimism-16.json": "227dc8a",
    "adaptive-draft/adaptive-draft-plainpy-16.json": "227dc8a",
    "adaptive-draft/adaptive-draft-pooled-16.json": "d930c09",
    "adaptive-draft/adaptive-draft-pooled-24.json": "697b5af",
    "adaptive-draft/adaptive-draft-prior-24.json": "681c1a2",
    "adaptive-draft/adaptive-draft-prior.json": "1649112",
    "adaptive-draft/adaptive-draft.json": "1649112",
    "cpu/README.md": "2e74c87",
    "cpu/bench-olmoe-bf16-ggml.json": "2e74c87",
    "cpu/fig2-olmoe-bf16-ggml.png": "2e74c87",
    "demo-cpu.md": "06ec24f",
    "gpu-h200/run1/bench-gpt-oss-20b.json": "f3721d5",
    "gpu-h200/run1/fig2-gpt-oss-20b.png": "f3721d5",
    "gpu-h200/run1/gpu_expert_op.json": "f3721d5",
    "gpu-h200/run1/log.txt": "f3721d5",
    "gpu-h200/run2/bench-olmoe-1b-7b.json": "edf2950",
    "gpu-h200/run2/bench-qwen3-30b-a3b.json": "edf2950",
    "gpu-h200/run2/fig2-olmoe-1b-7b.png": "edf2950",
    "gpu-h200/run2/fig2-qwen3-30b-a3b.png": "edf2950",
    "gpu-h200/run2/gpu_expert_op.json": "edf2950",
    "gpu-h200/run2/log.txt": "edf2950",
    "llama-cpp/README.md": "2e74c87",
    "llama-cpp/llama-cpp-verify.json": "7875152",
    "llama-cpp/plan/README.md": "287cbec",
    "llama-cpp/plan/bench.json": "287cbec",
    "llama-cpp/plan/draft-cal.json": "287cbec",
    "llama-cpp/plan/draft-scored.json": "287cbec",
    "llama-cpp/plan/pipeline.sh": "287cbec",
    "llama-cpp/plan/plan-draft.json": "287cbec",
    "llama-cpp/plan/plan.json": "287cbec",
    "llama-cpp/plan/runs-q8_0.json": "287cbec",
    "llama-cpp/plan/score-draft-calibrated.json": "287cbec",
    "llama-cpp/plan/score-draft-prediction.json": "287cbec",
    "llama-cpp/plan/score-oracle-calibrated.json": "287cbec",
    "llama-cpp/plan/score-oracle-prediction.json": "287cbec",
    "llama-cpp/plan/scored-llama.json": "287cbec",
    "llama-cpp/plan/staircase-q8_0.json": "287cbec",
    "llama-cpp/plan/verify-llama.json": "287cbec",
    "llama-cpp/quantized/README.md": "50e9324",
    "llama-cpp/quantized/bench-q8_0.json": "50e9324",
    "llama-cpp/quantized/fig2-q8_0.png": "50e9324",
    "llama-cpp/quantized/pipeline.log": "50e9324",
    "llama-cpp/quantized/pipeline.sh": "50e9324",
    "llama-cpp/quantized/plan-q8_0.json": "50e9324",
    "llama-cpp/quantized/score-calibrated.json": "50e9324",
    "llama-cpp/quantized/score-prediction.json": "50e9324",
    "llama-cpp/quantized/scored-q8_0.json": "287cbec",
    "llama-cpp/quantized/verify-q8_0.json": "50e9324",
    "llama-cpp/speculative/README.md": "31c7ac5",
    "llama-cpp/speculative/llama-cpp-speculative.json": "31c7ac5",
}

# Files a device machine wrote: its copy of the working tree has no .git, so their provenance records no commit; the
# commit it ran is in the call's command line (longest matching folder wins).
DEVICE_COMMITS = {"structure-model/gpu-h200/": "7fd42da", "structure-model/gpu-h200/launch-bound/": "8cbb921"}

# Folders of raw rounds: indexed as one row, their files are the rounds of the file that summarises them.
FOLDERS = {
    "sweep/bench": Entry("the sweep's ten benches, one per preset and format (bench.json each)",
                         source="sweep/summary.json"),
    "llama-cpp/llama-cpp-verify-rounds": Entry(
        "every round's raw samples behind llama-cpp-verify.json (llama-bench JSONL and moespec's per-round runs)",
        source="llama-cpp/llama-cpp-verify.json"),
}


def with_console(stem: str, claim: str) -> dict[str, Entry]:
    """A result STEM.json with `claim` and the console output beside it, STEM.txt."""
    return {f"{stem}.json": Entry(claim), f"{stem}.txt": Entry(f"console output of {stem.rsplit('/', 1)[-1]}.json",
                                                             source=f"{stem}.json")}


def batch_runs(folder: str, claim: str, where: str) -> dict[str, Entry]:
    """Runs 1..5 of benchmarks/batch_pass.py in `folder`: each JSON with `claim`, its console output beside it."""
    return {**{f"{folder}/batch-pass-{i}.json": Entry(f"run {i} of 5 of benchmarks/batch_pass.py {claim}")
               for i in range(1, 6)},
            **{f"{folder}/batch-pass-{i}.txt": Entry(f"console output of run {i} {where}",
                                                     source=f"{folder}/batch-pass-{i}.json") for i in range(1, 6)}}


AD = "adaptive-draft/"
STRUCTURE_MODELS = ("olmoe-1b-7b", "qwen3-30b-a3b", "gpt-oss-20b", "deepseek-v2-lite", "mixtral-8x7b", "pair",
                    "heldout-1536x512", "heldout-3072x1536")  # benchmarks/structure_model.py MODELS
STRUCTURE_GPU = ("olmoe-1b-7b", "qwen3-30b-a3b", "gpt-oss-20b")  # measured on the H200 (gpu-h200/)
# per run of epyc-avx2/: its profile's self-check with the capped rates (median / max) and the model-kernels within
EPYC_CAPPED = {1: ("slot 9.8% / 12.6%, dedup 9.6% / 12.7%", 12), 2: ("slot 1.8% / 12.9%, dedup 4.3% / 10.2%", 13),
               3: ("slot 1.4% / 5.9%, dedup 2.0% / 8.3%", 15), 4: ("slot 1.5% / 11.0%, dedup 5.3% / 10.6%", 6),
               5: ("slot 6.2% / 17.5%, dedup 2.5% / 8.6%", 15)}
STRUCTURE_GGUF = {"q8_0": STRUCTURE_MODELS, "q4_0": ("olmoe-1b-7b", "heldout-1536x512")}  # validated GGUF formats
STRUCTURE_GGUF_B8 = ("olmoe-1b-7b", "qwen3-30b-a3b", "heldout-1536x512")  # q8_0 also at passes of 8..72 tokens
# structure-model/same-session/: (model, format folder, B) of each measured and predicted bench
SAME_SESSION = ([(m, "", 1) for m in STRUCTURE_MODELS] + [(m, "", 8) for m in ("olmoe-1b-7b", "heldout-1536x512")]
                + [(m, "q8_0/", 1) for m in STRUCTURE_MODELS] + [(m, "q4_0/", 1) for m in STRUCTURE_GGUF["q4_0"]])


# structure-model/pinned/run-N/: each run's profile (pinned to one level of the host) and its table
PINNED_RUNS = {
    1: ('bf16 profile of run 1, pinned at 34.4 GB/s (take 1; 0 of 1274 calls kept off the level, 13 '
        'dropped; ceiling 35.8 GB/s; self-check 3.4% / 5.6% slot, 3.7% / 5.7% dedup)',
        "run 1: both kernels within 10% / 20% on 7 of 8 models at the bench's ceiling per n (3 paired by "
        'call); misses: pair slot 10.2% / 13.2%; crossover within one on 7 of 8, k_hat*(a) on 7 of 7 '
        'plannable'),
    2: ('bf16 profile of run 2, pinned at 32.8 GB/s (take 1; 105 of 1274 calls kept off the level, 42 '
        'dropped; ceiling 32.9 GB/s; self-check 2.6% / 6.7% slot, 2.9% / 6.3% dedup)',
        "run 2: both kernels within 10% / 20% on 6 of 8 models at the bench's ceiling per n (4 paired by "
        'call); misses: deepseek-v2-lite slot 4.9% / 28.1%, deepseek-v2-lite dedup 4.9% / 23.5%, pair '
        'slot 7.9% / 25.3%, pair dedup 7.3% / 24.4%; crossover within one on 8 of 8, k_hat*(a) on 7 of 7 '
        'plannable'),
    3: ('bf16 profile of run 3, pinned at 56.1 GB/s (take 1; 2 of 1274 calls kept off the level, 47 '
        'dropped; ceiling 56.5 GB/s; self-check 6.7% / 16.4% slot, 12.8% / 24.8% dedup)',
        "run 3: both kernels within 10% / 20% on 1 of 8 models at the bench's ceiling per n (1 paired by "
        'call); misses: olmoe-1b-7b dedup 10.6% / 15.1%, qwen3-30b-a3b dedup 13.0% / 15.2%, gpt-oss-20b '
        'slot 5.2% / 62.4%, gpt-oss-20b dedup 8.8% / 50.3%, deepseek-v2-lite dedup 8.1% / 20.9%, '
        'mixtral-8x7b dedup 8.9% / 26.3%, heldout-1536x512 dedup 10.2% / 14.9%, heldout-3072x1536 slot '
        '11.5% / 16.7%, heldout-3072x1536 dedup 13.6% / 18.3%; crossover within one on 8 of 8, k_hat*(a) '
        'on 4 of 7 plannable'),
    4: ('bf16 profile of run 4, pinned at 32.2 GB/s (take 1; 0 of 1274 calls kept off the level, 23 '
        'dropped; ceiling 33.7 GB/s; self-check 1.5% / 7.6% slot, 2.9% / 6.4% dedup)',
        "run 4: both kernels within 10% / 20% on 8 of 8 models at the bench's ceiling per n (2 paired by "
        'call); crossover within one on 8 of 8, k_hat*(a) on 6 of 7 plannable'),
    5: ('bf16 profile of run 5, pinned at 37.1 GB/s (take 3; 1149 of 1274 calls kept off the level, 23 '
        'dropped; ceiling 51.6 GB/s; self-check 28.8% / 38.6% slot, 18.0% / 33.8% dedup)',
        "run 5: both kernels within 10% / 20% on 0 of 8 models at the bench's ceiling per n (0 paired by "
        'call); misses: olmoe-1b-7b slot 10.8% / 12.1%, olmoe-1b-7b dedup 12.9% / 15.0%, qwen3-30b-a3b '
        'slot 10.6% / 13.7%, qwen3-30b-a3b dedup 12.9% / 17.8%, gpt-oss-20b slot 12.3% / 15.3%, '
        'gpt-oss-20b dedup 13.4% / 14.6%, deepseek-v2-lite slot 11.6% / 14.7%, deepseek-v2-lite dedup '
        '13.7% / 17.5%, mixtral-8x7b dedup 12.0% / 20.7%, pair slot 30.4% / 35.0%, pair dedup 17.4% / '
        '33.5%, heldout-1536x512 slot 11.9% / 14.6%, heldout-1536x512 dedup 13.0% / 16.1%, '
        'heldout-3072x1536 slot 9.2% / 43.2%, heldout-3072x1536 dedup 10.9% / 50.4%; crossover within one'
        ' on 8 of 8, k_hat*(a) on 4 of 7 plannable'),
}


# structure-model/pinned-gguf/run-N/: ggml's pair pinned like pinned/, q8_0 at every model; q4_0 at OLMoE and
# 1536 x 512 in the runs whose profile timed it
PINNED_GGUF_RUNS = {
    1: ('q8_0 and q4_0 profile of run 1, pinned at 48.9 GB/s (take 1; 176 of 3717 calls kept off the level, 63 '
        'dropped; ceiling 57.2 GB/s; self-check q8_0 5.1% / 18.6% per-slot, 3.2% / 8.9% mul_mat_id; q4_0 0.7% / '
        '6.5%, 1.8% / 3.7%)',
        "run 1: both kernels within 10% / 20% on 0 of 10 model-formats at the bench's ceiling per n; 1 benches at"
        " the profile's level (0 of them within); crossover within one on 4 of 10, k_hat*(a) on 9 of 9 plannable"),
    2: ('q8_0 and q4_0 profile of run 2, pinned at 53.6 GB/s (take 3, flagged; 671 of 3717 calls kept off the '
        'level, 212 dropped; ceiling 51.9 GB/s; self-check q8_0 10.9% / 26.9% per-slot, 4.2% / 12.8% mul_mat_id; '
        'q4_0 7.0% / 19.9%, 1.9% / 9.7%)',
        "run 2: both kernels within 10% / 20% on 2 of 10 model-formats at the bench's ceiling per n; 0 benches at"
        " the profile's level (0 of them within); crossover within one on 2 of 10, k_hat*(a) on 9 of 9 plannable"),
    3: ('q8_0 profile of run 3, pinned at 49.6 GB/s (take 1; 8 of 1897 calls kept off the level, 79 dropped; '
        'ceiling 55.8 GB/s; self-check q8_0 6.9% / 19.6% per-slot, 6.6% / 11.4% mul_mat_id)',
        "run 3: both kernels within 10% / 20% on 2 of 8 model-formats at the bench's ceiling per n; 4 benches at "
        "the profile's level (1 of them within); crossover within one on 3 of 8, k_hat*(a) on 7 of 7 plannable"),
    4: ('q8_0 profile of run 4, pinned at 57.7 GB/s (take 3, flagged; 494 of 1897 calls kept off the level, 256 '
        'dropped; ceiling 57.7 GB/s; self-check q8_0 15.4% / 40.1% per-slot, 5.7% / 16.6% mul_mat_id)',
        "run 4: both kernels within 10% / 20% on 3 of 8 model-formats at the bench's ceiling per n; 1 benches at "
        "the profile's level (0 of them within); crossover within one on 4 of 8, k_hat*(a) on 7 of 7 plannable"),
    5: ('q8_0 profile of run 5, pinned at 33.6 GB/s (take 3, flagged; 430 of 1897 calls kept off the level, 29 '
        'dropped; ceiling 36.4 GB/s; self-check q8_0 10.6% / 14.7% per-slot, 6.4% / 14.0% mul_mat_id)',
        "run 5: both kernels within 10% / 20% on 2 of 8 model-formats at the bench's ceiling per n; 8 benches at "
        "the profile's level (2 of them within); crossover within one on 6 of 8, k_hat*(a) on 7 of 7 plannable"),
}
GGUF_Q4_RUNS = (1, 2)
# ggml's pair at q4_0 on the Xeon VM: (run, profile, table) of xeon-q4_0/, and the summary over them
XEON_Q4_RUNS = (
    ("run-1", "pinned at 33.3 GB/s, one take, flagged by its self-check (14 of 3437 calls off that level; self-check "
              "0.8% / 75.9% per-slot, 2.2% / 7.0% mul_mat_id; cache 256 MiB)",
     "16 of 16 model-kernels within 10% / 20%, and 16 of 16 predicted from the profile alone"),
    ("run-2", "pinned at 32.9 GB/s, one take, flagged by its self-check (0 of 3437 calls off that level; self-check "
              "1.9% / 70.8% per-slot, 2.9% / 8.7% mul_mat_id; cache 128 MiB)",
     "16 of 16 model-kernels within 10% / 20%, and 16 of 16 predicted from the profile alone"),
    ("run-3", "pinned at 29.2 GB/s, one take, flagged by its "
              "self-check (221 of 3437 calls off that level; "
              "self-check 25.7% / 68.4% per-slot, 11.9% / 37.3% mul_mat_id; cache 256 MiB)",
     "0 of 16 model-kernels within 10% / 20%, and 1 of 16 predicted from the profile alone"),
    ("run-4", "pinned at 29.7 GB/s, one take, flagged by its "
              "self-check (232 of 3437 calls off that level; "
              "self-check 21.4% / 75.9% per-slot, 9.8% / 27.6% mul_mat_id; cache 256 MiB)",
     "2 of 16 model-kernels within 10% / 20%, and 4 of 16 predicted from the profile alone"),
    ("run-5", "pinned at 29.8 GB/s, one take, flagged by its "
              "self-check (522 of 3437 calls off that level; "
              "self-check 29.1% / 60.5% per-slot, 15.6% / 38.8% mul_mat_id; cache 256 MiB)",
     "0 of 16 model-kernels within 10% / 20%, and 0 of 16 predicted from the profile alone"))
XEON_Q4_SUMMARY = (
    "ggml's pair at q4_0 on the Xeon VM, five runs: in median over them 2 of 16 model-kernels within 10% / 20% "
    "(Qwen3's and 1536 x 512's mul_mat_id), 34 of 80 model-kernel-runs (runs 1-2 all 32, runs 3-5 2 of 48: their profiles "
    "took the host at 28.5-29.1 GB/s and a slower loop, their benches at 30-33); crossover within one in 40 of 40 "
    "model-runs; predicted plans at the self-check's median error: k_hat*(a) within one at every a in 19 of 33 "
    "plannable model-runs, by the paper's rules 2 and 3 in 33 of 33, at most 4.7% of the speedup given up")

# the same protocol with a state probe around each bench: (run, profile, table) of xeon-q4_0-probed/
XEON_Q4_PROBED_RUNS = (
    ("run-1", "pinned at 29.1 GB/s, one take (15 of 3437 calls off that level; self-check 13.9% / 91.0% per-slot, "
              "6.9% / 21.0% mul_mat_id; cache 128 MiB); its benches probed at k = 0.93-1.07",
     "8 of 16 model-kernels within 10% / 20% at the probe's k, 5 at the profile's loop, 6 predicted from the "
     "profile alone"),
    ("run-2", "pinned at 30.5 GB/s, one take (6 of 3437 calls off that level; self-check 8.2% / 80.7% per-slot, "
              "5.6% / 12.4% mul_mat_id; cache 128 MiB); its benches probed at k = 0.97-1.12",
     "4 of 16 model-kernels within 10% / 20% at the probe's k, 6 at the profile's loop, 11 predicted from the "
     "profile alone"))
XEON_Q4_PROBED_SUMMARY = (
    "two q4_0 runs with a state probe around each bench: 12 of 32 model-kernel-runs within 10% / 20% at the probe's "
    "k, 11 at the profile's loop, 17 from the profile alone (the per-slot kernel 10-21% off in median on every model "
    "but gpt-oss); crossover within one in 16 of 16, k_hat*(a) by the paper's rules 2 and 3 in 14 of 14 plannable")
XEON_Q4_CROSS = (
    "each of the seven q4_0 profiles of xeon-q4_0/ and xeon-q4_0-probed/ against each probed run's benches "
    "(benchmarks/cross_state.py, nothing timed): 79 of 224 model-kernels within 10% / 20% at each profile's loop, 89 "
    "at the probe's k; the morning profiles 11-16 of 16 a pairing, those whose self-check missed by over 10% in "
    "median 0-8")

# the same protocol with every timed call's experts read before its flush: (run, profile, table) of *-in-place/
XEON_BF16_IN_PLACE_RUNS = (
    ("run-1", "pinned at 31.1 GB/s, one take (0 of 3094 calls off that level; self-check 5.0% / 36.5% per-slot, "
              "5.8% / 19.8% dedup; cache 128 MiB), every timed call's experts read before its flush; its benches "
              "probed at k = 0.81-1.06",
     "13 of 16 model-kernels within 10% / 20% at the probe's k (the pair 19.2% and 16.3% in median, 1536 x 512's "
     "per-slot 10.1%), 14 at the profile's loop, 14 predicted from the profile alone; crossover within one in 7 of 8, "
     "k_hat*(a) by the paper's rules 2 and 3 in 7 of 7 plannable"),
    ("run-2", "pinned at 31.8 GB/s, one take (0 of 3101 calls off that level; self-check 7.6% / 46.8% per-slot, "
              "7.4% / 8.6% dedup; cache 256 MiB), every timed call's experts read before its flush; its benches, "
              "B = 1 and B = 8, probed at k = 0.91-1.05",
     "B = 1: 14 of 16 model-kernels within 10% / 20% at the probe's k (1536 x 512's two 12-13% in median), 14 at the "
     "profile's loop, 14 from the profile alone; B = 8 (passes of 8 to 72 tokens): 14 of 16 at the probe's k (the "
     "pair's per-slot 18.4% / 33.8%, 1536 x 512's per-slot 17.4% / 17.8%), 14 at the profile's loop, 13 from the "
     "profile alone; crossover within one in 8 of 8 at B = 1 and equal in 8 of 8 at B = 8"),
    ("run-3", "pinned at 40.8 GB/s while its calls read 31.1 in median, one take (1558 of 2653 calls off that level: "
              "its wait ran out, flagged; self-check 8.5% / 50.9% per-slot, 8.6% / 30.4% dedup; cache 32 MiB), every "
              "timed call's experts read before its flush; its benches, B = 1 and B = 8, probed at k = 1.03-1.24",
     "B = 1: 12 of 16 model-kernels within 10% / 20% at the probe's k (the pair 50-54% fast, Qwen3's and 1536 x "
     "512's per-slot 13-15% in median), 13 at the profile's loop, 12 from the profile alone; B = 8: 10 of 16, 10 and "
     "9; crossover within one in 7 of 8 at B = 1 and equal in 7 of 8 at B = 8 (the pair's)"),
    ("run-4", "pinned at 30.2 GB/s, one take (7 of 3101 calls off that level; self-check 7.7% / 42.9% per-slot, "
              "7.6% / 13.1% dedup; cache 256 MiB), every timed call's experts read before its flush; its benches, "
              "B = 1 and B = 8, probed at k = 0.79-1.00",
     "B = 1: 12 of 16 model-kernels within 10% / 20% at the probe's k (the pair 55% slow: its profile's 26 us a "
     "token; Qwen3's per-slot 10.3%, 1536 x 512's dedup 12.2% in median), 11 at the profile's loop, 12 from the "
     "profile alone; B = 8: 13 of 16 (the pair 2-5x slow, 1536 x 512's per-slot 11.0%), 11 and 12; crossover within "
     "one in 8 of 8 at B = 1 and equal in 8 of 8 at B = 8"),
    ("run-5", "pinned at 34.6 GB/s, one take (39 of 3101 calls off that level; self-check 4.8% / 47.1% per-slot, "
              "2.9% / 5.3% dedup; cache 256 MiB), every timed call's experts read before its flush; its benches, "
              "B = 1 and B = 8, probed at k = 0.93-1.07",
     "B = 1: 16 of 16 model-kernels within 10% / 20% at the probe's k, at the profile's loop and from the profile "
     "alone; B = 8: 14 of 16 (the pair's per-slot 35.6% / 47.6%, 1536 x 512's per-slot 14.4% / 21.1%), 13 and 13; "
     "crossover within one in 8 of 8 at B = 1 and equal in 8 of 8 at B = 8"))
XEON_Q4_IN_PLACE_RUNS = (
    ("run-1", "pinned at 30.0 GB/s, one take (238 of 3437 calls off that level: its wait ran out; self-check 5.8% / "
              "51.6% per-slot, 2.5% / 4.9% mul_mat_id; cache 64 MiB), every timed call's experts read before its "
              "flush; its benches probed at k = 0.85-1.03, Mixtral's at 0.34 before and 1.15 after",
     "12 of 16 model-kernels within 10% / 20% at the probe's k (Mixtral's two 26-27% fast on the probe taken right "
     "after a test run: 1-2% at the profile's loop; 1536 x 512 12-16%), 10 at the profile's loop, 11 predicted from "
     "the profile alone"),
    ("run-2", "pinned at 30.6 GB/s, one take (60 of 3437 calls off that level; self-check 3.5% / 57.4% per-slot, "
              "1.7% / 8.2% mul_mat_id; cache 256 MiB), every timed call's experts read before its flush; its benches "
              "probed at k = 0.88-0.97",
     "14 of 16 model-kernels within 10% / 20% at the probe's k (the pair 17.5% and 15.1% in median), 13 at the "
     "profile's loop, 13 predicted from the profile alone; crossover within one in 8 of 8, k_hat*(a) by the paper's "
     "rules 2 and 3 in 7 of 7 plannable"),
    ("run-3", "pinned at 34.1 GB/s, one take (402 of 3437 calls off that level: its wait ran out; self-check 3.6% / "
              "59.7% per-slot, 4.0% / 9.0% mul_mat_id; cache 256 MiB), every timed call's experts read before its "
              "flush; its benches probed at k = 0.89-1.02",
     "16 of 16 model-kernels within 10% / 20% at the probe's k, at the profile's loop and from the profile alone"),
    ("run-4", "pinned at 30.0 GB/s, one take (23 of 3437 calls off that level; self-check 4.5% / 61.7% per-slot, "
              "1.8% / 7.5% mul_mat_id; cache 256 MiB), every timed call's experts read before its flush; its benches "
              "probed at k = 0.95-1.07",
     "15 of 16 model-kernels within 10% / 20% at the probe's k (the pair's mul_mat_id 12.2% / 17.1%), 15 at the "
     "profile's loop, 14 from the profile alone"),
    ("run-5", "pinned at 30.3 GB/s, one take (19 of 3437 calls off that level; self-check 4.6% / 45.3% per-slot, "
              "1.9% / 6.0% mul_mat_id; cache 42 MiB), every timed call's experts read before its flush; its benches "
              "probed at k = 0.94-1.06",
     "16 of 16 model-kernels within 10% / 20% at the probe's k, at the profile's loop and from the profile alone"))
XEON_BF16_IN_PLACE_SUMMARY = (
    "the five bf16 runs of xeon-bf16-in-place/: B = 1, in median over them 13 of 16 model-kernels within 10% / 20% "
    "(the pair's two 16-19%, 1536 x 512's per-slot 10.1%), 67 of 80 model-kernel-runs (12-16 a run); B = 8, four "
    "runs: 13 of 16 (the pair's two 27-30%, 1536 x 512's per-slot 15.9%), 51 of 64; crossover within one in 38 of 40 "
    "model-runs at B = 1; k_hat*(a) within one at every a in 21 of 35 plannable model-runs, by the paper's rules 2 and "
    "3 in 35 of 35")
XEON_Q4_IN_PLACE_SUMMARY = (
    "ggml's pair at q4_0, the five runs of xeon-q4_0-in-place/: in median over them 16 of 16 model-kernels within "
    "10% / 20% (2.1-8.6% in median, at most 15.7%), 73 of 80 model-kernel-runs; crossover within one in 40 of 40 model-runs; "
    "k_hat*(a) within one at every a in 23 of 33 plannable model-runs, by the paper's rules 2 and 3 in 32 of 33, at "
    "most 8.3% of the speedup given up (1% in median)")
PLACEMENT_Q4_SLOPES = (
    "the five q4_0 runs of xeon-q4_0-in-place/ (70 model-kernel-batches with a placement): log(predicted / "
    "measured) on log p has slope -0.31, -0.39 and -0.48 at beta 0, 0.5 and 1 (ggml's pair's errors fall as the "
    "placement rises at every power), root mean square 0.073, 0.069 and 0.067")
PLACEMENT_BF16_SLOPES = (
    "the five bf16 runs of xeon-bf16-in-place/ (126 model-kernel-batches with a placement): log(predicted / "
    "measured) on log p has slope -0.05, -0.43 and -0.81 at beta 0, 0.5 and 1 (our kernels' errors do not follow "
    "the placement; applied wholly it leaves its spread), root mean square 0.060, 0.051 and 0.063")
IDLE_MEMORY = (
    "the first cold one-token pass over ~400 MB of bf16 experts left untouched 1, 5, 15, 30 and 60 s: 27.4, 24.5, "
    "17.3, 14.6 and 13.5 GB/s in median, the same pass right after 28.9-29.3, with the weights read before the flush "
    "28.3-29.8 (benchmarks/idle_memory.py, two rounds, the Xeon VM in its evening state)")
IDLE_BEFORE = (
    "a bf16 profile of the Xeon VM that evening at 43df2ce, before timed calls read their weights first, with every "
    "call it fitted (calls): its one-token rate passes, each the first read of its weights in a round, streamed at "
    "10-18 GB/s where the check passes read 25-28; one-thread scaling 1.03x at G = 1; self-check 23.5% / 42.4% in "
    "median (per-slot / dedup)")

SIDE_AT_CEILING = "at the measured ceiling"
# the side by side of benchmarks/structure_model.py since plan_sides.side_state: the state the measured passes met
SIDE_AT_STATE = "at the ceilings the measured bench sampled per n, its experts at its placement"
SIDE_PROBED = SIDE_AT_STATE + ", its loop at the state probe's k"


def validation_folder(folder: str, runs: list[tuple[str, str, int]], profile: str,
                      consoles: bool = True, alone: bool = False, side: str = SIDE_AT_CEILING,
                      probed: bool = False) -> dict[str, Entry]:
    """The entries of one run of benchmarks/structure_model.py into `folder`: its table, held-out configs, each
    (model, format folder, B) of `runs`' measured and predicted bench (`side`: where it was predicted; `alone`: also
    the one predicted from the profile alone), each model's errors and (`consoles`) console output, and (`probed`) the
    state probe around each measured bench; `profile` says which profile predicted them."""
    kinds = {"bench": "measured", "predicted": f"predicted (bench --predict {side})",
             **({"from-profile": "predicted from the profile alone (bench --predict at its ceiling)"} if alone else {})}
    pairs = sorted({(m, sub) for m, sub, _ in runs})
    fmt = lambda sub: f" in {sub[:-1]}, ggml's pair" if sub else ""  # noqa: E731
    return {
        f"{folder}/table.md": Entry("table.json as markdown", source=f"{folder}/table.json"),
        **{f"{folder}/configs/{m}/config.json": Entry(f"the OLMoE-class config of the held-out shape {m}",
                                                      source=f"{folder}/table.json")
           for m in ("heldout-1536x512", "heldout-3072x1536")},
        **{f"{folder}/{m}/{sub}{kind}-B{b}.json": Entry(
            f"{what} bench of {m}{fmt(sub)}, MoE layer 0, "
            f"{'n = 1..9' if b == 1 else 'passes of 8 windows x n tokens'}, "
            f"{profile}") for m, sub, b in runs for kind, what in kinds.items()},
        **{f"{folder}/{m}/{sub}errors.json": Entry(
            f"{m}{fmt(sub)}: every pass measured and predicted, the error per n") for m, sub in pairs},
        **{f"{folder}/{m}/{sub}state-B{b}.json": Entry(
            f"the state probe around the measured bench of {m}{fmt(sub)} (bench_state.py): the profile's check passes "
            f"timed just before and after it, and the loop factor k each gave against the profile")
           for m, sub, b in runs if probed},
        **{f"{folder}/log-{m}{'-' + sub[:-1] if sub else ''}.txt": Entry(
            f"console output of the {m} {sub[:-1] or 'bf16'} step", source=f"{folder}/{m}/{sub}errors.json")
           for m, sub in pairs if consoles}}


def validation_run(folder: str, profile: str, table: str, runs: list[tuple[str, str, int]],
                   predicted_by: str, consoles: bool = True, alone: bool = False,
                   side: str = SIDE_AT_CEILING, probed: bool = False) -> dict[str, Entry]:
    """A run of benchmarks/structure_model.py with its own profile: the profile (its claim), the table (its claim),
    the profile's console output and validation_folder's entries (with the models' console output, `consoles`; the
    benches from the profile alone, `alone`)."""
    return {f"{folder}/device.json": Entry(profile), f"{folder}/table.json": Entry(table),
            f"{folder}/log-profile.txt": Entry("console output of moespec profile", source=f"{folder}/device.json"),
            **validation_folder(folder, runs, predicted_by, consoles, alone, side, probed)}


def summary_entries(folder: str, what: str) -> dict[str, Entry]:
    """A summary over runs (structure_model.py summary): its summary.json, the claim `what`, and the markdown of it."""
    return {f"{folder}/summary.json": Entry(what),
            f"{folder}/summary.md": Entry("summary.json as markdown", source=f"{folder}/summary.json")}


def rerun_entries(folder: str, name: str, runs: tuple[int, ...], table: str,
                  summaries: dict[str, str]) -> dict[str, Entry]:
    """A script over stored runs (benchmarks/stored_runs.py) at each value of its parameter `name`, in
    folder/NAME-VALUE/: each run's table (the claim `table`, formatted with run and value) and each value's summary
    (summaries: value -> its claim)."""
    out = {}
    for value, claim in summaries.items():
        sub = f"{folder}/{name}-{value}"
        out |= {f"{sub}/run-{r}/table.json": Entry(table.format(run=r, value=value)) for r in runs}
        out[f"{sub}/summary.json"] = Entry(claim)
        out[f"{sub}/summary.md"] = Entry("summary.json as markdown", source=f"{sub}/summary.json")
    return out


def loop_state_entries(host: str, dtype: str, what: str, runs: tuple[int, ...],
                       counts: tuple[tuple[int, int], ...]) -> dict[str, Entry]:
    """benchmarks/loop_state.py over one folder's runs at alpha 0, 0.5 and 1 (rerun_entries; counts: per alpha, the
    model-kernels within the target in median and the model-kernel-runs within)."""
    return rerun_entries(f"structure-model/loop-state/{host}", "alpha", runs,
                         f"{what}: run-{{run}}'s {dtype} benches predicted again from its profile, the loop's terms "
                         f"scaled by (C_p / C)^{{value}}", {
                             alpha: f"{what} at alpha = {alpha}: {met} of 16 model-kernels within 10% / 20% in median "
                                    f"over {len(runs)} runs, {within} of {16 * len(runs)} model-kernel-runs"
                             for alpha, (met, within) in zip(("0", "0.5", "1"), counts)})


def placement_share_entries(host: str, dtype: str, what: str, runs: tuple[int, ...], summaries: dict[str, str],
                            slopes: str) -> dict[str, Entry]:
    """benchmarks/placement_share.py over one folder's runs (rerun_entries; summaries: beta -> what that beta's
    summary claims), and its slopes.json (the claim `slopes`)."""
    folder = f"structure-model/placement-share/{host}"
    return rerun_entries(folder, "beta", runs, f"{what}: run-{{run}}'s {dtype} benches predicted again in place, each "
                                               f"expert's placement p_e raised to the power {{value}}", summaries) | {
        f"{folder}/slopes.json": Entry(slopes)}


def placed_runs(folder: str, what: str, runs: tuple[tuple[str, str, str], ...], sub: str = "",
                alone: bool = False, side: str = SIDE_AT_CEILING, probed: bool = False,
                batches: dict[str, tuple[int, ...]] | None = None) -> dict[str, Entry]:
    """validation_run of each (run, profile, table) of `runs` under `folder`: every model at B = 1, or at the batches
    `batches` names for that run (in format folder `sub`, ggml's pair), its profile `what` and the run's own, each
    expert at its placement (`alone`: with the benches from the profile alone; `side`: where the predicted bench was
    predicted)."""
    return {path: entry for run, profile, table in runs for path, entry in validation_run(
        f"{folder}/{run}", f"{what}, {profile}", table,
        [(m, sub, b) for m in STRUCTURE_MODELS for b in (batches or {}).get(run, (1,))],
        "the run's own profile, each expert at its placement, its benches pinned to its level", alone=alone,
        side=side, probed=probed).items()}


ENTRIES: dict[str, Entry] = {
    "demo-cpu.md": Entry(
        "`make demo` runs on this machine, grouped by code; the latest group is the final code's record",
        command=".venv/bin/moespec demo --out out/demo-s27-N (one folder per run; each group's command is in the file)",
        machine=CPU, date="2026-12-01 to 2026-12-08"),
    # CPU expert kernels
    "cpu/README.md": Entry("write-up of bench-olmoe-bf16-ggml.json (Table 1 with the ceiling per n)",
                           source="cpu/bench-olmoe-bf16-ggml.json"),
    "cpu/bench-olmoe-bf16-ggml.json": Entry(
        "CPU, OLMoE-1B-7B bf16: our slot and dedup kernels at 54-96% of the ceiling sampled between rounds, ggml's "
        "MUL_MAT_ID at 46-79%; r(n) = 0.90-1.01"),
    "cpu/fig2-olmoe-bf16-ggml.png": Entry("figure 2 of bench-olmoe-bf16-ggml.json (bandwidth per n against the ceiling)",
                                          source="cpu/bench-olmoe-bf16-ggml.json"),
    # contention
    "contention/README.md": Entry("write-up of contention.json",
                                  source="contention/contention.json"),
    "contention/contention.json": Entry(
        "beside one busy process the verify pass with fitted threads takes 1.7-2.0x its quiet time (2.2-3.1x on "
        "every core); beside a torch job 2.1-2.7x (2.6-5.0x); llama.cpp 1.6-2.1x and 2.0-4.4x"),
    **{f"contention/runs/run{i}.json": Entry(
        f"run {i} of 5 of benchmarks/contention.py: fitted threads beside one busy process at most 1.77-2.25x quiet "
        f"over the five, whole team 1.97-2.41x, llama.cpp 1.95-3.65x (results/contention/README.md)")
       for i in range(1, 6)},
    "contention/quiet.json": Entry(
        "on a quiet machine fitting the threads costs nothing: fitted over whole team 0.995-1.009 (paired)"),
    # structure-model: each kernel's time from its structure and a device profile, leave-one-out (issue 35)
    "structure-model/README.md": Entry("write-up: the structural model's error per held-out model and kernel, crossover "
                                       "and k_hat* from the predicted and the measured bench",
                                       source="structure-model/table.json"),
    "structure-model/device.json": Entry("the device profile (moespec profile, synthetic shapes only) every prediction "
                                         "here is made from"),
    "structure-model/table.json": Entry("median and largest relative error of the predicted expert-op time per model, "
                                        "kernel and batch; crossover and k_hat*(a) side by side"),
    "structure-model/table.md": Entry("table.json as markdown", source="structure-model/table.json"),
    **{f"structure-model/configs/{m}/config.json": Entry(f"the OLMoE-class config of the held-out shape {m}",
                                                         source="structure-model/table.json")
       for m in ("heldout-1536x512", "heldout-3072x1536")},
    **{f"structure-model/{m}/{kind}-B{b}.json": Entry(
        f"{'measured' if kind == 'bench' else 'predicted (bench --predict at the measured ceiling)'} bench of {m}, "
        f"MoE layer 0, {'n = 1..9' if b == 1 else 'passes of 8 windows x n tokens'}")
       for m in STRUCTURE_MODELS for kind in ("bench", "predicted") for b in (1, 8)},
    **{f"structure-model/{m}/errors.json": Entry(f"{m}: every pass measured and predicted, the error per n")
       for m in STRUCTURE_MODELS},
    **{f"structure-model/log-{m}.txt": Entry(f"console output of the {m} step",
                                             source=f"structure-model/{m}/errors.json") for m in STRUCTURE_MODELS},
    # the same for ggml's pair (ggml-per-slot, ggml-mul_mat_id) at the GGUF formats, n = 1..9 (and B = 8)
    **with_console("dense-paths/xeon-2core", "a 2-core Intel Xeon VM with AMX: a bf16 dense layer on oneDNN's packed "
                   "copy against the native kernel at 1-16 rows; packed faster from 4-5 rows (0.29x at 16 rows of the "
                   "LM head), so the engine packs from AMX_PACKED_ROWS = 5 there"),
    **with_console("dense-paths/xeon-2core-amx-path", "a 2-core Intel Xeon VM with AMX: the native dense kernel's AMX "
                   "path from 2 rows against its dot path and oneDNN's packed copy at 1-72 rows; packed / native "
                   "1.17-1.47 on the LM head at every row count, so the engine runs the AMX path to 256 rows"),
    **with_console("dense-paths/xeon-2core-amx-every-row", "a 2-core Intel Xeon VM with AMX: the native dense "
                   "kernel on the tiles at every row count against its dot path and oneDNN's packed copy at 1-72 rows; "
                   "packed / native 1.24-1.64 on the LM head, dot / native 1.02 at 1 row and 1.11-3.59 at 2-16"),
    **{path: entry for i in range(1, 6) for path, entry in with_console(
        f"dense-paths/epyc-zen3-lanes-{i}", f"run {i} of 5 on a 2-core Zen 3 EPYC VM (AVX2 only): the lanes path against "
        "the fma path's row blocks of 16 at 18-72 rows (0.72-0.89x their time in median over the runs) and the "
        "engine's 16-row call against the fma path").items()},
    "dense-paths/README.md": Entry("write-up of the dense-paths runs", source="dense-paths/xeon-2core-amx-every-row.json"),
    **with_console("one-token-paths/xeon-2core", "a 2-core Intel Xeon VM: one-token rows in prefetched tiles over rows "
                   "read in sequence, LM head 1.57x, expert op 1.18-1.19x; streaming read 28.7 prefetched, 25.1 not"),
    "one-token-paths/epyc-zen3.json": Entry(
        "a 2-core Zen 3 EPYC (AVX2): one-token tiles over rows, LM head 1.11x (0.96-1.32), expert op 0.95-0.96x; the "
        "kernels 25.6-28.2 GB/s against a streaming read of 38.3 plain, 30.1 prefetched (five rounds)"),
    **with_console("structure-model/stream-share", "how much of a cold one-token pass follows the streaming read: "
                   "t/b = x + s/C over calls spanning host states; ours s 0.81, ggml's q8_0 0.46"),
    **with_console("structure-model/stream-share-ab", "one profile's timings fitted with the stream's share s_G and "
                   "with s = 1: s_G's errors at or under s = 1's on every ggml bench"),
    "structure-model/device-ggml.json": Entry("the device profile of ggml's pair at q8_0 and q4_0 (moespec profile "
                                              "--dtypes q8_0,q4_0, synthetic shapes only) the GGUF predictions use"),
    **{f"structure-model/{m}/{dt}/{kind}-B1.json": Entry(
        f"{'measured' if kind == 'bench' else 'predicted (bench --predict at the measured ceiling)'} bench of {m} "
        f"in {dt}, ggml's pair, MoE layer 0, n = 1..9")
       for dt, models in STRUCTURE_GGUF.items() for m in models for kind in ("bench", "predicted")},
    **{f"structure-model/{m}/q8_0/{kind}-B8.json": Entry(
        f"{'measured' if kind == 'bench' else 'predicted (bench --predict at the measured ceiling)'} bench of {m} "
        f"in q8_0, ggml's pair, MoE layer 0, passes of 8 windows x n tokens")
       for m in STRUCTURE_GGUF_B8 for kind in ("bench", "predicted")},
    **{f"structure-model/{m}/{dt}/errors.json": Entry(f"{m} in {dt}, ggml's pair: every pass measured and predicted, "
                                                      f"the error per n")
       for dt, models in STRUCTURE_GGUF.items() for m in models},
    **{f"structure-model/log-{m}-{dt}.txt": Entry(f"console output of the {m} {dt} step",
                                                  source=f"structure-model/{m}/{dt}/errors.json")
       for dt, models in STRUCTURE_GGUF.items() for m in models},
    # the same validation with each format's profile taken in the benches' own session (same-session/)
    **{f"structure-model/same-session/{name}.json": Entry(claim) for name, claim in (
        ("device", "bf16 profile taken just before the bf16 benches beside it (ceiling 34.9 GB/s, self-check 3.5% / "
                   "9.5% slot, 3.2% / 10.7% dedup)"),
        ("device-q8_0", "q8_0 profile of ggml's pair taken just before the q8_0 benches beside it (32.7 GB/s)"),
        ("device-q4_0", "q4_0 profile of ggml's pair, taken in a faster state (49.2 GB/s) than its benches (31-34)"),
        ("table", "per model, format and kernel: median and largest error over n; dedup within 10% / 20% on 6 of 8 "
                  "bf16 models, slot on 3; crossover equal on every bf16 bench"))},
    **{f"structure-model/same-session/log-profile{sfx}.txt": Entry(
        f"console output of the {dt} profile", source=f"structure-model/same-session/device{sfx}.json")
       for sfx, dt in (("", "bf16"), ("-q8_0", "q8_0"), ("-q4_0", "q4_0"))},
    **validation_folder("structure-model/same-session", SAME_SESSION, "profile of the same session"),
    # the bf16 validation on a profile that measures the cache a per-slot re-read finds (measured-cache/)
    **validation_run(
        "structure-model/measured-cache",
        "bf16 profile, format 4: the cache a per-slot re-read finds measured at 11.5 MiB of the 32 MiB L3 "
        "(ceiling 31.4 GB/s, self-check 2.0% / 6.6% slot, 1.0% / 3.2% dedup)",
        "per model and kernel: median and largest error over n with the measured cache; both kernels within 10% / 20% "
        "on 5 of 8 models, slot median 1.3-7.1% on all",
        [run for run in SAME_SESSION if not run[1]], "the measured cache's profile"),
    # the bf16 validation again, each pass also predicted at its own round's ceiling sample (paired/)
    **validation_run(
        "structure-model/paired",
        "bf16 profile of the paired run: the cache a per-slot re-read finds 16.5 MiB of the 32 MiB L3 (ceiling 30.2 "
        "GB/s, self-check 2.5% / 10.1% slot, 4.1% / 8.2% dedup)",
        "per model and kernel: median and largest error over n, unpaired and paired by round; both kernels within 10% "
        "/ 20% on 4 of 8 models either way (not the same four); crossover equal on all 8",
        [(m, "", 1) for m in STRUCTURE_MODELS], "the paired run's profile, each round's times and ceiling sample kept"),
    # the bf16 validation with a ceiling sample after every timed call, each call paired with it (call-paired/)
    **validation_run(
        "structure-model/call-paired",
        "bf16 profile predicting the call-paired benches: the first of four taken after them that the profile check "
        "does not flag (ceiling 35.2 GB/s, 33.9 before, 35.7 after; cache 13.0 MiB; self-check 2.6% / 13.3% slot, "
        "2.6% / 9.7% dedup)",
        "paired by call: both kernels within 10% / 20% on 7 of 8 models (not the pair's dedup kernel, whose op runs "
        "at 12% of the ceiling); unpaired on 5; crossover within one on all 8, k_hat*(a) within one on 6 of 7",
        [(m, "", 1) for m in STRUCTURE_MODELS], "a ceiling sample after every timed call (bench --call-ceilings)"),
    "structure-model/call-paired/device-flagged.json": Entry(
        "the profile taken just before the call-paired benches, flagged by the profile check (56.2 GB/s during its "
        "calls, 30.9 before): its predictions are in table-flagged.md"),
    "structure-model/call-paired/table-flagged.md": Entry(
        "the call-paired benches predicted from the flagged profile: dedup 9-20% too slow in median",
        source="structure-model/call-paired/device-flagged.json"),
    "structure-model/call-paired/token-s/device.json": Entry(
        "bf16 profile with a call's fixed time per token (token_s 1.56 us; pass_s 202 us, group_s 0.36 us), taken "
        "after the call-paired benches, unflagged (32.6 GB/s; self-check 4.1% / 10.9% slot, 3.8% / 7.1% dedup)"),
    "structure-model/call-paired/token-s/table.json": Entry(
        "the call-paired benches predicted with token_s, after the fact: paired by call both kernels within 10% / 20% "
        "on 7 of 8 models (3072 x 1536's slot max 21.3%), the pair's dedup 7.0% / 16.4% where it was 20.4% / 30.2%"),
    "structure-model/call-paired/token-s/table.md": Entry("table.json as markdown",
                                                          source="structure-model/call-paired/token-s/table.json"),
    "structure-model/call-paired/token-s/log-profile.txt": Entry(
        "console output of the profile", source="structure-model/call-paired/token-s/device.json"),
    **{f"structure-model/call-paired/token-s/{m}/{name}": Entry(f"{m}: {what}, with token_s")
       for m in STRUCTURE_MODELS for name, what in (("predicted-B1.json", "the predicted bench"),
                                                    ("errors.json", "every call-paired pass and its prediction"))},
    # the final code's validation measured anew (fresh-run/)
    **validation_run(
        "structure-model/fresh-run",
        "bf16 profile of the fresh run, unflagged (30.1 GB/s; self-check 4.5% / 8.3% slot, 4.0% / 7.3% dedup), but "
        "its stream share fitted 0.03 on calls of more than one host state",
        "the final code measured anew: paired by call the target holds on gpt-oss alone (predictions 10-50% slow, "
        "per-call samples down to 16 GB/s); crossover equal on 7 of 8",
        [(m, "", 1) for m in STRUCTURE_MODELS], "the final code, measured anew"),
    # five runs, each profile and its benches pinned to one bandwidth level of the host (pinned/)
    **{key: entry for r, (profile, table) in PINNED_RUNS.items() for key, entry in validation_run(
        f"structure-model/pinned/run-{r}", profile, table, [(m, "", 1) for m in STRUCTURE_MODELS],
        f"the profile of run {r}, its benches pinned to the profile's level").items()},
    "structure-model/pinned/summary.json": Entry(
        "the five pinned runs: in median over runs every model and kernel within 10% / 20% (median / largest error "
        "over n, each n at its bench's ceiling); per run 7, 6, 1, 8, 0 of 8 models; crossover within one in 39 of "
        "40 model-runs; k_hat*(a) within one at every a in 28 of 35 plannable model-runs"),
    "structure-model/pinned/summary.md": Entry("summary.json as markdown",
                                               source="structure-model/pinned/summary.json"),
    # one pinned run on the 2-core Intel Xeon VM (xeon/), before its streaming read prefetched
    **validation_run(
        "structure-model/xeon/run-1", "bf16 profile on a 2-core Intel Xeon VM, pinned at 27.3 GB/s (take 3 of 3, all "
        "flagged: self-check 23.4% / 82.7% slot, 25.0% / 35.7% dedup; cache 256 MiB; ceiling 26.4 GB/s)",
        "the Xeon's run: every model predicted 20-27% slow in median over n (pair's dedup 7.5%), 15 of 16 model-kernels "
        "at the profile's level; crossover within one on 7 of 8; every predicted plan refused (eps 0.83 from the "
        "self-check)", [(m, "", 1) for m in STRUCTURE_MODELS], "the run's own profile, its benches pinned to its level"),
    # the same on the Xeon with its streaming read prefetching (one take of `moespec profile`; three models)
    **validation_run(
        "structure-model/xeon/ceiling-prefetch", "bf16 profile on the Xeon with the prefetching streaming read, "
        "pinned at 29.8 GB/s (one take, flagged: self-check 23.4% / 77.5% slot, 20.1% / 33.2% dedup; ceiling 32.0 "
        "GB/s)", "the Xeon with its higher ceiling: OLMoE, Qwen3 and 3072 x 1536 still predicted 16-29% slow in "
        "median over n: the ceiling was not the Xeon's miss", [(m, "", 1) for m in ("olmoe-1b-7b", "qwen3-30b-a3b",
                                                                                   "heldout-3072x1536")],
        "the run's own profile, its benches pinned to its level"),
    # the Xeon again with cold rate passes at two sizes and hot ones at two (a cold pass's first bytes apart from
    # its rate), the probe's experts of 8.1 MB; the models' console output was not kept
    **validation_run(
        "structure-model/xeon/run-2", "bf16 profile on the Xeon with cold rate passes of ~48 and ~384 MiB, pinned at "
        "36.3 GB/s (take 3 of 3, all flagged: self-check 53% per-slot at n = 9, U = 4, dedup max 14%; cache 128 MiB)",
        "the Xeon with a cold pass's first bytes fitted apart: median error over n 4-11% on 6 of 8 models (largest "
        "8-15%), the pair's per-slot 28% and 3072 x 1536 24-26% (its benches at 28 GB/s, the profile at 36); "
        "crossover within one on 7 of 8; every predicted plan refused (eps 0.53-0.54 from the self-check)",
        [(m, "", 1) for m in STRUCTURE_MODELS], "the run's own profile, its benches pinned to its level", consoles=False),
    **validation_run(
        "structure-model/xeon/run-3", "bf16 profile on the Xeon, the code of run-2, pinned at 35.2 GB/s (take 3 of 3, "
        "all flagged: self-check 36% per-slot, 20% dedup; cache 78 MiB)",
        "the Xeon's second run of the two-size fit: 7 of 8 models within 10% / 20% (median / largest error over n) on "
        "both kernels (median 2.1-9.1%, largest 7.2-15.9%), the pair's per-slot 27% / 43%; crossover within one on 7 "
        "of 8; k_hat*(a) within one at every a on 5 of 7 plannable models", [(m, "", 1) for m in STRUCTURE_MODELS],
        "the run's own profile, its benches pinned to its level"),
    **validation_run(
        "structure-model/xeon/run-4", "bf16 profile on the Xeon, the code of run-2, pinned at 35.6 GB/s (take 3 of 3, "
        "unflagged: self-check 23% per-slot, 24% dedup; cache 116 MiB)",
        "the Xeon's third run of the two-size fit: 5 of 8 models within 10% / 20% on both kernels (gpt-oss's max 42% / "
        "58% at n = 6, 3072 x 1536 12.6-14.1% median, the pair's per-slot 27%)", [(m, "", 1) for m in STRUCTURE_MODELS],
        "the run's own profile, its benches pinned to its level"),
    **validation_run(
        "structure-model/xeon/run-5", "bf16 profile on the Xeon, the code of run-2, pinned at 35.1 GB/s (take 3 of 3, "
        "all flagged: self-check 31% per-slot, 21% dedup; cache 88 MiB)",
        "the Xeon's fourth run: 4 of 8 models within 10% / 20% on both kernels, the benches of 6 of 8 models off the "
        "profile's level (22-29 GB/s)", [(m, "", 1) for m in STRUCTURE_MODELS],
        "the run's own profile, its benches pinned to its level"),
    **validation_run(
        "structure-model/xeon/run-6", "bf16 profile on the Xeon, the code of run-2, pinned at 31.6 GB/s (take 3 of 3, "
        "all flagged: self-check 33% per-slot, 19% dedup; cache 38 MiB)",
        "the Xeon's fifth run: 1 of 8 models within 10% / 20% on both kernels, the six largest predicted 7-19% slow "
        "in median",
        [(m, "", 1) for m in STRUCTURE_MODELS], "the run's own profile, its benches pinned to its level"),
    **validation_run(
        "structure-model/xeon/run-7", "bf16 profile on the Xeon with every expert weight and buffer in 2 MiB pages, "
        "pinned at 30.6 GB/s (take 3 of 3, all flagged: self-check up to 43-45%; cache 132 MiB)",
        "the Xeon's run on the final kernels (2 MiB pages): 3 of 8 models within 10% / 20% on both kernels as "
        "registered (OLMoE, DeepSeek-V2-Lite, 3072 x 1536), 5 of 8 paired by round; predicted 1.07-1.18x slow on "
        "four models, 1.00-1.03 on two, 0.84-0.88 on Mixtral; crossover within one on 7 of 8",
        [(m, "", 1) for m in STRUCTURE_MODELS], "the run's own profile, its benches pinned to its level"),
    # one pinned run on a 2-core AMD EPYC (Zen 1) with AVX2 and FMA only: the kernels' fma paths
    **validation_run(
        "structure-model/epyc-avx2/run-1", "bf16 profile on a 2-core Zen 1 AMD EPYC with AVX2 only, pinned at 23.7 "
        "GB/s (take 3 of 3, the first two flagged at 32% and 27%; the kept take's self-check 9.5% / 12.1% per-slot, "
        "7.1% / 21.6% dedup)",
        "the AVX2 EPYC's first run on the final kernels: 12 of 16 model-kernels within 10% / 20% (not gpt-oss's and "
        "Mixtral's per-slot 10.7% and 11.6%, DeepSeek-V2-Lite's and the pair's dedup 10.9% and 10.4%); crossover "
        "within one on 7 of 8, k_hat*(a) at all four acceptances on 6 of 7 plannable",
        [(m, "", 1) for m in STRUCTURE_MODELS], "the run's own profile, its benches pinned to its level"),
    **validation_run(
        "structure-model/epyc-avx2/run-2", "bf16 profile on the AVX2 EPYC, the code of run-1, pinned at 23.7 GB/s "
        "(take 1, unflagged: self-check 2.1% / 12.7% per-slot, 4.2% / 20.3% dedup)",
        "the AVX2 EPYC's second run: 10 of 16 model-kernels within 10% / 20% (not DeepSeek-V2-Lite's two, the dedup "
        "kernel of Mixtral and 3072 x 1536, the pair's per-slot); dedup predicted 2-17% slow; crossover within one on "
        "7 of 8, k_hat*(a) at all four acceptances on 5 of 7 plannable",
        [(m, "", 1) for m in STRUCTURE_MODELS], "the run's own profile, its benches pinned to its level"),
    **validation_run(
        "structure-model/epyc-avx2/run-3", "bf16 profile on the AVX2 EPYC, the code of run-1, pinned at 17.9 GB/s "
        "(take 3 of 3, all flagged: 31% of calls kept off the level, self-check 14.5% / 19.4% per-slot, 24.3% / 38.2% "
        "dedup)",
        "the AVX2 EPYC's third run: 12 of 16 model-kernels within 10% / 20% (not OLMoE's and gpt-oss's dedup, the "
        "pair's two); crossover within one on 7 of 7 timeable, k_hat*(a) at all four acceptances on 6 of 7 plannable",
        [(m, "", 1) for m in STRUCTURE_MODELS], "the run's own profile, its benches pinned to its level"),
    **validation_run(
        "structure-model/epyc-avx2/run-4", "bf16 profile on the AVX2 EPYC, the code of run-1, pinned at 15.7 GB/s "
        "(take 3 of 3, all flagged: 42% of calls kept off the level, self-check 13.1% / 19.4% per-slot, 24.8% / 41.4% "
        "dedup)",
        "the AVX2 EPYC's fourth run, its profile in a slow state of the host and 6 of 8 benches off its level (19-20 "
        "GB/s against 15.7): 1 of 16 model-kernels within 10% / 20%, every model predicted 1.2-1.4x slow; crossover "
        "within one on 7 of 8, k_hat*(a) at all four acceptances on 6 of 7 plannable",
        [(m, "", 1) for m in STRUCTURE_MODELS], "the run's own profile, its benches pinned to its level"),
    **validation_run(
        "structure-model/epyc-avx2/run-5", "bf16 profile on the AVX2 EPYC, the code of run-1, pinned at 25.0 GB/s "
        "(take 3 of 3, all flagged: self-check 21.5% / 32.7% per-slot, 26.2% / 34.1% dedup)",
        "the AVX2 EPYC's fifth run, every bench at its profile's level: 1 of 16 model-kernels within 10% / 20% (the "
        "pair's dedup), every model predicted 1.2-1.4x slow (the profile's hot rate, slower than its cold one, set "
        "every cold group's rate: capped/); crossover within one on 7 of 8, k_hat*(a) at all four acceptances on 6 of "
        "7 plannable",
        [(m, "", 1) for m in STRUCTURE_MODELS], "the run's own profile, its benches pinned to its level"),
    **validation_run(
        "structure-model/epyc-avx2/run-6", "bf16 profile on the AVX2 EPYC with the hot rate capped, pinned at 24.6 "
        "GB/s (take 1, unflagged: self-check 7.9% / 17.5% per-slot, 10.6% / 16.8% dedup)",
        "the capped model's own run on the AVX2 EPYC, every bench at its profile's level: 8 of 16 model-kernels "
        "within 10% / 20% (the rest 11-14% in median, predicted slow, the pair's dedup 13.9% / 20.0%); crossover "
        "within one on 7 of 8, k_hat*(a) at all four acceptances on 7 of 7 plannable",
        [(m, "", 1) for m in STRUCTURE_MODELS], "the run's own profile, its benches pinned to its level"),
    "structure-model/epyc-avx2/summary.json": Entry(
        "the AVX2 EPYC's five runs (run-1 to run-5) as registered: in median over runs 7 of 16 model-kernels within "
        "10% / 20% (not OLMoE's dedup, gpt-oss's, DeepSeek-V2-Lite's and Mixtral's two, 3072 x 1536's dedup, the "
        "pair's per-slot); crossover within one in 35 of 40 model-runs (the misses the pair's, too small to time), "
        "k_hat*(a) in 29 of 35 plannable"),
    "structure-model/epyc-avx2/summary.md": Entry("summary.json as markdown",
                                                  source="structure-model/epyc-avx2/summary.json"),
    # the five runs predicted again from their recorded profiles and benches with the hot rate capped (nothing timed)
    **{f"structure-model/epyc-avx2/capped/run-{r}/{name}": entry
       for r, (check, within) in EPYC_CAPPED.items() for name, entry in {
           "device.json": Entry(f"run-{r}'s recorded profile, its self-check recomputed on the capped rates: {check}"),
           "table.json": Entry(f"run-{r}'s recorded benches predicted again with the hot rate held to the cold one "
                               f"(structure_model_recorded.py): {within} of 16 model-kernels within 10% / 20%"),
           "table.md": Entry("table.json as markdown", source=f"structure-model/epyc-avx2/capped/run-{r}/table.json"),
           **{f"{m}/{f}": Entry(f"{m}: {what}, the hot rate capped") for m in STRUCTURE_MODELS
              for f, what in (("predicted-B1.json", "predicted bench"),
                              ("errors.json", "every recorded pass and its prediction"))}}.items()},
    **validation_run(
        "structure-model/epyc-avx2/run-7", "bf16 profile on the AVX2 EPYC with the hot rate capped, pinned at 20.1 "
        "GB/s (take 1, unflagged: self-check 2.7% / 10.0% per-slot, 3.5% / 6.4% dedup)",
        "the capped model's second run on the AVX2 EPYC, 5 of 8 benches at its profile's level: 14 of 16 "
        "model-kernels within 10% / 20% (not OLMoE's per-slot 10.4%, the pair's dedup 18.0% / 27.7%); crossover within "
        "one on 7 of 8, k_hat*(a) at all four acceptances on 7 of 7 plannable",
        [(m, "", 1) for m in STRUCTURE_MODELS], "the run's own profile, its benches pinned to its level"),
    "structure-model/epyc-avx2/capped/summary.json": Entry(
        "the capped model on the AVX2 EPYC, seven runs (run-1 to run-5 predicted again, run-6 and run-7 its own): in "
        "median over runs 15 of 16 model-kernels within 10% / 20%, all but the trained pair's dedup (10.7% / 16.4%); "
        "84 of 112 model-kernel-runs; crossover within one in 49 of 56 model-runs, k_hat*(a) in 48 of 49 plannable"),
    "structure-model/epyc-avx2/capped/summary.md": Entry("summary.json as markdown",
                                                         source="structure-model/epyc-avx2/capped/summary.json"),
    # the per-row time of our kernels (hot passes on ROW_SHAPES) and the hot rate for cache hits only
    **validation_run(
        "structure-model/epyc-avx2/run-8", "bf16 profile on the AVX2 EPYC with our kernels' per-row time, pinned at "
        "19.8 GB/s (take 1, unflagged: self-check 1.8% / 11.7% per-slot, 1.2% / 12.7% dedup; r(G) 1.3-4.4 ns per row "
        "and token at G = 2..16)",
        "the per-row model's first run on the AVX2 EPYC (the hot rate still a floor under the cold one): 9 of 16 "
        "model-kernels within 10% / 20%, the pair's dedup 6.4% / 15.9%; OLMoE, DeepSeek-V2-Lite, gpt-oss's dedup, "
        "1536 x 512's and the pair's per-slot predicted 5-17% slow at benches above the profile's level",
        [(m, "", 1) for m in STRUCTURE_MODELS], "the run's own profile, its benches pinned to its level"),
    **validation_run(
        "structure-model/epyc-avx2/run-9", "bf16 profile on the AVX2 EPYC, per-row time and the hot rate for hits "
        "only, pinned at 20.4 GB/s (take 1, unflagged: self-check 1.3% / 4.3% per-slot, 1.3% / 7.5% dedup)",
        "10 of 16 model-kernels within 10% / 20% (not OLMoE's two, predicted 1.02-1.25x slow at 22.7 GB/s, "
        "DeepSeek-V2-Lite's dedup 10.5%, 3072 x 1536's per-slot 10.7%, the pair's two: per-slot 24.6% slow at every n "
        "from a pass_s fitted beside a negative per-token term)",
        [(m, "", 1) for m in STRUCTURE_MODELS], "the run's own profile, its benches pinned to its level"),
    **validation_run(
        "structure-model/epyc-avx2/run-10", "bf16 profile on the AVX2 EPYC, the code of run-9, its level pinned at "
        "12.8 GB/s while its calls' streaming read was 23.3 GB/s in median (not flagged then; self-check 2.9% / 4.4% "
        "per-slot, 4.3% / 4.9% dedup)",
        "9 of 16 model-kernels within 10% / 20%: gpt-oss and Mixtral predicted 0.63-0.81x their time, OLMoE's and "
        "DeepSeek-V2-Lite's per-slot and the pair's per-slot missing by 10-15% in median",
        [(m, "", 1) for m in STRUCTURE_MODELS], "the run's own profile"),
    **validation_run(
        "structure-model/epyc-avx2/run-11", "bf16 profile on the AVX2 EPYC, per-row time, hits-only hot rate and "
        "fixed costs fitted with no term below 0, pinned at 19.9 GB/s (take 2 of 3, the first flagged: 93% of its "
        "calls off a level of 16.8 GB/s; self-check 1.8% / 5.1% per-slot, 1.4% / 5.5% dedup)",
        "the final model's run on the AVX2 EPYC: 14 of 16 model-kernels within 10% / 20%, all but the pair's "
        "per-slot (18.7% / 22.6%, predicted 1.14-1.21x slow at every n) and the pair's dedup (3.9% / 20.5%); crossover "
        "within one on 7 of 8, k_hat*(a) at all four acceptances on 7 of 7 plannable",
        [(m, "", 1) for m in STRUCTURE_MODELS], "the run's own profile, its benches pinned to its level"),
    **validation_run(
        "structure-model/epyc-avx2/run-12", "bf16 profile on the AVX2 EPYC, the per-row model of run-11 (5937832), "
        "pinned at 24.8 GB/s (take 2 of 3, the first flagged: its calls' 18.7 GB/s off a level of 23.3, self-check "
        "up to 42%)",
        "the per-row model's fifth run: 13 of 16 model-kernels within 10% / 20%, not Mixtral's two (predicted at "
        "0.57-0.69x their time: its weights read far under the ceiling's buffer) and the pair's per-slot (15.8% / "
        "21.0%)",
        [(m, "", 1) for m in STRUCTURE_MODELS], "the run's own profile, its benches pinned to its level"),
    **placed_runs("structure-model/epyc-avx2/placement", "bf16 profile on the AVX2 EPYC with placement", (
        ("run-13", "pinned at 24.8 GB/s, take 1 kept (self-check 4.2% / 12.3% per-slot, 3.9% / 8.9% dedup; the "
                   "check weights' placement 0.59-0.90)",
         "15 of 16 model-kernels within 10% / 20% (every one but the pair's per-slot at 0.3-6.3% in median, 1.1-8.0% "
         "at most), the pair's per-slot 20.0% / 27.0%"),
        ("run-14", "pinned at 25.2 GB/s, take 1 kept (self-check 1.8% / 4.1% per-slot, 1.5% / 3.2% dedup)",
         "15 of 16 model-kernels within 10% / 20% (every one but the pair's per-slot at 0.3-6.8% in median, 1.1-9.6% "
         "at most), the pair's per-slot 13.9% / 19.2%"),
        ("run-15", "pinned at 25.8 GB/s, take 2 of 3 (the first kept 11% of its calls off its level, self-check up to "
                   "63%; the second 0.9% / 3.1% per-slot, 0.8% / 1.8% dedup)",
         "15 of 16 model-kernels within 10% / 20% (every one but the pair's per-slot at 0.8-4.6% in median, at most "
         "11.7%), the pair's per-slot 19.9% / 30.0%"),
        ("run-16", "pinned at 24.2 GB/s, take 1 kept (self-check 1.5% / 3.9% per-slot, 1.8% / 2.5% dedup)",
         "16 of 16 model-kernels within 10% / 20% (0.6-7.7% in median, at most 12.5%; the pair's per-slot 5.2% / "
         "6.7%)"),
        ("run-17", "pinned at 26.3 GB/s, take 1 kept (self-check 0.7% / 2.6% per-slot, 1.1% / 3.2% dedup)",
         "14 of 16 model-kernels within 10% / 20%: not the pair's per-slot (9.5% / 15.1%) nor Mixtral's per-slot "
         "(10.1% / 12.1%, one pass measured 27% slow)"))),
    **placed_runs("structure-model/epyc-avx2/timed-call", "bf16 profile on the AVX2 EPYC, every cold call timed as "
                  "the bench times one and a hit's own group time, take 1 kept", (
        ("run-18", "pinned at 26.4 GB/s (self-check 2.1% / 3.5% per-slot, 1.2% / 3.8% dedup)",
         "15 of 16 model-kernels within 10% / 20%, not the pair's dedup (15.4% / 21.2%)"),
        ("run-19", "pinned at 25.3 GB/s (self-check 1.3% / 5.5% per-slot, 1.2% / 5.5% dedup; 1414 of 1420 cold calls "
                   "flagged contended)",
         "15 of 16 model-kernels within 10% / 20%, not the pair's dedup (15.9% / 21.6%)"),
        ("run-20", "pinned at 26.4 GB/s (self-check 2.1% / 3.5% per-slot, 0.8% / 2.6% dedup)",
         "15 of 16 model-kernels within 10% / 20%, not the pair's dedup (19.0% / 23.4%)"),
        ("run-21", "pinned at 26.1 GB/s (self-check 5.2% / 6.7% per-slot, 2.7% / 6.1% dedup)",
         "15 of 16 model-kernels within 10% / 20%, not Mixtral's per-slot (10.3% / 11.2%)"),
        ("run-22", "pinned at 24.5 GB/s (self-check 1.0% / 2.4% per-slot, 0.9% / 2.0% dedup)",
         "15 of 16 model-kernels within 10% / 20%, not the pair's dedup (15.6% / 20.5%)"))),
    "structure-model/epyc-avx2/timed-call/summary.json": Entry(
        "the model with the bench's timed call on the AVX2 EPYC, five runs (run-18 to run-22): "
        "in median over runs 15 of 16 model-kernels within 10% / 20% (0.7-7.6% in median, at most 11.9%), not the "
        "pair's dedup (15.6% / 21.2%, within in 1 of 5 runs); 75 of 80 model-kernel-runs; crossover within one in 36 "
        "of 40 model-runs, k_hat*(a) in 34 of 35 plannable"),
    "structure-model/epyc-avx2/timed-call/summary.md": Entry(
        "summary.json as markdown", source="structure-model/epyc-avx2/timed-call/summary.json"),
    **placed_runs("structure-model/epyc-zen3", "bf16 profile on the Zen 3 EPYC (AVX2), rows of 32 weights among "
                  "ROW_SHAPES", (
        ("run-23", "pinned at 26.2 GB/s, take 3 of 3 kept and flagged (94% of its calls off that level, at 40.6 GB/s "
                   "in median; self-check 4.1% / 11.6% per-slot, 3.7% / 12.8% dedup)",
         "13 of 16 model-kernels within 10% / 20%, not the pair's two (24.1% / 31.9% per-slot, 35.1% / 37.5% dedup) "
         "nor Mixtral's per-slot (10.8% / 17.7%)"),
        ("run-24", "pinned at 44.0 GB/s, take 2 of 3 (self-check 4.3% / 9.5% per-slot, 2.8% / 7.4% dedup)",
         "14 of 16 model-kernels within 10% / 20%, not the pair's two (15.0% / 22.6% per-slot, 24.8% / 31.1% dedup)"),
        ("run-25", "pinned at 37.7 GB/s, take 2 of 3 (self-check 7.6% / 20.1% per-slot, 4.1% / 10.8% dedup)",
         "14 of 16 model-kernels within 10% / 20%, not the pair's per-slot (10.2% / 14.3%) nor Mixtral's per-slot "
         "(9.4% / 25.5%)"),
        ("run-26", "pinned at 38.9 GB/s, take 2 of 3 (self-check 0.5% / 11.2% per-slot, 1.0% / 8.7% dedup)",
         "13 of 16 model-kernels within 10% / 20%, not the pair's two (8.8% / 20.5% per-slot, 10.9% / 15.4% dedup) "
         "nor Mixtral's per-slot (5.6% / 21.1%)"),
        ("run-27", "pinned at 41.0 GB/s, take 3 of 3 kept and flagged (14% of its calls off that level; self-check "
                   "4.1% / 10.6% per-slot, 1.9% / 6.2% dedup)",
         "13 of 16 model-kernels within 10% / 20%, not the pair's dedup (14.0% / 17.2%), gpt-oss's dedup (11.5% / "
         "16.1%) nor 1536 x 512's per-slot (12.2% / 14.2%)"))),
    "structure-model/epyc-zen3/summary.json": Entry(
        "the model with rows of 32 weights on the Zen 3 EPYC, five runs (run-23 to run-27): in median over runs 14 "
        "of 16 model-kernels within 10% / 20% (2.2-5.8% in median, at most 17.7%), not the pair's dedup (14.0% / "
        "17.2%) nor its per-slot (10.2% / 20.5%); 67 of 80 model-kernel-runs; crossover within one in 35 of 40 "
        "model-runs (the pair's 0 of 5), k_hat*(a) in 33 of 35 plannable"),
    "structure-model/epyc-zen3/summary.md": Entry(
        "summary.json as markdown", source="structure-model/epyc-zen3/summary.json"),
    **placed_runs("structure-model/epyc-zen3-scratch", "bf16 profile on the Zen 3 EPYC (AVX2) with the expert kernels' "
                  "scratch capped at the matrix's rows", (
        ("run-1", "pinned at 44.8 GB/s, take 3 of 3 kept and flagged (49% of its calls off that level; self-check "
                  "3.2% / 8.9% per-slot, 7.0% / 24.8% dedup)", "16 of 16 model-kernels within 10% / 20%"),
        ("run-2", "pinned at 41.2 GB/s, take 1 of 3 (self-check 2.5% / 9.2% per-slot, 2.9% / 5.3% dedup)",
         "16 of 16 model-kernels within 10% / 20%"),
        ("run-3", "pinned at 35.9 GB/s, take 2 of 3 (self-check 2.1% / 12.5% per-slot, 2.1% / 5.7% dedup)",
         "13 of 16 model-kernels within 10% / 20%, not Mixtral's per-slot (10.7% / 17.4%) nor the pair's two (12.9% / "
         "22.1% per-slot, 22.7% / 29.7% dedup)"),
        ("run-4", "pinned at 39.0 GB/s, take 3 of 3 kept and flagged (40% of its calls off that level; self-check "
                  "2.9% / 7.4% per-slot, 3.0% / 8.5% dedup)", "16 of 16 model-kernels within 10% / 20%"),
        ("run-5", "pinned at 31.9 GB/s, take 3 of 3 kept and flagged (45% of its calls off that level; self-check "
                  "2.7% / 10.0% per-slot, 3.2% / 10.3% dedup)",
         "14 of 16 model-kernels within 10% / 20%, not the pair's two (16.6% / 24.7% per-slot, 20.3% / 28.1% "
         "dedup)"))),
    "structure-model/epyc-zen3-scratch/summary.json": Entry(
        "the model on the Zen 3 EPYC with the kernels' scratch capped, five runs: in median over runs 16 of 16 "
        "model-kernels within 10% / 20% (1.7-9.6% in median, at most 16.2%; the pair 7.3% / 15.9% dedup, 9.6% / 16.2% "
        "per-slot); 75 of 80 model-kernel-runs; crossover within one in 40 of 40 model-runs (the pair's 5 of 5), "
        "k_hat*(a) in 33 of 35 plannable"),
    "structure-model/epyc-zen3-scratch/summary.md": Entry(
        "summary.json as markdown", source="structure-model/epyc-zen3-scratch/summary.json"),
    # ggml's pair at q8_0 on the Zen 3, pinned as pinned-gguf/ (five runs: each profile took three takes)
    **{key: entry for run, profile, table in (
        ("run-1", "pinned at 29.2 GB/s, take 3 of 3 kept and flagged (32% of its calls off that level; self-check "
                  "6.3% / 13.1% per-slot, 4.6% / 10.2% mul_mat_id)",
         "12 of 16 model-kernels within 10% / 20%, not Qwen3's two (10.9% / 13.7% per-slot, 12.2% / 15.2% "
         "mul_mat_id) nor the pair's (9.6% / 21.9% per-slot, 10.8% / 19.5% mul_mat_id); 6 of 8 benches at the "
         "profile's level"),
        ("run-2", "pinned at 29.0 GB/s, take 3 of 3 kept and flagged (50% of its calls off that level; self-check "
                  "3.6% / 14.0% per-slot, 3.3% / 7.8% mul_mat_id)",
         "12 of 16 model-kernels within 10% / 20%, not Mixtral's per-slot (7.9% / 22.4%), the pair's mul_mat_id "
         "(10.9% / 13.0%) nor 1536 x 512's two (14.3% / 18.3% per-slot, 11.2% / 16.0% mul_mat_id); 2 of 8 benches "
         "at the profile's level"),
        ("run-3", "pinned at 23.5 GB/s, take 3 of 3 kept and flagged (35% of its calls off that level; self-check "
                  "5.0% / 15.9% per-slot, 4.5% / 10.6% mul_mat_id)",
         "16 of 16 model-kernels within 10% / 20%; 7 of 8 benches at the profile's level"),
        ("run-4", "pinned at 23.3 GB/s, take 3 of 3 kept and flagged (54% of its calls off that level; self-check "
                  "6.2% / 13.1% per-slot, 3.5% / 9.2% mul_mat_id)",
         "14 of 16 model-kernels within 10% / 20%, not DeepSeek's two (11.4% / 17.3% per-slot, 10.3% / 13.4% "
         "mul_mat_id); 8 of 8 benches at the profile's level"),
        ("run-5", "pinned at 27.9 GB/s, take 3 of 3 kept and flagged (39% of its calls off that level; self-check "
                  "1.9% / 6.8% per-slot, 1.5% / 12.2% mul_mat_id)",
         "15 of 16 model-kernels within 10% / 20%, not OLMoE's mul_mat_id (10.1% / 14.1%); 6 of 8 benches at the "
         "profile's level"))
       for key, entry in validation_run(
           f"structure-model/epyc-zen3-gguf/{run}", f"q8_0 profile on the Zen 3 EPYC (AVX2), {profile}", table,
           [(m, "q8_0/", 1) for m in STRUCTURE_MODELS],
           "the run's own profile, its benches pinned to the profile's level").items()},
    "structure-model/epyc-zen3-gguf/summary.json": Entry(
        "ggml's pair at q8_0 on the Zen 3 EPYC, five pinned runs: in median over them 16 of 16 model-kernels within "
        "10% / 20% (2.5-8.7% in median, at most 16.7%); 69 of 80 model-kernel-runs; crossover within one in 38 of 40 "
        "model-runs, k_hat*(a) in 33 of 35 plannable"),
    "structure-model/epyc-zen3-gguf/summary.md": Entry(
        "summary.json as markdown", source="structure-model/epyc-zen3-gguf/summary.json"),
    # ggml's pair at q4_0 on the Zen 3, pinned as epyc-zen3-gguf/ with one profile take a run (run-1's console output
    # of the profile not kept)
    **{key: entry for run, profile, table in (
        ("run-1", "pinned at 26.9 GB/s, one take, flagged (35% of its calls off that level; self-check 3.0% / 7.7% "
                  "per-slot, 1.7% / 6.4% mul_mat_id)",
         "10 of 16 model-kernels within 10% / 20%, not gpt-oss's per-slot (16.4% / 18.9%), gpt-oss's mul_mat_id (16.9% "
         "/ 22.2%), DeepSeek's per-slot (14.1% / 17.8%), DeepSeek's mul_mat_id (15.5% / 18.3%), Mixtral's per-slot "
         "(13.2% / 16.3%), Mixtral's mul_mat_id (11.7% / 15.2%); 4 of 8 benches at the profile's level"),
        ("run-2", "pinned at 27.6 GB/s, one take, flagged (47% of its calls off that level; self-check 6.6% / 9.9% "
                  "per-slot, 6.1% / 8.3% mul_mat_id)",
         "13 of 16 model-kernels within 10% / 20%, not gpt-oss's per-slot (10.6% / 14.2%), gpt-oss's mul_mat_id (10.2% "
         "/ 15.1%), Mixtral's mul_mat_id (10.2% / 13.9%); 2 of 8 benches at the profile's level"),
        ("run-3", "pinned at 29.2 GB/s, one take, flagged (76% of its calls off that level; self-check 4.9% / 8.1% "
                  "per-slot, 2.8% / 8.8% mul_mat_id)",
         "10 of 16 model-kernels within 10% / 20%, not Qwen3's mul_mat_id (11.8% / 15.5%), DeepSeek's per-slot (13.1% "
         "/ 20.2%), DeepSeek's mul_mat_id (14.7% / 21.7%), Mixtral's per-slot (10.3% / 14.9%), the pair's per-slot "
         "(6.5% / 23.7%), the pair's mul_mat_id (10.7% / 29.0%); 1 of 8 benches at the profile's level"),
        ("run-4", "pinned at 24.2 GB/s, one take, flagged (45% of its calls off that level; self-check 4.6% / 8.5% "
                  "per-slot, 3.4% / 8.7% mul_mat_id)",
         "12 of 16 model-kernels within 10% / 20%, not gpt-oss's mul_mat_id (12.9% / 18.4%), DeepSeek's per-slot "
         "(13.5% / 19.4%), DeepSeek's mul_mat_id (15.0% / 19.2%), the pair's mul_mat_id (10.7% / 13.6%); 8 of 8 "
         "benches at the profile's level"),
        ("run-5", "pinned at 42.0 GB/s, one take, flagged (96% of its calls off that level; self-check 3.1% / 10.8% "
                  "per-slot, 5.6% / 11.4% mul_mat_id)",
         "14 of 16 model-kernels within 10% / 20%, not Qwen3's mul_mat_id (10.9% / 16.5%), 3072 x 1536's per-slot "
         "(12.3% / 14.9%); 0 of 8 benches at the profile's level"))
       for key, entry in validation_run(
           f"structure-model/epyc-zen3-q4_0/{run}", f"q4_0 profile on the Zen 3 EPYC (AVX2), {profile}", table,
           [(m, "q4_0/", 1) for m in STRUCTURE_MODELS],
           "the run's own profile, its benches pinned to the profile's level").items()
       if key != "structure-model/epyc-zen3-q4_0/run-1/log-profile.txt"},
    "structure-model/epyc-zen3-q4_0/summary.json": Entry(
        "ggml's pair at q4_0 on the Zen 3 EPYC, five pinned runs: in median over them 13 of 16 model-kernels within "
        "10% / 20%, not gpt-oss's mul_mat_id (10.2% / 15.1%) nor DeepSeek's two (13.1%, 14.7%); 59 of 80 "
        "model-kernel-runs; crossover within one in 25 of 40 model-runs (two measured benches within one of each "
        "other in 50 of 80 pairs of runs), k_hat*(a) in 32 of 35 plannable"),
    "structure-model/epyc-zen3-q4_0/summary.md": Entry(
        "summary.json as markdown", source="structure-model/epyc-zen3-q4_0/summary.json"),
    # today's model on the Xeon VM (AVX-512, AMX): five bf16 runs and two q4_0 runs, one profile take each, every
    # model also predicted from the profile alone
    **placed_runs("structure-model/xeon-bf16", "bf16 profile on the Xeon VM (AVX-512, AMX)", (
        ("run-1", "pinned at 34.0 GB/s, one take, flagged by its self-check (0 of 3101 calls off that level; "
                  "self-check 2.1% / 43.3% per-slot, 2.0% / 5.9% dedup; cache 240 MiB)",
         "16 of 16 model-kernels within 10% / 20%, and 16 of 16 predicted from the profile alone"),
        ("run-2", "pinned at 31.0 GB/s, one take, flagged by its self-check (0 of 3101 calls off that level; "
                  "self-check 4.8% / 48.5% per-slot, 1.9% / 5.1% dedup; cache 256 MiB)",
         "16 of 16 model-kernels within 10% / 20%, and 16 of 16 predicted from the profile alone"),
        ("run-3", "pinned at 32.7 GB/s, one take, flagged by its self-check (0 of 3094 calls off that level; "
                  "self-check 3.2% / 39.2% per-slot, 1.8% / 5.2% dedup; cache 80 MiB)",
         "16 of 16 model-kernels within 10% / 20%, and 16 of 16 predicted from the profile alone"),
        ("run-4", "pinned at 32.4 GB/s, one take, flagged by its self-check (0 of 3094 calls off that level; "
                  "self-check 1.0% / 40.5% per-slot, 1.0% / 3.5% dedup; cache 78 MiB)",
         "15 of 16 model-kernels within 10% / 20%, not the pair's per-slot (13.6% / 18.3%); 15 of 16 predicted "
         "from the profile alone"),
        ("run-5", "pinned at 34.5 GB/s, one take, flagged by its self-check (0 of 3094 calls off that level; "
                  "self-check 1.5% / 36.4% per-slot, 1.2% / 3.3% dedup; cache 48 MiB)",
         "16 of 16 model-kernels within 10% / 20%, and 16 of 16 predicted from the profile alone")), alone=True,
        side=SIDE_AT_STATE),
    "structure-model/xeon-bf16/summary.json": Entry(
        "today's model on the Xeon VM at bf16, five runs: in median over runs 16 of 16 model-kernels within 10% / 20% "
        "(0.8-8.5% in median, at most 10.7%), 79 of 80 model-kernel-runs, and 16 of 16 from the profile alone; "
        "crossover within one in 40 of 40 model-runs; k_hat*(a) at the 11 acceptances against the measured bench's "
        "op times: within one at every a in 21 of 35 plannable (22 from the profile alone), the paper's rules 2 and "
        "3 in 35 of 35 (35 of 35), the speedup given up at most 3.5%"),
    "structure-model/xeon-bf16/summary.md": Entry(
        "summary.json as markdown", source="structure-model/xeon-bf16/summary.json"),
    **placed_runs("structure-model/xeon-q4_0", "q4_0 profile on the Xeon VM (AVX-512, AMX)", XEON_Q4_RUNS, "q4_0/",
                  alone=True, side=SIDE_AT_STATE),
    **summary_entries("structure-model/xeon-q4_0", XEON_Q4_SUMMARY),
    **placed_runs("structure-model/xeon-q4_0-probed", "q4_0 profile on the Xeon VM (AVX-512, AMX)",
                  XEON_Q4_PROBED_RUNS, "q4_0/", alone=True, side=SIDE_PROBED, probed=True),
    **summary_entries("structure-model/xeon-q4_0-probed", XEON_Q4_PROBED_SUMMARY),
    **placed_runs("structure-model/xeon-bf16-probed", "bf16 profile on the Xeon VM (AVX-512, AMX)", (
        ("run-1", "pinned at 31.4 GB/s, one take (0 of 3094 calls off that level; self-check 22.7% / 46.9% per-slot, "
                  "21.2% / 44.1% dedup: flagged by its median; cache 128 MiB); its benches probed at k = 0.70-1.12, "
                  "8-26 of their calls contended, their weights' placement 0.62-0.86 in median",
         "0 of 16 model-kernels within 10% / 20% at the probe's k (25% in median), 0 at the profile's loop (31%), 1 "
         "predicted from the profile alone (15%)"),), alone=True, side=SIDE_PROBED, probed=True),
    **placed_runs("structure-model/xeon-bf16-in-place", "bf16 profile on the Xeon VM (AVX-512, AMX)",
                  XEON_BF16_IN_PLACE_RUNS, alone=True, side=SIDE_PROBED, probed=True,
                  batches={f"run-{r}": (1, 8) for r in range(2, 6)}),
    **summary_entries("structure-model/xeon-bf16-in-place", XEON_BF16_IN_PLACE_SUMMARY),
    **placed_runs("structure-model/xeon-q4_0-in-place", "q4_0 profile on the Xeon VM (AVX-512, AMX)",
                  XEON_Q4_IN_PLACE_RUNS, "q4_0/", alone=True, side=SIDE_PROBED, probed=True),
    **summary_entries("structure-model/xeon-q4_0-in-place", XEON_Q4_IN_PLACE_SUMMARY),
    **placement_share_entries(
        "xeon-q4_0-in-place", "q4_0", "the five q4_0 runs of xeon-q4_0-in-place/", tuple(range(1, 6)), {
            beta: f"the five q4_0 runs of xeon-q4_0-in-place/ at beta = {beta}: 16 of 16 model-kernels within 10% / "
                  f"20% in median over 5 runs, {within} of 80 model-kernel-runs"
            for beta, within in (("0", 74), ("0.5", 73), ("1", 73))}, PLACEMENT_Q4_SLOPES),
    **placement_share_entries(
        "xeon-bf16-in-place", "bf16", "the five bf16 runs of xeon-bf16-in-place/", tuple(range(1, 6)), {
            beta: f"the five bf16 runs of xeon-bf16-in-place/ at beta = {beta}: B = 1, {b1} of 16 model-kernels "
                  f"within 10% / 20% in median over 5 runs, {w1} of 80 model-kernel-runs; B = 8 (four runs), {b8} of "
                  f"16, {w8} of 64"
            for beta, b1, w1, b8, w8 in (("0", 14, 74, 13, 52), ("0.5", 14, 74, 13, 53), ("1", 13, 67, 13, 51))},
        PLACEMENT_BF16_SLOPES),
    **with_console("structure-model/idle-memory/idle-memory", IDLE_MEMORY),
    **with_console("structure-model/idle-memory/device-before", IDLE_BEFORE),
    "structure-model/xeon-q4_0-probed/cross/cross.json": Entry(XEON_Q4_CROSS),
    "structure-model/xeon-q4_0-probed/cross/cross.md": Entry(
        "cross.json as markdown", source="structure-model/xeon-q4_0-probed/cross/cross.json"),
    # run-8 predicted again with the rules of run-9 and run-11 (nothing timed)
    **{f"structure-model/epyc-avx2/rows/run-8/{name}": entry for name, entry in {
        "device.json": Entry("run-8's recorded profile, its self-check recomputed with the hot rate for hits only: "
                             "slot 3.8% / 12.0%, dedup 2.8% / 9.1%"),
        "table.json": Entry("run-8's recorded benches predicted again with the hot rate for hits only "
                            "(structure_model_recorded.py): 12 of 16 model-kernels within 10% / 20%"),
        "table.md": Entry("table.json as markdown", source="structure-model/epyc-avx2/rows/run-8/table.json"),
        **{f"{m}/{f}": Entry(f"{m}: {what}, the hot rate for hits only") for m in STRUCTURE_MODELS
           for f, what in (("predicted-B1.json", "predicted bench"),
                           ("errors.json", "every recorded pass and its prediction"))}}.items()},
    "structure-model/epyc-avx2/rows/summary.json": Entry(
        "the per-row model on the AVX2 EPYC, five runs (run-8 predicted again with its final rules, run-9 to run-12): "
        "in median over runs 15 of 16 model-kernels within 10% / 20%, not the pair's per-slot (15.8% / 22.6%); 58 of "
        "80 model-kernel-runs; crossover within one in 35 of 40 model-runs (the misses the pair's), k_hat*(a) in 33 "
        "of 35 plannable"),
    "structure-model/epyc-avx2/placement/summary.json": Entry(
        "the model with placement on the AVX2 EPYC, five runs (run-13 to run-17): in median over runs 15 of 16 "
        "model-kernels within 10% / 20% (0.7-5.3% in median, at most 10.0%), not the pair's per-slot (13.9% / "
        "19.2%, within in 2 of 5 runs); 76 of 80 model-kernel-runs; crossover within one in 35 of 40 model-runs (the "
        "pair's missing), k_hat*(a) in 35 of 35 plannable"),
    "structure-model/epyc-avx2/placement/summary.md": Entry(
        "summary.json as markdown", source="structure-model/epyc-avx2/placement/summary.json"),
    "structure-model/epyc-avx2/rows/summary.md": Entry("summary.json as markdown",
                                                       source="structure-model/epyc-avx2/rows/summary.json"),
    "structure-model/xeon/summary.json": Entry(
        "the Xeon's five runs of the two-size fit (run-2 to run-6): in median over runs 13 of 16 model-kernels within "
        "10% / 20% (not Qwen3's per-slot 11.1%, 3072 x 1536 12.6-14.1%, the pair's per-slot 26.6%); predictions slow "
        "in 58 of 60 model-kernel-runs of the six largest; crossover within one in 35 of 40 model-runs, k_hat*(a) in 19 "
        "of 28 plannable"),
    "structure-model/xeon/summary.md": Entry("summary.json as markdown", source="structure-model/xeon/summary.json"),
    **with_console("structure-model/xeon/stream-share", "the Xeon's stream share (stream_share.py, 150 s, the code of "
                   "run-2): the host held 28-30 GB/s, too narrow a span to tell s (correlation 0.05); the dedup "
                   "kernel's cold one-token pass 27.5-27.9 GB/s"),
    # ggml's pair in five runs pinned the same way (pinned-gguf/), and predicted again at another profile's share
    **{key: entry for r, (profile, table) in PINNED_GGUF_RUNS.items() for key, entry in validation_run(
        f"structure-model/pinned-gguf/run-{r}", profile, table,
        [(m, "q8_0/", 1) for m in STRUCTURE_MODELS]
        + [(m, "q4_0/", 1) for m in STRUCTURE_GGUF["q4_0"] if r in GGUF_Q4_RUNS],
        f"the profile of run {r}, its benches pinned to the profile's level").items()},
    "structure-model/pinned-gguf/summary.json": Entry(
        "ggml's pair in the five pinned runs, each n at its bench's ceiling with the pinned profile's s = 1: the "
        "target not met in median (q8_0 medians 3.4-29.1%; within on Qwen3's mul_mat_id, Mixtral and q4_0's 1536 x "
        "512 only); the benches met their profile's level in 14 of 44 model-runs; k_hat*(a) within one in every "
        "plannable model-run, the crossover in 19 of 40 at q8_0"),
    "structure-model/pinned-gguf/summary.md": Entry("summary.json as markdown",
                                                    source="structure-model/pinned-gguf/summary.json"),
    **{f"structure-model/pinned-gguf/share-{dt}/run-{r}/table.json": Entry(
        f"run {r}'s {dt} benches predicted again from its pinned profile at device-ggml.json's stream share "
        "(benchmarks/stream_share_pinned.py)") for dt, runs in (("q8_0", PINNED_GGUF_RUNS), ("q4_0", GGUF_Q4_RUNS))
       for r in runs},
    "structure-model/pinned-gguf/share-q8_0/summary.json": Entry(
        "q8_0 over the five runs at device-ggml.json's share (s = 0.14 at G = 1, 0 past it): median errors 1.8-20.2% "
        "where s = 1 gave 3.4-29.1%; within 10% / 20% in median on Qwen3, Mixtral and 1536 x 512 and OLMoE's "
        "mul_mat_id; gpt-oss, 3072 x 1536, the pair and DeepSeek (10.2-10.5%) still predicted slow"),
    "structure-model/pinned-gguf/share-q8_0/summary.md": Entry(
        "summary.json as markdown", source="structure-model/pinned-gguf/share-q8_0/summary.json"),
    "structure-model/pinned-gguf/share-q4_0/summary.json": Entry(
        "q4_0 over runs 1 and 2 at device-ggml.json's share (0): 1536 x 512 within target in both runs, OLMoE 9.5% / "
        "12.7% median (s = 1: 18.5% / 24.1%)"),
    "structure-model/pinned-gguf/share-q4_0/summary.md": Entry(
        "summary.json as markdown", source="structure-model/pinned-gguf/share-q4_0/summary.json"),
    # stored runs predicted again with the loop's terms scaled by (C_p / C)^alpha (benchmarks/loop_state.py)
    **{key: entry for args in (
        ("epyc-zen3-q4_0", "q4_0", "the Zen 3 EPYC's q4_0 runs", tuple(range(1, 6)), ((13, 59), (16, 65), (15, 61))),
        ("epyc-zen3-gguf", "q8_0", "the Zen 3 EPYC's q8_0 runs", tuple(range(1, 6)), ((16, 69), (16, 68), (16, 65))),
        ("epyc-zen3", "bf16", "the Zen 3 EPYC's bf16 runs", tuple(range(23, 28)), ((14, 67), (15, 68), (12, 53))),
        ("epyc-zen3-scratch", "bf16", "the Zen 3 EPYC's runs with the scratch capped", tuple(range(1, 6)),
         ((16, 75), (14, 72), (14, 71))),
        ("epyc-avx2", "bf16", "the Zen 1 EPYC's runs", tuple(range(1, 13)), ((15, 154), (15, 144), (14, 132))),
        ("pinned", "bf16", "the pinned bf16 runs (older profiles)", tuple(range(1, 6)), ((16, 58), (13, 50), (11, 47))),
        ("pinned-gguf", "q8_0", "the pinned q8_0 runs (older profiles)", tuple(range(1, 6)),
         ((3, 22), (3, 18), (2, 13))),
        ("xeon", "bf16", "the Xeon VM's runs (older profiles)", tuple(range(1, 8)), ((10, 61), (12, 64), (12, 67))),
        ("xeon-bf16", "bf16", "the Xeon VM's runs on today's model", tuple(range(1, 6)),
         ((16, 79), (16, 79), (16, 79))))
       for key, entry in loop_state_entries(*args).items()},
    # the Triton kernels on an H200 (gpu-h200/)
    "structure-model/gpu-h200/device.json": Entry(
        "profile of the Triton kernels on an H200 (device copy 4210 GB/s; cold 4.16 TB/s at G = 1, 13.7 us a call; the "
        "per-slot kernel's own rates; the cache probe's 1 MiB, which priced per-slot re-reads as cold)"),
    "structure-model/gpu-h200/log.txt": Entry("console output of the call (profile, three models, table)",
                                              source="structure-model/gpu-h200/device.json",
                                              command="benchmarks/structure_model_gpu.sh /tmp/sm 305 5"),
    "structure-model/gpu-h200/table.json": Entry(
        "H200, as run: dedup within 10% / 20% on OLMoE, Qwen3, gpt-oss; slot 4.8-13.5% median, 6.9-24.9% max; "
        "crossover 2 measured and predicted on each; the predicted benches refused by plan (stated error 53%)"),
    "structure-model/gpu-h200/table.md": Entry("table.json as markdown", source="structure-model/gpu-h200/table.json"),
    **{f"structure-model/gpu-h200/{m}/{kind}-B1.json": Entry(
        f"{'measured' if kind == 'bench' else 'predicted (bench --predict at the measured ceiling)'} bench of {m} "
        f"on the H200, Triton kernels, MoE layer 0, n = 1..9")
       for m in STRUCTURE_GPU for kind in ("bench", "predicted")},
    **{f"structure-model/gpu-h200/{m}/errors.json": Entry(f"{m} on the H200: every pass measured and predicted")
       for m in STRUCTURE_GPU},
    "structure-model/gpu-h200/l2/device.json": Entry(
        "the H200 profile with the L2's 60 MiB as the cache (the rule a GPU profile now follows) and its self-check "
        "recomputed: slot 4.1% / 18.7%, dedup 9.3% / 21.0%"),
    "structure-model/gpu-h200/l2/table.json": Entry(
        "the recorded H200 benches predicted with the L2 as the cache, after the fact: both kernels within 10% / 20% "
        "on all three, crossover and k_hat*(a) at four acceptances equal"),
    "structure-model/gpu-h200/l2/table.md": Entry("table.json as markdown",
                                                  source="structure-model/gpu-h200/l2/table.json"),
    **{f"structure-model/gpu-h200/l2/{m}/{name}": Entry(f"{m}: {what}, the L2 as the cache")
       for m in STRUCTURE_GPU for name, what in (("predicted-B1.json", "predicted bench"),
                                                 ("errors.json", "every recorded pass and its prediction"))},
    "structure-model/gpu-h200/launch-bound/log.txt": Entry(
        "the first H200 call, void: the launch lead calibrated at an idle clock spun ~6x short, so small passes "
        "measured the host's launch (OLMoE 220-350 us at n = 1..9)",
        command="benchmarks/structure_model_gpu.sh /tmp/sm 470 5", machine="cuda: NVIDIA H200, sm90, 140 GiB",
        date="2026-12-04 17:20 UTC"),
    # batch: passes of B sequences
    "batch/README.md": Entry("write-up of the four benches at batch B = 1, 2, 4, 8",
                             source="batch/bench-olmoe-bf16-B8.json"),
    **{f"batch/bench-olmoe-bf16-B{b}.json": Entry(
        f"CPU, OLMoE-1B-7B bf16 layer 0, passes of B = {b} sequences x n = 1..9 tokens: " + claim)
       for b, claim in ((1, "r(9) 0.87, u 0.48, dedup 77 GFLOP/s (10% of the matmul peak)"),
                        (2, "r(9) 0.79, u_B 0.34"), (4, "r(9) 0.63, u_B 0.20, dedup 114 GFLOP/s (14%)"),
                        (8, "dedup falls to 12.7 GB/s at 72 tokens (115 GFLOP/s, 17% of the matmul peak), r(9) "
                            "0.36, u_B 0.11"))},
    **{f"batch/log-B{b}.txt": Entry(f"console output of the B = {b} bench", source=f"batch/bench-olmoe-bf16-B{b}.json")
       for b in (1, 2, 4, 8)},
    # cluster: moespec on Ray
    "cluster/README.md": Entry("write-up: the Ray path against one process on 2 CPUs", source="cluster/ray-overhead.json"),
    "cluster/ray-overhead.json": Entry(
        "trace and reuse on a local Ray instance against one process (benchmarks/ray_overhead.py): Ray / one process "
        "0.82 for the traced documents, 0.75 for reuse, after a 2.2 s ray.init and the workers' model load"),
    "sweep/README.md": Entry("write-up: the presets' sweep, crossover and k_hat* per cell",
                             source="sweep/summary.json"),
    "sweep/summary.json": Entry("moespec sweep of the 5 presets x {bf16, q8_0} x depth {512, 4096} on a local Ray: "
                                "20 cells, 19 planned, 1 refused (qwen3 q8_0, eps 0.54)"),
    "sweep/summary.md": Entry("the sweep's table", source="sweep/summary.json"),
    "sweep/summary.html": Entry("the sweep's page", source="sweep/summary.json"),
    "sweep/presets.toml": Entry("the sweep file of the five presets x {bf16, q8_0} x depth {512, 4096}, bench and "
                                "plan (moespec sweep)"),
    # fidelity: the pre-registered chain over repeated runs
    "fidelity/README.md": Entry("write-up: the six rules held per version over 5 demo runs, median and range, and "
                                "what moves them", source="fidelity/fidelity-cpu.json"),
    "fidelity/fidelity-cpu.json": Entry(
        "the demo's chain 5 times, every version scored on both throughput rates (benchmarks/fidelity.py): rules "
        "held 5 (4-6) of 6 for the prediction, 5 (3-5) measured-time, 4 (4-5) calibrated, 5 (3-6) whole-pass"),
    "fidelity/fidelity-cpu.md": Entry("the tables benchmarks/fidelity.py printed for fidelity-cpu.json",
                                      source="fidelity/fidelity-cpu.json"),
    # batch-engine: B sequences verified in one pass
    "batch-engine/README.md": Entry("write-up: the batched pass beside llama.cpp, the batch plan scored, its fidelity",
                                    source="batch-engine/batch-pass.json"),
    "batch-engine/batch-pass.json": Entry(
        "B sequences x n tokens in one pass, B 1-8, n 1-9, each pass against the ceilings sampled around its round: "
        "moespec dedup / llama.cpp 0.59-0.98 in median over five runs (run 1 of 5); dedup roofline share 54-81%, "
        "llama.cpp's 33-80%"),
    "batch-engine/batch-pass.txt": Entry("console output of benchmarks/batch_pass.py",
                                         source="batch-engine/batch-pass.json"),
    **{f"batch-engine/batch-pass-{i}.json": Entry(f"run {i} of 5 of benchmarks/batch_pass.py (the medians over the five "
                                                  f"in batch-engine/README.md)") for i in range(2, 6)},
    **{f"batch-engine/batch-pass-{i}.txt": Entry(f"console output of run {i} of benchmarks/batch_pass.py",
                                                 source=f"batch-engine/batch-pass-{i}.json") for i in range(2, 6)},
    **batch_runs("batch-engine/xeon",
                 "on the 2-core Intel Xeon VM (dense layers on oneDNN's packed copies from 5 rows): moespec dedup / "
                 "llama.cpp 0.44-0.77 in median over the five, dedup roofline share 35-72%",
                 "on the Xeon"),
    **batch_runs("batch-engine/xeon-amx",
                 "on the Xeon with the AMX expert tiles and the blocked attention kernel: moespec dedup / llama.cpp "
                 "0.32-0.87 in median over the five, dedup roofline share 53-72%",
                 "on the Xeon with the AMX tiles"),
    **with_console("batch-engine/xeon-amx/fidelity-rounds",
                   "the batch chain five times at the paper's 11 acceptances on the Xeon with the AMX expert tiles: "
                   "k_hat within one at 10, 11, 11, 11 of 11 (B = 1, 2, 4, 8, median of the measured map; >= 9 in "
                   "every chain, both versions), crossover 5 of 5, B_stop 2 of 5 (misses at a = 0.4 only)"),
    **batch_runs("batch-engine/xeon-amx-attention",
                 "on the Xeon with attention on the AMX tiles: moespec dedup / llama.cpp 0.30-0.91 in median over the "
                 "five, dedup roofline share 59-72% (8 x 9: 87 ms, 59%)",
                 "on the Xeon with attention on the AMX tiles"),
    **with_console("batch-engine/xeon-amx-attention/fidelity-rounds",
                   "the batch chain five times at the paper's 11 acceptances, B_stop the batch from which no draft "
                   "pays: k_hat within one at 11, 11, 11, 10 of 11 (measured map) and 10, 11, 10, 9 (prediction), "
                   "crossover 5 of 5, B_stop 5 of 5 in both versions"),
    **batch_runs("batch-engine/xeon-amx-dense",
                 "on the Xeon with weights in 2 MiB pages and dense layers on the AMX tiles: moespec dedup / llama.cpp"
                 " 0.27-0.77 in median over the five, dedup roofline share 78-80% at B = 1 and 63-76% at B > 1 (8 x 9:"
                 " 86.5 ms, 63%)",
                 "on the Xeon with weights in 2 MiB pages and dense layers on the AMX tiles"),
    **batch_runs("batch-engine/xeon-amx-every-row",
                 "on the final engine (2 MiB pages, dense layers on the AMX tiles at every row count): moespec dedup /"
                 " llama.cpp 0.27-0.78 in median over the five, dedup roofline share 79-81% at B = 1 and 63-77% at B >"
                 " 1 (8 x 9: 85.9 ms, 63%)",
                 "on the final engine"),
    **batch_runs("batch-engine/epyc-avx2",
                 "on a Zen 1 EPYC with AVX2 only (compute ceiling in fp32): moespec dedup / llama.cpp 0.45-0.80 in "
                 "median over the five, dedup roofline share 58-76%",
                 "on the AVX2 EPYC"),
    **batch_runs("batch-engine/epyc-zen3",
                 "on a Zen 3 EPYC with AVX2 only (compute ceiling in fp32): moespec dedup / llama.cpp 0.60-0.95 in "
                 "median over the five, dedup roofline share 45-73%",
                 "on the Zen 3 EPYC"),
    **batch_runs("batch-engine/epyc-zen3-lanes",
                 "on the Zen 3 EPYC with the dense lanes path: moespec dedup / llama.cpp 0.54-0.94 in median over the "
                 "five, dedup roofline share 45-70%",
                 "on the Zen 3 EPYC, lanes path"),
    **with_console("batch-engine/epyc-zen3/fidelity-rounds",
                   "the batch chain five times at the paper's 11 acceptances on the Zen 3 EPYC: k_hat within one at "
                   "11, 10, 10, 10 of 11 in median (measured map) and 11, 10, 10, 9 (prediction) at B = 1, 2, 4, 8; "
                   "crossover 3 of 5 at B = 2, 5 of 5 elsewhere (measured map); B_stop 3 of 5 (measured map), 2 of 5 "
                   "(prediction)"),
    **with_console("batch-engine/epyc-zen3-lanes/fidelity-rounds",
                   "the batch chain five times at the paper's 11 acceptances on the Zen 3 EPYC with the dense lanes "
                   "path: on the plan's measured map k_hat within one at 9, 10, 11, 10 of 11 in median at B = 1, 2, 4, "
                   "8, the crossover 5 of 5 at every B, B_stop 5 of 5; the prediction's B_stop 3 of 5"),
    **with_console("batch-engine/xeon-amx-dense/fidelity-rounds",
                   "the batch chain five times at the paper's 11 acceptances with weights in 2 MiB pages and dense "
                   "layers on the AMX tiles: k_hat within one at 11, 11, 11, 10 of 11 (measured map) and 11 at every "
                   "B (prediction), crossover 5 of 5, B_stop 4 of 5 (measured map) and 5 of 5 (prediction)"),
    "batch-engine/bench-demo.json": Entry("the demo's bench (layer 7, OLMoE-1B-7B bf16) the batch plans are made with"),
    "batch-engine/runs-verify.json": Entry("verify times at B = 1, 2, 4, 8 (both kernels): V_B(1)/V_B(0) 1.31-1.53 "
                                           "at B > 1, dedup from n = 2"),
    "batch-engine/plan.json": Entry("the pre-registered batch plan: k_hat*(a, B), B_stop(0.2) = 2, B_stop(0.5) = 8"),
    "batch-engine/runs.json": Entry("the scored run at B = 1, 2, 4, 8: k_hat within one at 3-4 of 4 acceptances per "
                                    "B, B_stop within a grid step, greedy tokens exact"),
    "batch-engine/fidelity.json": Entry("the batch chain five times (benchmarks/batch_fidelity.py)"),
    **with_console("batch-engine/fidelity-rounds",
                   "the batch chain five times at the paper's 11 acceptances, one decoding round per acceptance "
                   "(benchmarks/batch_fidelity.py): k_hat within one at 9, 10, 10, 10 of 11 (B = 1, 2, 4, 8, median "
                   "of the measured map), crossover 5 of 5, B_stop 2 of 5 (misses at a = 0.4 only)"),
    "batch-engine/bench-fidelity-rounds.json": Entry("the demo's bench (out/demo-s34) fidelity-rounds.json's plans "
                                                     "are made with"),
    "batch-engine/fidelity-11.json": Entry("the batch chain five times at the paper's 11 acceptances, both versions of the "
                                           "batch map scored (benchmarks/batch_fidelity.py)"),
    "batch-engine/fidelity-11.txt": Entry("console output of benchmarks/batch_fidelity.py for fidelity-11.json",
                                          source="batch-engine/fidelity-11.json"),
    "batch-engine/bench-fidelity-11.json": Entry("the demo's bench on the 512-bit expert tiles, read by fidelity-11.json's "
                                                 "plans (moespec demo --out out/demo-s32)"),
    "batch-engine/fidelity.txt": Entry("console output of benchmarks/batch_fidelity.py",
                                       source="batch-engine/fidelity.json"),
    # GPU (H200)
    "gpu-h200/run2/bench-olmoe-1b-7b.json": Entry(
        "current H200 run: Triton kernels on OLMoE-1B-7B bf16, r(n) = 0.87-0.98 at n = 2..9, crossover n = 2"),
    "gpu-h200/run2/bench-qwen3-30b-a3b.json": Entry(
        "current H200 run: Triton kernels on Qwen3-30B-A3B bf16, r(n) = 0.79-0.89 at n = 2..9, crossover n = 2"),
    "gpu-h200/run2/fig2-olmoe-1b-7b.png": Entry("figure 2 of run2/bench-olmoe-1b-7b.json",
                                                source="gpu-h200/run2/bench-olmoe-1b-7b.json"),
    "gpu-h200/run2/fig2-qwen3-30b-a3b.png": Entry("figure 2 of run2/bench-qwen3-30b-a3b.json",
                                                  source="gpu-h200/run2/bench-qwen3-30b-a3b.json"),
    "gpu-h200/run2/gpu_expert_op.json": Entry(
        "current H200 run's summary: copy ceiling 4.17 TB/s, kernels checked on the real shapes, r(n) per model"),
    "gpu-h200/run2/log.txt": Entry("the current H200 run's whole console output",
                                   source="gpu-h200/run2/gpu_expert_op.json"),
    "gpu-h200/run1/bench-gpt-oss-20b.json": Entry(
        "H200, gpt-oss-20b bf16 (run 1's kernels, before run 2's launch lead and wider tiles; not measured in run "
        "2): r(n) = 0.93-1.10 at n = 2..9"),
    "gpu-h200/run1/fig2-gpt-oss-20b.png": Entry("figure 2 of run1/bench-gpt-oss-20b.json",
                                                source="gpu-h200/run1/bench-gpt-oss-20b.json"),
    "gpu-h200/run1/gpu_expert_op.json": Entry(
        "run 1's summary, kept for gpt-oss-20b (its OLMoE and Qwen3 rows are superseded by run2)"),
    "gpu-h200/run1/log.txt": Entry("run 1's console output, kept for gpt-oss-20b (superseded by run2 otherwise)",
                                   source="gpu-h200/run1/gpu_expert_op.json"),
    # llama.cpp: verify pass
    "llama-cpp/README.md": Entry("write-up: moespec's verify pass beside llama.cpp's, same model, same run",
                                 source="llama-cpp/llama-cpp-verify.json"),
    "llama-cpp/llama-cpp-verify.json": Entry(
        "verify pass with every logit, cold cache: moespec 0.95x llama.cpp's at n = 1 and 0.77-0.90x at n = 2..9"),
    # llama.cpp: planning llama.cpp itself
    "llama-cpp/plan/README.md": Entry("write-up: moespec planning llama.cpp itself, pre-registered and scored",
                                      source="llama-cpp/plan/plan.json"),
    "llama-cpp/plan/pipeline.sh": Entry("the commands that made the draft-GGUF and q8_0 files of this folder",
                                        source="llama-cpp/plan/draft-cal.json", command="bash pipeline.sh"),
    "llama-cpp/plan/bench.json": Entry("bench of the 2-layer demo model's bf16 GGUF, MoE layer 0 (the plan's input)"),
    "llama-cpp/plan/verify-llama.json": Entry("llama.cpp's bf16 verify pass per n: 13.4 ms at n = 1, 39.2 at n = 9"),
    "llama-cpp/plan/plan.json": Entry("the plan for llama.cpp (oracle draft), with llama.cpp's flags per acceptance"),
    "llama-cpp/plan/scored-llama.json": Entry("llama.cpp's runs under plan.json (oracle draft), pre-registered"),
    "llama-cpp/plan/score-oracle-calibrated.json": Entry(
        "calibrated plan, oracle draft: 3 of 4 applicable rules hold (loss at k_hat 9.6% fails)",
        source="llama-cpp/plan/scored-llama.json",
        command="moespec score --plan plan.json --runs scored-llama.json --version calibrated"),
    "llama-cpp/plan/score-oracle-prediction.json": Entry(
        "prediction (22), oracle draft: 0 of 4 rules hold (llama.cpp's dense part grows with n, (22) leaves it out)",
        source="llama-cpp/plan/scored-llama.json",
        command="moespec score --plan plan.json --runs scored-llama.json"),
    "llama-cpp/plan/draft-cal.json": Entry("the q8_0 draft GGUF's calibration run (acceptance 0.90-0.97, 12-14 ms "
                                           "a drafted token)"),
    "llama-cpp/plan/plan-draft.json": Entry("the plan with the real q8_0 draft: k = 0 below a = 0.993"),
    "llama-cpp/plan/draft-scored.json": Entry("llama.cpp's runs under plan-draft.json: plain decoding is best"),
    "llama-cpp/plan/score-draft-calibrated.json": Entry(
        "calibrated plan, q8_0 draft: all 4 applicable rules hold", source="llama-cpp/plan/draft-scored.json",
        command="moespec score --plan plan-draft.json --runs draft-scored.json --version calibrated"),
    "llama-cpp/plan/score-draft-prediction.json": Entry(
        "prediction (22), q8_0 draft: 1 of 4 rules holds", source="llama-cpp/plan/draft-scored.json",
        command="moespec score --plan plan-draft.json --runs draft-scored.json"),
    "llama-cpp/plan/runs-q8_0.json": Entry("llama.cpp's q8_0 verify pass per n and step times (staircase input)"),
    "llama-cpp/plan/staircase-q8_0.json": Entry(
        "the q8_0 model's best k per acceptance from its measured step times: k = 0 to 0.709, 2, 3, 7 above 0.841",
        source="llama-cpp/plan/runs-q8_0.json", command="moespec staircase --runs runs-q8_0.json --for llama.cpp"),
    # llama.cpp: a quantized plan
    "llama-cpp/quantized/README.md": Entry("write-up: a plan for a q8_0 GGUF from ggml's own kernels at q8_0",
                                           source="llama-cpp/quantized/plan-q8_0.json"),
    "llama-cpp/quantized/pipeline.sh": Entry("the commands that made this folder's files",
                                             source="llama-cpp/quantized/bench-q8_0.json", command="bash pipeline.sh"),
    "llama-cpp/quantized/pipeline.log": Entry("the whole output of pipeline.sh",
                                              source="llama-cpp/quantized/bench-q8_0.json", command="bash pipeline.sh"),
    "llama-cpp/quantized/bench-q8_0.json": Entry("bench of ggml's q8_0 kernels (MUL_MAT_ID and per-slot) on the "
                                                 "2-layer demo model"),
    "llama-cpp/quantized/fig2-q8_0.png": Entry("figure 2 of bench-q8_0.json", source="llama-cpp/quantized/bench-q8_0.json"),
    "llama-cpp/quantized/verify-q8_0.json": Entry("llama.cpp's q8_0 verify pass per n (the plan's input)"),
    "llama-cpp/quantized/plan-q8_0.json": Entry("the plan for the q8_0 model from the q8_0 bench"),
    "llama-cpp/quantized/scored-q8_0.json": Entry("llama.cpp's runs under plan-q8_0.json, pre-registered"),
    "llama-cpp/quantized/score-prediction.json": Entry(
        "the q8_0 plan's prediction (22): 1 of 4 applicable rules holds (k_hat)", source="llama-cpp/quantized/scored-q8_0.json",
        command="moespec score --plan q8/plan-q8_0.json --runs q8/scored-q8_0.json --json"),
    "llama-cpp/quantized/score-calibrated.json": Entry(
        "the q8_0 plan's calibrated version: 3 of 4 applicable rules hold (loss at k_hat fails)", source="llama-cpp/quantized/scored-q8_0.json",
        command="moespec score --plan q8/plan-q8_0.json --runs q8/scored-q8_0.json --version calibrated --json"),
    # llama.cpp: speculative decoding
    "llama-cpp/speculative/README.md": Entry("write-up: llama.cpp's speculative decoding beside moespec's loop",
                                             source="llama-cpp/speculative/llama-cpp-speculative.json"),
    "llama-cpp/speculative/llama-cpp-speculative.json": Entry(
        "same pair, k = 0..8: plain decoding level, moespec's loop over libllama 1.12-1.31x llama.cpp's own at k >= 1"),
    # adaptive draft length on the trained pair: one file per code state, the history is the folder's README
    AD + "README.md": Entry("write-up of every adaptive-draft-*.json run, newest first, with what changed between them",
                            source=AD + "adaptive-draft-pooled-16.json"),
    AD + "HISTORY.md": Entry("design notes behind moespec/model/adaptive.py: what was tried (the runs: README.md here)"),
    AD + "adaptive-draft-pooled-16.json": Entry(
        "current code: online 1.089 / 1.035 of the best constant k (Spec-Bench / WikiText), above the heuristic; "
        "k_hat 3/3 and 0/1"),
    AD + "adaptive-draft-pooled-24.json": Entry(
        "current code, first draw: online above the best constant and the heuristic on both kinds; WikiText k_hat "
        "missed (3 against 0, curve flat within 1%)"),
    AD + "adaptive-draft-plainpy-16.json": Entry(
        "superseded code (before the pooled calibration): policy arithmetic in plain Python, online 1.047 / 0.961"),
    AD + "adaptive-draft-optimism-16.json": Entry(
        "superseded code: first token drafted on thin evidence, online 0.974 / 0.973 of the best constant"),
    AD + "adaptive-draft-confidence-16.json": Entry(
        "superseded code: online policy reads the draft's confidence, 1.008 / 1.037 of the best constant"),
    AD + "adaptive-draft-fixedV-16.json": Entry(
        "superseded code: online policy on the plan's fixed V(k), 0.998 / 0.895 of the best constant"),
    AD + "adaptive-draft-median-16.json": Entry(
        "superseded code: 3 decodings a cell with the median kept; heuristic ahead of online in both kinds"),
    AD + "adaptive-draft-level-48.json": Entry(
        "superseded code: 48 prompts kept at the host's level; heuristic ahead of online in both kinds"),
    AD + "adaptive-draft-mean-24.json": Entry(
        "superseded code: posterior-mean online policy with the exact replay, 1.006 / 0.966 of the best constant"),
    AD + "adaptive-draft-prior-24.json": Entry(
        "superseded code: plan profile as prior, 24 prompts, online 8-9% below the best constant"),
    AD + "adaptive-draft-prior.json": Entry(
        "superseded code: plan profile as the online policy's prior, 12 prompts, online 0.942 / 0.934"),
    AD + "adaptive-draft.json": Entry(
        "first run (Thompson sampling): online 8-9% below the best constant k; the pair and protocol described"),
}


@functools.lru_cache(maxsize=None)  # a file is read once per run: the index and the table both ask
def provenance(path: Path) -> dict | None:
    if path.suffix != ".json":
        return None
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    found = doc.get("provenance") if isinstance(doc, dict) else None
    return found if isinstance(found, dict) else None


def from_provenance(prov: dict) -> dict[str, str]:
    git = prov.get("git") or {}
    commit = git.get("commit")
    if commit:
        commit = commit[:7] + (" (uncommitted changes)" if git.get("dirty") else "")
    stamp = str(prov.get("timestamp") or "")
    date = f"{stamp[:10]} {stamp[11:16]} UTC" if len(stamp) >= 16 else stamp
    machine = "; ".join(str(prov[k]) for k in ("device", "host") if prov.get(k))
    return {"command": str(prov.get("command") or ""), "commit": commit or NO_COMMIT, "machine": machine,
            "date": date}


def row(rel: str, entry: Entry) -> dict[str, str]:
    prov = provenance(RESULTS / rel)
    if prov is None and entry.source is not None:
        prov = provenance(RESULTS / entry.source)
    found = from_provenance(prov) if prov is not None else {"command": "", "commit": NO_COMMIT, "machine": "",
                                                            "date": ""}
    if provenance(RESULTS / rel) is None:  # a file that records no command of its own
        found["command"] = entry.command or found["command"]
    if found["commit"] == NO_COMMIT and rel in ADDED_IN:
        found["commit"] = f"{NO_COMMIT}; added in {ADDED_IN[rel]}"
    ran = [folder for folder in DEVICE_COMMITS if rel.startswith(folder)]
    if found["commit"] == NO_COMMIT and ran:
        found["commit"] = f"{DEVICE_COMMITS[max(ran, key=len)]} (the device's copy, from its command line)"
    found["machine"] = entry.machine or found["machine"]
    found["date"] = entry.date or found["date"]
    return {"claim": entry.claim, "file": rel, **found}


def folder_row(rel: str, entry: Entry) -> dict[str, str]:
    """One row for a folder of rounds: the command of its summary, the dates of its first and last file."""
    found = row(entry.source, entry) if entry.source else {"command": "", "commit": NO_COMMIT, "machine": ""}
    stamps = sorted(p["timestamp"] for p in map(provenance, sorted((RESULTS / rel).glob("*.json")))
                    if p and p.get("timestamp"))
    dates = [from_provenance({"timestamp": s})["date"] for s in (stamps[0], stamps[-1])] if stamps else []
    date = dates[0] if len(set(dates)) == 1 else " to ".join(dates)
    return {**found, "claim": entry.claim, "file": rel + "/", "date": date or found.get("date", "")}


def files() -> list[str]:
    """Every file under results/ but this index itself."""
    return sorted(str(p.relative_to(RESULTS)) for p in RESULTS.rglob("*") if p.is_file() and p != README)


def problems() -> list[str]:
    found = []
    for rel in files():
        if rel not in ENTRIES and not any(rel.startswith(folder + "/") for folder in FOLDERS):
            found.append(f"results/{rel}: not indexed (add it to ENTRIES in scripts/results_index.py)")
    for rel, entry in ENTRIES.items():
        if (RESULTS / rel).is_file() and row(rel, entry)["commit"] == NO_COMMIT:
            found.append(f"results/{rel}: names no commit (its provenance has none and ADDED_IN lacks it)")
        if entry.source and not (RESULTS / entry.source).is_file():
            found.append(f"results/{rel}: its source results/{entry.source} is missing")
    return found


def table() -> str:
    rows = [folder_row(rel, e) for rel, e in FOLDERS.items() if (RESULTS / rel).is_dir()]
    rows += [row(rel, e) for rel, e in ENTRIES.items() if (RESULTS / rel).is_file()]
    rows.sort(key=lambda r: r["file"])
    cell = lambda text: text.replace("|", "\\|")  # noqa: E731
    lines = ["| claim | file | command | commit | machine | date |", "|---|---|---|---|---|---|"]
    for r in rows:
        command = f"`{cell(r['command'])}`" if r["command"] else "-"
        lines.append(f"| {cell(r['claim'])} | [{r['file']}]({r['file']}) | {command} | {r['commit']} | "
                     f"{cell(r['machine']) or '-'} | {r['date'] or '-'} |")
    return "\n".join(lines)


def with_table(text: str, body: str) -> str:
    head, sep, rest = text.partition(START)
    _, sep2, tail = rest.partition(END)
    if not sep or not sep2:
        raise SystemExit(f"{README}: the markers {START} and {END} are missing")
    return f"{head}{START}\n{body}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="rewrite the table in results/README.md")
    mode.add_argument("--check", action="store_true", help="exit 1 if a file is unindexed or the table is stale")
    args = ap.parse_args(argv)
    found = problems()
    if args.check:
        if README.is_file() and with_table(README.read_text(), table()) != README.read_text():
            found.append(f"{README.relative_to(ROOT)}: the table is stale (run scripts/results_index.py --write)")
        for line in found:
            print(line, file=sys.stderr)
        return 1 if found else 0
    for line in found:
        print(line, file=sys.stderr)
    if args.write:
        README.write_text(with_table(README.read_text(), table()))
    else:
        print(table())
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())

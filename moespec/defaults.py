"""The defaults every stage shares, each in one place with the reason beside it.

A stage's own tuning knobs (a bench's repetitions, a plot's dpi) stay in its module; what two stages must agree
on (the model, the depth, the largest draft, the kernel names, the default routing) lives here.
"""

from __future__ import annotations

from pathlib import Path

MODEL = "olmoe-1b-7b"  # the built-in default: OLMoE-1B-7B's shapes (16 MoE layers, N = 64, m = 8)
FORMAT = "bf16"  # the weight format of the default and of the paper's engines
DEPTH = 512  # context depth d: the paper's shorter depth (Section 4)
KMAX = 8  # the paper drafts up to 8 tokens ...
N_MAX = KMAX + 1  # ... so a verification pass holds up to 9

KERNELS = ("slot", "dedup")  # our two expert kernels: per-slot and deduplicating
POLICIES = (*KERNELS, "auto")  # a plan's policies: a fixed kernel, or AUTO (its kernel per pass size n)
DTYPES = ("bf16", "fp32")  # weight dtypes our kernels and the engine run
TORCH_DTYPES = {"fp32": "float32", "bf16": "bfloat16"}  # those names -> torch dtype attribute
QUANTIZED = ("q8_0", "q4_0")  # GGUF expert formats the bench times with ggml's kernels (llama.cpp's CPU backend)
BENCH_DTYPES = (*DTYPES, *QUANTIZED)  # every expert format `moespec bench --dtype` takes
DEVICE_KINDS = ("cpu", "cuda")  # where the kernels run
ENGINES = ("moespec", "llama.cpp")  # what `moespec run` measures: our engine, or llama.cpp on a GGUF file

# The default routing: the calibrated process at the paper's WikiText-103 reuse, 50k tokens in 50 documents
# (bootstrap intervals of rho(n) narrower than 0.01, synthesized in about a second).
PROFILE = "paper-wikitext"
# The trained pair shipped with the project (scripts/train_pair.py, issue 16): an OLMoE-class target at N = 64, m = 8
# and a dense draft, and the target's routing traced on WikiText-2's test split (real text, real documents).
PAIR_DIR = Path(__file__).resolve().parent / "data" / "pair"
PAIR_TRACE = PAIR_DIR / "trace-wikitext-test.npz"
# The text `moespec trace` records routing on when given none: six short documents of plain English prose written
# for moespec (MIT, as the code; WikiText-style " = Title = " headings split them), 6.5 kB, 1,250 words (1,944
# tokens of the trained pair's tokenizer): enough windows of n <= 9 tokens per document for reuse and the bench.
SAMPLE_TEXT = Path(__file__).resolve().parent / "data" / "text" / "sample.txt"
ROUTINGS = ("synthetic", "trained")  # the demo's routing: the calibrated process, or the trained target's trace
TRACE_TOKENS, TRACE_DOCS = 50_000, 50

# ---- bounds: every size a user passes is checked against one of these before any work (the CLI's --help states
# the bound; the loaders check the same sizes in files). Each is generous for real use and keeps a mistyped
# value from running for hours or exhausting memory.
KMAX_LIMIT = 32  # largest draft length: the exact staircase grows ~k^3 (33 step times take ~1 s, 65 take 5 s)
DEPTH_LIMIT = 131_072  # context depth and tokens per forward pass: the presets' longest context (gpt-oss, 128k)
WINDOW_LIMIT = 64  # largest reuse window n: 7x the paper's 9; reuse holds n_max x tokens x layers counts
BATCH_LIMIT = 1_024  # sequences in one verify pass: past the largest batch servers schedule for speculation
BOOTSTRAP_LIMIT = 20_000  # bootstrap resamples: 10x the default; memory grows as resamples x layers x n_max
REPS_LIMIT = 1_000  # repetitions or rounds per timed pass (bench --reps, run --reps, --max-reps)
SAMPLES_LIMIT = 1_000  # bench windows and U values per n, run prompts per cell, acceptances of a grid
TOKENS_LIMIT = 10_000_000  # trace tokens (synth, trace, demo): 10M OLMoE tokens are 2.6 GB of expert ids
GENERATED_LIMIT = 4_096  # tokens a run generates per prompt
N_LIMIT = KMAX_LIMIT + 1  # pass sizes n: a verify pass of the largest draft
# |x| of a number a user types or a result file holds (and 1/|x| of a nonzero step time or acceptance): far past
# any unit, and safely inside floats through the products and sums of a plan
MAGNITUDE_LIMIT = 1e100
# Draft lengths k (and step-time vectors of k + 1) the theory library computes with: 128x the paper's 8 and 32x the
# CLI's KMAX_LIMIT; G_a(k) takes k exact steps, and at k = 10**7 they would not end
DRAFT_LIMIT = 1_024
# Decimal digits of the integers the exact step points compare (two step times put on their common denominator): a
# decimal of 17 significant digits stays far inside; their bisection costs grow with the square of the digits (33
# step times of 40 digits take ~5 s, of 90 digits ~100 s, of 4,000 digits forever)
DIGITS_LIMIT = 40
LAYERS_LIMIT = 1_000  # decoder layers and layer indices (the presets have at most 48)
THREADS_LIMIT = 1_024  # llama.cpp threads: more than any CPU socket has cores

"""The defaults every stage shares, each in one place with the reason beside it.

A stage's own tuning knobs (a bench's repetitions, a plot's dpi) stay in its module; what two stages must agree
on (the model, the depth, the largest draft, the kernel names, the default routing) lives here.
"""

from __future__ import annotations

MODEL = "olmoe-1b-7b"  # the built-in default: OLMoE-1B-7B's shapes (16 MoE layers, N = 64, m = 8)
FORMAT = "bf16"  # the weight format of the default and of the paper's engines
DEPTH = 512  # context depth d: the paper's shorter depth (Section 4)
KMAX = 8  # the paper drafts up to 8 tokens ...
N_MAX = KMAX + 1  # ... so a verification pass holds up to 9

KERNELS = ("slot", "dedup")  # our two expert kernels: per-slot and deduplicating
POLICIES = (*KERNELS, "auto")  # a plan's policies: a fixed kernel, or AUTO (its kernel per pass size n)
DTYPES = ("bf16", "fp32")  # weight dtypes our kernels and the engine run
TORCH_DTYPES = {"fp32": "float32", "bf16": "bfloat16"}  # those names -> torch dtype attribute
DEVICE_KINDS = ("cpu", "cuda")  # where the kernels run

# The default routing: the calibrated process at the paper's WikiText-103 reuse, 50k tokens in 50 documents
# (bootstrap intervals of rho(n) narrower than 0.01, synthesized in about a second).
PROFILE = "paper-wikitext"
TRACE_TOKENS, TRACE_DOCS = 50_000, 50

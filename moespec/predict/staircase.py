"""The staircase of a step-time vector: the best draft length k*(a), the step points and the speedup.

Give V(0), ..., V(kmax) in any unit (times of plain decoding and of steps drafting 1..kmax tokens). Numbers are
read exactly (0.2 is 1/5, and 3/2 is accepted), so ties and rational step points come out exact. The output
lists a0 (B.4), the step points a_j (B.31) with the staircase as intervals, and per acceptance k*(a), the
speedup (9) at k*(a) and whether speculation helps (B.3).

JSON (`--json`), one document:
  step_times        V as given (floats)
  a0                V(1)/V(0) - 1
  step_points       [a_1, ..., a_kmax] as floats (1.0 where no acceptance reaches j)
  step_points_exact the same as strings "p/q" where rational, else null
  step_brackets     [[lo, hi], ...] certified enclosures of each a_j
  k_star_at_zero    k*(0)
  intervals         [{"k", "from", "to"}]: k*(a) = k for a in (from, to]
  table             [{"a", "k_star", "speedup", "helps"}] one row per acceptance
  helps_at          the acceptances at which some k >= 1 beats plain decoding
  llama_cpp         with --for llama.cpp: [{"k", "from", "to", "flags"}], the staircase as llama.cpp settings

For llama.cpp (`--for llama.cpp`): give its own step times (for example llama-bench's or
benchmarks/llama_cpp_verify.py's verify times plus the draft model's time per step) and each interval of the
staircase becomes the flags that make llama.cpp draft exactly k tokens at every step (LLAMA_CPP_FLAGS): the step
times are what the theory needs, whatever engine measured them.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any, Sequence

from moespec import theory

# llama.cpp's flags for a fixed draft length k, as named by the llama.cpp llama-cpp-python 0.3.36 vendors (llama-server,
# llama-speculative; older trees: --draft-max, --draft-min, --draft-p-min). A minimum draft probability of 0 never
# stops a draft early, so every step drafts exactly k tokens: the draft length the staircase is exact for.
LLAMA_CPP_FLAGS = "--spec-draft-n-max {k} --spec-draft-n-min 0 --spec-draft-p-min 0"
LLAMA_CPP_PLAIN = "no draft model (plain decoding)"  # k = 0


def for_llama_cpp(intervals: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The staircase's intervals (analyse()["intervals"]) with llama.cpp's flags for their k."""
    return [row | {"flags": LLAMA_CPP_FLAGS.format(k=row["k"]) if row["k"] else LLAMA_CPP_PLAIN}
            for row in intervals]


def analyse(V: Sequence[Fraction], acceptances: Sequence[Fraction]) -> dict[str, Any]:
    """Everything `staircase` reports, as plain JSON-ready values."""
    points = theory.step_points(V)
    k0, steps = theory.staircase_intervals(V, points)
    table = []
    for a in acceptances:
        k = theory.best_draft_length(V, a)
        table.append({"a": float(a), "k_star": k, "speedup": float(theory.speedup(V, a, k)),
                      "helps": theory.speculation_helps(V, a)})
    return {
        "step_times": [float(v) for v in V],
        "a0": float(theory.first_draft_threshold(V)),
        "step_points": [float(p) for p in points],
        "step_points_exact": [str(p.value) if p.exact else None for p in points],
        "step_brackets": [[float(p.lo), float(p.hi)] for p in points],
        "k_star_at_zero": k0,
        "intervals": [{"k": s.k, "from": float(s.lo), "to": float(s.hi)} for s in steps],
        "table": table,
        "helps_at": [row["a"] for row in table if row["helps"]],
    }



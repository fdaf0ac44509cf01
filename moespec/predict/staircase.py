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
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any, Sequence

from moespec import theory


def analyse(V: Sequence[Fraction], acceptances: Sequence[Fraction]) -> dict[str, Any]:
    """Everything `staircase` reports, as plain JSON-ready values."""
    points = theory.step_points(V)
    k0, steps = theory.staircase_intervals(V)
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



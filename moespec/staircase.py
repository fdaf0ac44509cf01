"""`moespec staircase`: the best draft length k*(a), the step points and the speedup for a step-time vector.

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

import argparse
import json
from fractions import Fraction
from typing import Any, Sequence

from moespec import MoespecError, theory
from moespec.io import console as console_


def parse_numbers(text: str, what: str) -> list[Fraction]:
    """Parse a comma-separated list of decimals or fractions exactly; one clear error line otherwise."""
    values = []
    for item in text.split(","):
        try:
            values.append(Fraction(item.strip()))
        except (ValueError, ZeroDivisionError):
            raise MoespecError(f"{what}: {item.strip()!r} is not a number") from None
    return values


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--step-times", required=True, metavar="V0,V1,...",
                   help="step times V(0), ..., V(kmax), any unit, at least two, all positive")
    p.add_argument("--acceptance", metavar="A,...",
                   help="acceptances in [0, 1) (default: the paper's 11 values 0.2..0.98)")
    p.add_argument("--json", action="store_true", help="print one JSON document instead of tables")


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


def print_report(result: dict[str, Any]) -> None:
    from rich.table import Table

    console = console_()
    V = ", ".join(f"{v:g}" for v in result["step_times"])
    console.print(f"step times V = ({V});  a0 = V(1)/V(0) - 1 = {result['a0']:.6g}")
    console.print("step points a_j (B.31): k*(a) >= j exactly when a > a_j")
    pts = Table()
    for col in ("j", "a_j", "exact"):
        pts.add_column(col, justify="right")
    for j, (x, exact) in enumerate(zip(result["step_points"], result["step_points_exact"]), start=1):
        pts.add_row(str(j), f"{x:.12f}", exact or "irrational")
    console.print(pts)
    stairs = " | ".join(f"k*={s['k']} on ({s['from']:.4f}, {s['to']:.4f}]" for s in result["intervals"])
    console.print(f"staircase: k*(0) = {result['k_star_at_zero']}; {stairs}")
    tab = Table()
    for col in ("a", "k*(a)", "speedup (9)", "speculation helps"):
        tab.add_column(col, justify="right")
    for row in result["table"]:
        tab.add_row(f"{row['a']:g}", str(row["k_star"]), f"{row['speedup']:.4f}", "yes" if row["helps"] else "no")
    console.print(tab)


def run(args: argparse.Namespace) -> int:
    V = parse_numbers(args.step_times, "--step-times")
    if len(V) < 2:
        raise MoespecError(f"--step-times: need at least two times V(0), V(1), got {len(V)}")
    bad = [v for v in V if v <= 0]
    if bad:
        raise MoespecError(f"--step-times: times must be positive, got {float(bad[0]):g}")
    acceptances = (parse_numbers(args.acceptance, "--acceptance") if args.acceptance
                   else list(theory.PAPER_ACCEPTANCES))
    bad = [a for a in acceptances if not 0 <= a < 1]
    if bad:
        raise MoespecError(f"--acceptance: {float(bad[0]):g} is outside [0, 1)")
    result = analyse(V, acceptances)
    if args.json:
        print(json.dumps(result))
    else:
        print_report(result)
    return 0

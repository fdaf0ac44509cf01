"""`moespec staircase`: k*(a), the step points and the speedup for a step-time vector (moespec.predict.staircase)."""

from __future__ import annotations

import argparse
import json
from fractions import Fraction
from typing import Any

from rich.table import Table

from moespec import MoespecError, theory
from moespec.cli.args import MAGNITUDES, within_magnitudes
from moespec.console import console as console_
from moespec.defaults import KERNELS, KMAX_LIMIT, SAMPLES_LIMIT
from moespec.formats.runsfile import load_runs
from moespec.predict.staircase import analyse, for_llama_cpp


def parse_numbers(text: str, what: str, most: int) -> list[Fraction]:
    """Parse a comma-separated list of decimals or fractions exactly; one clear error line otherwise (a number of
    magnitude beyond MAGNITUDE_LIMIT, or a nonzero one below its inverse, would overflow the float results; more
    than `most` numbers would take hours)."""
    if not text.strip():
        raise MoespecError(f"{what}: an empty list")
    if text.count(",") >= most:
        raise MoespecError(f"{what}: {text.count(',') + 1} numbers, at most {most:,}")
    values = []
    for item in text.split(","):
        try:
            value = Fraction(item.strip())
        except (ValueError, ZeroDivisionError):
            raise MoespecError(f"{what}: {item.strip()!r} is not a number") from None
        if not within_magnitudes(value):
            raise MoespecError(f"{what}: {item.strip()} is outside the magnitudes {MAGNITUDES} moespec takes")
        values.append(value)
    return values


def add_arguments(p: argparse.ArgumentParser) -> None:
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--step-times", metavar="V0,V1,...",
                        help=f"step times V(0), ..., V(kmax), any unit, at least two and at most {KMAX_LIMIT + 1}, "
                             f"all positive")
    source.add_argument("--runs", metavar="RUNS",
                        help="runs.json of `moespec run` (either engine): V(k) = its median verify time at n = k + 1 "
                             "plus its draft + host time per step at k (0 where it has none)")
    p.add_argument("--kernel", choices=list(KERNELS),
                   help="with --runs: whose verify times (default the one the runs hold; dedup when both)")
    p.add_argument("--acceptance", metavar="A,...",
                   help=f"acceptances in [0, 1), at most {SAMPLES_LIMIT:,} (default: the paper's 11 values "
                        f"0.2..0.98)")
    p.add_argument("--for", dest="engine", choices=["llama.cpp"],
                   help="also print the staircase as this engine's settings (llama.cpp: the flags that draft "
                        "exactly k tokens per step, per acceptance range)")
    p.add_argument("--json", action="store_true", help="print one JSON document instead of tables")


def print_report(result: dict[str, Any]) -> None:
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
    if "llama_cpp" in result:
        flags = Table(title="llama.cpp (llama-server / llama-speculative with --model-draft)")
        for col in ("acceptance a", "k*", "flags"):
            flags.add_column(col, justify="left")
        for row in result["llama_cpp"]:
            flags.add_row(f"({row['from']:.4f}, {row['to']:.4f}]", str(row["k"]), row["flags"])
        console.print(flags)


def runs_step_times(path: str, kernel: str | None) -> list[Fraction]:
    """V(0..K) from a runs.json: the verify time of `kernel` at n = k + 1 plus draft_time_s at k, for the k
    (from 0 on, consecutive) that both hold."""
    runs = load_runs(path)
    kernel = kernel or ("dedup" if "dedup" in runs.kernels or not runs.kernels else runs.kernels[0])
    tau = runs.get("verify_time_s", {}).get(kernel)
    if not isinstance(tau, dict):
        raise MoespecError(f"{path}: no verify_time_s.{kernel}")
    h = runs.get("draft_time_s") or {}
    K = 0
    while str(K + 2) in tau and K + 1 <= KMAX_LIMIT:
        K += 1
    V = runs.series(f"verify_time_s.{kernel}", range(1, K + 2), positive=True)
    extra = runs.series("draft_time_s", range(K + 1), positive=False) if all(str(k) in h for k in range(K + 1)) \
        else [0.0] * (K + 1)
    return [Fraction(str(float(v + e))) for v, e in zip(V, extra)]


def run(args: argparse.Namespace) -> int:
    V = runs_step_times(args.runs, args.kernel) if args.runs else \
        parse_numbers(args.step_times, "--step-times", KMAX_LIMIT + 1)
    if len(V) < 2:
        raise MoespecError(f"--step-times: need at least two times V(0), V(1), got {len(V)}")
    bad = [v for v in V if v <= 0]
    if bad:
        raise MoespecError(f"--step-times: times must be positive, got {float(bad[0]):g}")
    acceptances = (parse_numbers(args.acceptance, "--acceptance", SAMPLES_LIMIT) if args.acceptance is not None
                   else list(theory.PAPER_ACCEPTANCES))
    bad = [a for a in acceptances if not 0 <= a < 1]
    if bad:
        raise MoespecError(f"--acceptance: {float(bad[0]):g} is outside [0, 1)")
    result = analyse(V, acceptances)
    if args.engine == "llama.cpp":
        result["llama_cpp"] = for_llama_cpp(result["intervals"])
    if args.json:
        print(json.dumps(result))
    else:
        print_report(result)
    return 0

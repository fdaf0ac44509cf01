"""Stored runs predicted again with each bench's placement raised to a power: whether the kernels' time follows the
measured placement.

The structural model reads expert e's cold bytes at C p_e (moespec.measure.placement: a plain read of the memory
behind the expert's block over a read of the ceiling's buffer, right after it). Where the placement was found, a
2-core guest of a Zen 1 EPYC, the kernels' reads followed it (buffers of one process read at 7-15 GB/s, and a layer's
per-slot kernel with them). Elsewhere a plain read and a kernel need not meet the memory alike (their access
patterns, threads and prefetching differ), and a placement that the kernels do not follow adds its spread to every
prediction. Here each stored run's benches are predicted again, in place (each at the loop factor its run's state
probe gave it, as the run predicted it), with every p_e raised to the power beta: beta = 1 is the model as
registered, 0 memory read at the ceiling's rate (at the same ceiling samples).
Nothing is fitted: each beta given is reported, and a beta picked from these tables would be picked on the models
they hold. Each beta's tables and summary are written as structure_model's `table` and `summary` write them, in
OUT/beta-B/ (crossover and k_hat* are not predicted again), and slopes.json holds, per beta, over every model,
kernel and batch with a placement (each its median signed error over n of its windows' mean time, against its bench's
median p_e): the least-squares line of log(predicted / measured) on log p (slope 0 where the errors do not follow the
placement; a placement the kernels do not follow, applied wholly, leaves a slope near -1 times the share of a pass's
time its cold bytes take) and the root mean square of log(predicted / measured), the spread the predictions leave.

    .venv/bin/python benchmarks/placement_share.py --runs RUN1,..,RUN5 --dtype bf16 --betas 0,0.5,1 --out OUT
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

import stored_runs
import structure_model
from moespec import ArgumentError
from moespec.arguments import show
from moespec.defaults import BENCH_DTYPES
from moespec.formats.benchfile import load_bench
from moespec.formats.files import check_output, provenance, write_json
from moespec.kernels.structure import kind_rates


def powered(bench: dict[str, Any], beta: float) -> dict[str, Any]:
    """`bench` with each layer's placement p_e raised to the power beta (a layer without one kept as it is)."""
    if isinstance(beta, bool) or not (isinstance(beta, (int, float)) and math.isfinite(beta) and beta >= 0):
        raise ArgumentError(f"beta must be a number >= 0, got {show(beta)}")
    placement = bench.get("placement")
    if not placement:
        return bench
    return bench | {"placement": {layer: None if p is None else [v ** beta for v in p]
                                  for layer, p in placement.items()}}


def line(points: Sequence[tuple[float, float]]) -> dict[str, Any]:
    """Over `points` (p, predicted / measured - 1): the least-squares line of log(predicted / measured) on log p
    (slope and intercept None where the points' p do not differ) and the root mean square of log(predicted /
    measured)."""
    if not points:
        raise ArgumentError("points must hold at least one (placement, error)")
    x = np.log([p for p, _ in points])
    y = np.log1p([e for _, e in points])
    slope, intercept = np.polyfit(x, y, 1) if len(points) > 1 and np.ptp(x) > 0 else (None, None)
    return {"points": len(points), "slope": None if slope is None else float(slope),
            "intercept": None if intercept is None else float(intercept),
            "rms_log_error": float(np.sqrt(np.mean(y * y)))}


def signed_points(run: Path, dtype: str, rows: list[dict[str, Any]]) -> list[tuple[float, float]]:
    """(the bench's median p_e, the row's median signed error) per row of `rows` (table rows of `run`) whose bench has
    a placement."""
    out = []
    for r in rows:
        name = structure_model.model_dir(run, r["model"], dtype) / f"bench-B{r['batch']}.json"
        placement = (load_bench(name).get("placement") or {}).get("0")
        if placement:
            out.append((float(np.median(placement)), r["median_signed_error"]))
    return out


def placement_tables(parser: argparse.ArgumentParser, argv: list[str]) -> int:
    """The checks of every argument and output, then each beta's tables and summary, and slopes.json (module
    docstring)."""
    parser.add_argument("--runs", required=True, help="structure_model runs' folders, comma-separated")
    parser.add_argument("--dtype", default="bf16", choices=BENCH_DTYPES, help="the format to predict (default bf16)")
    parser.add_argument("--betas", type=stored_runs.numbers_of, default=[0.0, 0.5, 1.0],
                        help="powers to raise each placement to (default 0,0.5,1)")
    parser.add_argument("--out", required=True, help="folder of each beta's tables and summary, and slopes.json")
    args = parser.parse_args(argv)
    out = Path(args.out)
    profiles, folders = stored_runs.variant_runs(parser, args.runs, args.dtype, out, "beta", args.betas)
    check_output(out / "slopes.json")
    slopes = {}
    for beta, folder in folders.items():
        tables, points = [], []
        for run, profile in profiles.items():
            rates = kind_rates(profile["dtypes"][args.dtype], profile["ceiling_gbps"])
            rows = stored_runs.rows_of_run(run, args.dtype, rates, view=partial(powered, beta=beta), probed=True)
            points += signed_points(run, args.dtype, rows)
            table = folder / run.name
            write_json(table / "table.json", {"rows": rows, "side_by_side": [], "run": str(run), "beta": beta,
                                              "command": shlex.join([sys.executable, *sys.argv]),
                                              "provenance": provenance()})
            tables.append(table)
        structure_model.step_summary(folder, tables)
        slopes[f"{beta:g}"] = line(points) if points else None
        print(json.dumps({"beta": beta, "line": slopes[f"{beta:g}"]}))
    write_json(out / "slopes.json", {"dtype": args.dtype, "runs": [str(r) for r in profiles], "betas": slopes,
                                     "command": shlex.join([sys.executable, *sys.argv]), "provenance": provenance()})
    return 0


if __name__ == "__main__":
    sys.exit(stored_runs.stored_main(__doc__, placement_tables, sys.argv[1:]))

"""Stored runs predicted again with the kernels' loop following the host's state, as the stream does.

The structural model (moespec.kernels.structure) takes a cold group's stream at the bench's ceiling C (s / C) and
every other term at its profile's value: the loop's excess x, the hot rate kappa, the per-row time r, a cold pass's
start F and the fixed seconds of a pass, a group, a node and a token, as if the CPU ran its loop at one speed in every
state of the host. On a shared host the state that slows the stream can slow the loop too (other tenants on the
cores' siblings, their clocks): a pinned profile taken in a slow state then predicts every bench slow, one taken in a
fast state every bench fast, and a bench meets its own state. Here each stored run's benches are predicted again from
the run's own profile with those terms scaled by (C_p / C)^alpha, C_p the profile's ceiling and C the bench's at
that n (at_state): alpha = 0 is the model as registered, 1 a loop slowed as much as the stream. Nothing is fitted:
each alpha given is reported, and an alpha picked from these tables would be picked on the models they hold. Each
alpha's tables and summary are written as structure_model's `table` and `summary` write them, in OUT/alpha-A/
(crossover and k_hat* are not predicted again):

    .venv/bin/python benchmarks/loop_state.py --runs RUN1,..,RUN5 --dtype q4_0 --alphas 0,0.5,1 --out OUT
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
from functools import partial
from pathlib import Path

import stored_runs
import structure_model
from moespec import ArgumentError
from moespec.arguments import show
from moespec.defaults import BENCH_DTYPES
from moespec.formats.files import provenance, write_json
from moespec.kernels.structure import Rates, kind_rates



def at_state(rates: Rates, ceiling_gbps: float, profile_gbps: float, alpha: float) -> Rates:
    """`rates` of a profile whose ceiling was profile_gbps GB/s, with every term but the stream's (s / C) scaled by
    (profile_gbps / ceiling_gbps)^alpha: the loop of a host whose stream reads ceiling_gbps."""
    for name, value in (("ceiling_gbps", ceiling_gbps), ("profile_gbps", profile_gbps)):
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            raise ArgumentError(f"{name} must be a positive number of GB/s, got {show(value)}")
    if not (isinstance(alpha, (int, float)) and math.isfinite(alpha) and alpha >= 0):
        raise ArgumentError(f"alpha must be a number >= 0, got {show(alpha)}")
    return rates.loop_scaled((profile_gbps / ceiling_gbps) ** alpha)


def state_tables(parser: argparse.ArgumentParser, argv: list[str]) -> int:
    """The checks of every argument and output, then each alpha's tables and summary (module docstring)."""
    parser.add_argument("--runs", required=True, help="structure_model runs' folders, comma-separated")
    parser.add_argument("--dtype", default="q4_0", choices=BENCH_DTYPES, help="the format to predict (default q4_0)")
    parser.add_argument("--alphas", type=stored_runs.numbers_of, default=[0.0, 0.5, 1.0],
                        help="exponents of C_p / C to scale the loop's terms by (default 0,0.5,1)")
    parser.add_argument("--out", required=True, help="folder of each alpha's tables and summary")
    args = parser.parse_args(argv)
    out = Path(args.out)
    profiles, folders = stored_runs.variant_runs(parser, args.runs, args.dtype, out, "alpha", args.alphas)
    for alpha, folder in folders.items():
        tables = []
        for run, profile in profiles.items():
            rates = kind_rates(profile["dtypes"][args.dtype], profile["ceiling_gbps"])
            rows = stored_runs.rows_of_run(run, args.dtype, rates, partial(
                at_state, profile_gbps=profile["ceiling_gbps"], alpha=alpha))
            table = folder / run.name
            write_json(table / "table.json", {"rows": rows, "side_by_side": [], "run": str(run), "alpha": alpha,
                                              "command": shlex.join([sys.executable, *sys.argv]),
                                              "provenance": provenance()})
            tables.append(table)
            print(json.dumps({"alpha": alpha, "run": str(run), "rows": [
                (r["model"], r["kernel"], round(r["median_error"], 3), round(r["max_error"], 3)) for r in rows]}))
        structure_model.step_summary(folder, tables)
    return 0


if __name__ == "__main__":
    sys.exit(stored_runs.stored_main(__doc__, state_tables, sys.argv[1:]))

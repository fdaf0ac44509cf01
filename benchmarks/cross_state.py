"""Every profile against every run's benches: does the state probe carry a profile to a state of the host it did not
meet? Each run of benchmarks/structure_model.py whose benches carry state records (bench_state.py: the profile's
self-check passes timed again around each bench) is predicted from each profile given, its own and the others' (of
this device and thread count: taken in other hours, other states), twice: with the profile's loop as taken, and with
its loop scaled by the factor k that profile's check passes and the bench's probe give (moespec.measure.state_probe;
nothing of any model enters k). Each pairing's rows are structure_model's table rows; the summary counts the
model-kernels within the target per pairing and over all, unprobed and probed:

    .venv/bin/python benchmarks/cross_state.py --profiles RUN_A/device.json,.. --runs RUN_1,.. --dtype q4_0 --out OUT
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any

import numpy as np

import stored_runs
import structure_model
from bench_state import bracketed, probes_of, read_state
from moespec.defaults import BENCH_DTYPES
from moespec.formats.benchfile import load_bench
from moespec.formats.devicefile import DeviceProfile, load_profile
from moespec.formats.files import check_output, provenance, write_json
from moespec.kernels.structure import kind_rates


def pairing_rows(profile: DeviceProfile, run: Path, dtype: str, probed: bool) -> tuple[list[dict[str, Any]], list]:
    """The table rows of `run`'s benches at `dtype` predicted from `profile` (its rates, cache and, where `probed`, its
    loop scaled by each bench's k against it), and each bench's k (None unprobed)."""
    rates = kind_rates(profile["dtypes"][dtype], profile["ceiling_gbps"])
    rows, ks = [], []
    for name in structure_model.MODELS:
        config = structure_model.configs(name, run, dtype, (1,))[1]
        state = read_state(config.out) if Path(config.out).exists() else None
        if state is None:
            continue
        k = bracketed(profile, dtype, probes_of(state))[0] if probed else None
        ks.append(k)
        errors = structure_model.pass_errors(config, load_bench(config.out), rates, profile["cache_bytes"],
                                             None if k is None else lambda r, _, k=k: r.loop_scaled(k))
        result = {"model": name, "dtype": dtype, "batches": {"1": {"ceiling_gbps": 0.0, "passes": errors}}}
        rows += structure_model.table_rows(result, None)
    return rows, ks


def within(rows: list[dict[str, Any]]) -> int:
    """Model-kernels within structure_model.TARGET."""
    return sum(r["median_error"] <= structure_model.TARGET[0] and r["max_error"] <= structure_model.TARGET[1]
               for r in rows)


def cross(parser: argparse.ArgumentParser, argv: list[str]) -> int:
    """The checks of every argument and output, then every pairing (module docstring)."""
    parser.add_argument("--profiles", required=True, help="device.json files, comma-separated")
    parser.add_argument("--runs", required=True, help="structure_model runs' folders whose benches carry state records")
    parser.add_argument("--dtype", default="q4_0", choices=BENCH_DTYPES, help="the format (default q4_0)")
    parser.add_argument("--out", required=True, help="folder of cross.json and cross.md")
    args = parser.parse_args(argv)
    runs = stored_runs.stored_runs(parser, args.runs)
    profiles = {path: load_profile(path) for path in args.profiles.split(",") if path}
    if not profiles or (missing := [p for p, doc in profiles.items() if args.dtype not in doc["dtypes"]]):
        parser.error(f"--profiles: give device.json files that timed {args.dtype}"
                     + (f" (not {', '.join(missing)})" if profiles else ""))
    out = Path(args.out)
    for name in ("cross.json", "cross.md"):
        check_output(out / name)
    pairings = []
    for path, profile in profiles.items():
        for run in runs:
            plain, _ = pairing_rows(profile, run, args.dtype, probed=False)
            probed, ks = pairing_rows(profile, run, args.dtype, probed=True)
            pairings.append({"profile": path, "run": str(run), "own": Path(path).parent == run, "k": ks,
                             "unprobed": plain, "probed": probed, "within": [within(plain), within(probed)]})
            print(f"{path} x {run}: k {', '.join(f'{k:.3f}' for k in ks)}; within {within(plain)} -> "
                  f"{within(probed)} of {len(probed)}")
    totals = [sum(p["within"][i] for p in pairings) for i in (0, 1)]
    cells = sum(len(p["probed"]) for p in pairings)
    lines = ["| profile | run's benches | own | k per model: median (range) | model-kernels within, unprobed | "
             "probed |", "|---|---|---|---|---|---|"]
    lines += [f"| {p['profile']} | {p['run']} | {'yes' if p['own'] else 'no'} | {np.median(p['k']):.3f} "
              f"({min(p['k']):.3f}-{max(p['k']):.3f}) | {p['within'][0]} of {len(p['unprobed'])} | {p['within'][1]} "
              f"of {len(p['probed'])} |" for p in pairings if p["k"]]
    lines.append(f"| all | | | | {totals[0]} of {cells} | {totals[1]} of {cells} |")
    write_json(out / "cross.json", {"dtype": args.dtype, "target": list(structure_model.TARGET),
                                    "pairings": pairings, "within": totals, "cells": cells,
                                    "command": shlex.join([sys.executable, *sys.argv]), "provenance": provenance()})
    (out / "cross.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(stored_runs.stored_main(__doc__, cross, sys.argv[1:]))

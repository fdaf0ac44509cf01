"""The stream's share s_G against none, on identical timings: one device profile's timed calls (moespec.measure.
device_profile: the rate, hot, overhead and check passes of each format) fitted twice, with s_G where the calls met
more than one host state (stream_fit) and with s_G = 1 forced (the model before it), and each fit's predictions of
the measured benches in results/structure-model (benchmarks/structure_model.py's, at their own ceilings) scored the
same way: median and largest relative error over n of each model's windows.

    .venv/bin/python benchmarks/stream_share_ab.py --dtypes q8_0,q4_0 --out results/structure-model/stream-share-ab.json

Run on a host whose streaming read moves (otherwise both fits are the same: s_G = 1); the spread of the calls'
ceilings is printed and recorded.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

import numpy as np

import structure_model
from moespec.defaults import BENCH_DTYPES
from moespec.formats.benchfile import load_bench
from moespec.formats.files import check_output, provenance, write_json
from moespec.measure import device_profile
from moespec.measure.contention import Cores
from moespec.measure.level import Level
from moespec.measure.profile_fit import fit_rates
from moespec.measure.profile_refit import rows_fit
from moespec.measure.timing import CpuTimer, flush_bytes

REPS = 7  # the profile's default rounds


def fits(dtype: str) -> tuple[dict, list[float]]:
    """Both fits of one format's freshly timed profile calls, and the calls' ceilings (GB/s)."""
    items, info, _ = device_profile._items(dtype, None, None)
    timer = CpuTimer()
    device_profile._time_rounds(items, REPS, timer, Level(None, 0), lambda text: None, timer.sampler(),
                                Cores(None, fit=False))
    by_key = {item.key: item for item in items}
    rows, g_values = rows_fit(dtype, "cpu"), device_profile.G_VALUES
    out = {"stream_share": fit_rates(by_key, info, g_values, rows),  # no spread suffices below: s = 1
           "all_of_the_stream": fit_rates(by_key, info, g_values, rows, state_spread=float("inf"))}
    return out, [c for item in items for c in (item.ceilings or [])]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dtypes", default="q8_0,q4_0", help="formats to time and score (default %(default)s)")
    p.add_argument("--out", default="out/stream-share-ab.json", help="the result JSON (default %(default)s)")
    args = p.parse_args(argv)
    dtypes = args.dtypes.split(",")
    if not set(dtypes) <= set(BENCH_DTYPES):
        p.error(f"--dtypes: some of {', '.join(BENCH_DTYPES)}")
    check_output(args.out, "--out")
    started = provenance("cpu", args.dtypes) | {"command": shlex.join([sys.executable, *sys.argv])}
    cache = flush_bytes() // 2  # the last-level cache, as the profile takes it
    result: dict = {"format": "moespec-stream-share-ab", "format_version": 1, "provenance": started, "dtypes": {}}
    for dtype in dtypes:
        fitted, ceilings = fits(dtype)
        entry = {"ceiling_p10_p90_gbps": [float(np.percentile(ceilings, 10)), float(np.percentile(ceilings, 90))],
                 "stream_share": list(fitted["stream_share"].stream_share), "benches": []}
        lo, hi = entry["ceiling_p10_p90_gbps"]
        print(f"== {dtype}: the calls' ceilings {lo:.0f}-{hi:.0f} GB/s (10-90%); s_G "
              + " ".join(f"{v:.2f}" for v in entry["stream_share"]))
        for name in structure_model.MODELS:
            for batch in structure_model.BATCHES:
                config = structure_model.configs(name, structure_model.OUT, dtype, (batch,))[batch]
                if not Path(config.out).exists():
                    continue
                bench = load_bench(config.out)
                row = {"model": name, "batch": batch, "ceiling_gbps": bench["ceiling_gbps"]}
                for label, rates in fitted.items():
                    errors = structure_model.pass_errors(config, bench, dict.fromkeys(("slot", "dedup"), rates), cache)
                    values = [abs(v["error"]) for by_n in errors.values() for v in by_n.values()]
                    row[label] = {"median": float(np.median(values)), "max": max(values)}
                entry["benches"].append(row)
                print(f"{name:18s} B = {batch}  with s_G: {row['stream_share']['median']:.1%} / "
                      f"{row['stream_share']['max']:.1%}   s_G = 1: {row['all_of_the_stream']['median']:.1%} / "
                      f"{row['all_of_the_stream']['max']:.1%}  (median / max over n and both kernels)")
        result["dtypes"][dtype] = entry
    write_json(args.out, result)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

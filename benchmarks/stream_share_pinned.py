"""A pinned profile's predictions again, with the stream's share of a profile that met several states of the host.

A profile pinned to one bandwidth level (`benchmarks/structure_model.py profile --pin-wait`) takes the stream's share
s = 1: its calls meet one state, and one state cannot tell s from the loop's excess x. A bench that met another
state than its profile is then predicted as if its time followed the stream wholly, which ggml's pair's does not
(moespec.kernels.structure). Here every measured bench of each run is predicted again from its run's pinned profile
with the rates re-expressed at the share s_G of `--share-from`, a profile of the same device and threads whose calls
spanned the host's states (Rates.with_share: the same cost at the pinned profile's ceiling, s_G of any change from
it). Nothing is fitted on the models: s_G comes from the other profile's synthetic shapes. Each run's table and the
summary over runs are written as structure_model's `table` and `summary` write them (crossover and k_hat* are not
predicted again):

    .venv/bin/python benchmarks/stream_share_pinned.py --runs RUN1,..,RUN5 --dtype q8_0 \\
        --share-from results/structure-model/device-ggml.json --out OUT
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

import stored_runs
import structure_model
from moespec.defaults import BENCH_DTYPES
from moespec.formats.devicefile import load_profile
from moespec.formats.files import check_output, provenance, write_json
from moespec.kernels.structure import kind_rates
from moespec.measure.level import pinned_of


def share_tables(parser: argparse.ArgumentParser, argv: list[str]) -> int:
    """The checks of every argument and output, then the tables and the summary (module docstring)."""
    parser.add_argument("--runs", required=True,
                        help="structure_model runs' folders (pinned profiles), comma-separated")
    parser.add_argument("--dtype", default="q8_0", choices=BENCH_DTYPES, help="the format to predict (default q8_0)")
    parser.add_argument("--share-from", required=True, help="a device profile whose calls met several host states")
    parser.add_argument("--out", required=True, help="folder of the tables and the summary")
    args = parser.parse_args(argv)
    runs = stored_runs.stored_runs(parser, args.runs)
    source = load_profile(args.share_from)
    if args.dtype not in source["dtypes"] or not source["dtypes"][args.dtype].get("stream_share"):
        parser.error(f"--share-from {args.share_from}: no stream share fitted at {args.dtype}")
    for run in runs:
        profile = load_profile(run / "device.json")
        if pinned_of(profile.get("level")) is None or args.dtype not in profile["dtypes"]:
            parser.error(f"--runs: {run}/device.json is not a profile pinned to a level that timed {args.dtype}")
        if (profile["device"], profile["threads"]) != (source["device"], source["threads"]):
            parser.error(f"--share-from {args.share_from}: another device or thread count than {run}/device.json")
    shares = kind_rates(source["dtypes"][args.dtype], source["ceiling_gbps"])
    out = Path(args.out)
    for name in [f"{run.name}/table.json" for run in runs] + ["summary.json", "summary.md"]:
        check_output(out / name)
    tables = []
    for run in runs:
        profile = load_profile(run / "device.json")
        rates = {kind: r.with_share(shares[kind], profile["ceiling_gbps"])
                 for kind, r in kind_rates(profile["dtypes"][args.dtype], profile["ceiling_gbps"]).items()}
        rows = stored_runs.rows_of_run(run, args.dtype, rates)
        table = out / run.name
        write_json(table / "table.json", {"rows": rows, "side_by_side": [], "run": str(run),
                                          "share_from": args.share_from, "command": shlex.join([sys.executable,
                                                                                               *sys.argv]),
                                          "provenance": provenance()})
        tables.append(table)
        print(json.dumps({"run": str(run), "rows": [(r["model"], r["kernel"], round(r["median_error"], 3),
                                                     round(r["max_error"], 3)) for r in rows]}))
    structure_model.step_summary(out, tables)
    return 0


if __name__ == "__main__":
    sys.exit(stored_runs.stored_main(__doc__, share_tables, sys.argv[1:]))

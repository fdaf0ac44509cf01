"""`moespec profile`: the one-time device profile the structural model of the expert kernels reads (device.json;
moespec.measure.device_profile). `moespec bench --predict device.json` turns it into a bench of any model's shapes.
Not the per-position acceptance profile of `plan --acceptance-profile` (moespec.theory.profile)."""

from __future__ import annotations

import argparse
import json

from rich.text import Text

from moespec.cli.args import add_level_flags, bounded
from moespec import MoespecError
from moespec.console import console
from moespec.defaults import BENCH_DTYPES, REPS_LIMIT, THREADS_LIMIT
from moespec.kernels.structure import kind_rates
from moespec.measure.device_profile import DEFAULT_REPS, ProfileConfig, run_profile
from moespec.measure.level import describe
from moespec.measure.profile_refit import refit_file
from moespec.predict.checks import profile_checks

OUTPUTS = ("--out",)  # the path flags kept apart before any work (moespec.cli.args.check_paths)
INPUTS = {"--refit": ()}
# The timing flags' defaults: --refit, which times nothing, refuses any of them set otherwise
TIMING_DEFAULTS = {"device": "cpu", "dtypes": "bf16", "reps": DEFAULT_REPS, "threads": None, "pin_gbps": None,
                   "pin_wait": None}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default=TIMING_DEFAULTS["device"],
                   help="where the kernels run: cpu (the native kernels and ggml's pair) or cuda (the Triton kernels; "
                        "bf16, fp32) (default cpu)")
    p.add_argument("--out", default="device.json", help="results file (default device.json)")
    p.add_argument("--dtypes", default=TIMING_DEFAULTS["dtypes"],
                   help=f"weight formats to time, comma-separated, of {', '.join(BENCH_DTYPES)} (default bf16): our "
                        f"native kernels at bf16 and fp32, ggml's pair (ggml-per-slot, ggml-mul_mat_id) at the GGUF "
                        f"formats")
    p.add_argument("--reps", type=bounded(2, REPS_LIMIT), default=TIMING_DEFAULTS["reps"],
                   help=f"timed rounds over every microbenchmark (default {DEFAULT_REPS}, 2..{REPS_LIMIT:,})")
    p.add_argument("--threads", type=bounded(1, THREADS_LIMIT),
                   help="threads of every timed call (default torch's, what `moespec bench` runs on)")
    add_level_flags(p)
    p.add_argument("--refit", metavar="FILE", help="time nothing: fit the calls a device.json records again under this "
                                                   "version's model and write the profile to --out")


def run(args: argparse.Namespace) -> int:
    out = console()
    if args.refit:
        given = [f"--{flag.replace('_', '-')}" for flag, value in TIMING_DEFAULTS.items()
                 if getattr(args, flag) != value]
        if given:
            raise MoespecError(f"--refit times nothing: drop {', '.join(given)}")
        profile = refit_file(args.refit, args.out)
    else:
        config = ProfileConfig(out=args.out, device=args.device, dtypes=tuple(dict.fromkeys(args.dtypes.split(","))),
                               reps=args.reps, threads=args.threads, level_gbps=args.pin_gbps,
                               level_wait_s=args.pin_wait)
        profile = run_profile(config, say=out.print)
    for dtype, entry in profile["dtypes"].items():
        c = profile.ceiling_gbps
        by_kind = kind_rates(entry, c) if "slot" in entry else {"both kinds": kind_rates(entry, c)["dedup"]}
        for kind, rates in by_kind.items():
            out.print(f"{dtype}, {kind}: fixed {rates.pass_s * 1e6:.0f} us a call, {rates.group_s * 1e6:.1f} us a "
                      f"group ({rates.group_hot * 1e6:.1f} us a cache hit's), {rates.node_s * 1e6:.1f} us a node past "
                      f"the first; per G (tokens per expert) cold GB/s at the ceiling, hot GB/s, the stream's share "
                      f"s, a cold pass's start in us: " +
                      ", ".join(f"{g}: {1e-9 / rates.per_byte(g, c):.0f}, {1e-9 / rates.per_byte(g, c, cold=False):.0f}"
                                f", {rates.share(g):.2f}, {rates.ramp(g) * 1e6:.0f}" for g in rates.G))
    stream, scaling = profile["stream_read"], profile["threads_1"]
    if stream:
        out.print("cold streaming read by chunk: " + ", ".join(
            f"{c >> 10} KiB {v:.1f} GB/s" for c, v in zip(stream["chunk_bytes"], stream["gbps"])))
    if scaling:
        out.print(f"1 thread: streaming read {scaling['ceiling_gbps']:.1f} GB/s; {profile['threads']} threads over 1 "
                  f"at G " + ", ".join(f"{g}: {s:.2f}x" for g, s in zip(scaling["G"], scaling["speedup"])))
    probe, cache = profile["cache_probe"], f"{profile['cache_bytes'] / 2**20:.1f} MiB"
    if probe is None:
        out.print(f"cache a per-slot re-read finds: the {cache} last-level cache (no probe on "
                  f"{profile['device_kind']})")
    else:
        out.print(f"cache a per-slot re-read finds: {cache} of the {profile['cache_nominal_bytes'] / 2**20:.0f} MiB "
                  f"last-level cache ({probe['kernel']}, re-reads at "
                  + ", ".join(f"{d / 2**20:.0f}" for d in probe["distances_bytes"]) + " MiB"
                  + ("" if probe["identified"] else "; they cannot tell: a cached read cost a cold one's here") + ")")
    if line := describe(profile["level"]):
        out.print(line)
    check = profile["self_check"]
    out.print("self-check on the check shape: " + "; ".join(
        f"{k} median {v['median']:.1%}, max {v['max']:.1%} over {v['passes']} passes" for k, v in check.items()))
    for line in profile_checks(profile, args.out):
        out.print(Text.assemble(("warning: ", "bold red"), line))
    how = f"{args.refit}'s calls fitted again" if args.refit else f"in {profile['elapsed_s']:.0f} s"
    out.print(f"wrote {args.out}: {how} (ceiling {profile.ceiling_gbps:.1f} GB/s)")
    print(json.dumps({"device": profile["device"], "threads": profile["threads"], "dtypes": profile.dtypes,
                      "ceiling_gbps": round(profile.ceiling_gbps, 2), "self_check": check, "out": args.out}))
    return 0

"""`moespec bench`: time the expert kernels on a layer's real shapes: beta(n), fits (4)/(E.1), r(n), the crossover
(moespec.measure.bench)."""

from __future__ import annotations

import argparse
import json

from rich.text import Text

from moespec.cli.args import CHECKPOINT_FILES, add_checkpoint_flags, add_level_flags, bounded, parse_ints, seed
from moespec.console import console
from moespec.defaults import (
    BATCH_LIMIT,
    BENCH_DTYPES,
    LAYERS_LIMIT,
    MODEL,
    N_LIMIT,
    N_MAX,
    QUANTIZED,
    REPS_LIMIT,
    SAMPLES_LIMIT,
)
from moespec import MoespecError
from moespec.formats.files import writing
from moespec.kernels.peers import GGML_PEERS
from moespec.measure.bench import (
    DEFAULT_KERNELS,
    DEFAULT_REPS,
    DEFAULT_U_VALUES,
    DEFAULT_WINDOWS,
    BenchConfig,
    default_dtype,
    run_bench,
)
from moespec.formats.benchfile import noise_verdict
from moespec.measure.level import describe as describe_level
from moespec.predict.checks import bench_checks
from moespec.predict.structure_bench import predict_bench
from moespec.report.figures import bandwidth_figure, check_plot, save_figure
from moespec.report.tables import bench_tables


# the path flags kept apart before any work (moespec.cli.args.check_paths)
OUTPUTS = ("--out", "--plot")
INPUTS = {"--model": CHECKPOINT_FILES, "--trace": (), "--predict": ()}


# ---- command: moespec bench --------------------------------------------------------------------------------
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=MODEL, help=f"model preset, config path or GGUF file (default {MODEL})")
    p.add_argument("--device", default="cpu", help="cpu or cuda: where the kernels run (cuda: our Triton kernels)")
    p.add_argument("--layers", help="MoE layers to time, e.g. 0,7 (default: the first and L/2 - 1)")
    p.add_argument("--dtype", choices=BENCH_DTYPES,
                   help=f"expert weight format (default: a GGUF file's own, else {BenchConfig.dtype}; "
                        f"{', '.join(QUANTIZED)}: GGUF blocks, timed with ggml's kernels, llama.cpp's CPU backend)")
    p.add_argument("--kernels", default=DEFAULT_KERNELS,
                   help=f"comma-separated kernels, or all (default {DEFAULT_KERNELS}, for a quantized --dtype "
                        f"{','.join(GGML_PEERS)}; peers: hf-batched_mm, hf-grouped_mm, hf-eager, and, when "
                        "installed, ggml-per-slot, ggml-mul_mat_id (ggml-python), mlx-gather, mlx-sorted (mlx-lm))")
    p.add_argument("--trace", help="routing trace (.npz) for the recorded windows and u(n) (default: synthesize "
                                   "the calibrated default for the model)")
    p.add_argument("--n", default=f"1-{N_MAX}",
                   help=f"pass sizes, a range like 1-9 or a list like 1,2,9 (default 1-{N_MAX}; n <= {N_LIMIT})")
    p.add_argument("--batch", type=bounded(1, BATCH_LIMIT), default=1,
                   help=f"B sequences per pass (default 1): passes of B x n tokens, chosen ids up to U = N and "
                        f"recorded passes of B windows from B documents; bench.json's n is then B n (B <= "
                        f"{BATCH_LIMIT})")
    p.add_argument("--out", default="bench.json", help="results file (default bench.json)")
    p.add_argument("--reps", type=bounded(1, REPS_LIMIT), default=DEFAULT_REPS,
                   help=f"timed rounds, each over every pass size and kernel once (default {DEFAULT_REPS}, at most "
                        f"{REPS_LIMIT:,})")
    p.add_argument("--windows", type=bounded(1, SAMPLES_LIMIT), default=DEFAULT_WINDOWS,
                   help=f"recorded windows per layer and n (default {DEFAULT_WINDOWS}, at most {SAMPLES_LIMIT:,})")
    p.add_argument("--u-values", type=bounded(2, SAMPLES_LIMIT), default=DEFAULT_U_VALUES,
                   help=f"chosen U values per n, evenly spread with both ends (default {DEFAULT_U_VALUES}, at most "
                        f"{SAMPLES_LIMIT:,})")
    p.add_argument("--seed", type=seed, default=0, help="seed of weights, chosen ids and window sampling (default 0)")
    p.add_argument("--plot", metavar="FILE", help="save the paper's Figure 2 to FILE (.png/.pdf/.svg)")
    p.add_argument("--predict", metavar="DEVICE_JSON",
                   help="predict the times instead of timing them: the structural model on a device profile from "
                        "`moespec profile` (the formats the profile timed: our slot and dedup at bf16/fp32, ggml's "
                        "pair at q8_0/q4_0); bench.json then says predicted: true")
    p.add_argument("--ceiling", type=float, metavar="GBPS",
                   help="with --predict: the streaming-read ceiling to predict at, GB/s (default: the profile's)")
    p.add_argument("--probe", action="store_true",
                   help="with --predict: time the profile's self-check passes here first (~10 s, no model weights) and "
                        "predict at this host's state now: the ceiling their calls met and the loop's speed against "
                        "the profile's (bench.json prediction.probe)")
    p.add_argument("--call-ceilings", action="store_true",
                   help="sample the ceiling after every timed call too (bench.json round_ceiling_gbps: the state each "
                        "call met; one more streaming read a call), and each expert's placement against that "
                        "sample's buffer (bench.json placement: the read rate of the memory behind its weights)")
    add_level_flags(p)
    add_checkpoint_flags(p)


def run(args: argparse.Namespace) -> int:
    if args.plot:
        check_plot(args.plot)  # before any work
    layers = None if args.layers is None else tuple(parse_ints(args.layers, "--layers", 0, LAYERS_LIMIT - 1,
                                                                              "MoE layer indices"))
    dtype = args.dtype or default_dtype(args.model)
    config = BenchConfig(out=args.out, model=args.model, layers=layers, dtype=dtype, kernels=args.kernels,
                         n=tuple(parse_ints(args.n, "--n", 1, N_LIMIT, "pass sizes n")), trace=args.trace,
                         reps=args.reps,
                         windows=args.windows, u_values=args.u_values, seed=args.seed, device=args.device,
                         fresh=args.fresh, level_gbps=args.pin_gbps, level_wait_s=args.pin_wait, batch=args.batch,
                         call_ceilings=args.call_ceilings)
    if args.ceiling is not None and not args.predict:
        raise MoespecError("--ceiling is the ceiling of a prediction: give --predict DEVICE_JSON with it")
    if args.probe and not args.predict:
        raise MoespecError("--probe measures the state a prediction is made at: give --predict DEVICE_JSON with it")
    if args.call_ceilings and args.predict:
        raise MoespecError("--call-ceilings samples the ceiling after timed calls: a --predict bench times none")
    if args.predict and (args.pin_gbps is not None or args.pin_wait is not None):
        raise MoespecError("--pin-gbps/--pin-wait keep timed rounds at a level: a --predict bench times none (give the "
                           "level to predict at as --ceiling)")
    out = console()
    with writing(args.plot, flag="--plot"):  # locked until drawn
        if args.predict:
            bench = predict_bench(config, args.predict, args.ceiling, say=out.print, probe=args.probe)
        else:
            bench = run_bench(config, say=out.print)
        if args.plot:
            save_figure(bandwidth_figure(bench), args.plot)
    for table in bench_tables(bench):
        out.print(table)
    if not bench.get("predicted"):
        before, after = bench["ceiling_before_after_gbps"]
        out.print(f"ceiling: {bench['ceiling_kind']} {before:.1f} GB/s before the timing, {after:.1f} GB/s after")
    if line := describe_level(bench.get("level")):
        out.print(line)
    warnings = bench["prediction"]["profile_warnings"] if bench.get("predicted") else []
    for line in warnings + bench_checks(bench, args.out):  # too small to time, noisy: each with the setting to change
        out.print(Text.assemble(("warning: ", "bold red"), line))
    if bench.get("predicted"):
        stated = ", ".join(f"{k} {v:.1%}" for k, v in bench["prediction"]["error"].items())
        probed = bench["prediction"].get("probe")
        state = f"; the loop {probed['k']:.3f}x the profile's (probed on {probed['used']} check passes)" \
            if probed else ""
        out.print(f"predicted, not timed: at {bench['ceiling_gbps']:.1f} GB/s, stated error {stated} "
                  f"({bench['prediction']['error_source']}){state}")
    out.print(f"wrote {args.out}{' and ' + args.plot if args.plot else ''} in {bench['elapsed_s']:.0f} s")
    rounded = lambda values, digits: {k: round(v, digits) for k, v in values.items()}  # noqa: E731
    print(json.dumps({"model": bench["model"], "device_kind": bench["device_kind"], "dtype": bench["dtype"],
                      "ceiling_gbps": round(bench["ceiling_gbps"], 2),
                      "beta_gbps": {k: rounded(v["beta_gbps"], 2) for k, v in bench["kernels"].items()},
                      "r": rounded(bench["r"], 3), "u": rounded(bench["u"], 3), "eps": rounded(bench["eps"], 4),
                      "crossover": bench["crossover"], "noisy": noise_verdict(bench)[0],
                      "too_small": bench["too_small"]["flag"], "predicted": bool(bench.get("predicted")),
                      "out": args.out}))
    return 0

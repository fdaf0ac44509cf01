"""`moespec synth`: a synthetic routing trace from a stationary seeded process (moespec.routing.synth)."""

from __future__ import annotations

import argparse
import sys

from moespec import MoespecError
from moespec.cli.args import CHECKPOINT_FILES, bounded, seed
from moespec.defaults import MODEL, PROFILE, TOKENS_LIMIT
from moespec.formats.files import writing
from moespec.formats.trace import load_trace
from moespec.model.spec import resolve
from moespec.routing.synth import PROCESSES, describe, layer_targets, synthesize


# the path flags kept apart before any work (moespec.cli.args.check_paths)
OUTPUTS = ("--out",)
INPUTS = {"--model": CHECKPOINT_FILES, "--fit": ()}


# ---- command: moespec synth ----------------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=MODEL, help=f"model preset or config path (default {MODEL})")
    parser.add_argument("--process", default="calibrated", choices=PROCESSES,
                        help="routing process (default calibrated)")
    parser.add_argument("--profile", default=PROFILE, help=f"calibration targets (default {PROFILE})")
    parser.add_argument("--rho2", type=float, help="calibrated: target layer-mean rho(2) (overrides the profile)")
    parser.add_argument("--rho9", type=float, help="calibrated: target layer-mean rho(9) (overrides the profile)")
    parser.add_argument("--fit", metavar="TRACE",
                        help="calibrated: each MoE layer fitted to the rho(2), rho(9) of a recorded trace's layer at "
                             "the same relative depth (same N and m)")
    parser.add_argument("--tokens", type=bounded(1, TOKENS_LIMIT), default=100_000,
                        help=f"tokens in all (default 100000, at most {TOKENS_LIMIT:,})")
    parser.add_argument("--docs", type=bounded(1, TOKENS_LIMIT), default=50,
                        help=f"documents of equal length (default 50, at most {TOKENS_LIMIT:,} and --tokens); "
                             f"calibrated: time grows with their length")
    parser.add_argument("--seed", type=seed, default=0, help="random seed (default 0)")
    parser.add_argument("--out", required=True, help="trace file to write (.npz)")


def run(args: argparse.Namespace) -> int:
    if (args.rho2 is None) != (args.rho9 is None):
        raise MoespecError("--rho2 and --rho9 go together")
    if args.fit is not None and args.rho2 is not None:
        raise MoespecError("--fit and --rho2/--rho9 are two kinds of targets: give one")
    targets = None if args.rho2 is None else (args.rho2, args.rho9)
    with writing(args.out):  # checked before any work, locked until written
        if args.fit is not None:
            targets = layer_targets(load_trace(args.fit), resolve(args.model), args.fit)
        trace = synthesize(args.model, args.process, args.tokens, args.docs, args.seed, args.profile, targets,
                           show_progress=sys.stderr.isatty(), fitted_to=args.fit)
        trace.save(args.out)
    print(f"synthesized {trace.num_tokens} tokens in {trace.num_documents} documents of {trace.meta['model']} "
          f"routing ({describe(trace.meta)}) -> {args.out}")
    return 0

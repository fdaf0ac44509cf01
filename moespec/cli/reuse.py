"""`moespec reuse`: rho(n), U(n) and the expert bytes of a trace with bootstrap intervals (moespec.routing.reuse)."""

from __future__ import annotations

import argparse
import json
import sys

from rich.table import Table

from moespec import MoespecError
from moespec.cli.args import bounded, parse_ints, seed
from moespec.cluster import check_address
from moespec.console import console as console_
from moespec.defaults import BATCH_LIMIT, BOOTSTRAP_LIMIT, FORMAT, N_MAX, WINDOW_LIMIT
from moespec.formats.files import provenance, writing
from moespec.formats.trace import load_trace
from moespec.report.figures import check_plot, reuse_figure, save_figure
from moespec.routing.batch import BatchUnion, batch_union
from moespec.routing.reuse import (
    DEFAULT_BOOTSTRAP,
    DEFAULT_LEVEL,
    ReuseStats,
    reuse_stats,
    trace_expert_bytes,
    uniform_rho,
)
from moespec.routing.shards import reuse_files


# the path flags kept apart before any work (moespec.cli.args.check_paths)
OUTPUTS = ("--plot",)
INPUTS = {"TRACE": ()}


# ---- command: moespec reuse --------------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("trace", nargs="+", metavar="TRACE",
                        help="trace file(s) (.npz) from `moespec trace` or `moespec synth`; several files of one "
                             "model count as one trace of all their documents, in order")
    parser.add_argument("--n-max", type=bounded(1, WINDOW_LIMIT), default=N_MAX,
                        help=f"largest window n (default {N_MAX}, at most {WINDOW_LIMIT})")
    parser.add_argument("--bootstrap", type=bounded(0, BOOTSTRAP_LIMIT), default=DEFAULT_BOOTSTRAP,
                        help=f"bootstrap resamples over documents (default {DEFAULT_BOOTSTRAP}, at most "
                             f"{BOOTSTRAP_LIMIT:,}; 0: no intervals)")
    parser.add_argument("--seed", type=seed, default=0, help="bootstrap seed (default 0)")
    parser.add_argument("--level", type=float, default=DEFAULT_LEVEL, help="interval level (default 0.95)")
    parser.add_argument("--format", default=FORMAT,
                        help="expert weight format for the byte quantities when the trace names a model (default bf16)")
    parser.add_argument("--batch", metavar="B,..",
                        help=f"also the expert union U^B(n) and bytes of a pass of B sequences x n tokens, each "
                             f"sequence from its own document (e.g. 1,2,4,8; at most {BATCH_LIMIT})")
    parser.add_argument("--ray", metavar="ADDRESS",
                        help="count each trace file as a task on a Ray cluster: local (a Ray instance on this "
                             "machine), auto, HOST:PORT or ray://HOST:PORT (moespec.cluster; `pip install "
                             "'moespec[ray]'`); the result equals the single-process one")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--plot", metavar="FILE", help="save the paper's Figure 1 (rho vs n) to FILE (.png/.pdf/.svg)")


def run(args: argparse.Namespace) -> int:
    batches = parse_ints(args.batch, "--batch", 1, BATCH_LIMIT, "batch sizes") if args.batch is not None else []
    if batches and (len(args.trace) > 1 or args.ray):
        raise MoespecError("--batch reads one trace file in this process (without --ray)")
    if args.ray:
        check_address(args.ray)
    if args.plot:
        check_plot(args.plot)  # before any work
    with writing(args.plot, flag="--plot"):  # locked until drawn
        batch = None
        if len(args.trace) == 1 and not args.ray:
            trace = load_trace(args.trace[0])
            w, units = trace_expert_bytes(trace, args.format)
            stats = reuse_stats(trace, args.n_max, args.bootstrap, args.seed, args.level, expert_bytes=w,
                                units=units, show_progress=sys.stderr.isatty())
            meta = trace.meta
            batch = batch_union(trace, batches, args.n_max, w, args.bootstrap, args.seed, args.level,
                                show_progress=sys.stderr.isatty()) if batches else None
        else:
            stats, meta = reuse_files(args.trace, args.n_max, args.bootstrap, args.seed, args.level, args.format,
                                      args.ray)
        name = args.trace[0] if len(args.trace) == 1 else f"{args.trace[0]} and {len(args.trace) - 1} more"
        if args.plot:
            save_figure(reuse_figure(stats, label=str(meta.get("model") or name)), args.plot)
    if args.json:
        print(json.dumps({"trace": args.trace[0] if len(args.trace) == 1 else args.trace, "meta": meta,
                          **stats.to_json(), **(batch.to_json() if batch else {}), "provenance": provenance()}))
    else:
        print_summary(stats, meta, name)
        if batch:
            print_batch(batch, stats)
    return 0


def print_batch(batch: BatchUnion, stats: ReuseStats) -> None:
    """Per n and batch size: the layer mean of U^B(n) with its interval and the byte share u_B(n)."""
    table = Table(title="a pass of B sequences x n tokens, each sequence from its own document",
                  caption=f"U^B(n): layer mean of the expected union of B windows (N = {stats.num_experts}); "
                          f"u_B(n) = E_dedup^B / E_slot^B; {stats.level:.0%} bootstrap intervals")
    table.add_column("n", justify="right")
    for b in batch.batches:
        table.add_column(f"U^{b}(n)", justify="right")
        table.add_column(f"u_{b}(n)", justify="right")
    for n in range(1, batch.n_max + 1):
        cells = [str(n)]
        for b in batch.batches:
            lo, hi = batch.ci.get(b, {}).get("union_mean", (None, None))
            interval = f" [{lo[n]:.1f}, {hi[n]:.1f}]" if lo is not None else ""
            cells += [f"{batch.union_mean[b][n]:.2f}{interval}", f"{batch.u[b][n]:.3f}"]
        table.add_row(*cells)
    console_().print(table)


def print_summary(stats: ReuseStats, meta: dict, path: str) -> None:
    """A rich table: per n, the layer-mean reuse with its interval, the uniform value and the byte quantities."""
    kind = "synthetic" if meta.get("synthetic") else "recorded"
    about = f"{meta.get('process')} process" if meta.get("process") else str(meta.get("source") or "")
    in_bytes = stats.units.startswith("bytes")
    scale, unit = (1e9, " GB") if in_bytes else (1.0, "")
    table = Table(title=f"{path}: {kind} trace of {meta.get('model') or 'an unnamed model'} {about}".rstrip(),
                  caption=f"{stats.num_tokens:,} tokens in {stats.num_documents} documents, L={stats.num_layers}, "
                          f"N={stats.num_experts}, m={stats.m}; rho: layer mean with {stats.level:.0%} bootstrap "
                          f"interval ({stats.bootstrap} resamples); bytes in {stats.units}")
    for name in ("n", "rho(n)", "interval", "uniform", "U(n)", "u(n)", f"E_slot{unit}", f"E_dedup{unit}",
                 f"gap (3){unit}", "rho_bar_(n-1) (11)"):
        table.add_column(name, justify="right")
    uniform = uniform_rho(stats.n_max, stats.num_experts, stats.m)
    lo, hi = stats.ci.get("rho_mean", (None, None))
    for n in range(1, stats.n_max + 1):
        interval = f"[{lo[n]:.3f}, {hi[n]:.3f}]" if lo is not None else "-"
        rho_bar = f"{stats.rho_bar[n - 1]:.3f}" if n >= 2 else "-"
        table.add_row(str(n), f"{stats.rho_mean[n]:.3f}", interval, f"{uniform[n]:.3f}", f"{stats.union_mean[n]:.2f}",
                      f"{stats.u[n]:.3f}", f"{stats.E_slot[n] / scale:.4g}", f"{stats.E_dedup[n] / scale:.4g}",
                      f"{stats.gap[n] / scale:.4g}", rho_bar)
    console = console_()
    console.print(table)
    for n in sorted({2, stats.n_max}):
        if n <= stats.n_max:
            per_layer = stats.rho[:, n]
            console.print(f"rho_l({n}) over layers: min {per_layer.min():.3f} (layer {per_layer.argmin()}), "
                          f"max {per_layer.max():.3f} (layer {per_layer.argmax()})")
    if meta.get("calibrated_to"):
        console.print(f"calibrated to: {json.dumps(meta['calibrated_to'])}")

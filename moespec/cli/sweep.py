"""`moespec sweep`: a grid of models (presets, config.json or GGUF files), formats, depths, batch sizes, devices and
kernels through bench and plan (and a verify-only run where asked), locally or on a Ray cluster (moespec.sweep)."""

from __future__ import annotations

import argparse
import json

from rich.table import Table

from moespec.cluster import check_address
from moespec.console import console
from moespec.report.sweep import summary_table
from moespec.sweep import load_sweep, run_sweep

INPUTS = {"SWEEP": ()}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("sweep", metavar="SWEEP", help="the sweep file (TOML; its keys: moespec/sweep.py)")
    parser.add_argument("--out", help="the sweep's folder (default: the file's `out`, else sweep)")
    parser.add_argument("--ray", metavar="ADDRESS",
                        help="run the units on a Ray cluster: local, auto, HOST:PORT or ray://HOST:PORT; each bench "
                             "and run holds a whole node, traces and plans take one CPU and never share a node with "
                             "one (`pip install 'moespec[ray]'`)")
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON document")


def run(args: argparse.Namespace) -> int:
    if args.ray:
        check_address(args.ray)
    sweep = load_sweep(args.sweep, args.out)  # every key and cell checked before any work
    rows = run_sweep(sweep, args.ray)
    if args.json:
        print(json.dumps({"cells": rows}))
        return 0
    columns, body = summary_table(rows)
    t = Table(title=f"moespec sweep: {len(rows)} cells -> {sweep.out / 'summary.html'}")
    for name in columns:
        t.add_column(name, overflow="fold")
    for row in body:
        t.add_row(*row)
    console().print(t)
    return 0

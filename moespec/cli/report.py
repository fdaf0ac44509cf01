"""`moespec report DIR`: one self-contained HTML page of a job's artifacts (moespec.report.html)."""

from __future__ import annotations

import argparse

from moespec.report.folder import DEFAULT_NAME
from moespec.report.html import write_report


# ---- command -------------------------------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dir", metavar="DIR", help="folder of a job's artifacts (trace.npz, bench.json, plan.json, "
                                                   "runs.json, runs-verify.json, demo.json; any subset)")
    parser.add_argument("--out", help=f"the HTML file to write (default DIR/{DEFAULT_NAME})")


def run(args: argparse.Namespace) -> int:
    print(f"report -> {write_report(args.dir, args.out)}")
    return 0

"""`moespec report DIR`: one self-contained HTML page of a job's artifacts (moespec.report.html)."""

from __future__ import annotations

import argparse
from pathlib import Path

from moespec import MoespecError
from moespec.report.folder import ARTIFACTS, DEFAULT_NAME
from moespec.report.html import write_report


# the path flags kept apart before any work (moespec.cli.args.check_paths)
OUTPUTS = ("--out",)
INPUTS = {"DIR": tuple(ARTIFACTS)}  # the artifacts it reads in DIR


# ---- command -------------------------------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dir", metavar="DIR", help="folder of a job's artifacts (trace.npz, bench.json, plan.json, "
                                                   "runs.json, runs-verify.json, demo.json; any subset)")
    parser.add_argument("--out", help=f"the HTML file to write (default DIR/{DEFAULT_NAME})")


def run(args: argparse.Namespace) -> int:
    folder = Path(args.dir)
    if not folder.is_dir():  # before --out's default, DIR/report.html, is checked and named instead
        raise MoespecError(f"{folder}: {'not a folder' if folder.exists() else 'no such folder'}; give the folder of "
                           f"a job's artifacts")
    print(f"report -> {write_report(args.dir, args.out)}")
    return 0

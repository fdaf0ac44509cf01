"""What the scripts over stored runs of benchmarks/structure_model.py share (stream_share_pinned.py, loop_state.py):
their --runs check, their one-line main and one run's benches predicted again from given rates."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Callable

import structure_model
from moespec import MoespecError
from moespec.formats.benchfile import load_bench
from moespec.formats.devicefile import load_profile
from moespec.kernels.structure import Rates
from moespec.measure.level import pinned_of


def rows_of_run(run: Path, dtype: str, rates: dict[str, Rates],
                state: Callable[[Rates, float], Rates] | None = None) -> list[dict[str, Any]]:
    """The table rows (structure_model.table_rows) of one run's measured benches at `dtype`, every model it
    measured, predicted again from `rates` (kind -> Rates; with `state`, as structure_model.pass_errors takes it) at
    its profile's cache."""
    profile = load_profile(run / "device.json")
    rows = []
    for name in structure_model.MODELS:
        if not (structure_model.model_dir(run, name, dtype) / "errors.json").exists():
            continue
        config = structure_model.configs(name, run, dtype, (1,), profile["device_kind"], profile.get("level"))[1]
        bench = load_bench(config.out)
        errors = structure_model.pass_errors(config, bench, rates, profile["cache_bytes"], state)
        result = {"model": name, "dtype": dtype, "batches": {"1": {"ceiling_gbps": bench["ceiling_gbps"],
                                                                   "passes": errors}}}
        rows += structure_model.table_rows(result, pinned_of(profile.get("level")))
    return rows


def stored_runs(parser: argparse.ArgumentParser, text: str) -> list[Path]:
    """--runs of a script over stored runs: folders, comma-separated, each with device.json and table.json (else one
    line and exit 2)."""
    runs = [Path(r) for r in text.split(",") if r]
    bad = [str(r) for r in runs if not (r / "device.json").is_file() or not (r / "table.json").is_file()]
    if not runs or bad:
        parser.error(f"--runs: give runs' folders, each with device.json and table.json (not {', '.join(bad)})")
    return runs


def stored_main(doc: str, tables: Callable[[argparse.ArgumentParser, list[str]], int], argv: list[str]) -> int:
    """main() of a script over stored runs: tables(parser, argv), a file that does not load or an output that cannot
    be written ending in one line and exit 2."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    try:
        return tables(parser, argv)
    except MoespecError as e:
        parser.error(str(e))

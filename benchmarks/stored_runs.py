"""What the scripts over stored runs of benchmarks/structure_model.py share (stream_share_pinned.py, loop_state.py,
placement_share.py): their --runs check, their one-line main and one run's benches predicted again from given rates."""

from __future__ import annotations

import argparse
import json
import math
from functools import partial
from pathlib import Path
from typing import Any, Callable

import structure_model
from moespec import MoespecError
from moespec.formats.benchfile import load_bench
from moespec.formats.devicefile import load_profile
from moespec.formats.files import check_output
from moespec.kernels.structure import Rates
from moespec.measure.level import pinned_of


def rows_of_run(run: Path, dtype: str, rates: dict[str, Rates],
                state: Callable[[Rates, float], Rates] | None = None,
                view: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
                probed: bool = False) -> list[dict[str, Any]]:
    """The table rows (structure_model.table_rows) of one run's measured benches at `dtype`, every model and batch it
    measured, predicted again from `rates` (kind -> Rates; with `state`, as structure_model.pass_errors takes it) at
    its profile's cache; each bench as view(bench) gives it where `view` is given, and with `probed` at the loop
    factor the run's state probe gave that bench (errors.json loop_factor: as the run predicted it in place; none
    where it recorded none)."""
    profile = load_profile(run / "device.json")
    rows = []
    for name in structure_model.MODELS:
        path = structure_model.model_dir(run, name, dtype) / "errors.json"
        if not path.exists():
            continue
        recorded = json.loads(path.read_text())["batches"]
        batches = tuple(int(b) for b in recorded)
        result: dict[str, Any] = {"model": name, "dtype": dtype, "batches": {}}
        for batch, config in structure_model.configs(name, run, dtype, batches, profile["device_kind"],
                                                     profile.get("level")).items():
            bench = load_bench(config.out)
            k = recorded[str(batch)].get("loop_factor") if probed else None
            errors = structure_model.pass_errors(config, bench if view is None else view(bench), rates,
                                                 profile["cache_bytes"], state if k is None else partial(
                                                     _probed, state=state, k=k))
            result["batches"][str(batch)] = {"ceiling_gbps": bench["ceiling_gbps"], "passes": errors}
        rows += structure_model.table_rows(result, pinned_of(profile.get("level")))
    return rows


def _probed(rates: Rates, ceiling_gbps: float, state: Callable[[Rates, float], Rates] | None, k: float) -> Rates:
    """The rates a bench's state finds (`state`, None: `rates`) with the loop k times the profile's."""
    return (rates if state is None else state(rates, ceiling_gbps)).loop_scaled(k)


def stored_runs(parser: argparse.ArgumentParser, text: str) -> list[Path]:
    """--runs of a script over stored runs: folders, comma-separated, each with device.json and table.json and a name
    of its own (else one line and exit 2)."""
    runs = [Path(r) for r in text.split(",") if r]
    bad = [str(r) for r in runs if not (r / "device.json").is_file() or not (r / "table.json").is_file()]
    if not runs or bad:
        parser.error(f"--runs: give runs' folders, each with device.json and table.json (not {', '.join(bad)})")
    if len({r.name for r in runs}) < len(runs):  # each run's table is written under its folder's name
        parser.error(f"--runs: two runs share a folder name ({', '.join(str(r) for r in runs)})")
    return runs


def numbers_of(text: str) -> list[float]:
    """A script's list of values (--alphas, --betas): comma-separated numbers >= 0."""
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        values = []
    if not values or not all(math.isfinite(v) and v >= 0 for v in values):
        raise argparse.ArgumentTypeError(f"give comma-separated numbers >= 0, got {text!r}")
    return values


def variant_runs(parser: argparse.ArgumentParser, text: str, dtype: str, out: Path, name: str,
                 values: list[float]) -> tuple[dict[Path, Any], dict[float, Path]]:
    """The runs of --runs (stored_runs) with their profiles, each of which must have timed `dtype`, and the folder of
    each value, out/NAME-VALUE, every output there (each run's table.json, the summary) checked before any work."""
    runs = stored_runs(parser, text)
    profiles = {run: load_profile(run / "device.json") for run in runs}
    if missing := [str(run) for run, p in profiles.items() if dtype not in p["dtypes"]]:
        parser.error(f"--runs: the profiles of {', '.join(missing)} did not time {dtype}")
    folders = {value: out / f"{name}-{value:g}" for value in values}
    for folder in folders.values():
        for file in [f"{run.name}/table.json" for run in runs] + ["summary.json", "summary.md"]:
            check_output(folder / file)
    return profiles, folders


def stored_main(doc: str, tables: Callable[[argparse.ArgumentParser, list[str]], int], argv: list[str]) -> int:
    """main() of a script over stored runs: tables(parser, argv), a file that does not load or an output that cannot
    be written ending in one line and exit 2."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    try:
        return tables(parser, argv)
    except MoespecError as e:
        parser.error(str(e))

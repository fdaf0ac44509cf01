"""`moespec sweep SWEEP.toml`: a grid of models x formats x depths x batch sizes x devices x kernels through bench and
plan (and a verify-only engine run where asked), one folder per unit, locally or on a Ray cluster (moespec.cluster),
with one summary of the crossover and k_hat*(a) per cell.

SWEEP.toml (tomllib; every key is optional but grid.model, and an unknown key is refused in one line):
    out = "sweep"                   # the sweep's folder (--out overrides)
    steps = ["bench", "plan"]       # add "run" for a verify-only engine run per cell, which calibrates its plan
    [grid]                          # every combination is a cell
    model = ["olmoe-1b-7b"]         # presets or config.json paths
    format = ["bf16"]               # the experts' format: bf16, fp32, q8_0, q4_0 (run: bf16 or fp32)
    depth = [512]                   # context depth of the plan's key-value bytes (and of the run)
    batch = [1]                     # the plan's batch sizes (B > 1 needs "run", which measures them)
    device = ["cpu"]                # cpu or cuda
    kernels = ["slot,dedup"]        # the bench's kernels (a quantized format's default: ggml's pair)
    [trace]                         # the routing every cell of a model plans with: the calibrated process
    tokens = 50000, docs = 50, seed = 0  #   where the paper's profile has the model, else uniform iid
    [bench]                         # moespec.measure.bench.BenchConfig: reps, windows, u_values, layers, n
    [plan]                          # kmax, draft_time
    [run]                           # moespec.measure.run.RunConfig: layers, reps, max_reps, budget_s, n

Units and where they run. A trace per model; a bench per (model, format, device, kernels), shared by the depths and
batch sizes (the expert operation does not depend on them); a run per (model, format, depth, device, batch grid);
a plan per cell. Benches and runs time the machine: on Ray each is a task holding every CPU of a node (and a GPU on
cuda), so two timing units never share a machine; traces and plans take one CPU. A unit whose output exists is
done: a rerun resumes, and each bench and run checkpoints its own rounds inside. Without a run, the plan's
one-token pass tau1 is the pass's bytes (16) at the bench's streaming ceiling, the physical floor the plan then
adds the measured expert-operation growth to (22); the summary says which.
"""

from __future__ import annotations

import itertools
import re
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch

from moespec import MoespecError
from moespec.cluster import check_address, cluster_gpus, connected, node_cpus, tasks
from moespec.defaults import BATCH_LIMIT, DEPTH_LIMIT, KMAX_LIMIT
from moespec.formats.files import atomic_write, provenance, read_json, write_json
from moespec.formats.trace import load_trace
from moespec.measure.bench import BenchConfig, run_bench
from moespec.measure.run import RunConfig, run_engine
from moespec.model.gguf import resolve_model
from moespec.predict.plan import PlanConfig, make_plan
from moespec.report.markup import CSS, table
from moespec.routing.synth import PROFILES, synthesize

STEPS = ("bench", "plan", "run")
GRID = {"model": None, "format": ["bf16"], "depth": [512], "batch": [1], "device": ["cpu"], "kernels": [None]}
TRACE = {"tokens": 50_000, "docs": 50, "seed": 0}
SECTIONS = {"bench": ("reps", "windows", "u_values", "layers", "n"), "plan": ("kmax", "draft_time"),
            "run": ("layers", "reps", "max_reps", "budget_s", "n")}
TOP = ("out", "steps", "grid", "trace", *SECTIONS)
ACCEPTANCES = (0.5, 0.7, 0.8, 0.9)  # the summary's k_hat*(a) columns
PROFILE = "paper-wikitext"  # the calibrated process's targets: the paper's published reuse per model


@dataclass(frozen=True)
class Cell:
    """One combination of the grid: what its bench, run and plan are made of."""

    model: str
    format: str
    depth: int
    batch: tuple[int, ...]
    device: str
    kernels: str | None

    def slug(self, *keys: str) -> str:
        """A folder name of the named fields (all by default)."""
        values = [getattr(self, k) for k in (keys or [f.name for f in fields(self)])]
        parts = ["+".join(map(str, v)) if isinstance(v, tuple) else str(v or "default") for v in values]
        return re.sub(r"[^A-Za-z0-9_.,=-]+", "_", "-".join(p.replace(",", "+") for p in parts)).strip("_")


@dataclass(frozen=True)
class Sweep:
    """A checked sweep file: its folder, steps, cells, trace settings and each step's settings."""

    out: Path
    steps: tuple[str, ...]
    cells: list[Cell]
    trace: dict[str, int]
    settings: dict[str, dict[str, Any]]


def load_sweep(path: str, out: str | None = None) -> Sweep:
    """Read and check a SWEEP.toml (module docstring); one line naming the file and the problem."""
    try:
        doc = tomllib.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError) as e:
        raise MoespecError(f"{path}: cannot read it ({e})") from None
    except tomllib.TOMLDecodeError as e:
        raise MoespecError(f"{path}: not TOML ({e})") from None

    def known(table: dict, allowed: tuple, where: str) -> None:
        for key in table:
            if key not in allowed:
                raise MoespecError(f"{path}: {where}{key}: unknown key (known: {', '.join(allowed)})")

    known(doc, TOP, "")
    grid = doc.get("grid") or {}
    known(grid, tuple(GRID), "grid.")
    if not grid.get("model"):
        raise MoespecError(f"{path}: grid.model must list one or more models")
    values = {k: grid.get(k, default) for k, default in GRID.items()}
    for key, v in values.items():
        if not isinstance(v, list) or not v:
            raise MoespecError(f"{path}: grid.{key} must be a non-empty list")
    steps = tuple(doc.get("steps", ["bench", "plan"]))
    if not set(steps) <= set(STEPS) or "bench" not in steps or "plan" not in steps:
        raise MoespecError(f"{path}: steps must hold bench and plan, and may add run (got {list(steps)})")
    if any(b != 1 for b in values["batch"]) and "run" not in steps:
        raise MoespecError(f"{path}: grid.batch beyond 1 needs steps = [..., \"run\"] (the batch map stands on "
                           f"verify times measured at each B)")
    trace = dict(TRACE) | (doc.get("trace") or {})
    known(trace, tuple(TRACE), "trace.")
    settings = {name: doc.get(name) or {} for name in SECTIONS}
    for name, allowed in SECTIONS.items():
        known(settings[name], allowed, f"{name}.")
    cells = [Cell(m, f, d, tuple(sorted(set(values["batch"]))), dev, k)
             for m, f, d, dev, k in itertools.product(values["model"], values["format"], values["depth"],
                                                      values["device"], values["kernels"])]
    for key, kind in (("depth", int), ("batch", int), ("format", str), ("device", str), ("model", str)):
        if not all(isinstance(v, kind) and not isinstance(v, bool) for v in values[key]):
            raise MoespecError(f"{path}: grid.{key} must list {kind.__name__}s, got {values[key]!r}")
    for name, section in [*settings.items(), ("trace", trace)]:
        for key, v in section.items():
            if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (v if isinstance(v, list)
                                                                                       else [v])):
                raise MoespecError(f"{path}: {name}.{key} must be a number or a list of numbers, got {v!r}")
    for key, least, most in (("depth", 0, DEPTH_LIMIT), ("batch", 1, BATCH_LIMIT)):
        if not all(least <= v <= most for v in values[key]):
            raise MoespecError(f"{path}: grid.{key} must lie in {least}..{most:,}, got {values[key]}")
    kmax = settings["plan"].get("kmax", PlanConfig.kmax)
    if not isinstance(kmax, int) or not 1 <= kmax <= KMAX_LIMIT:
        raise MoespecError(f"{path}: plan.kmax must be a whole number in 1..{KMAX_LIMIT}, got {kmax!r}")
    for cell in cells:
        try:
            resolve_model(cell.model)  # a model moespec cannot read is refused before any work
        except (MoespecError, ValueError) as e:
            raise MoespecError(f"{path}: grid.model: {e}") from None
        if str(cell.model).endswith(".gguf"):
            raise MoespecError(f"{path}: grid.model {cell.model}: the sweep plans presets and config.json shapes "
                               f"(a GGUF's chain: moespec trace --gguf, bench, run --engine llama.cpp)")
        if "run" in steps and Path(cell.model).exists():
            raise MoespecError(f"{path}: steps run: the engine runs presets (random weights at real shapes), "
                               f"not {cell.model}")
        if cell.device not in ("cpu", "cuda"):
            raise MoespecError(f"{path}: grid.device {cell.device!r}: cpu or cuda")
    return Sweep(Path(out or doc.get("out", "sweep")), steps, cells, trace, settings)


def _trace_path(sweep: Sweep, cell: Cell) -> str:
    return str(sweep.out / "traces" / f"{cell.slug('model')}.npz")


def _trace_unit(sweep: Sweep, cell: Cell) -> None:
    """The model's routing: the calibrated process where the paper's profile has the model, else uniform iid."""
    path = Path(_trace_path(sweep, cell))
    if path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    process = "calibrated" if resolve_model(cell.model).name in PROFILES[PROFILE] else "uniform"
    synthesize(cell.model, process, sweep.trace["tokens"], sweep.trace["docs"], seed=sweep.trace["seed"],
               profile=PROFILE).save(path)


def _settings(sweep: Sweep, step: str) -> dict[str, Any]:
    """A step's settings as its config takes them (TOML lists as tuples)."""
    return {k: tuple(v) if isinstance(v, list) else v for k, v in sweep.settings[step].items()}


def bench_config(sweep: Sweep, cell: Cell) -> BenchConfig:
    return BenchConfig(out=str(sweep.out / "bench" / cell.slug("model", "format", "device", "kernels") / "bench.json"),
                       model=cell.model, dtype=cell.format, device=cell.device,
                       trace=_trace_path(sweep, cell),
                       **({"kernels": cell.kernels} if cell.kernels else {}), **_settings(sweep, "bench"))


def run_config(sweep: Sweep, cell: Cell) -> RunConfig:
    return RunConfig(out=str(sweep.out / "runs" / cell.slug("model", "format", "depth", "device", "batch") /
                             "runs-verify.json"), preset=cell.model, dtype=cell.format, device=cell.device,
                     depth=cell.depth, throughput=False, batch=cell.batch if cell.batch != (1,) else (),
                     replay=_trace_path(sweep, cell), **_settings(sweep, "run"))


def _timed_unit(kind: str, config: Any) -> str:
    """One bench or run (its own checkpoint resumes it); its output path."""
    if not Path(config.out).exists():
        Path(config.out).parent.mkdir(parents=True, exist_ok=True)
        (run_bench if kind == "bench" else run_engine)(config)
    return config.out


def _one_token_bytes_time(bench: dict[str, Any], cell: Cell, kmax: int) -> float:
    """tau1 without a run: the one-token pass's bytes (16) over the bench's streaming ceiling."""
    mW, D, kv = resolve_model(cell.model).byte_model(cell.format, cell.depth, kmax)
    return (D + mW + kv[0]) / (float(bench["ceiling_gbps"]) * 1e9)


def _plan_unit(sweep: Sweep, cell: Cell) -> dict[str, Any]:
    out = sweep.out / "cells" / cell.slug() / "plan.json"
    bench_path = bench_config(sweep, cell).out
    runs = run_config(sweep, cell).out if "run" in sweep.steps else None
    kmax = sweep.settings["plan"].get("kmax", PlanConfig.kmax)
    tau1 = None if runs else _one_token_bytes_time(read_json(bench_path, "bench"), cell, kmax)
    row = {**{f.name: getattr(cell, f.name) for f in fields(cell)}, "batch": list(cell.batch), "plan": str(out),
           "tau1_from": "the verify-only run" if runs else "bytes at the ceiling", "refused": None,
           "routing": load_trace(_trace_path(sweep, cell)).meta.get("process")}
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        try:
            make_plan(PlanConfig(bench=bench_path, trace=_trace_path(sweep, cell),
                                 tau1=tau1, runs=runs, kmax=kmax, depth=cell.depth, out=str(out),
                                 draft_time=str(sweep.settings["plan"].get("draft_time", PlanConfig.draft_time)),
                                 batch=cell.batch if runs else ()))
        except MoespecError as e:  # the cell's plan is refused (a bench too small to time, ...): said, not fatal
            return row | {"plan": None, "refused": str(e), "crossover": None, "tau1_s": tau1, "k_hat": {},
                          "speedup": {}, "b_stop": None}
    plan = read_json(out, "plan")
    table = {(r["policy"], round(r["a"], 6)): r for r in plan["table"]}
    return row | {"crossover": plan["crossover"], "tau1_s": plan["tau1_s"],
                  "k_hat": {str(a): table[("auto", a)]["k_hat"] for a in ACCEPTANCES if ("auto", a) in table},
                  "speedup": {str(a): table[("auto", a)]["speedup"] for a in ACCEPTANCES if ("auto", a) in table},
                  "b_stop": (plan.get("batch") or {}).get("b_stop")}


def run_sweep(sweep: Sweep, ray: str | None = None) -> list[dict[str, Any]]:
    """Every unit of the sweep, in this process or on the Ray cluster at `ray`; the summary rows, one per cell,
    also written to OUT/summary.json."""
    benches = {c.slug("model", "format", "device", "kernels"): c for c in sweep.cells}
    runs = {c.slug("model", "format", "depth", "device", "batch"): c for c in sweep.cells} if "run" in sweep.steps \
        else {}
    timed = [("bench", bench_config(sweep, c)) for c in benches.values()] + \
            [("run", run_config(sweep, c)) for c in runs.values()]
    for _, config in timed:
        config.check()
    if ray is None and any(c.device == "cuda" for c in sweep.cells) and not torch.cuda.is_available():
        raise MoespecError("a cell asks for device cuda and this machine has no GPU (--ray ADDRESS: a cluster's)")
    if ray is None:
        for c in sweep.cells:
            _trace_unit(sweep, c)
        for kind, config in timed:
            _timed_unit(kind, config)
    else:
        check_address(ray)
        with connected(ray) as cluster:
            if any(c.device == "cuda" for c in sweep.cells) and not cluster_gpus(cluster):
                raise MoespecError("a cell asks for device cuda and the Ray cluster has no GPU")
            for c in sweep.cells:
                _trace_unit(sweep, c)
            _timed_on(cluster, timed)
    rows = [_plan_unit(sweep, c) for c in sweep.cells]
    write_summary(sweep, rows)
    return rows


def _timed_on(ray: Any, timed: list[tuple[str, Any]]) -> None:
    """The timing units as Ray tasks, each holding a whole node (its CPUs, and a GPU on cuda)."""
    tasks(ray, _timed_unit, timed, num_cpus=node_cpus(ray), num_gpus=[int(c.device == "cuda") for _, c in timed])


def summary_table(rows: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """The summary's columns and rows: per cell its grid values, the crossover, k_hat*(a) of AUTO and tau1's source."""
    columns = ["model", "format", "depth", "batch", "device", "kernels", "routing", "crossover",
               *(f"k_hat*({a:g})" for a in ACCEPTANCES), "tau1 ms", "tau1 from"]
    body = [[Path(r["model"]).name, r["format"], str(r["depth"]), ",".join(map(str, r["batch"])), r["device"],
             r["kernels"] or "default", str(r["routing"]),
             f"refused: {r['refused']}" if r["refused"] else "none" if r["crossover"] is None else str(r["crossover"]),
             *(str(r["k_hat"].get(str(a), "-")) for a in ACCEPTANCES),
             "-" if r["tau1_s"] is None else f"{r['tau1_s'] * 1e3:.2f}", r["tau1_from"]]
            for r in rows]
    return columns, body


def write_summary(sweep: Sweep, rows: list[dict[str, Any]]) -> None:
    """OUT/summary.json (format moespec-sweep, version 1: cells [the summary rows of run_sweep], acceptances,
    provenance), summary.md (the table) and summary.html (the same as one self-contained page)."""
    columns, body = summary_table(rows)
    write_json(sweep.out / "summary.json", {"format": "moespec-sweep", "format_version": 1, "cells": rows,
                                            "acceptances": list(ACCEPTANCES), "provenance": provenance()})
    md = "\n".join(["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns),
                     *("| " + " | ".join(row) + " |" for row in body)]) + "\n"
    atomic_write(sweep.out / "summary.md", lambda tmp: tmp.write_text(md, encoding="utf-8"))
    page = (f"<!doctype html><meta charset='utf-8'><title>moespec sweep</title><style>{CSS}</style>"
            f"<h1>moespec sweep: {len(rows)} cells</h1>"
            + table(columns, body, "crossover: the smallest n from which the dedup kernel's predicted saving stays "
                    "positive; k_hat*(a): AUTO's best draft length at acceptance a (the plan's prediction)"))
    atomic_write(sweep.out / "summary.html", lambda tmp: tmp.write_text(page, encoding="utf-8"))

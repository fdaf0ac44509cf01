"""`moespec sweep SWEEP.toml`: a grid of models x formats x depths x batch sizes x devices x kernels through bench and
plan (and a verify-only engine run where asked), one folder per unit, locally or on a Ray cluster (moespec.cluster),
with one summary of the crossover and k_hat*(a) per cell (moespec.report.sweep).

SWEEP.toml (tomllib; every key is optional but grid.model, and an unknown key is refused in one line):
    out = "sweep"                   # the sweep's folder (--out overrides)
    steps = ["bench", "plan"]       # add "run" for a verify-only engine run per cell, which calibrates its plan
    [grid]                          # every combination is a cell
    model = ["olmoe-1b-7b"]         # presets, config.json paths or GGUF files (FILE.gguf)
    format = ["bf16"]               # the experts' format: bf16, fp32, q8_0, q4_0 (run: bf16 or fp32); a GGUF's is
                                    #   its file's (its experts' type; F32 is fp32, as llama.cpp's f32 is here),
                                    #   and a cell of another format is refused
    depth = [512]                   # context depth of the plan's key-value bytes (and of the run)
    batch = [1]                     # the plan's batch sizes (B > 1 needs "run", which measures them; presets only)
    device = ["cpu"]                # cpu or cuda (a GGUF's run: cpu)
    kernels = ["slot,dedup"]        # the bench's kernels (a quantized format's default: ggml's pair)
    [trace]                         # the routing every cell of a model plans with: a GGUF's traced by llama.cpp
    tokens = 50000                  #   on `text` (default moespec's sample text), at most `tokens` tokens; any
    docs = 50, seed = 0             #   other model's the calibrated process where the paper's profile has it,
    text = "corpus.txt"             #   else uniform iid, `tokens` in `docs` documents from `seed`
    [bench]                         # moespec.measure.bench.BenchConfig: reps, windows, u_values, layers, n, threads
    [plan]                          # kmax, draft_time
    [run]                           # moespec.measure.run.RunConfig: layers (a preset's), reps, max_reps, budget_s, n,
                                    #   threads (bench and run: default one per core of the machine the unit runs on)

Units. A trace per model; a bench per (model, format, device, kernels), shared by the depths and batch sizes (the
expert operation does not depend on them); a run per (model, format, depth, device, batch grid): moespec's engine on
a preset (random weights at its shapes, the trace's routing replayed), llama.cpp on a GGUF (`run --engine
llama.cpp`, its one kernel, dedup, at B = 1: its plan has no batch map); a plan per cell. A GGUF needs
llama-cpp-python: its routing is the model's own, read from llama.cpp's graph (moespec.routing.llama_tracer);
without the bindings a sweep of a GGUF is refused before any work, never planned on a stand-in routing that its
summary would show as the model's. A GGUF's trace runs on one thread, so it is the same bits wherever it runs. A
unit whose output exists is done: a rerun resumes, and each trace, bench and run checkpoints its own parts inside.
Without a run, the plan's one-token pass tau1 is the pass's bytes (16; a GGUF's: the file's) at the bench's
streaming ceiling, the physical floor the plan then adds the measured expert-operation growth to (22); the summary
says which.

Where they run. Locally, one after another in this process: the traces, the benches and runs, the plans. With --ray
traces and plans are Ray tasks of one CPU, and the driver deals out the benches and runs (moespec.cluster.
on_whole_nodes): each, once its model's trace is done, to a free node of its own, pinned there and asking for all of
that node's CPUs (and its GPU on cuda: only nodes with one take a cuda unit), and the node's next unit when it ends,
so every node times, whatever its size. Two timing units never share a node, and no trace or plan runs on a node
while one is timed there, by Ray's own accounting: a timing task holds all of its node's CPUs, so no one-CPU task is
placed there, and it starts only once every CPU there is free. A node lost mid-unit has the unit dealt to another. A
bench or run without `threads` times on one thread per core of the node it runs on, counted there when it starts
(moespec.measure.contention.on_own_cores), not on the driver's machine. A plan is submitted once its bench and run are
done, so a trace or plan of one model runs while another model is timed. The driver submits, deals and waits, and
writes the summary at the end. Traces and plans compute the same values wherever they run, so the summary equals the
local path's from the same timing units.
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
from moespec.cluster import WholeNode, check_address, cluster_gpus, connected, on_whole_nodes, results, submit
from moespec.defaults import BATCH_LIMIT, DEPTH_LIMIT, ENGINES, KMAX_LIMIT, SAMPLE_TEXT, TOKENS_LIMIT
from moespec.formats.files import check_input, read_json
from moespec.formats.trace import load_trace
from moespec.measure.bench import BenchConfig, run_bench
from moespec.measure.llama_run import run_llama_cpp
from moespec.measure.run import RunConfig, run_engine
from moespec.model.gguf import is_gguf, read_gguf, resolve_model
from moespec.model.llama_cpp import bindings
from moespec.model.weights import format_name
from moespec.predict.plan import PlanConfig, make_plan
from moespec.report.sweep import ACCEPTANCES, write_summary
from moespec.routing.synth import PROFILES, synthesize
from moespec.routing.tracer import TraceConfig, trace

STEPS = ("bench", "plan", "run")
GRID = {"model": None, "format": ["bf16"], "depth": [512], "batch": [1], "device": ["cpu"], "kernels": [None]}
TRACE = {"tokens": 50_000, "docs": 50, "seed": 0}
TEXT = "text"  # [trace]'s one string: the text a GGUF's routing is traced on
SECTIONS = {"bench": ("reps", "windows", "u_values", "layers", "n", "threads"), "plan": ("kmax", "draft_time"),
            "run": ("layers", "reps", "max_reps", "budget_s", "n", "threads")}
TOP = ("out", "steps", "grid", "trace", *SECTIONS)
PROFILE = "paper-wikitext"  # the calibrated process's targets: the paper's published reuse per model
GGUF_TRACE_THREADS = 1  # a GGUF's trace: one thread, the same bits on every node (and one Ray CPU)


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
    """A checked sweep file: its folder, steps, cells, trace settings, the text a GGUF is traced on and each step's
    settings."""

    out: Path
    steps: tuple[str, ...]
    cells: list[Cell]
    trace: dict[str, int]
    text: str
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
    routing = dict(TRACE) | (doc.get("trace") or {})
    known(routing, (*TRACE, TEXT), "trace.")
    text = routing.pop(TEXT, None)
    settings = {name: doc.get(name) or {} for name in SECTIONS}
    for name, allowed in SECTIONS.items():
        known(settings[name], allowed, f"{name}.")
    for key, kind in (("depth", int), ("batch", int), ("format", str), ("device", str), ("model", str)):
        if not all(isinstance(v, kind) and not isinstance(v, bool) for v in values[key]):
            raise MoespecError(f"{path}: grid.{key} must list {kind.__name__}s, got {values[key]!r}")
    formats = list(dict.fromkeys(format_name(f) for f in values["format"]))  # f32 is fp32 (one cell)
    cells = [Cell(m, f, d, tuple(sorted(set(values["batch"]))), dev, k)
             for m, f, d, dev, k in itertools.product(values["model"], formats, values["depth"],
                                                      values["device"], values["kernels"])]
    for name, section in [*settings.items(), ("trace", routing)]:
        for key, v in section.items():
            if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (v if isinstance(v, list)
                                                                                       else [v])):
                raise MoespecError(f"{path}: {name}.{key} must be a number or a list of numbers, got {v!r}")
    for key, least, most in (("depth", 0, DEPTH_LIMIT), ("batch", 1, BATCH_LIMIT)):
        if not all(least <= v <= most for v in values[key]):
            raise MoespecError(f"{path}: grid.{key} must lie in {least}..{most:,}, got {values[key]}")
    for key in ("tokens", "docs"):
        if not isinstance(routing[key], int) or not 1 <= routing[key] <= TOKENS_LIMIT:
            raise MoespecError(f"{path}: trace.{key} must be a whole number in 1..{TOKENS_LIMIT:,}, "
                               f"got {routing[key]!r}")
    kmax = settings["plan"].get("kmax", PlanConfig.kmax)
    if not isinstance(kmax, int) or not 1 <= kmax <= KMAX_LIMIT:
        raise MoespecError(f"{path}: plan.kmax must be a whole number in 1..{KMAX_LIMIT}, got {kmax!r}")
    for cell in cells:
        try:
            resolve_model(cell.model)  # a model moespec cannot read is refused before any work
        except (MoespecError, ValueError) as e:
            raise MoespecError(f"{path}: grid.model: {e}") from None
        if cell.device not in ("cpu", "cuda"):
            raise MoespecError(f"{path}: grid.device {cell.device!r}: cpu or cuda")
        if is_gguf(cell.model):
            _check_gguf(path, cell, steps)
        elif "run" in steps and Path(cell.model).exists():
            raise MoespecError(f"{path}: steps run: the engine runs presets (random weights at real shapes) and GGUF "
                               f"files (llama.cpp), not {cell.model}")
    if text is not None:
        if not any(is_gguf(c.model) for c in cells):
            raise MoespecError(f"{path}: trace.text: only a GGUF's routing is traced on a text, and grid.model "
                               f"lists none")
        if not isinstance(text, str):
            raise MoespecError(f"{path}: trace.text must be a file name, got {text!r}")
        try:
            check_input(text, "text")
        except MoespecError as e:
            raise MoespecError(f"{path}: trace.text: {e}") from None
    return Sweep(Path(out or doc.get("out", "sweep")), steps, cells, routing, text or str(SAMPLE_TEXT), settings)


def _check_gguf(path: str, cell: Cell, steps: tuple[str, ...]) -> None:
    """A GGUF cell, before any work: its format is the file's, its routing needs llama.cpp, and its run is
    llama.cpp's (one sequence per pass, on the CPU)."""
    where = f"{path}: cell {cell.slug()}"
    stored = read_gguf(cell.model).expert_format()
    if cell.format != stored:
        raise MoespecError(f"{where}: grid.format {cell.format}, but {cell.model} stores its experts as {stored} "
                           f"(a GGUF's format is its file's)")
    try:
        bindings()
    except MoespecError as e:
        raise MoespecError(f"{where}: a GGUF's routing is traced by llama.cpp: {e}") from None
    if "run" in steps and cell.device != "cpu":
        raise MoespecError(f"{where}: steps run: a GGUF runs on llama.cpp's CPU build, not on {cell.device}")
    if "run" in steps and cell.batch != (1,):
        raise MoespecError(f"{where}: steps run: llama.cpp's run measures one sequence per pass (grid.batch = [1])")


def _trace_path(sweep: Sweep, cell: Cell) -> str:
    return str(sweep.out / "traces" / f"{cell.slug('model')}.npz")


def _trace_unit(sweep: Sweep, cell: Cell) -> None:
    """The model's routing (module docstring): a GGUF's traced by llama.cpp on the sweep's text, else the calibrated
    process where the paper's profile has the model, else uniform iid."""
    path = Path(_trace_path(sweep, cell))
    if path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    if is_gguf(cell.model):
        trace(TraceConfig(model=None, gguf=cell.model, out=str(path), text=sweep.text,
                          max_tokens=sweep.trace["tokens"], threads=GGUF_TRACE_THREADS))
        return
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
    """The cell's verify-only run: moespec's engine on a preset replaying the trace, llama.cpp on a GGUF."""
    gguf = is_gguf(cell.model)
    return RunConfig(out=str(sweep.out / "runs" / cell.slug("model", "format", "depth", "device", "batch") /
                             "runs-verify.json"),
                     preset=None if gguf else cell.model, gguf=cell.model if gguf else None,
                     engine=ENGINES[1] if gguf else ENGINES[0], dtype=cell.format, device=cell.device,
                     depth=cell.depth, throughput=False, batch=cell.batch if cell.batch != (1,) else (),
                     replay=None if gguf else _trace_path(sweep, cell), **_settings(sweep, "run"))


def _timed_unit(kind: str, config: Any) -> str:
    """One bench or run (its own checkpoint resumes it); its output path."""
    if not Path(config.out).exists():
        Path(config.out).parent.mkdir(parents=True, exist_ok=True)
        if kind == "bench":
            run_bench(config)
        else:
            (run_engine if config.engine == ENGINES[0] else run_llama_cpp)(config)
    return config.out


def _units(sweep: Sweep) -> tuple[dict[str, Cell], dict[str, tuple[str, Any, Cell]]]:
    """The sweep's traces (by path: a cell of the model) and timing units (by output: kind, config, a cell of it)."""
    traces = {_trace_path(sweep, c): c for c in sweep.cells}
    timed: dict[str, tuple[str, Any, Cell]] = {}
    for c in sweep.cells:
        for kind, config in _timing(sweep, c):
            timed.setdefault(config.out, (kind, config, c))
    return traces, timed


def _timing(sweep: Sweep, cell: Cell) -> list[tuple[str, Any]]:
    """The timing units a cell's plan reads: its bench, and its run where the steps ask for one."""
    return [("bench", bench_config(sweep, cell))] + ([("run", run_config(sweep, cell))] if "run" in sweep.steps
                                                     else [])


def _one_token_bytes_time(bench: dict[str, Any], cell: Cell, kmax: int) -> float:
    """tau1 without a run: the one-token pass's bytes (16; a GGUF's as its file stores them) over the bench's
    streaming ceiling."""
    mW, D, kv = read_gguf(cell.model).byte_model(cell.depth, kmax) if is_gguf(cell.model) else \
        resolve_model(cell.model).byte_model(cell.format, cell.depth, kmax)
    return (D + mW + kv[0]) / (float(bench["ceiling_gbps"]) * 1e9)


def _plan_unit(sweep: Sweep, cell: Cell) -> dict[str, Any]:
    """The cell's plan (made once: a rerun reads it) and its summary row."""
    out = sweep.out / "cells" / cell.slug() / "plan.json"
    bench_path = bench_config(sweep, cell).out
    runs = run_config(sweep, cell).out if "run" in sweep.steps else None
    kmax = sweep.settings["plan"].get("kmax", PlanConfig.kmax)
    tau1 = None if runs else _one_token_bytes_time(read_json(bench_path, "bench"), cell, kmax)
    meta = load_trace(_trace_path(sweep, cell)).meta
    row = {**{f.name: getattr(cell, f.name) for f in fields(cell)}, "batch": list(cell.batch), "plan": str(out),
           "tau1_from": "the verify-only run" if runs else "bytes at the ceiling", "refused": None,
           "routing": "llama.cpp" if meta.get("gguf") else meta.get("process")}
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        try:  # the batch map reads the engine's runs at each B; llama.cpp's are at B = 1 of its one kernel
            make_plan(PlanConfig(bench=bench_path, trace=_trace_path(sweep, cell),
                                 tau1=tau1, runs=runs, kmax=kmax, depth=cell.depth, out=str(out),
                                 draft_time=str(sweep.settings["plan"].get("draft_time", PlanConfig.draft_time)),
                                 batch=cell.batch if runs and not is_gguf(cell.model) else ()))
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
    """Every unit of the sweep, in this process or on the Ray cluster at `ray` (module docstring); the summary rows,
    one per cell, also written to OUT/summary.json."""
    traces, timed = _units(sweep)
    for _, config, _ in timed.values():
        config.check()
    cuda = any(c.device == "cuda" for c in sweep.cells)
    if ray is None:
        if cuda and not torch.cuda.is_available():
            raise MoespecError("a cell asks for device cuda and this machine has no GPU (--ray ADDRESS: a cluster's)")
        for cell in traces.values():
            _trace_unit(sweep, cell)
        for kind, config, _ in timed.values():
            _timed_unit(kind, config)
        rows = [_plan_unit(sweep, c) for c in sweep.cells]
    else:
        check_address(ray)
        with connected(ray) as cluster:
            if cuda and not cluster_gpus(cluster):
                raise MoespecError("a cell asks for device cuda and the Ray cluster has no GPU")
            rows = _on_ray(cluster, sweep, traces, timed)
    write_summary(sweep.out, rows)
    return rows


def _on_ray(ray: Any, sweep: Sweep, traces: dict[str, Cell], timed: dict[str, tuple[str, Any, Cell]]) -> list[dict]:
    """The units on Ray (module docstring): traces and plans as tasks of one CPU, each timing unit dealt to a node of
    its own that it holds whole (and one with a GPU on cuda) once its model's trace is done, each plan submitted once
    its timing units are; the rows."""
    traced = {path: submit(ray, _trace_unit, (sweep, cell)) for path, cell in traces.items()}
    units = {_named(kind, out): WholeNode((kind, config), cell.device == "cuda",
                                          {f"the trace {_trace_path(sweep, cell)}": traced[_trace_path(sweep, cell)]})
             for out, (kind, config, cell) in timed.items()}
    left = {cell: {_named(kind, config.out) for kind, config in _timing(sweep, cell)} for cell in sweep.cells}
    plans = {}
    for name, _ in on_whole_nodes(ray, _timed_unit, units):
        for cell, names in left.items():
            names.discard(name)
            if not names and cell not in plans:
                plans[cell] = submit(ray, _plan_unit, (sweep, cell))
    return results(ray, [plans[c] for c in sweep.cells], "a plan")


def _named(kind: str, out: str) -> str:
    """A timing unit as a failure names it."""
    return f"the {kind} {out}"

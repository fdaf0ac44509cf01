"""`moespec demo`: the main job on the built-in default, what `make demo` runs (moespec.demo)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rich.table import Table

from moespec import theory
from moespec.cli.args import bounded, seed
from moespec.cli.plan import print_summary as print_plan
from moespec.cli.reuse import print_summary
from moespec.cli.run import report as report_runs
from moespec.cli.score import print_score
from moespec.console import console
from moespec.defaults import (
    DEPTH,
    DEPTH_LIMIT,
    FORMAT,
    KMAX,
    KMAX_LIMIT,
    LAYERS_LIMIT,
    MODEL,
    REPS_LIMIT,
    ROUTINGS,
    SAMPLES_LIMIT,
    TOKENS_LIMIT,
    TRACE_DOCS,
    TRACE_TOKENS,
)
from moespec.demo import (
    BENCH_REPS,
    DEFAULT_OUT_DIR,
    DRAFTING_PROMPTS,
    ENGINE_LAYERS,
    KERNEL_LABELS,
    DemoConfig,
    Quiet,
    demo,
)
from moespec.formats.benchfile import Bench
from moespec.formats.planfile import Plan
from moespec.formats.runsfile import Runs
from moespec.formats.trace import Trace
from moespec.predict.acceptance import UNNAMED_RATE
from moespec.predict.score import Score
from moespec.report.tables import bench_tables
from moespec.routing.reuse import ReuseStats


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=MODEL, help=f"model preset (default {MODEL})")
    p.add_argument("--format", default=FORMAT, help=f"weight format (default {FORMAT})")
    p.add_argument("--depth", type=bounded(0, DEPTH_LIMIT), default=DEPTH,
                   help=f"context depth d (default {DEPTH}, at most {DEPTH_LIMIT:,})")
    p.add_argument("--kmax", type=bounded(1, KMAX_LIMIT), default=KMAX,
                   help=f"largest draft length (default {KMAX}, at most {KMAX_LIMIT}; the engine steps take at most "
                        f"{KMAX})")
    p.add_argument("--tokens", type=bounded(1, TOKENS_LIMIT), default=TRACE_TOKENS,
                   help=f"trace tokens (default {TRACE_TOKENS}, at most {TOKENS_LIMIT:,})")
    p.add_argument("--docs", type=bounded(1, TOKENS_LIMIT), default=TRACE_DOCS,
                   help=f"trace documents (default {TRACE_DOCS}, at most {TOKENS_LIMIT:,})")
    p.add_argument("--seed", type=seed, default=0, help="seed of the synthetic routing (default 0)")
    p.add_argument("--out", default=DEFAULT_OUT_DIR,
                   help=f"folder for every artifact (trace, bench, plan, runs, report; default {DEFAULT_OUT_DIR}); "
                        f"a re-run with the same settings and code reuses what is there")
    p.add_argument("--bench-reps", type=bounded(0, REPS_LIMIT), default=BENCH_REPS,
                   help=f"repetitions of the short bench (default {BENCH_REPS}, at most {REPS_LIMIT:,}; 0 skips the "
                        f"measurement)")
    p.add_argument("--engine-layers", type=bounded(0, LAYERS_LIMIT), default=ENGINE_LAYERS,
                   help=f"layers of the engine's model (default {ENGINE_LAYERS}, at most {LAYERS_LIMIT:,}; 0 skips "
                        f"steps 4-6)")
    p.add_argument("--routing", default=ROUTINGS[0], choices=ROUTINGS,
                   help="synthetic (the calibrated process, default) or trained (the shipped trained pair's routing "
                        "on WikiText-2 test text, on the model's layers by relative depth; the process is reported "
                        "beside it)")
    p.add_argument("--drafting-prompts", type=bounded(0, SAMPLES_LIMIT), default=DRAFTING_PROMPTS,
                   help=f"prompts of the drafting step on the trained pair (default {DRAFTING_PROMPTS}; 0 skips it, "
                        f"as --bench-reps 0 does)")
    p.add_argument("--json", action="store_true", help="print one JSON document instead of tables")


def print_report(r: dict[str, Any]) -> None:
    c = console()
    b, s = r["bytes"], r["shape"]
    t = r["trace"]
    if t.get("synthetic_rho_mean"):
        mean = lambda rho, n: f"{rho[n]:.3f}"  # noqa: E731
        c.print(f"routing: {t['source']}; layer-mean rho(2) {mean(t['rho_mean'], 2)}, rho(9) "
                f"{mean(t['rho_mean'], 9)} (the calibrated process: {mean(t['synthetic_rho_mean'], 2)}, "
                f"{mean(t['synthetic_rho_mean'], 9)})")
    c.print(f"[bold]2. theory[/bold] on {r['model']} shapes (L={s['L']} MoE layers, N={s['N']}, m={s['m']}, "
            f"hidden {s['hidden']}, expert width {s['expert_width']}), {r['format']}, context depth {r['depth']}")
    c.print("[yellow]Theory on stated assumptions, not a measurement:[/yellow] " + "; ".join(r["assumptions"][:2]))
    c.print(f"bytes: w_l = {b['w_l'] / 1e6:.2f} MB, W = {b['W'] / 1e9:.3f} GB, mW = {b['mW'] / 1e9:.3f} GB, "
            f"D = {b['D'] / 1e9:.3f} GB, kv(0) = {b['kv0'] / 1e6:.1f} MB")
    names = list(KERNEL_LABELS)
    t = Table(title="step bytes V(k) in GB", title_justify="left")
    t.add_column("k", justify="right")
    for name in names:
        t.add_column(KERNEL_LABELS[name], justify="right")
    for k in range(r["kmax"] + 1):
        t.add_row(str(k), *[f"{r['kernels'][name]['step_bytes'][k] / 1e9:.3f}" for name in names])
    c.print(t)
    for name in names:
        pts = ", ".join(f"{p:.4f}" for p in r["kernels"][name]["step_points"])
        c.print(f"{KERNEL_LABELS[name]:>22}: a0 = {r['kernels'][name]['a0']:.4f}; "
                f"step points a_1..a_{r['kmax']} = {pts}")
    t = Table(title="staircases side by side: k*(a) and speedup (9)", title_justify="left")
    t.add_column("a", justify="right")
    for name in names:
        t.add_column(f"k* {KERNEL_LABELS[name]}", justify="right")
        t.add_column("speedup", justify="right")
    for i, a in enumerate(theory.PAPER_ACCEPTANCES):
        cells = []
        for name in names:
            row = r["kernels"][name]["table"][i]
            cells += [str(row["k_star"]), f"{row['speedup']:.3f}"]
        t.add_row(f"{float(a):g}", *cells)
    c.print(t)
    t = Table(title="reuse threshold rho*_k(a) (16): dedup at k beats plain decoding exactly when rho_bar_k > rho*_k(a)"
                    "; u = uniform routing beats it, t = traced routing beats it", title_justify="left")
    t.add_column("a", justify="right")
    for k in range(1, r["kmax"] + 1):
        t.add_column(f"k={k}", justify="right")
    rb_u, rb_t = r["rho_bar"]["uniform"], r["rho_bar"]["trace"]
    t.add_row("rho_bar_k uniform", *[f"{x:.3f}" for x in rb_u])
    t.add_row("rho_bar_k traced", *[f"{x:.3f}" for x in rb_t])
    for row in r["reuse_threshold"]:
        cells = [f"{x:+.3f} {'u' if u > x else ' '}{'t' if tr > x else ' '}"
                 for x, u, tr in zip(row["rho_star"], rb_u, rb_t)]
        t.add_row(f"{row['a']:g}", *cells)
    c.print(t)


def print_engine_summary(engine: dict[str, Any], bench: dict[str, Any]) -> None:
    """The closing summary: crossover, r(n), best k per acceptance, measured vs predicted speedup, verdicts."""
    c = console()
    r = ", ".join(f"{v:.2f}" for v in bench["r"].values())
    c.print(f"[bold]summary[/bold]: crossover from the bench n = {bench['crossover']}, predicted n = "
            f"{engine['crossover_predicted']}, measured n = {engine['crossover_measured']}; r(1..9) = {r}")
    versions = list(engine["rules_hold"])
    t = Table(title=f"AUTO policy per acceptance: best draft length and speedup, measured vs plan "
                    f"({' / '.join(versions)}, band (21))", title_justify="left")
    for col in ("a", "k measured", "k_hat " + " / ".join(versions), "speedup measured",
                *(f"{v} [band]" for v in versions)):
        t.add_column(col, justify="right")
    band = lambda s: f"{s[0]:.2f}" + ("" if s[1] is None else f" [{s[1]:.2f}, {s[2]:.2f}]")  # noqa: E731
    for a, row in engine["auto"].items():
        t.add_row(a, str(row["k_measured"]), " / ".join(str(row[f"k_{v}"]) for v in versions),
                  f"{row['speedup_measured']:.2f}", *(band(row[f"speedup_{v}"]) for v in versions))
    c.print(t)
    for version, names in engine["rules_hold"].items():
        c.print(f"scoring rules holding, {version}: {len(names)} of 6 ({', '.join(names) or 'none'})")
    rate = engine.get("throughput_rate", UNNAMED_RATE)  # demos before the plan named its rate
    c.print(f"throughput scored (rules 2, 3, 6): the {rate} rate"
            + (", G_a(k) over the median step time: the demo's cells are too short to count tokens by"
               if rate == "computed" else ""))
    batch = engine.get("batch")
    if batch:  # absent in demos made before the batch map
        predicted = batch.get("k_hat_predicted") or {}
        t = Table(title="batch map: k_hat*(a, B) from verify times measured at each B [predicted from the bench]; "
                        "B_stop: no draft pays from this B on", title_justify="left")
        for col in ("a", *(f"B = {b}" for b in batch["batches"]), "B_stop"):
            t.add_column(col, justify="right")
        for i, a in enumerate(batch["acceptances"]):
            stop = batch["b_stop"][i]
            t.add_row(f"{a:g}", *(str(batch["k_hat"][str(b)][i]) + (f" [{predicted[str(b)][i]}]" if predicted else "")
                                  for b in batch["batches"]), "-" if stop is None else str(stop))
        c.print(t)
    c.print(f"pre-registered: {'yes' if engine['pre_registered'] else 'no'}; report: {engine['report']}")


class Printed:
    """The demo's DemoView on the terminal: each step's tables, as its own command prints them."""

    def __init__(self) -> None:
        self.out = console()

    def say(self, text: str) -> None:
        self.out.print(text)

    def routing(self, stats: ReuseStats, trace: Trace, path: str) -> None:
        print_summary(stats, trace.meta, path)

    def theory(self, result: dict[str, Any]) -> None:
        print_report(result)

    def bench(self, bench: Bench) -> None:
        for table in bench_tables(bench):
            self.out.print(table)

    def runs(self, runs: Runs) -> None:
        report_runs(runs, str(runs.path), self.out)

    def plan(self, plan: Plan) -> None:
        print_plan(plan, plan.path)

    def score(self, score: Score) -> None:
        print_score(score)

    def drafting(self, found: dict[str, Any]) -> None:
        t = Table(title=f"drafting on the trained pair ({found['prompts']} prompts sampled from the target, "
                        f"{found['tokens']} tokens each): tokens/s and the share of the best constant k")
        for col in ("cell", "tokens/s", "/ best constant", "replayed / best", "mean k", "greedy = plain"):
            t.add_column(col, justify="right")
        replay = found.get("replay", {})
        for cell, row in found["cells"].items():
            t.add_row(cell, f"{row['tokens_per_s']:.1f}", f"{row['vs_best_constant']:.3f}",
                      f"{replay[cell]:.3f}" if cell in replay else "-",
                      "-" if row["mean_k"] is None else f"{row['mean_k']:.2f}", "yes" if row["greedy_exact"] else "NO")
        self.out.print(t)
        profile = ", ".join(f"{a:.2f}" for a in found["profile_calibration"])
        self.out.print(f"acceptance profile a_1..a_{len(found['profile_calibration'])} (calibration prompts): "
                       f"{profile}; the plan's k_hat from it: {found['k_hat_plan']}, the best constant k measured: "
                       f"{found['best_constant_k']}")


def run(args: argparse.Namespace) -> int:
    config = DemoConfig(model=args.model, format=args.format, depth=args.depth, kmax=args.kmax, tokens=args.tokens,
                        docs=args.docs, seed=args.seed, out=args.out, bench_reps=args.bench_reps,
                        engine_layers=args.engine_layers, routing=args.routing, drafting=args.drafting_prompts)
    result = demo(config, Quiet() if args.json else Printed())
    if args.json:
        print(json.dumps(result))
        return 0
    if "engine" in result:
        print_engine_summary(result["engine"], result["bench"])
    console().print(f"results: {Path(args.out) / 'demo.json'}")
    return 0

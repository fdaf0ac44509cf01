"""`moespec demo`: the main job on the built-in default (what `make demo` runs).

The built-in default is OLMoE-1B-7B's shape (16 MoE layers, N = 64 experts, top m = 8, expert width 1024,
hidden 2048) in bf16 at context depth 512, with routing from the calibrated `paper-wikitext` OLMoE profile
(a synthetic stationary process whose layer-mean reuse hits the paper's rho(2) = 0.363 and rho(9) = 0.762).

1. Routing: synthesize the default trace and print its reuse summary (rho(n), U(n), u(n), bytes; App. D.2).
2. Theory ON STATED ASSUMPTIONS (this step times nothing; step 3 measures):
   - one bandwidth for every byte and no fixed work, so a step time is its bytes (any common bandwidth
     divides every V(k) alike and leaves k*(a) and every speedup unchanged, Section 3.5);
   - per-slot kernel: a step drafting k tokens reads D(k+1) + m (k+1) W + kv(k) bytes, linear in k+1;
   - deduplicating kernel: D(k+1) + E_dedup(k+1) + kv(k) with E_dedup(k+1) = mW + mWk(1 - rho_bar_k) (12),
     once under uniform iid routing (1 - rho(n) = q^(n-1), q = 1 - m/N) and once with the trace's rho_bar_k.
   It prints the staircases side by side (k*(a), speedup (9), step points (B.31)) and the reuse threshold
   rho*_k(a) of (16) against the drafted reuse rho_bar_k (11) of uniform and of the traced routing.
3. Measurement: a short bench of one MoE layer's expert operation with our per-slot and deduplicating kernels on
   this machine (`moespec bench` with fewer repetitions), which replaces the one-bandwidth assumption by the
   measured bandwidth ratio r(n): dedup is faster where u(n) < r(n) (7), and the crossover is printed.
4. Engine: verify times tau_p(n) of a shape-faithful model (2 of the 16 layers, random weights, the trace's
   routing replayed) with dedup off and on (`moespec run --no-throughput`).
5. Plan: (22) from the bench and the trace, calibrated by the measured verify times; the AUTO kernel per n,
   k_hat*(a) and the speedup band (21) (`moespec plan`).
6. Engine with the plan on a reduced grid (slot, dedup, AUTO; k = 0..8; a = 0.4, 0.6, 0.8, 0.9) and the six
   scoring rules (`moespec run --plan`, `moespec score`): the plan is written before that run, so pre-registered.
7. Report: `moespec report` writes report.html (Figures 1, 2, 4, 5, the staircases, Tables 1, 3, 8) from them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from fractions import Fraction
from typing import Any

from pathlib import Path

from moespec import MoespecError, theory
from moespec.benchfile import DTYPES
from moespec.io import console, provenance, write_json
from moespec.reuse import print_summary, reuse_stats, trace_expert_bytes
from moespec.spec import ModelSpec
from moespec.synth import synthesize

DEFAULT_MODEL = "olmoe-1b-7b"
DEFAULT_FORMAT = "bf16"
DEFAULT_DEPTH = 512  # the paper's shorter context depth (Section 4)
DEFAULT_KMAX = 8  # the paper verifies up to 9 tokens per pass
# 50k tokens in 50 documents: bootstrap intervals of rho(n) narrower than 0.01, synthesized in about a second.
DEFAULT_TOKENS, DEFAULT_DOCS = 50_000, 50
DEFAULT_OUT_DIR = "out/demo"
STEPS_FILE = "demo-steps.json"  # the measuring steps finished in the output folder, with the settings they used
# The short bench: one middle MoE layer, 3 repetitions, 8 windows and 4 chosen U per n: about 30 s here.
BENCH_LAYER, BENCH_REPS, BENCH_WINDOWS, BENCH_U_VALUES = 7, 3, 8, 4
# The engine steps: 2 of OLMoE's 16 layers at full shape (1.6 GB of bf16 experts, ~10 s to build here), 3 verify
# samples per kernel and n, and a reduced throughput grid: every k = 0..8 (the score needs the plan's k_hat*
# measured) at 4 acceptances, one prompt of 16 tokens per cell: ~2 min here.
ENGINE_LAYERS, ENGINE_REPS, ENGINE_TOKENS = 2, 3, 16
ENGINE_A = "0.4,0.6,0.8,0.9"
KERNEL_LABELS = {"slot": "slot", "dedup_uniform": "dedup, uniform routing", "dedup_trace": "dedup, traced routing"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=DEFAULT_MODEL, help=f"model preset (default {DEFAULT_MODEL})")
    p.add_argument("--format", default=DEFAULT_FORMAT, help=f"weight format (default {DEFAULT_FORMAT})")
    p.add_argument("--depth", type=int, default=DEFAULT_DEPTH, help=f"context depth d (default {DEFAULT_DEPTH})")
    p.add_argument("--kmax", type=int, default=DEFAULT_KMAX, help=f"largest draft length (default {DEFAULT_KMAX})")
    p.add_argument("--tokens", type=int, default=DEFAULT_TOKENS, help=f"trace tokens (default {DEFAULT_TOKENS})")
    p.add_argument("--docs", type=int, default=DEFAULT_DOCS, help=f"trace documents (default {DEFAULT_DOCS})")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic routing (default 0)")
    p.add_argument("--out", default=DEFAULT_OUT_DIR,
                   help=f"folder for every artifact (trace, bench, plan, runs, report; default {DEFAULT_OUT_DIR}); "
                        f"a re-run with the same settings reuses what is there")
    p.add_argument("--bench-reps", type=int, default=BENCH_REPS,
                   help=f"repetitions of the short bench (default {BENCH_REPS}; 0 skips the measurement)")
    p.add_argument("--engine-layers", type=int, default=ENGINE_LAYERS,
                   help=f"layers of the engine's model (default {ENGINE_LAYERS}; 0 skips steps 4-6)")
    p.add_argument("--json", action="store_true", help="print one JSON document instead of tables")


def byte_profile(spec: ModelSpec, fmt: str, depth: int, rho: list[list], kmax: int) -> dict[str, Any]:
    """Byte step times of both kernels under one bandwidth, for per-layer reuse rho[l][n] (index n, n <= kmax+1)."""
    w = [spec.expert_bytes(layer, fmt) for layer in range(spec.L)]
    mW, D, kv = spec.byte_model(fmt, depth, kmax)
    rho_bars = [theory.mean_drafted_reuse(rho, w, k) for k in range(1, kmax + 1)]
    return {"w": w, "W": sum(w), "mW": mW, "D": D, "kv": kv, "rho_bars": rho_bars,
            "V_slot": [D + mW * (k + 1) + kv[k] for k in range(kmax + 1)],
            "V_dedup": theory.byte_step_times(mW, D, kv, rho_bars)}


def uniform_rho(spec: ModelSpec, kmax: int) -> list[list]:
    """Exact rho_l(n) = 1 - q^(n-1), q = 1 - m/N, of uniform iid routing, every layer alike."""
    q = 1 - Fraction(spec.m, spec.N)
    return [[None] + [1 - q ** (n - 1) for n in range(1, kmax + 2)] for _ in range(spec.L)]


def kernel_summary(V: list) -> dict[str, Any]:
    points = theory.step_points(V)
    return {"step_bytes": [int(v) for v in V], "a0": float(theory.first_draft_threshold(V)),
            "step_points": [float(p) for p in points],
            "table": [{"a": float(a), "k_star": (k := theory.best_draft_length(V, a)),
                       "speedup": float(theory.speedup(V, a, k))} for a in theory.PAPER_ACCEPTANCES]}


def run_demo(model: str, fmt: str, depth: int, kmax: int, tokens: int, docs: int, seed: int,
             out_dir: Path) -> tuple[dict[str, Any], Any, Any]:
    """Synthesize the default trace, measure its reuse, and apply the theory; returns (result, trace, stats)."""
    spec = ModelSpec.from_name(model)
    trace = synthesize(model, "calibrated", tokens, docs, seed=seed, profile="paper-wikitext")
    trace.save(out_dir / "trace.npz")
    w, units = trace_expert_bytes(trace, fmt)
    stats = reuse_stats(trace, kmax + 1, expert_bytes=w, units=units, seed=seed)
    traced = [[None, *row[1:]] for row in stats.rho.tolist()]
    uniform = byte_profile(spec, fmt, depth, uniform_rho(spec, kmax), kmax)
    routed = byte_profile(spec, fmt, depth, traced, kmax)
    kernels = {"slot": kernel_summary(uniform["V_slot"]), "dedup_uniform": kernel_summary(uniform["V_dedup"]),
               "dedup_trace": kernel_summary(routed["V_dedup"])}
    D0, mW = uniform["D"], uniform["mW"]  # reuse threshold (16) in the same byte model
    thresholds = [{"a": float(a), "rho_star": [float(theory.reuse_threshold_bytes(a, k, mW, D0, uniform["kv"]))
                                              for k in range(1, kmax + 1)]} for a in theory.PAPER_ACCEPTANCES]
    result = {
        "model": spec.name, "format": fmt, "depth": depth, "kmax": kmax,
        "trace": {"path": str(out_dir / "trace.npz"), "tokens": trace.num_tokens, "documents": trace.num_documents,
                  "calibrated_to": trace.meta.get("calibrated_to"),
                  "rho_mean": stats.rho_mean.tolist(), "u": stats.u.tolist()},
        "assumptions": ["one bandwidth for every byte, no fixed work: step time = bytes",
                        "per-slot bytes m(k+1)W; dedup bytes from uniform routing and from the synthetic trace",
                        "theory on stated assumptions, not a measurement"],
        "shape": {"L": spec.L, "N": spec.N, "m": spec.m, "hidden": spec.hidden, "expert_width": spec.expert_width},
        "bytes": {"w_l": uniform["w"][0], "W": uniform["W"], "mW": mW, "D": D0, "kv0": uniform["kv"][0]},
        "kernels": kernels,
        "rho_bar": {"uniform": [float(x) for x in uniform["rho_bars"]],
                    "trace": [float(x) for x in routed["rho_bars"]]},
        "reuse_threshold": thresholds,
    }
    return result, trace, stats


def print_report(r: dict[str, Any]) -> None:
    from rich.table import Table

    c = console()
    b, s = r["bytes"], r["shape"]
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
        c.print(f"{KERNEL_LABELS[name]:>22}: a0 = {r['kernels'][name]['a0']:.4f}; step points a_1..a_{r['kmax']} = {pts}")
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


class Steps:
    """Which measuring steps already finished in the output folder with these settings (STEPS_FILE), so a re-run
    resumes from the artifacts there; other settings start over (their interrupted checkpoints removed)."""

    def __init__(self, out_dir: Path, settings: dict[str, Any], say: Any) -> None:
        self.path, self.settings, self.say = out_dir / STEPS_FILE, settings, say
        try:
            saved = json.loads(self.path.read_text())
        except (OSError, ValueError):
            saved = {}
        same = isinstance(saved, dict) and saved.get("settings") == settings
        self.done: list[str] = list(saved.get("done", [])) if same else []
        if not same:
            for partial in out_dir.glob("*.partial"):
                partial.unlink()

    def run(self, artifact: Path, step: Any) -> None:
        """step() unless it already wrote `artifact` with these settings."""
        if artifact.name in self.done and artifact.exists():
            self.say(f"reusing {artifact} (same settings; delete it to measure again)")
            return
        step()
        self.done.append(artifact.name)
        write_json(self.path, {"settings": self.settings, "done": self.done})


def command(name: str, argv: list[str], quiet: bool) -> None:
    """Run `moespec NAME ARGV` through the same code a user runs (its output to stderr when quiet)."""
    import importlib

    module = importlib.import_module(f"moespec.{name}")
    parser = argparse.ArgumentParser(prog=f"moespec {name}")
    module.add_arguments(parser)
    with contextlib.redirect_stdout(sys.stderr if quiet else sys.stdout):
        module.run(parser.parse_args(argv))


def run_bench(model: str, fmt: str, out_dir: Path, reps: int, quiet: bool, steps: Steps) -> dict[str, Any]:
    """Step 3: the short bench; returns the bench document."""
    from moespec.benchfile import load_bench

    spec = ModelSpec.from_name(model)
    steps.run(out_dir / "bench.json", lambda: command(
        "bench", ["--model", model, "--layers", str(min(BENCH_LAYER, spec.L - 1)), "--dtype", fmt,
                  "--trace", str(out_dir / "trace.npz"), "--out", str(out_dir / "bench.json"),
                  "--reps", str(reps), "--windows", str(BENCH_WINDOWS), "--u-values", str(BENCH_U_VALUES),
                  "--plot", str(out_dir / "fig2.png"), "--resume"], quiet))
    return load_bench(out_dir / "bench.json")


def run_engine(model: str, fmt: str, depth: int, kmax: int, out_dir: Path, layers: int, quiet: bool,
               steps: Steps) -> dict[str, Any]:
    """Steps 4-7: verify times on a shape-faithful model, the plan from them, the engine with the plan, the score.

    The engine replays the trace's routing (random weights route like uniform iid); the plan is written before
    the run it is scored against, so the score is pre-registered."""
    trace, engine_args = str(out_dir / "trace.npz"), ["--preset", model, "--layers", str(layers), "--dtype", fmt,
                                                       "--depth", str(depth), "--reps", str(ENGINE_REPS),
                                                       "--resume"]
    say = (lambda text: None) if quiet else console().print
    say(f"[bold]4. engine[/bold]: verify times of {model} with {layers} of its layers at full shape, random "
        f"weights, the trace's routing replayed")
    steps.run(out_dir / "runs-verify.json", lambda: command(
        "run", [*engine_args, "--no-throughput", "--replay", trace, "--out", str(out_dir / "runs-verify.json")], quiet))
    say("[bold]5. plan[/bold]: the bench's bandwidths, the trace's bytes and the measured one-token time")
    steps.run(out_dir / "plan.json", lambda: command(
        "plan", ["--bench", str(out_dir / "bench.json"), "--trace", trace, "--runs", str(out_dir / "runs-verify.json"),
                 "--kmax", str(kmax), "--out", str(out_dir / "plan.json")], quiet))
    say("[bold]6. engine with the plan[/bold]: slot, dedup and AUTO on a reduced grid, then the score")
    steps.run(out_dir / "runs.json", lambda: command(
        "run", [*engine_args, "--plan", str(out_dir / "plan.json"), "--k", f"0-{kmax}", "--a", ENGINE_A,
                "--prompts", "1", "--tokens", str(ENGINE_TOKENS), "--replay", trace,
                "--out", str(out_dir / "runs.json")],
        quiet))
    for version in ("prediction", "calibrated"):
        command("score", ["--plan", str(out_dir / "plan.json"), "--runs", str(out_dir / "runs.json"), "--version",
                          version], quiet)
    say("[bold]7. report[/bold]: every figure and table from the artifacts in one self-contained page")
    command("report", [str(out_dir)], quiet)
    return engine_summary(out_dir)


def engine_summary(out_dir: Path) -> dict[str, Any]:
    """What the engine steps found: crossovers, AUTO's best draft length and speedup per acceptance measured beside
    the plan's prediction and calibration, and the six verdicts of each version."""
    from moespec.score import score_files

    runs = json.loads((out_dir / "runs.json").read_text())
    plan = json.loads((out_dir / "plan.json").read_text())
    rows = [r for r in runs["throughput"] if r["policy"] == "auto"]
    per_a = {}
    for a in sorted({r["a"] for r in rows}):
        T = {r["k"]: r["tokens_per_s"] for r in rows if r["a"] == a}
        best = max(T, key=lambda k: (T[k], -k))
        planned = {v: next(r for r in plan[t] if r["policy"] == "auto" and abs(r["a"] - a) < 1e-9)
                   for v, t in (("prediction", "table"), ("calibrated", "table_calibrated"))}
        per_a[str(a)] = {"k_measured": best, "speedup_measured": T[best] / T[0],
                         **{f"k_{v}": row["k_hat"] for v, row in planned.items()},
                         **{f"speedup_{v}": [row["speedup"], row["speedup_lo"], row["speedup_hi"]]
                            for v, row in planned.items()}}
    scores = {v: score_files(str(out_dir / "plan.json"), str(out_dir / "runs.json"), v) for v in
              ("prediction", "calibrated")}
    return {"runs": str(out_dir / "runs.json"), "plan": str(out_dir / "plan.json"),
            "report": str(out_dir / "report.html"), "crossover_predicted": plan["crossover"],
            "crossover_measured": runs["crossover"], "greedy_match": runs["greedy_match"],
            "greedy_exact": runs["greedy_exact"], "verify_time_s": runs["verify_time_s"],
            "auto_ratio": runs["auto_ratio"], "auto": per_a,
            "rules_hold": {v: [r.name for r in sc.rules if r.holds] for v, sc in scores.items()},
            "pre_registered": scores["prediction"].pre_registered}


def print_engine_summary(engine: dict[str, Any], bench: dict[str, Any]) -> None:
    """The closing summary: crossover, r(n), best k per acceptance, measured vs predicted speedup, verdicts."""
    from rich.table import Table

    c = console()
    r = ", ".join(f"{v:.2f}" for v in bench["r"].values())
    c.print(f"[bold]summary[/bold]: crossover from the bench n = {bench['crossover']}, predicted n = "
            f"{engine['crossover_predicted']}, measured n = {engine['crossover_measured']}; r(1..9) = {r}")
    t = Table(title="AUTO policy per acceptance: best draft length and speedup, measured vs plan "
                    "(prediction / calibrated, band (21))", title_justify="left")
    for col in ("a", "k measured", "k_hat pred / cal", "speedup measured", "predicted [band]", "calibrated [band]"):
        t.add_column(col, justify="right")
    band = lambda s: f"{s[0]:.2f}" + ("" if s[1] is None else f" [{s[1]:.2f}, {s[2]:.2f}]")  # noqa: E731
    for a, row in engine["auto"].items():
        t.add_row(a, str(row["k_measured"]), f"{row['k_prediction']} / {row['k_calibrated']}",
                  f"{row['speedup_measured']:.2f}", band(row["speedup_prediction"]), band(row["speedup_calibrated"]))
    c.print(t)
    for version, names in engine["rules_hold"].items():
        c.print(f"scoring rules holding, {version}: {len(names)} of 6 ({', '.join(names) or 'none'})")
    c.print(f"pre-registered: {'yes' if engine['pre_registered'] else 'no'}; report: {engine['report']}")


def run(args: argparse.Namespace) -> int:
    if args.kmax < 1 or args.depth < 0 or args.bench_reps < 0 or args.engine_layers < 0:
        raise MoespecError(f"need --kmax >= 1, --depth >= 0, --bench-reps >= 0 and --engine-layers >= 0, got "
                           f"{args.kmax}, {args.depth}, {args.bench_reps} and {args.engine_layers}")
    if args.bench_reps and args.format not in DTYPES:
        raise MoespecError(f"--format {args.format}: the bench times {' or '.join(DTYPES)} weights "
                           f"(--bench-reps 0 skips it)")
    if args.docs < 1 or args.tokens < args.docs * (args.kmax + 1):
        raise MoespecError(f"need --docs >= 1 and at least kmax+1 = {args.kmax + 1} tokens per document, "
                           f"got --tokens {args.tokens} --docs {args.docs}")
    out_dir = Path(args.out)
    result, trace, stats = run_demo(args.model, args.format, args.depth, args.kmax, args.tokens, args.docs,
                                    args.seed, out_dir)
    if not args.json:
        console().print(f"[bold]1. routing[/bold]: synthetic {trace.meta.get('process')} trace -> "
                        f"{out_dir / 'trace.npz'}")
        print_summary(stats, trace, str(out_dir / "trace.npz"))
        print_report(result)
    if args.bench_reps:
        if not args.json:
            console().print("[bold]3. measurement[/bold]: a short bench of one MoE layer on this machine")
        settings = {k: v for k, v in vars(args).items() if k not in ("json", "command", "_module")}
        steps = Steps(out_dir, settings, (lambda text: None) if args.json else console().print)
        doc = run_bench(args.model, args.format, out_dir, args.bench_reps, args.json, steps)
        result["bench"] = {"path": str(out_dir / "bench.json"), "ceiling_gbps": doc["ceiling_gbps"],
                           "r": doc["r"], "u": doc["u"], "crossover": doc["crossover"]}
        if not args.json:
            r = ", ".join(f"{n}: {v:.2f}" for n, v in doc["r"].items())
            console().print(f"measured r(n) = beta_dedup/beta_slot: {r}; the theory in 2. assumed r = 1. "
                            f"Measured crossover (u(n) < r(n) from there on): n = {doc['crossover']}")
        if args.engine_layers:
            result["engine"] = run_engine(args.model, args.format, args.depth, args.kmax, out_dir, args.engine_layers,
                                          args.json, steps)
    write_json(out_dir / "demo.json", {**result, "provenance": provenance(dtype=args.format)})
    if args.json:
        print(json.dumps(result))
    else:
        if "engine" in result:
            print_engine_summary(result["engine"], result["bench"])
        console().print(f"results: {out_dir / 'demo.json'}")
    return 0

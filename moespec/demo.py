"""The demo: the main job on the built-in default (what `make demo` runs), a plain sequence of library calls.

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
   this machine (moespec.measure.bench with fewer repetitions), which replaces the one-bandwidth assumption by the
   measured bandwidth ratio r(n): dedup is faster where u(n) < r(n) (7), and the crossover is printed.
4. Engine: verify times tau_p(n) of a shape-faithful model (2 of the 16 layers, random weights, the trace's
   routing replayed) with dedup off and on (moespec.measure.run, no throughput), and of passes of B = 4 sequences
   x n tokens (moespec.measure.batch_run).
5. Plan: (22) from the bench and the trace, calibrated by the measured verify times; the AUTO kernel per n,
   k_hat*(a) and the speedup band (21) (moespec.predict.plan); and the batch map k_hat*(a, B), B_stop(a) at
   B = 1 and 4 from the verify times at each, beside its prediction from the bench (moespec.predict.batch_map).
6. Engine with the plan on a reduced grid (slot, dedup, AUTO; k = 0..8; the paper's 11 acceptances; as many prompts
   per cell as step 4's verify times say fit the grid's seconds, scored_prompts) and the six
   scoring rules (moespec.measure.run with the plan, moespec.predict.score): the plan is written before that run,
   so pre-registered.
7. Report: moespec.report.html writes report.html (Figures 1, 2, 4, 5, the staircases, Tables 1, 3, 8) from them.
Steps 3-6 keep every timed round at one bandwidth level of the host (moespec.measure.level): the bench pins it,
the verify-only run keeps it, the plan records it and the scored run reads it from the plan. Their waiting for it
(settling before rounds, units thrown away off the level and run again) has one cap, DEMO_WAIT_CAP_S, split
across the three measurements (WaitCap); where one spends its share it says so in one line and goes on at the level
the host has. Step 2b waits for no level.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from fractions import Fraction
from pathlib import Path
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from moespec import MoespecError, __version__, theory
from moespec.defaults import (
    DEPTH,
    DTYPES,
    FORMAT,
    KERNELS,
    KMAX,
    MODEL,
    PAIR_DIR,
    PAIR_TRACE,
    PROFILE,
    ROUTINGS,
    TRACE_DOCS,
    TRACE_TOKENS,
)
from moespec.formats.benchfile import Bench, load_bench
from moespec.formats.demofile import DRAFTING_FILE, STEPS_FILE, Demo, Steps, load_drafting
from moespec.formats.files import check_output, holds_outputs, provenance, source_commit, write_json
from moespec.formats.planfile import Plan, load_plan
from moespec.formats.runsfile import RATES, Runs, load_runs
from moespec.formats.trace import Trace, load_trace
from moespec.measure.bench import BenchConfig, run_bench
from moespec.measure.run import RunConfig, run_engine
from moespec.model.spec import ModelSpec
from moespec.predict.plan import PlanConfig, inputs_level, make_plan
from moespec.predict.acceptance import plan_rate
from moespec.predict.score import VERSIONS, Score, score_files
from moespec.report.figures import bandwidth_figure, save_figure
from moespec.report.html import write_report
from moespec.routing.reuse import ReuseStats, reuse_stats, trace_expert_bytes
from moespec.routing.synth import synthesize

DEFAULT_OUT_DIR = "out/demo"
# The short bench: one middle MoE layer, 3 repetitions, 8 windows and 4 chosen U per n: about 30 s here.
BENCH_LAYER, BENCH_REPS, BENCH_WINDOWS, BENCH_U_VALUES = 7, 3, 8, 4
# The engine steps are sized in seconds, so that a CPU of slow passes measures fewer samples, not more minutes:
# 2 of OLMoE's 16 layers at full shape; 7-40 verify rounds to a 5% interval, each set of rounds stopped after 4 s
# per n; and up to 24 prompts of 6 tokens per (policy, k) cell in interleaved rounds (a cell's V(k) to ~2.5%), as
# many as the verify-only run's pass times say decode in ENGINE_DECODE_S, 8 at least (scored_prompts;
# results/demo-cpu.md).
ENGINE_LAYERS, ENGINE_REPS, ENGINE_MAX_REPS, ENGINE_BUDGET_S = 2, 7, 40, 4.0
ENGINE_PROMPTS, ENGINE_MIN_PROMPTS, ENGINE_TOKENS, ENGINE_DECODE_S = 24, 8, 6, 60.0
# The batch map's grid: batch one and one B > 1, whose verify rounds step 4 measures too (~45 s here).
DEMO_BATCHES = (1, 4)
# All of the demo's waiting for the host's bandwidth level: ~6 min of measuring on a 2-core AVX2 CPU plus at most
# this keeps the demo under 8 minutes on a noisy host (moespec.measure.level; results/demo-cpu.md).
DEMO_WAIT_CAP_S = 45.0
# The cap's split across the measurements that pin a level, by their artifacts: each engine run measures 2.5x as
# long as the bench, and the scored chain stays at one level only where the engine runs can wait for it.
WAIT_SHARES = {"bench.json": 1.0, "runs-verify.json": 2.5, "runs.json": 2.5}
# The scored grid: the paper's 11 acceptances (theory.PAPER_ACCEPTANCES), as rule 2 is written (>= 9 of 11); every
# a reads its cell's one V(k), so 11 cost no more decoding than 4 (results/demo-cpu.md).
ENGINE_A = None
# The throughput the demo's plan is scored on: computed, G_a(k) over V(k). Its cells of 2-3 prompts of 6 tokens per
# acceptance count 2-15 steps, where the counted rate (the paper's, `moespec plan`'s default) spreads by tens of
# percent and would rank k by chance; `moespec score --rate counted` scores the same files on it.
DEMO_RATE = "computed"
OUTPUTS = ("trace.npz", DRAFTING_FILE, "bench.json", "fig2.png", "runs-verify.json", "plan.json", "runs.json",
           "report.html", STEPS_FILE, "demo.json")  # every file the demo writes in its folder
# The drafting step on the trained pair (moespec/data/pair): 2 calibration + 4 scored prompts of 48 tokens sampled
# from the target, 64 tokens generated each, k = 0..kmax, the heuristic and the online policy: ~20 s here.
DRAFTING_PROMPTS, DRAFTING_PROMPT_TOKENS, DRAFTING_TOKENS = 4, 48, 64
KERNEL_LABELS = {"slot": "slot", "dedup_uniform": "dedup, uniform routing", "dedup_trace": "dedup, traced routing"}


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


def trained_routing(spec: ModelSpec) -> Trace:
    """The trained target's routing on WikiText-2's test split (PAIR_TRACE: 4 MoE layers, N = 64, m = 8) on the
    model's MoE layers by relative depth (Trace.by_relative_depth), named as the model for the bench and plan."""
    recorded = load_trace(PAIR_TRACE)
    if (recorded.num_experts, recorded.m) != (spec.N, spec.m):
        raise MoespecError(f"--routing trained: the trained pair routes N={recorded.num_experts}, m={recorded.m}; "
                           f"{spec.name} has N={spec.N}, m={spec.m}")
    return recorded.by_relative_depth(spec.L, {"model": spec.name, "spec": spec.to_dict(),
                                               "source": f"trained pair's routing ({recorded.meta.get('source')})"})


def routing_and_theory(model: str, fmt: str, depth: int, kmax: int, tokens: int, docs: int, seed: int,
                       out_dir: Path, routing: str = ROUTINGS[0]) -> tuple[dict[str, Any], Trace, ReuseStats]:
    """Steps 1 and 2: the routing (the calibrated process, or with routing "trained" the trained pair's traced
    routing, the process's layer-mean reuse reported beside it), its reuse, and the theory; returns (result,
    trace, stats)."""
    spec = ModelSpec.from_name(model)
    synthetic = synthesize(model, "calibrated", tokens, docs, seed=seed, profile=PROFILE)
    trace = trained_routing(spec) if routing == "trained" else synthetic
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
                  "routing": routing, "source": trace.meta.get("source"),
                  "calibrated_to": trace.meta.get("calibrated_to"),
                  "rho_mean": stats.rho_mean.tolist(), "u": stats.u.tolist(),
                  "rho_layers": {str(n): stats.rho[:, n].tolist() for n in (2, kmax + 1)}},
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
    if routing == "trained":  # both routings reported: the process the default uses, beside the trained one
        other = reuse_stats(synthetic, kmax + 1, bootstrap=0)
        result["trace"]["synthetic_rho_mean"] = other.rho_mean.tolist()
    return result, trace, stats


@dataclass(frozen=True)
class DemoConfig:
    """The demo's settings: the model preset and weight format, the context depth and largest draft, the synthetic
    trace (tokens, documents, seed), the output folder, the short bench's repetitions (0 skips steps 3-7) and the
    engine model's layers (0 skips steps 4-7)."""

    model: str = MODEL
    format: str = FORMAT
    depth: int = DEPTH
    kmax: int = KMAX
    tokens: int = TRACE_TOKENS
    docs: int = TRACE_DOCS
    seed: int = 0
    out: str = DEFAULT_OUT_DIR
    bench_reps: int = BENCH_REPS
    engine_layers: int = ENGINE_LAYERS
    routing: str = ROUTINGS[0]
    drafting: int = DRAFTING_PROMPTS

    @property
    def outputs(self) -> list[Path]:
        """Every file the demo writes, in its output folder."""
        return [Path(self.out) / name for name in OUTPUTS]

    def check(self) -> None:
        """Every setting in its domain, the settings of every later step too (bench, engine runs), and the output
        folder writable, before any work: a bad setting leaves nothing behind."""
        for path in self.outputs:
            check_output(path, "--out")
        if self.routing not in ROUTINGS:
            raise MoespecError(f"--routing {self.routing!r}: one of {', '.join(ROUTINGS)}")
        if self.routing == "trained" and not PAIR_TRACE.is_file():
            raise MoespecError(f"--routing trained: {PAIR_TRACE} is missing (scripts/train_pair.py makes it)")
        if self.drafting < 0:
            raise MoespecError(f"--drafting-prompts must be >= 0 (0 skips the drafting step), got {self.drafting}")
        if self.kmax < 1 or self.depth < 0 or self.bench_reps < 0 or self.engine_layers < 0:
            raise MoespecError(f"need --kmax >= 1, --depth >= 0, --bench-reps >= 0 and --engine-layers >= 0, got "
                               f"{self.kmax}, {self.depth}, {self.bench_reps} and {self.engine_layers}")
        if self.bench_reps and self.format not in DTYPES:
            raise MoespecError(f"--format {self.format}: the bench times {' or '.join(DTYPES)} weights "
                               f"(--bench-reps 0 skips it)")
        if self.docs < 1 or self.tokens < self.docs * (self.kmax + 1):
            raise MoespecError(f"need --docs >= 1 and at least kmax+1 = {self.kmax + 1} tokens per document, "
                               f"got --tokens {self.tokens} --docs {self.docs}")
        spec = ModelSpec.from_name(self.model)
        if self.bench_reps:
            bench_config(self).check()
            if self.engine_layers:
                if self.engine_layers > spec.layers or self.kmax > KMAX:
                    raise MoespecError(f"the engine steps need --engine-layers <= {spec.layers} ({spec.name}'s "
                                       f"layers) and --kmax <= {KMAX}, got {self.engine_layers} and {self.kmax} "
                                       f"(--engine-layers 0 skips them)")
                verify, _, scored = engine_configs(self)
                verify.check()
                scored.check()


class DemoView(Protocol):
    """What the demo shows as each step finishes (the CLI prints it; a quiet view shows nothing)."""

    def say(self, text: str) -> None: ...
    def routing(self, stats: ReuseStats, trace: Trace, path: str) -> None: ...
    def theory(self, result: dict[str, Any]) -> None: ...
    def bench(self, bench: Bench) -> None: ...
    def runs(self, runs: Runs) -> None: ...
    def plan(self, plan: Plan) -> None: ...
    def score(self, score: Score) -> None: ...
    def drafting(self, found: dict[str, Any]) -> None: ...


class Quiet:
    """A DemoView that shows nothing."""

    def __getattr__(self, name: str) -> Any:
        return lambda *args: None


def wait_share(artifact: str, cap_s: float = DEMO_WAIT_CAP_S) -> float:
    """The waiting budget, seconds, of the measurement that writes `artifact`: its WAIT_SHARES part of the cap. Fixed
    by the settings alone, so that a rerun resumes the measurement's checkpoint (whose key holds its wait)."""
    return cap_s * WAIT_SHARES[artifact] / sum(WAIT_SHARES.values())


class WaitCap:
    """The demo's one cap on waiting for the host's bandwidth level, `cap_s` seconds: each measurement's Level waits
    its wait_share at most (moespec.measure.level: settling, and units thrown away off the level), so all of them
    together wait the cap at most; where one has spent its share, the demo says so in one line and goes on."""

    def __init__(self, say: Callable[[str], None], cap_s: float = DEMO_WAIT_CAP_S) -> None:
        self.say, self.cap_s, self.waited_s = say, cap_s, 0.0

    def charge(self, record: dict[str, Any] | None) -> None:
        """Count what a finished measurement waited (its `level` record, bench.json's or runs.json's; None: it
        pinned nothing) and say it once its share is spent: it went on at the level the host had."""
        if not record:
            return
        self.waited_s += record["waited_s"]
        if record["wait_s"] > 0 and record["waited_s"] >= record["wait_s"]:
            self.say(f"[yellow]waited {record['waited_s']:.0f} s for the host's bandwidth level, the cap of this "
                     f"step ({record['wait_s']:.0f} s; {self.waited_s:.0f} s of the demo's {self.cap_s:.0f} s so far): "
                     "going on at the level it has[/]")


def step_settings(config: DemoConfig) -> dict[str, Any]:
    """What a finished measuring step was made with, so a re-run reuses it only under the same: the demo's settings
    and the code that measured (moespec's version and, in a git checkout, its commit)."""
    return vars(config) | {"code": {"moespec": __version__, "git": source_commit()}}


@holds_outputs(lambda config: config.outputs)
def demo(config: DemoConfig, view: DemoView = Quiet()) -> Demo:
    """The whole chain on the built-in default (module docstring); returns what demo.json records (written to
    config.out/demo.json with every other artifact, with its provenance; all of them locked meanwhile). A re-run
    with the same settings and code reuses the finished steps (step_settings)."""
    config.check()
    out_dir = Path(config.out)
    result, trace, stats = routing_and_theory(config.model, config.format, config.depth, config.kmax, config.tokens,
                                              config.docs, config.seed, out_dir, config.routing)
    view.say(f"[bold]1. routing[/bold]: synthetic {trace.meta.get('process')} trace -> {out_dir / 'trace.npz'}")
    view.routing(stats, trace, str(out_dir / "trace.npz"))
    view.theory(result)
    steps = Steps(out_dir, step_settings(config), view.say)
    if config.drafting and config.bench_reps and PAIR_DIR.is_dir():  # a measurement: --bench-reps 0 skips it too
        view.say("[bold]2b. drafting[/bold] on the trained pair (moespec/data/pair): the acceptance profile, every "
                 "constant k, transformers' heuristic and the online policy")
        steps.run(out_dir / DRAFTING_FILE, lambda: view.drafting(drafting_step(config, out_dir)))
        found = load_drafting(out_dir / DRAFTING_FILE)  # validated: a resumed demo may find an old or broken one
        result["drafting"] = {key: found[key] for key in ("k_hat_plan", "best_constant_k", "profile_calibration")} \
            | {"vs_best_constant": {c: row["vs_best_constant"] for c, row in found["cells"].items()}}
    if config.bench_reps:
        view.say("[bold]3. measurement[/bold]: a short bench of one MoE layer on this machine")
        cap = WaitCap(view.say)
        bench = _bench(config, out_dir, steps, view, cap)
        result["bench"] = {"path": str(out_dir / "bench.json"), "ceiling_gbps": bench.ceiling_gbps,
                           "r": bench["r"], "u": bench["u"], "crossover": bench.crossover}
        r = ", ".join(f"{n}: {v:.2f}" for n, v in bench.r.items())
        view.say(f"measured r(n) = beta_dedup/beta_slot: {r}; the theory in 2. assumed r = 1. Measured crossover "
                 f"(u(n) < r(n) from there on): n = {bench.crossover}")
        if config.engine_layers:
            result["engine"] = _engine(config, out_dir, steps, view, bench, cap)
    write_json(out_dir / "demo.json", {**result, "provenance": provenance(dtype=config.format)})
    if "engine" in result:  # after demo.json, which the report reads too
        view.say("[bold]7. report[/bold]: every figure and table from the artifacts in one self-contained page")
        view.say(f"report -> {write_report(out_dir)}")
    return Demo(result, out_dir / "demo.json")


def drafting_step(config: DemoConfig, out_dir: Path) -> dict[str, Any]:
    """Step 2b: moespec.measure.drafting.compare on the trained pair, prompts sampled from its target (the demo
    reads no third-party text); writes drafting.json and returns it."""
    from moespec.measure.drafting import CALIBRATION, compare, sampled_prompts
    from moespec.model.load import load_draft

    target, draft = load_draft(str(PAIR_DIR / "target"), "fp32"), load_draft(str(PAIR_DIR / "draft"), "fp32")
    prompts = sampled_prompts(target, CALIBRATION + config.drafting, DRAFTING_PROMPT_TOKENS, config.seed)
    found = compare(target, draft, prompts, DRAFTING_TOKENS, min(config.kmax, KMAX))
    found |= {"pair": str(PAIR_DIR), "prompts_source": f"sampled from the target (temperature 1, seed {config.seed})",
              "provenance": provenance(dtype="fp32")}
    write_json(out_dir / DRAFTING_FILE, found)
    return found


def bench_config(config: DemoConfig) -> BenchConfig:
    """Step 3's bench: one middle MoE layer, the demo's trace, a few repetitions."""
    spec, out_dir = ModelSpec.from_name(config.model), Path(config.out)
    return BenchConfig(out=str(out_dir / "bench.json"), model=config.model, layers=(min(BENCH_LAYER, spec.L - 1),),
                       dtype=config.format, trace=str(out_dir / "trace.npz"), reps=config.bench_reps,
                       windows=BENCH_WINDOWS, u_values=BENCH_U_VALUES, level_wait_s=wait_share("bench.json"))


def engine_configs(config: DemoConfig) -> tuple[RunConfig, PlanConfig, RunConfig]:
    """Steps 4-6: the verify-only engine run, the plan made from it, the engine run with the plan (scored)."""
    out_dir = Path(config.out)
    trace, plan = str(out_dir / "trace.npz"), str(out_dir / "plan.json")
    engine = dict(preset=config.model, layers=config.engine_layers, dtype=config.format, depth=config.depth,
                  reps=ENGINE_REPS, max_reps=ENGINE_MAX_REPS, budget_s=ENGINE_BUDGET_S, replay=trace)
    verify = RunConfig(out=str(out_dir / "runs-verify.json"), throughput=False,
                       level_wait_s=wait_share("runs-verify.json"), batch=DEMO_BATCHES, **engine)
    planned = PlanConfig(bench=str(out_dir / "bench.json"), trace=trace, runs=verify.out, kmax=config.kmax, out=plan,
                         batch=DEMO_BATCHES, rate=DEMO_RATE)
    # the scored run needs no outside time: the plan read it from the verify-only run
    scored = RunConfig(out=str(out_dir / "runs.json"), plan=plan, k=tuple(range(config.kmax + 1)), a=ENGINE_A,
                       prompts=ENGINE_PROMPTS, tokens=ENGINE_TOKENS, outside=False,
                       level_wait_s=wait_share("runs.json"), **engine)
    return verify, planned, scored


def _bench(config: DemoConfig, out_dir: Path, steps: Steps, view: DemoView, cap: WaitCap) -> Bench:
    """Step 3: the short bench of one middle MoE layer, its waiting charged to `cap`; its figure is drawn by the
    report."""
    def step() -> None:
        bench = run_bench(bench_config(config), view.say)
        cap.charge(bench.get("level"))
        save_figure(bandwidth_figure(bench), str(out_dir / "fig2.png"))
        view.bench(bench)

    steps.run(out_dir / "bench.json", step)
    return load_bench(out_dir / "bench.json")


def _engine(config: DemoConfig, out_dir: Path, steps: Steps, view: DemoView, bench: Bench,
            cap: WaitCap) -> dict[str, Any]:
    """Steps 4-6: verify times on a shape-faithful model, the plan from them, the engine with the plan, the score
    (the report, step 7, follows demo.json). The engine replays the trace's routing (random weights route like
    uniform iid); the plan is written before the run it is scored against, so the score is pre-registered. Every
    timed round of the chain is kept at the bench's bandwidth level (moespec.measure.level): the verify-only run
    pins it, the plan records it, the scored run reads it from the plan; their waiting is charged to `cap`."""
    verify, planned, scored = engine_configs(config)
    verify = replace(verify, level_gbps=inputs_level(bench, None))
    view.say(f"[bold]4. engine[/bold]: verify times of {config.model} with {config.engine_layers} of its layers at "
             f"full shape, random weights, the trace's routing replayed")
    steps.run(out_dir / "runs-verify.json", lambda: view.runs(engine_run(verify, view.say, cap)))
    view.say("[bold]5. plan[/bold]: the bench's bandwidths, the trace's bytes and the measured one-token time")
    steps.run(out_dir / "plan.json", lambda: view.plan(make_plan(planned)))
    scored = replace(scored, prompts=scored_prompts(load_runs(verify.out), config.kmax))
    view.say(f"[bold]6. engine with the plan[/bold]: slot, dedup and AUTO on a reduced grid ({scored.prompts} prompts "
             f"per cell: of {ENGINE_PROMPTS}, as many as the verify times say decode in {ENGINE_DECODE_S:.0f} s), then "
             "the score")
    steps.run(out_dir / "runs.json", lambda: view.runs(engine_run(scored, view.say, cap)))
    planned_versions = [v for v, keys in VERSIONS.items() if keys.table in load_plan(planned.out)]
    for version in planned_versions:
        view.score(score_files(planned.out, scored.out, version))
    return engine_summary(out_dir)


def scored_prompts(verify: Runs, kmax: int) -> int:
    """The scored grid's prompts per cell: as many of ENGINE_PROMPTS as the verify-only run's pass times say
    decode in ENGINE_DECODE_S, ENGINE_MIN_PROMPTS at least. A prompt costs, in each policy (AUTO at the faster
    kernel of each size), its plain decoding (ENGINE_TOKENS + KMAX + 1 one-token passes: the oracle's continuation)
    and at each k = 0..kmax about ENGINE_TOKENS / G_a(k) passes of k + 1 tokens, over the grid's acceptances."""
    V = {p: [float(verify["verify_time_s"][p][str(n)]) for n in range(1, kmax + 2)] for p in KERNELS}
    V["auto"] = [min(pair) for pair in zip(*V.values())]
    steps = [float(np.mean([ENGINE_TOKENS / theory.geometric_sum(float(a), k) for a in theory.PAPER_ACCEPTANCES]))
             for k in range(kmax + 1)]
    prompt_s = sum((ENGINE_TOKENS + KMAX + 1) * t[0] + sum(s * v for s, v in zip(steps, t)) for t in V.values())
    return max(ENGINE_MIN_PROMPTS, min(ENGINE_PROMPTS, int(ENGINE_DECODE_S / prompt_s)))


def engine_run(config: RunConfig, say: Callable[[str], None], cap: WaitCap) -> Runs:
    """One engine run of the demo, its waiting charged to `cap`."""
    runs = run_engine(config, say)
    cap.charge(runs.get("level"))
    return runs


def engine_summary(out_dir: Path) -> dict[str, Any]:
    """What the engine steps found: crossovers, AUTO's best draft length and speedup per acceptance measured beside
    each version of the plan (prediction, calibrated, whole-pass), and the six verdicts of each."""
    runs = load_runs(out_dir / "runs.json")
    plan = load_plan(out_dir / "plan.json")
    rate = plan_rate(plan)
    rows = [r for r in runs["throughput"] if r["policy"] == "auto" and r[RATES[rate]] is not None]
    versions = {v: keys for v, keys in VERSIONS.items() if keys.table in plan}
    per_a = {}
    for a in sorted({r["a"] for r in rows}):
        T = {r["k"]: r[RATES[rate]] for r in rows if r["a"] == a}
        best = max(T, key=lambda k: (T[k], -k))
        planned = {v: next(r for r in plan[keys.table] if r["policy"] == "auto" and abs(r["a"] - a) < 1e-9)
                   for v, keys in versions.items()}
        per_a[str(a)] = {"k_measured": best, "speedup_measured": T[best] / T[0],
                         **{f"k_{v}": row["k_hat"] for v, row in planned.items()},
                         **{f"speedup_{v}": [row["speedup"], row["speedup_lo"], row["speedup_hi"]]
                            for v, row in planned.items()}}
    scores = {v: score_files(str(out_dir / "plan.json"), str(out_dir / "runs.json"), v) for v in versions}
    return {"runs": str(out_dir / "runs.json"), "plan": str(out_dir / "plan.json"),
            "report": str(out_dir / "report.html"), "crossover_predicted": plan["crossover"],
            "crossover_measured": runs["crossover"], "greedy_match": runs["greedy_match"],
            "greedy_exact": runs["greedy_exact"], "verify_time_s": runs["verify_time_s"],
            "auto_ratio": runs["auto_ratio"], "auto": per_a, "throughput_rate": rate,
            "rules_hold": {v: [r.name for r in sc.rules if r.holds] for v, sc in scores.items()},
            "batch": {"batches": plan["batch"]["batches"], "acceptances": plan["batch"]["acceptances"],
                      "b_stop": plan["batch"]["b_stop"],
                      "k_hat": {b: e["k_hat"] for b, e in plan["batch"]["per_batch"].items()},
                      "k_hat_predicted": {b: e["k_hat"] for b, e in
                                          ((plan["batch"].get("predicted") or {}).get("per_batch") or {}).items()}},
            "pre_registered": scores["prediction"].pre_registered}

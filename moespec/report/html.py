"""One self-contained HTML page (DIR/report.html) of everything a moespec job left in DIR.

What it shows and why. A job (`moespec demo`, or the commands run by hand) leaves one file per stage of the chain
trace -> reuse -> bench -> theory -> predict -> engine in one folder. Each file answers one question; the report
puts the answers side by side, so that one page says what was measured, on what, when and by which command, and
whether the prediction made before the engine ran held up against it:

  top           the folder the page was made from, as given; then a bold warning for each file that is not the
                one its neighbours were made from (a plan made from another bench, trace or runs; runs that ran
                another plan), saying what to do (moespec.report.inputs)
  Inputs        each artifact's path from the page, size, sha256, status and provenance (created, command,
                host); the other result files in the folder, not read; what plan.json was made from
  header        model, device, dtype, context depth, MoE layers, the trace (synthetic and calibrated to what, or
                recorded)
  Figure 1      reuse rho(n): layer mean with bootstrap interval, against uniform iid routing      trace.npz
  Figure 2      each kernel's effective bandwidth vs n with the device ceiling; Table 1 (r(n), u(n)) and
                the fits (the re-read cost c_re/c_u)                                              bench.json
  staircase     k_hat*(a) and its step points for slot, dedup and AUTO, per plan version          plan.json
  Figure 4      the measured saving S(n) with its 95% interval against the predicted saving and its band
                (18), its measured-time version and the calibrated one                 plan.json (+ runs.json)
  Figure 5      per acceptance: predicted k_hat* vs the measured best k, the throughput lost at k_hat* vs
                the bound (20), the speedup error vs the band (21)                      plan.json + runs.json
  Tables 3, 8   per n the saving error and the verify-time error; the six scoring rules (moespec.predict.score)
  engine        verify times per n and kernel, AUTO ratio, engine overhead, greedy agreement and the top-2
                logit gap of every mismatch                                        runs.json, runs-verify.json
  batch map     k_hat*(a, B) per acceptance and batch size with B_stop(a), the crossover and V_B(k) per B, and the
                batch rules where the runs measured at batch (moespec.report.batch)   plan.json (+ runs.json)

A section whose artifact is missing or unreadable says so in one line and the rest of the page is still made,
so a folder holding only bench.json gives a report of the bench; a folder with no artifact is an error. The
figures are PNGs embedded as base64 and the style sheet is inline, so the page opens offline and travels as one
file; nothing else is written to DIR.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterable

from moespec import MoespecError, theory
from moespec.defaults import N_MAX
from moespec.formats.demofile import DRAFTING_FILE
from moespec.formats.files import atomic_write, check_output, writing
from moespec.predict.checks import bench_checks, runs_checks
from moespec.predict.acceptance import ACCEPTANCE_DIGITS, VERSIONS, acceptance_rows, plan_rate
from moespec.predict.rules import LOSS_LIMIT
from moespec.predict.score import score_files
from moespec.predict.verdict import build_verdict
from moespec.report.figures import (
    PLAN_VERSIONS,
    acceptance_figure,
    bandwidth_figure,
    reuse_figure,
    saving_figure,
    staircase_figure,
)
from moespec.report.batch import batch_section
from moespec.report.engine import engine_section
from moespec.report.folder import DEFAULT_NAME, RUNS, RUNS_VERIFY, Folder, load_folder
from moespec.report.inputs import inputs_section, warnings_html
from moespec.report.markup import CSS, VERDICT, Markup
from moespec.report.markup import escape as _e
from moespec.report.markup import facts as _facts
from moespec.report.markup import figure as _figure
from moespec.report.markup import missing as _missing
from moespec.report.markup import ms as _ms
from moespec.report.markup import pct as _pct
from moespec.report.markup import policies as _policies
from moespec.report.markup import table as _table
from moespec.report.tables import FITS_CAPTION, TABLE1_CAPTION, fits_table, table1
from moespec.routing.reuse import reuse_stats
from moespec.routing.synth import describe

# ---- header --------------------------------------------------------------------------------------------------
def _distinct(values: Iterable[Any]) -> str:
    """The different values the artifacts give (a folder that mixes jobs shows it), or '-'."""
    seen = list(dict.fromkeys(str(v) for v in values if v not in (None, "")))
    return " / ".join(seen) if seen else "-"


def _trace_text(f: Folder) -> str:
    trace = f.docs.get("trace.npz")
    if trace is not None:
        meta = trace.meta
        what = f"synthetic: {describe(meta)}" if meta.get("synthetic") else f"recorded: {meta.get('source')}"
        return f"{what}; {trace.num_tokens:,} tokens in {trace.num_documents} documents (trace.npz)"
    bench_trace = f.docs.get("bench.json", {}).get("trace")
    if bench_trace:
        kind = "synthetic" if bench_trace.get("synthetic") else "recorded"
        return f"{kind}: {bench_trace.get('source')}, {bench_trace.get('num_tokens')} tokens (as bench.json " \
               f"records it; trace.npz is not here)"
    return "-"


def _layers_text(f: Folder) -> str:
    d = f.docs
    parts = []
    if "trace.npz" in d:
        parts.append(f"the trace records {d['trace.npz'].num_layers}")
    if "bench.json" in d:
        parts.append(f"the bench timed layer(s) {', '.join(map(str, d['bench.json']['layers']))}")
    if "plan.json" in d and isinstance(d["plan.json"].get("coverage"), dict):
        cov = d["plan.json"]["coverage"]
        parts.append(f"the plan covers {cov['num_moe_layers']} of {cov['model_moe_layers']}")
    ran = [f"{d[name].get('moe_layers')} ({name})" for name in (RUNS, RUNS_VERIFY) if name in d]
    if ran:
        parts.append(f"the engine ran {', '.join(ran)}")
    return "; ".join(parts) or "-"


def _model(f: Folder) -> str:
    return _distinct(doc.meta.get("model") if name == "trace.npz" else doc.get("model") for name, doc in f.docs.items())


def header(f: Folder) -> str:
    """What ran on what: the artifacts' model, device, dtype, depth, layers, trace."""
    d = f.docs
    jsons = [doc for name, doc in d.items() if name != "trace.npz"]
    plan = d.get("plan.json", {})
    plan_depth = (plan.get("runs") or {}).get("depth") or (plan.get("reuse_threshold") or {}).get("depth")
    summary = [
        ("model", _model(f)),
        ("device", _distinct(d[name].get("device") for name in ("bench.json", "plan.json", RUNS, RUNS_VERIFY)
                             if name in d)),
        ("dtype", _distinct([*(doc.get("dtype") for doc in jsons), d.get("demo.json", {}).get("format")])),
        ("context depth", _distinct([*(d[name].get("depth") for name in (RUNS, RUNS_VERIFY, "demo.json")
                                       if name in d), plan_depth])),
        ("MoE layers", _layers_text(f)),
        ("trace", _trace_text(f)),
    ]
    return _facts(summary)


# ---- the verdict ---------------------------------------------------------------------------------------------
def verdict_section(f: Folder) -> str:
    """The plain answer, first on the page (moespec.predict.verdict): the kernel per n and the draft length per
    acceptance from plan.json, decided by the measured S(n) intervals of runs.json (else runs-verify.json) where they
    hold them and scored against runs.json, then the input checks of the bench and the runs as a list; without
    plan.json, the checks alone."""
    d = f.docs
    runs_name = next((name for name in (RUNS, RUNS_VERIFY) if name in d), None)
    runs, bench = d.get(runs_name), d.get("bench.json")
    if "plan.json" not in d:
        title, blocks = "The verdict needs plan.json", [(f.problems["plan.json"], [
            *(bench_checks(bench, "bench.json") if bench is not None else []),
            *(runs_checks(runs, runs_name) if runs is not None else [])])]
    else:
        compared = _compared(f) if RUNS in d else None
        score = None if compared is None or isinstance(compared, str) else compared[0]
        verdict = build_verdict(d["plan.json"], runs, score, bench=bench, plan_path="plan.json",
                                runs_path=runs_name or RUNS, bench_path="bench.json")
        title, blocks = verdict.title, verdict.blocks()
    return (f'<div id="verdict"><h2>{_e(title)}</h2>'
            + "".join(f"<h3>{_e(heading)}</h3>" + ("<ul>" + "".join(f"<li>{_e(item)}</li>" for item in items)
                                                    + "</ul>" if items else "") for heading, items in blocks)
            + "</div>")


# ---- Figure 1: reuse -----------------------------------------------------------------------------------------
def reuse_section(f: Folder) -> str:
    """Figure 1: the trace's reuse (App. D.2 estimator, bootstrap over documents) drawn by reuse_figure."""
    trace = f.docs["trace.npz"]
    n_max = int(min(N_MAX, trace.document_lengths.max()))  # a window never crosses a document
    stats = reuse_stats(trace, n_max)
    lo, hi = stats.ci["rho_mean"]
    fig = reuse_figure(stats, label=str(trace.meta.get("model") or "trace"))
    values = "; ".join(f"rho({n}) = {stats.rho_mean[n]:.3f} [{lo[n]:.3f}, {hi[n]:.3f}]" for n in sorted({2, n_max})
                       if n <= n_max)
    caption = (f"Look at how far the layer-mean reuse (dots; each layer faint and the {stats.level:.0%} bootstrap "
               f"interval over {stats.num_documents} documents shaded, where wider than its line) lies above the "
               f"dotted uniform iid curve: the higher, the more experts a pass of n tokens shares and the fewer "
               f"bytes a deduplicating kernel reads ({values}).")
    return _figure(fig, caption)


# ---- Figure 2, Table 1: bandwidth ----------------------------------------------------------------------------
def bandwidth_section(f: Folder) -> str:
    """Figure 2 (bandwidth_figure), Table 1 and the fits of bench.json, with its ceiling, eps and noise."""
    bench = f.docs["bench.json"]
    where = "at no n here" if bench["crossover"] is None else f"from n = {bench['crossover']} on here"
    by_n = bench.get("ceiling_by_n_gbps") or {}
    sampled = all(str(n) in by_n for n in bench["n"])
    ceiling = (f"{min(by_n.values()):.1f}-{max(by_n.values()):.1f} GB/s over n, each the median of the samples "
               f"taken between that n's rounds; {bench['ceiling_gbps']:.1f} before and after the timing"
               if sampled else f"{bench['ceiling_gbps']:.1f} GB/s, sampled before and after the timing only")
    caption = ("Compare each kernel's effective bandwidth with the dotted device ceiling ("
               + ("sampled between the rounds of each n, the machine the kernels ran on" if sampled else
                  "sampled before and after the timing only: a host whose level moved meanwhile can put a kernel "
                  "above it") + ") and with the other kernel's: the deduplicating kernel is faster at n wherever "
               f"u(n) < r(n) = beta_dedup/beta_slot (Table 1), {where}.")
    noisy = bench.get("noisy") or {}
    facts = [("ceiling", f"{ceiling} ({bench['ceiling_kind']})"),
             ("fit error eps", ", ".join(f"{k} {v:.3f}" for k, v in bench["eps"].items()) or "-"),
             ("crossover", "none" if bench["crossover"] is None else f"n = {bench['crossover']}")]
    if noisy:
        facts.append(("noisy timings", f"{noisy.get('count')} of {noisy.get('total')} have an IQR above "
                                       f"{noisy.get('threshold')} x their median"))
    columns, rows = table1(bench)
    fit_columns, fit_rows = fits_table(bench)
    fits = _table(fit_columns, fit_rows, FITS_CAPTION, text_columns=3) if fit_rows else \
        "<p>bench.json holds no fits.</p>"
    return (_figure(bandwidth_figure(bench), caption) + "<h3>Table 1: effective bandwidth, GB/s (% of ceiling)</h3>"
            + _table(columns, rows, TABLE1_CAPTION) + "<h3>Fits on chosen ids: (4) and (E.1)</h3>" + fits
            + _facts(facts))


# ---- staircase -----------------------------------------------------------------------------------------------
def staircase_section(f: Folder) -> str:
    """k_hat*(a) of each policy as a step function with its step points, one panel per plan version; the step
    times and step points as tables."""
    plan = f.docs["plan.json"]
    versions = [v for v, (stairs, _) in PLAN_VERSIONS.items() if stairs in plan]
    policies = _policies(plan[PLAN_VERSIONS[versions[0]][0]])
    tables = []
    for version in versions:
        stairs_key, times_key = PLAN_VERSIONS[version]
        stairs, times = plan[stairs_key], plan[times_key]
        rows = []
        for k in range(plan["kmax"] + 1):
            step_points = [("-" if k == 0 else "not reached" if stairs[p]["step_points"][k - 1] >= 1 else
                            f"{stairs[p]['step_points'][k - 1]:.4f}") for p in policies]
            rows.append([str(k), *(_ms(times[p][k]) for p in policies), *step_points])
        tables.append(f"<h3>{_e(version)}: step times and step points (B.31)</h3>" + _table(
            ("k", *(f"V_hat(k) {p}, ms" for p in policies), *(f"a_k {p}" for p in policies)), rows,
            "V_hat(k) = tau(k+1) + h(k): the plan's step time drafting k tokens; k_hat*(a) >= k exactly when a > a_k"))
    caption = ("Read off the best draft length at your acceptance rate and where each policy's staircase jumps "
               "(its step points a_j, the markers: k_hat* >= j for a > a_j), one panel per version of the plan: a "
               "policy whose steps come at lower acceptances drafts more tokens sooner.")
    return _figure(staircase_figure(plan, versions, policies), caption) + "".join(tables)


# ---- Figure 4: saving ----------------------------------------------------------------------------------------
def saving_section(f: Folder) -> str:
    """Figure 4: the plan's predicted saving with its band (18), measured-time and calibrated versions, and the
    engine's measured saving with its 95% interval when runs.json is there."""
    runs = f.docs.get(RUNS)
    note = "" if runs is not None else _missing(f"the engine's measured saving: {f.problems[RUNS]}")
    caption = ("Look for the engine's measured saving (black, 95% interval) inside the shaded band (18) around the "
               "predicted saving: above zero the deduplicating kernel is faster, and the crossover is the n from "
               "which the saving stays positive.")
    return _figure(saving_figure(f.docs["plan.json"], runs), caption) + note


# ---- Figure 5 and Tables 3, 8: prediction against measurement --------------------------------------------------
def _compared(f: Folder) -> tuple[Any, dict[str, list[dict]]] | str:
    """The score (moespec.predict.score, default version) and the per-acceptance comparison, or why there is none."""
    plan_path, runs_path = str(f.path / "plan.json"), str(f.path / RUNS)
    try:
        return (score_files(plan_path, runs_path),
                acceptance_rows(f.docs["plan.json"], f.docs[RUNS], runs_path))
    except MoespecError as e:
        return f"the plan cannot be scored against {RUNS}: {e}"


def acceptance_section(f: Folder) -> str:
    """Figure 5 and its table: per policy and acceptance, k_hat* vs k*, the loss vs (20), the speedup vs (21)."""
    compared = _compared(f)
    if isinstance(compared, str):
        return _missing(compared)
    _, per_policy = compared
    per_policy = {p: per_policy[p] for p in _policies(per_policy)}
    plan = f.docs["plan.json"]
    predicted = {(row["policy"], round(row["a"], ACCEPTANCE_DIGITS)): row["speedup"] for row in plan["table"]}
    deltas = plan.get("delta_steps", {}).get("prediction", {})
    cells = {(c["policy"], round(c["a"], ACCEPTANCE_DIGITS), c["k"]): c
             for c in f.docs[RUNS].get("throughput") or [] if c.get("a") is not None}
    rows = []
    for p, entries in per_policy.items():
        delta = deltas.get(p)
        bound = None if delta is None else float(theory.throughput_loss_bound(delta))
        for r in entries:
            e = r["speedup"] / predicted[p, r["a"]] - 1
            rows.append([p, f"{r['a']:g}", str(r["k_hat"]), str(r["k_star"]), _pct(r["loss"]),
                         "no band" if bound is None else _pct(bound), f"{predicted[p, r['a']]:.3f}",
                         f"{r['speedup']:.3f}", f"{e:+.1%}",
                         "no band" if r["lo"] is None else f"[{r['lo']:.3f}, {r['hi']:.3f}]",
                         "no band" if r["inside"] is None else "yes" if r["inside"] else "no",
                         *_rates(cells.get((p, r["a"], r["k_hat"])))])
    fig = acceptance_figure(per_policy, predicted, deltas, plan["kmax"], LOSS_LIMIT)
    caption = ("Check, per acceptance, that the plan's k_hat* is within one of the measured best k (left), that the "
               "throughput it loses stays under its bound (20) (middle) and that the speedup error stays inside the "
               "band (21) (right).")
    rate = plan_rate(plan)
    table = _table(("policy", "a", "k_hat*", "k* measured", "loss at k_hat*", "bound (20)", "speedup predicted",
                    "speedup measured", "error", "band (21)", "inside", "T(k_hat*) computed",
                    "T(k_hat*) counted [95%]", "counted / computed"), rows,
                   f"k*, loss and speedup on the {rate} throughput (the one the plan names: plan.json "
                   f"throughput_rate); computed: G_a(k) over the median step time (B.1); counted: every emitted "
                   f"token over the steps' time, the paper's, with its interval over the steps; tokens/s. bound "
                   f"(20) and band (21) use the plan's step-time delta of each policy (delta_steps.prediction); "
                   f"measured speedup: best measured throughput over plain decoding's", text_columns=1)
    return _figure(fig, caption) + table


def _rates(cell: dict[str, Any] | None) -> list[str]:
    """A throughput row's computed and counted rates (with the counted one's interval) and their ratio."""
    if cell is None or cell.get("counted_tokens_per_s") is None:
        return ["-" if cell is None else f"{cell['tokens_per_s']:.1f}", "-", "-"]
    counted, interval = cell["counted_tokens_per_s"], cell.get("counted_tokens_per_s_ci")
    return [f"{cell['tokens_per_s']:.1f}",
            f"{counted:.1f}" + ("" if interval is None else f" [{interval[0]:.1f}, {interval[1]:.1f}]"),
            f"{counted / cell['tokens_per_s']:.3f}"]


def score_section(f: Folder) -> str:
    """Table 3 (per n: saving error against (18), verify-time error per kernel) and Table 8 (the six verdicts)."""
    compared = _compared(f)
    if isinstance(compared, str):
        return _missing(compared)
    result, _ = compared
    plan, runs = f.docs["plan.json"], f.docs[RUNS]
    rules = {rule.name: rule for rule in result.rules}
    errors = rules["verify_time"].detail["errors"]
    rows = []
    # llama.cpp's runs time one kernel (dedup) and measure no saving: their columns read "-"
    for n in sorted({n for per_n in errors.values() for n in per_n}, key=int):
        s, m = plan["saving"].get(n), runs["saving_s"].get(n)
        predicted = ["-", "-"] if s is None else [_ms(s["predicted_s"], "+.3f"), _ms(s["band_s"])]
        if s is None or m is None:
            measured = ["-" if m is None else f"{_ms(m['median'], '+.3f')}", "-", "-"]
        else:
            error = s["predicted_s"] - m["median"]
            measured = [f"{_ms(m['median'], '+.3f')} [{_ms(m['lo'], '+.3f')}, {_ms(m['hi'], '+.3f')}]",
                        _ms(error, "+.3f"), "yes" if abs(error) <= s["band_s"] else "no"]
        rows.append([n, *predicted, *measured, *(_pct(errors[k][n]) if n in errors.get(k, {}) else "-"
                                                 for k in ("slot", "dedup"))])
    table3 = _table(("n", "S_hat ms", "band (18) ± ms", "S measured ms [95%]", "S_hat - S ms", "within (18)",
                     "verify error slot", "verify error dedup"), rows,
                    f"{result.version} version; verify error |tau_hat - tau| / tau, n = 1 left out (tau_hat(1) is the "
                    f"measured one-token time)")
    table8 = _table(("rule", "predicted", "measured", "verdict"),
                    [[r.rule, *r.shown, VERDICT[r.holds]] for r in result.rules], text_columns=3)
    facts = [("all six hold" if result.applicable == 6 else f"all {result.applicable} applicable hold",
              "yes" if result.all_hold else "no"),
             ("throughput scored", f"the {result.rate} rate (rules 2, 3 and 6)"),
             ("pre-registered", result.pre_registration),
             ("plan sha256", result.plan_sha256)]
    if result.machine is not None:
        m = result.machine
        facts.append(("machine state", result.machine_note or
                      f"the same within {m['drift']:.0%}: streaming ceiling of the plan's inputs "
                      f"{', '.join(f'{k} {v:.1f}' for k, v in m['plan_inputs_gbps'].items())} GB/s, runs "
                      f"{m['runs_gbps']:.1f} GB/s"))
    versions = [v for v, keys in VERSIONS.items() if keys.table in plan]
    by_version = {v: score_files(str(f.path / "plan.json"), str(f.path / RUNS), v) for v in versions}
    cell = lambda rule: Markup(f"{VERDICT[rule.holds]} {_e(rule.shown[1])}")  # noqa: E731
    table8_all = _table(("rule", *versions), [[rule.rule, *(cell(s.rules[i]) for s in by_version.values())]
                                              for i, rule in enumerate(result.rules)],
                        "each version of the plan scored against the same runs: the verdict and what was measured",
                        text_columns=1)
    return ("<h3>Table 3: saving and verify time per n</h3>" + table3
            + "<h3>Table 8: the six scoring rules</h3>" + table8 + _facts(facts)
            + "<h3>Table 8 by plan version</h3>" + table8_all)


def drafting_section(f: Folder) -> str:
    """The demo's drafting step on the trained pair: the measured acceptance profile beside the plan's k_hat, and
    every constant k, transformers' heuristic and the online policy."""
    d = f.docs[DRAFTING_FILE]
    profile = ", ".join(f"{a:.2f}" for a in d["profile_calibration"])
    replay = d.get("replay", {})
    rows = [[cell, f"{row['tokens_per_s']:.1f}", f"{row['vs_best_constant']:.3f}",
             f"{replay[cell]:.3f}" if cell in replay else "-",
             "-" if row["mean_k"] is None else f"{row['mean_k']:.2f}", "yes" if row["greedy_exact"] else "no"]
            for cell, row in d["cells"].items()]
    return (f"<p>{_e(d.get('prompts_source', ''))}; {d['prompts']} prompts, {d['tokens']} tokens each. Acceptance "
            f"profile a_1..a_{len(d['profile_calibration'])} on the calibration prompts: {_e(profile)} (not "
            f"geometric: G(k) = 1 + a_1 + a_1 a_2 + ...). The plan's k_hat from it and the measured step times: "
            f"{d['k_hat_plan']}; the best constant k measured: {d['best_constant_k']}. Replayed: each cell decoded "
            f"again on the prompts' agreement sequences with the calibration's step times, without the machine's "
            f"noise (moespec.measure.drafting.replay).</p>"
            + _table(["cell", "tokens/s", "/ best constant", "replayed / best", "mean k", "tokens = plain decoding's"],
                     rows))


# ---- the page ------------------------------------------------------------------------------------------------
# (anchor, link text, title, the artifacts it needs, the function that renders it from them)
SECTIONS: tuple[tuple[str, str, str, tuple[str, ...], Callable[[Folder], str]], ...] = (
    ("reuse", "Figure 1", "Figure 1: reuse rho(n) of the trace", ("trace.npz",), reuse_section),
    ("bandwidth", "Figure 2, Table 1", "Figure 2 and Table 1: effective bandwidth of each kernel", ("bench.json",),
     bandwidth_section),
    ("staircase", "staircase", "The staircase k_hat*(a) and its step points", ("plan.json",), staircase_section),
    ("saving", "Figure 4", "Figure 4: the saving S(n), measured against predicted", ("plan.json",), saving_section),
    ("acceptance", "Figure 5", "Figure 5: best draft length, throughput loss and speedup, per acceptance",
     ("plan.json", RUNS), acceptance_section),
    ("score", "Tables 3, 8", "Tables 3 and 8: the prediction scored", ("plan.json", RUNS), score_section),
    ("engine", "engine", "The engine: verify times, AUTO, overhead, greedy agreement", (), engine_section),
    ("drafting", "drafting", "Drafting on the trained pair: the acceptance profile, constant k, heuristic, online",
     (DRAFTING_FILE,), drafting_section),
    ("batch", "batch map", "Batch sizes: k_hat*(a, B), B_stop(a) and the step times V_B(k)", ("plan.json",),
     lambda f: batch_section(f.docs["plan.json"], f.docs.get(RUNS)) if "batch" in f.docs["plan.json"]
     else _missing("the plan has no batch map (moespec plan --batch)")),
)


def render(f: Folder, page_dir: str | Path | None = None) -> str:
    """The whole page, its paths written from `page_dir` (the folder the page is written to; default the artifacts'
    folder)."""
    if not isinstance(f, Folder):
        raise ValueError(f"f must be a Folder (moespec.report.folder.load_folder), got {type(f).__name__}")
    model = _model(f)
    body = [f"<h1>moespec report: {_e(model)}</h1>", f"<p>Made from the folder {_e(f.path)}.</p>"]
    # the plain answer first after the title, behind only a warning that the plan is not of the folder's files
    body += [warnings_html(f), verdict_section(f), inputs_section(f, f.path if page_dir is None else page_dir),
             "<h2>What ran on what</h2>", header(f)]
    body.append("<nav>" + " | ".join(f'<a href="#{anchor}">{_e(link)}</a>' for anchor, link, *_ in SECTIONS)
                + "</nav>")
    for anchor, _, title, needs, section in SECTIONS:
        problem = f.missing(*needs)
        body.append(f'<section id="{anchor}"><h2>{_e(title)}</h2>'
                    f"{_missing(problem) if problem else section(f)}</section>")
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>moespec report: {_e(model)}'
            f"</title><style>{CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")


def write_report(folder: str | Path, out: str | Path | None = None) -> Path:
    """Read DIR's artifacts and write the page to `out` (default DIR/report.html, locked meanwhile); returns its
    path."""
    target = check_output(out or Path(folder) / DEFAULT_NAME)  # before any work
    f = load_folder(folder)  # before writing() can make the folder
    with writing(target):
        page = render(f, target.parent)
        return atomic_write(target, lambda tmp: tmp.write_text(page, encoding="utf-8"))



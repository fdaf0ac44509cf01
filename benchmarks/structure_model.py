"""Validation of the structural model of the expert kernels (moespec.kernels.structure), leave-one-out: no parameter
of the model is fitted on any model it predicts. The device profile (`moespec profile`) is taken once on synthetic
shapes only; then, for one MoE layer of each preset, of the trained pair's target and of two shapes no model has,
the expert operation of both our kernels is measured (`moespec bench`: n = 1..9, and passes of B = 8 windows x n
tokens, up to 72) and predicted from the profile, pass by pass, at the streaming ceiling the bench measured between
the rounds of that n, each expert's bytes at that ceiling times its placement (moespec.measure.placement: the read
rate of the memory behind the bench's draw of the weights over the ceiling buffer's; device measurements of the same
run, never a fitted parameter). It writes the error table
(median and largest relative error per model, kernel and batch, over n, of each n's mean time over the recorded
windows; and over every timed pass; and, paired by round, each call predicted at the ceiling sampled right after it
(the benches sample one after every call), against that round's times, the median over rounds) and, from the
measured and the predicted bench (`bench --predict` at the ceilings the measured bench sampled at each n and its
placement), the crossover and k_hat*(a) of `moespec plan` side by side (the measured bench's from its op times as
timed, the predicted one's and the profile alone's as a user's plan answers), with the speedup the predicted k_hat*(a)
gives up on the measured bench (plan_sides).

Each step is one command short enough to hold the CPU lock for (each model's measurement is written as it finishes;
a rerun skips what exists, and a bench interrupted midway resumes from its checkpoint):
    .venv/bin/python benchmarks/structure_model.py profile
    .venv/bin/python benchmarks/structure_model.py model olmoe-1b-7b   # each MODEL
    .venv/bin/python benchmarks/structure_model.py table
    .venv/bin/python benchmarks/structure_model.py summary --runs RUN1,RUN2,..   # several runs' tables, into OUT
`--dtype q8_0` (or q4_0) measures and predicts ggml's pair (ggml-per-slot, ggml-mul_mat_id: what a bench of a GGUF
format times) from a profile of that format (`profile --dtypes q8_0,q4_0 --profile FILE`), into MODEL/q8_0/;
`--batches 1` leaves out the passes of B = 8. `profile --pin-wait S` takes every call of the profile at one bandwidth
level of the host (moespec.measure.level; `--pin-gbps` names it, else the host's when the rounds start), and every
model's benches are then kept at the profile's level, waiting S seconds at most for it: the profile and the benches
meet one state of a shared host, so what is left of the error is the model's. A profile the profile checks flag (its
calls met two states) is taken again, PROFILE_TAKES takes at most (`--takes`: where the host moves every few minutes
every take comes out flagged, and each costs a whole profile's time). Each bench measured is bracketed by a probe of
the host's loop (bench_state.py: the profile's check passes timed again) and predicted at the loop factor k it gives
(moespec.measure.state_probe); the tables keep the prediction at the profile's own loop beside it (unprobed).
Models: the presets, `pair` (moespec/data/pair/target, its recorded WikiText-2 routing) and `heldout-1536x512`,
`heldout-3072x1536` (OLMoE-class configs written into the results folder, N = 64, m = 8). A model with published reuse
(OLMoE, Qwen3, gpt-oss) is routed by its calibrated default trace, the others (DeepSeek-V2-Lite, the held-out shapes)
by a trace calibrated to OLMoE's, or uniform routing where that is out of the process's reach (Mixtral: N = 8, m = 2).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np

from moespec import ArgumentError, MoespecError
from moespec.defaults import BENCH_DTYPES, PAIR_DIR, PAIR_TRACE, PROFILE, TRACE_DOCS, TRACE_TOKENS
from moespec.formats.benchfile import load_bench
from moespec.formats.devicefile import load_profile
from moespec.formats.files import provenance, write_json
from moespec.measure.bench import BenchConfig, bench_layers, bench_passes, bench_trace, run_bench
from moespec.measure.device_profile import ProfileConfig, pair_of, run_profile
from moespec.measure.level import Level, check_level, pinned_of
from moespec.model.gguf import resolve_model
from moespec.model.spec import PRESETS
from moespec.predict.checks import profile_checks
from moespec.kernels.structure import Rates, kind_rates, pass_time
from moespec.predict.structure_bench import predict_bench
from moespec.routing.synth import PROFILES, synthesize
from bench_state import around_bench
from plan_sides import KHAT_VERDICTS, agreement, bench_errors, plan_sides, side_state

OUT = Path("results/structure-model")
# Synthesized traces (~6 MB each, seeded: the same bytes on every run; each bench records its sha1) stay out of results/
TRACES = Path("out/structure-model/traces")
# Two shapes no preset or the pair has, as OLMoE-class configs (hidden d, expert width f); N, m and L are OLMoE's so
# the calibrated OLMoE routing targets apply
HELD_OUT = {"heldout-1536x512": (1536, 512), "heldout-3072x1536": (3072, 1536)}
OLMOE_REUSE = (0.363, 0.762)  # the paper's layer-mean rho(2), rho(9) of OLMoE on WikiText-103 (Section 2)
MODELS = (*PRESETS, "pair", *HELD_OUT)
BATCHES = (1, 8)  # n = 1..9 tokens, and passes of 8 windows x n tokens (8 to 72)
# Settings per batch and model: a model whose passes read GBs (Mixtral's experts are 352 MB) gets fewer windows and
# rounds. A pass of B = 8 windows reads most of the layer (U near N from 8 tokens on), so its windows differ little
# and each call streams the layer twice (its read before the flush): fewer pass sizes, windows, U values and rounds
# keep a model's B = 8 bench near a minute or two, so every run carries it beside B = 1
SETTINGS = {1: {"reps": 5, "windows": 8, "u_values": 4, "n": tuple(range(1, 10))},
            8: {"reps": 3, "windows": 4, "u_values": 2, "n": (1, 3, 5, 7, 9)}}
LARGE = {1: {"mixtral-8x7b": {"reps": 3, "windows": 4, "u_values": 3}, "gpt-oss-20b": {"reps": 3, "windows": 6}},
         8: {"mixtral-8x7b": {"n": (1, 5, 9)}}}
# tau(1) of the plans that compare k_hat*: the model's expert time at n = 1 over this share of a one-token pass (the
# same tau(1) for the measured and the predicted bench; only their expert-op times differ)
EXPERT_SHARE = 0.6
SIDE_TAGS = ("paired_", "profile_", "unprobed_")  # the errors beside the table's own: by call, alone, unprobed
TARGET = (0.10, 0.20)  # the target: median and largest relative error over n, per model and kernel
# A profile the profile checks flag (its calls met two states of the host) is taken again, this many takes at most
# (--takes); the first unflagged one is kept, else the last (no model's pass takes part in the check)
PROFILE_TAKES = 3


def model_arg(name: str, out: Path) -> tuple[str, str]:
    """(--model, --trace) of a model of MODELS: a preset and its synthesized default trace, the pair's target and its
    recorded trace, or a held-out config (written under `out`) and a trace calibrated to OLMoE's reuse (in TRACES)."""
    traces = TRACES
    traces.mkdir(parents=True, exist_ok=True)
    if name == "pair":
        return str(PAIR_DIR / "target"), str(PAIR_TRACE)
    model, trace = name, traces / f"{name}.npz"
    if name in HELD_OUT:
        d, f = HELD_OUT[name]
        config = json.loads((PAIR_DIR / "target" / "config.json").read_text()) | {
            "hidden_size": d, "intermediate_size": f, "num_hidden_layers": 16, "num_experts": 64,
            "num_experts_per_tok": 8, "num_attention_heads": 16, "num_key_value_heads": 16, "vocab_size": 50304}
        folder = out / "configs" / name
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps(config, indent=1))
        model = str(folder / "config.json")
    if not trace.exists():
        targets = None if name in PROFILES[PROFILE] else OLMOE_REUSE  # no published reuse: OLMoE's
        try:
            synthesize(model, "calibrated", TRACE_TOKENS, TRACE_DOCS, 0, PROFILE, targets).save(trace)
        except ArgumentError:  # OLMoE's reuse is out of the calibrated process's reach at this N, m (Mixtral's 8, 2)
            synthesize(model, "uniform", TRACE_TOKENS, TRACE_DOCS, 0).save(trace)
    return model, str(trace)


def model_dir(out: Path, name: str, dtype: str) -> Path:
    """Where one model's benches and errors.json go: out/NAME for bf16, out/NAME/DTYPE for another format."""
    return out / name if dtype == "bf16" else out / name / dtype


def configs(name: str, out: Path, dtype: str, batches: tuple[int, ...], device: str = "cpu",
            level: dict[str, Any] | None = None) -> dict[int, BenchConfig]:
    """The measured bench of each batch size (layer 0, both kernels of the format's pair: the bench's default) on
    `device`, kept at a pinned `level` (a profile's Level.record, its pinned_gbps and wait_s) where one is given."""
    pinned = pinned_of(level)
    model, trace = model_arg(name, out)
    s = {batch: SETTINGS[batch] | LARGE[batch].get(name, {}) for batch in batches}
    return {batch: BenchConfig(out=str(model_dir(out, name, dtype) / f"bench-B{batch}.json"), model=model,
                               layers=(0,), dtype=dtype, n=s[batch]["n"], trace=trace, reps=s[batch]["reps"],
                               windows=s[batch]["windows"], u_values=s[batch]["u_values"], batch=batch,
                               device=device, call_ceilings=True, level_gbps=pinned,
                               level_wait_s=level["wait_s"] if pinned else None)
            for batch in batches}


def pass_errors(config: BenchConfig, bench: dict[str, Any], rates: dict[str, Rates], cache: float,
                state: Callable[[Rates, float], Rates] | None = None) -> dict[str, Any]:
    """Per kernel and n: each pass's measured median and predicted time (rates[kind], or state(rates[kind], C) where
    `state` gives the rates a ceiling of C GB/s finds (a variant of the model; None: the same at every C); at the
    ceiling the bench sampled
    at that n: the median of the samples after its calls where the bench kept one per call and measured its
    placement against their buffer, else those between its groups; each expert at its placement), and the
    relative error of the mean over the recorded windows; where the bench kept each round's
    times and a ceiling sample per call (round_ceiling_gbps, `bench --call-ceilings`) or per group
    (ceiling_rounds_gbps), also each round's prediction at the sample taken right after that call or group and the
    paired error: the median over rounds of the windows' mean predicted over their mean measured, less 1 (a pass
    compared with the state it met, not the median state of that n)."""
    def predict(kind: str, ids: np.ndarray, b: float, ceiling: float, placed: list[float] | None) -> float:
        at = rates[kind] if state is None else state(rates[kind], ceiling)
        return pass_time(at, kind, ids, b, spec.expert_rows, ceiling, cache, placed)

    spec = resolve_model(config.model)
    layers = bench_layers(config.layers, spec)
    trace, _ = bench_trace(spec, config.trace, config.seed)
    plan, _, ns = bench_passes(spec, config, trace, layers)
    kinds = {name: kind for kind, name in pair_of(config.dtype).items()}
    out: dict[str, Any] = {k: {} for k in kinds}
    for (layer, n), passes in plan.items():
        b = spec.expert_bytes(layer, config.dtype)
        placed = (bench.get("placement") or {}).get(str(layer))  # the memory behind the bench's weights
        by_round = (bench.get("ceiling_rounds_gbps") or {}).get(str(layer), {}).get(str(n))
        rows = {"chosen": bench["chosen"][str(layer)][str(n)], "window": bench["windows"][str(layer)][str(n)]}
        # the median sample after this n's calls where the bench kept them and measured its placement against their
        # buffer; without a placement those samples stand for no read of the weights, and the samples between its
        # groups do (the bench's own ceiling)
        samples = [c for source in rows.values() for row in source
                   for calls in row.get("round_ceiling_gbps", {}).values() for c in calls] if placed else []
        ceiling = float(np.median(samples)) if samples else bench["ceiling_by_n_gbps"][str(n)]
        seen = {"chosen": 0, "window": 0}
        for kernel in kinds:
            out[kernel][str(n)] = {"ceiling_gbps": ceiling, "passes": []}
        for p in passes:
            row = rows[p.source][seen[p.source]]
            seen[p.source] += 1
            assert row["U"] == p.U, "the regenerated passes must be the bench's"
            for kernel, kind in kinds.items():
                record = {"source": p.source, "U": p.U, "measured_s": row["median_s"][kernel],
                          "iqr_s": row["iqr_s"][kernel],
                          "predicted_s": predict(kind, p.ids, b, ceiling, placed)}
                calls = row.get("round_ceiling_gbps", {}).get(kernel) or by_round  # each call's own sample if kept
                if calls and len(row.get("round_s", {}).get(kernel, [])) == len(calls):
                    record |= {"round_s": row["round_s"][kernel], "round_ceiling_gbps": calls,
                               "round_predicted_s": [predict(kind, p.ids, b, c, placed) for c in calls]}
                out[kernel][str(n)]["passes"].append(record)
        for kernel in kinds:
            windows = [q for q in out[kernel][str(n)]["passes"] if q["source"] == "window"]
            measured, predicted = (float(np.mean([q[key] for q in windows])) for key in ("measured_s", "predicted_s"))
            out[kernel][str(n)] |= {"mean_measured_s": measured, "mean_predicted_s": predicted,
                                    "error": predicted / measured - 1}
            if windows and all("round_s" in q for q in windows):
                ratios = [np.mean([q["round_predicted_s"][r] for q in windows]) / np.mean([q["round_s"][r]
                                                                                          for q in windows])
                          for r in range(len(windows[0]["round_s"]))]
                out[kernel][str(n)]["paired_error"] = float(np.median(ratios)) - 1
    return out


def step_model(name: str, out: Path, profile_path: Path, dtype: str, batches: tuple[int, ...]) -> None:
    """Measure (unless done), predict and compare one model in one format on the profile's device kind (module
    docstring); writes errors.json in model_dir."""
    profile = load_profile(profile_path)
    if dtype not in profile.dtypes:
        raise ArgumentError(f"{profile_path} timed {', '.join(profile.dtypes)}, not {dtype}")
    rates = kind_rates(profile["dtypes"][dtype], profile.ceiling_gbps)
    result: dict[str, Any] = {"model": name, "dtype": dtype, "profile": str(profile_path), "batches": {}}
    for batch, config in configs(name, out, dtype, batches, profile["device_kind"], profile.get("level")).items():
        Path(config.out).parent.mkdir(parents=True, exist_ok=True)
        state = around_bench(config.out, profile, dtype, lambda: run_bench(config, say=print))
        k = state["loop_factor"] if state else None
        bench = load_bench(config.out)
        predicted_out = config.out.replace("bench-", "predicted-")
        predicted = predict_bench(BenchConfig(**{**config.__dict__, "out": predicted_out}), str(profile_path),
                                  **side_state(bench), loop_factor=k)
        from_profile = config.out.replace("bench-", "from-profile-")  # a user's: the profile alone, at its ceiling
        alone = predict_bench(BenchConfig(**{**config.__dict__, "out": from_profile}), str(profile_path))
        errors = pass_errors(config, bench, rates, profile["cache_bytes"],
                             None if k is None else lambda r, _: r.loop_scaled(k))
        unprobed = pass_errors(config, bench, rates, profile["cache_bytes"]) if k is not None else None
        spec = resolve_model(config.model)
        tau1 = spec.L * bench["per_layer"]["0"]["one_token_s"]["measured_s"] / EXPERT_SHARE if batch == 1 else None
        entry = {"ceiling_gbps": bench["ceiling_gbps"], "ceiling_iqr_gbps": bench["ceiling_iqr_gbps"],
                 "noisy": bench["noisy"], "passes": errors,
                 "from_profile": bench_errors(bench, alone), "loop_factor": k,
                 **({"unprobed": {kernel: {n: v["error"] for n, v in by_n.items()} for kernel, by_n in
                                  unprobed.items()}} if unprobed else {}),
                 "crossover": {"measured": bench["crossover"], "predicted": predicted["crossover"]}}
        if tau1 is not None:
            entry["plan"] = plan_sides(config.out, predicted_out, from_profile, config.trace, tau1)
        result["batches"][str(batch)] = entry
    result["provenance"] = provenance(profile["device"], dtype)
    write_json(model_dir(out, name, dtype) / "errors.json", result)
    print(json.dumps(summary_rows(result), indent=1))


def summary_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Per batch and kernel: median and largest |error| over n of the windows' mean time (and the median signed
    error: + where predicted slow), over every pass, paired by call where the bench sampled each, of `bench --predict`
    at the profile's own ceiling where errors.json has it (from_profile: what a user with the profile alone is told)
    and, where a state probe set the loop's factor, of the model with the profile's loop (unprobed)."""
    rows = []
    for batch, entry in result["batches"].items():
        for kernel, by_n in entry["passes"].items():
            per_n = [abs(v["error"]) for v in by_n.values()]
            per_pass = [abs(q["predicted_s"] / q["measured_s"] - 1) for v in by_n.values() for q in v["passes"]]
            worst = max(by_n, key=lambda n: abs(by_n[n]["error"]))
            paired = [abs(v["paired_error"]) for v in by_n.values() if "paired_error" in v]
            alone = [abs(v) for v in entry.get("from_profile", {}).get(kernel, {}).values()]
            unprobed = [abs(v) for v in entry.get("unprobed", {}).get(kernel, {}).values()]
            rows.append({"model": result["model"], "dtype": result.get("dtype", "bf16"), "batch": int(batch),
                         "kernel": kernel,
                         "median_error": float(np.median(per_n)), "max_error": max(per_n), "max_at_tokens": int(worst),
                         "median_signed_error": float(np.median([v["error"] for v in by_n.values()])),
                         "pass_median_error": float(np.median(per_pass)), "pass_max_error": max(per_pass),
                         "ceiling_gbps": entry["ceiling_gbps"],
                         **({"paired_median_error": float(np.median(paired)), "paired_max_error": max(paired)}
                            if len(paired) == len(per_n) else {}),
                         **({"profile_median_error": float(np.median(alone)), "profile_max_error": max(alone)}
                            if alone else {}),
                         **({"unprobed_median_error": float(np.median(unprobed)), "unprobed_max_error": max(unprobed)}
                            if unprobed else {})})
    return rows


def table_rows(result: dict[str, Any], level: float | None) -> list[dict[str, Any]]:
    """summary_rows of one model's errors, each with whether its bench's ceiling read as a pinned profile's `level`
    (GB/s; None: the profile was not pinned)."""
    return [r | {"at_profile_level": None if level is None else Level(level, 1).within(r["ceiling_gbps"])}
            for r in summary_rows(result)]


def step_table(out: Path, profile_path: Path) -> None:
    """table.json and table.md from every model's errors.json, every format; where the profile was pinned, whether
    each bench's ceiling read as the profile's level (else the bench met another state of the host than its
    profile, its wait for the level spent)."""
    rows, sides = [], []
    level = pinned_of(load_profile(profile_path).get("level")) if profile_path.exists() else None
    for name, dtype in [(name, dtype) for dtype in BENCH_DTYPES for name in MODELS]:
        path = model_dir(out, name, dtype) / "errors.json"
        if not path.exists():
            continue
        result = json.loads(path.read_text())
        rows += table_rows(result, level)
        entry = result["batches"]["1"]
        sides.append({"model": name, "dtype": dtype, "crossover": entry["crossover"],
                      "crossover_B8": result["batches"].get("8", {}).get("crossover"), "plan": entry.get("plan")})
    lines = ["| model | dtype | B | kernel | median error over n | max error over n (at tokens) | median / max over "
             "passes | paired by round: median / max over n | the profile alone: median / max over n | the "
             "profile's loop (unprobed) | ceiling GB/s |" + (f" at the profile's {level:.1f} GB/s |" if level else ""),
             "|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if level else "")]
    lines += [f"| {r['model']} | {r['dtype']} | {r['batch']} | {r['kernel']} | {r['median_error']:.1%} | "
              f"{r['max_error']:.1%} "
              f"({r['max_at_tokens']}) | {r['pass_median_error']:.1%} / {r['pass_max_error']:.1%} | "
              + " | ".join(f"{r[tag + 'median_error']:.1%} / {r[tag + 'max_error']:.1%}" if tag + "max_error" in r
                           else "-" for tag in SIDE_TAGS)
              + f" | {r['ceiling_gbps']:.1f} |" + (f" {'yes' if r['at_profile_level'] else 'no'} |" if level else "")
              for r in rows]
    lines += ["", "| model | dtype | crossover B=1 measured / predicted | B=8 (tokens) measured / predicted | "
                  "k_hat*(a) measured | k_hat*(a) predicted |", "|---|---|---|---|---|---|"]
    for s in sides:
        plan = s["plan"] or {}
        shown = {side: plan.get(side, {}).get("k_hat") or plan.get(side, {}).get("refused", "-")
                 for side in ("measured", "predicted")}
        b8 = s["crossover_B8"] or {}
        lines.append(f"| {s['model']} | {s['dtype']} | {s['crossover']['measured']} / {s['crossover']['predicted']} | "
                     f"{b8.get('measured')} / {b8.get('predicted')} | {shown['measured']} | {shown['predicted']} |")
    write_json(out / "table.json", {"rows": rows, "side_by_side": sides, "profile_level_gbps": level,
                                    "provenance": provenance()})
    (out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def step_summary(out: Path, runs: list[Path]) -> None:
    """summary.json and summary.md over several runs' table.json (each a profile and every model measured anew): per
    model, batch and kernel (each over the runs that measured it) the median over runs of the median and of the
    largest error over n, with their range, and how many runs met TARGET, unpaired (each n at its bench's ceiling),
    paired by call and from the profile alone (summary_rows), and of the runs whose bench met its pinned profile's
    level (step_table) how many met it; per model the side by sides' agreement over runs (plan_sides.agreement:
    crossover and k_hat*(a), of the predicted bench and of the profile alone, within one and by the paper's rules)."""
    tables = [json.loads((run / "table.json").read_text()) for run in runs]
    rows, lines = [], ["| model | dtype | B | kernel | median error over n: median (range) over runs | max error over "
                       "n: median (range) | runs within 10% / 20% | paired by call: median / max, medians over runs | "
                       "runs within, paired | the profile alone: median / max, medians over runs | runs within, the "
                       "profile alone | the profile's loop (unprobed): median / max | runs within, unprobed | runs "
                       "within of those at the profile's level |", "|---" * 14 + "|"]
    keys = sorted({(r["model"], r["dtype"], r["batch"], r["kernel"]) for t in tables for r in t["rows"]},
                  key=lambda k: (BENCH_DTYPES.index(k[1]), k[2], MODELS.index(k[0]), k[3]))
    for model, dtype, batch, kernel in keys:
        found = [r for t in tables for r in t["rows"]
                 if (r["model"], r["dtype"], r["batch"], r["kernel"]) == (model, dtype, batch, kernel)]
        row: dict[str, Any] = {"model": model, "dtype": dtype, "batch": batch, "kernel": kernel, "runs": len(found)}
        for tag in ("", *SIDE_TAGS):
            med, top = tag + "median_error", tag + "max_error"
            if not all(med in r for r in found):  # a run without a ceiling sample per call, or older
                row[tag + "median_error"] = row[tag + "max_error"] = row[tag + "runs_within"] = None
                continue
            medians, maxima = [r[med] for r in found], [r[top] for r in found]
            row[tag + "median_error"] = {"median": float(np.median(medians)), "range": [min(medians), max(medians)]}
            row[tag + "max_error"] = {"median": float(np.median(maxima)), "range": [min(maxima), max(maxima)]}
            row[tag + "runs_within"] = sum(a <= TARGET[0] and b <= TARGET[1] for a, b in zip(medians, maxima))
        at_level = [r for r in found if r.get("at_profile_level")]
        row["at_level"] = {"runs": len(at_level), "within": sum(r["median_error"] <= TARGET[0]
                                                                and r["max_error"] <= TARGET[1] for r in at_level)}
        rows.append(row)
        m, x = row["median_error"], row["max_error"]
        paired = " ".join(f"{row[tag + 'median_error']['median']:.1%} / {row[tag + 'max_error']['median']:.1%} | "
                          f"{row[tag + 'runs_within']} of {len(found)} |" if row[tag + "median_error"] else "- | - |"
                          for tag in SIDE_TAGS)
        lines.append(f"| {model} | {dtype} | {batch} | {kernel} | {m['median']:.1%} ({m['range'][0]:.1%}-"
                     f"{m['range'][1]:.1%}) | {x['median']:.1%} ({x['range'][0]:.1%}-{x['range'][1]:.1%}) | "
                     f"{row['runs_within']} of {len(found)} | {paired} {row['at_level']['within']} of "
                     f"{row['at_level']['runs']} |")
    sides = {(s["model"], s["dtype"]): [] for t in tables for s in t["side_by_side"]}
    for t in tables:
        for s in t["side_by_side"]:
            sides[s["model"], s["dtype"]].append(s)
    lines += ["", "| model | dtype | crossover within one (runs) | measured crossover per run (pairs of runs within "
                  "one) | k_hat*(a) within one at every a (runs; plans refused) | k_hat*(a) by the paper's rules 2 "
                  "and 3 (runs) | the profile alone: within one at every a | the profile alone: rules 2 and 3 | "
                  "measured k_hat*(a) over the runs, per a | speedup given up at the predicted k_hat*(a), largest over "
                  "a: median (range) over runs |", "|---|---|---|---|---|---|---|---|---|---|"]
    agree: dict[str, dict[str, Any]] = {}
    for (model, dtype), found in sides.items():
        key_of = model if dtype == "bf16" else f"{model}/{dtype}"  # summary.json's within_one: a model_dir's name
        agree[key_of] = a = agreement(found)
        counts = [a[key] for key in ("crossover", *KHAT_VERDICTS)]
        lines.append(f"| {model} | {dtype} | {counts[0]['within']} of {counts[0]['runs']} | "
                     f"{', '.join(map(str, a['measured_crossover']['runs']))} ({a['measured_crossover']['within']} "
                     f"of {a['measured_crossover']['pairs']}) | "
                     + " | ".join(f"{k['within']} of {k['runs']}" + (f" ({k['refused']} refused)" if k["refused"]
                                                                      else "") for k in counts[1:]) + " | "
                     + ("; ".join(f"{x}: {min(v)}-{max(v)}" for x, v in a["measured_k_hat"].items()) or "-") + " | "
                     + (f"{np.median(a['loss']):.2%} ({min(a['loss']):.2%}-{max(a['loss']):.2%}; {len(a['loss'])} "
                        f"runs)" if a["loss"] else "-") + " |")
    met = all(r["median_error"]["median"] <= TARGET[0] and r["max_error"]["median"] <= TARGET[1] for r in rows)
    write_json(out / "summary.json", {"runs": [str(r) for r in runs], "target": list(TARGET), "rows": rows,
                                      "within_one": agree, "target_met_in_median": met, "provenance": provenance()})
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"target (median over runs of each model's and kernel's median <= {TARGET[0]:.0%}, max <= "
          f"{TARGET[1]:.0%}): {'met' if met else 'not met'}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("step", choices=("profile", "model", "table", "summary"))
    parser.add_argument("model", nargs="?", choices=MODELS, help="with `model`: the model to measure and predict")
    parser.add_argument("--out", default=str(OUT), help=f"results folder (default {OUT})")
    parser.add_argument("--runs", help="with `summary`: the runs' results folders, comma-separated")
    parser.add_argument("--reps", type=int, default=7, help="with `profile`: its rounds (default 7)")
    parser.add_argument("--dtypes", default="bf16", help="with `profile`: the formats to time (default bf16)")
    parser.add_argument("--dtype", default="bf16", choices=BENCH_DTYPES,
                        help="with `model`: the format to measure and predict, with its pair (default bf16)")
    parser.add_argument("--batches", default=",".join(map(str, BATCHES)),
                        help=f"with `model`: the batch sizes B (default {','.join(map(str, BATCHES))})")
    parser.add_argument("--profile", help="the device profile written or read (default OUT/device.json)")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                        help="with `profile`: the device to profile (cpu: the native kernels; cuda: the Triton ones, "
                             "whose passes take up to 16 tokens: --batches 1); `model` runs on the profile's")
    parser.add_argument("--pin-wait", type=float, help="with `profile`: take every call at one bandwidth level of the "
                        "host, waiting S seconds at most for it; `model` then keeps its benches at the profile's level "
                        "(module docstring; default: no pinning)")
    parser.add_argument("--pin-gbps", type=float,
                        help="with `profile --pin-wait`: the level (default the host's when the rounds start)")
    parser.add_argument("--takes", type=int, default=PROFILE_TAKES,
                        help=f"with `profile`: takes at most while the profile checks flag it "
                             f"(default {PROFILE_TAKES})")
    args = parser.parse_args(argv)
    if args.takes < 1:
        parser.error(f"--takes must be a positive count, got {args.takes}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    profile_path = Path(args.profile) if args.profile else out / "device.json"
    batches = tuple(int(b) for b in args.batches.split(","))
    if not set(batches) <= set(BATCHES):
        parser.error(f"--batches: some of {', '.join(map(str, BATCHES))}")
    try:
        check_level(args.pin_gbps, args.pin_wait)
    except MoespecError as e:
        parser.error(str(e))
    if args.step == "profile":
        for take in range(1, args.takes + 1):
            profile = run_profile(ProfileConfig(out=str(profile_path), device=args.device,
                                                dtypes=tuple(args.dtypes.split(",")), reps=args.reps,
                                                level_gbps=args.pin_gbps, level_wait_s=args.pin_wait), say=print)
            warnings = profile_checks(profile, str(profile_path))
            for line in warnings:
                print(f"warning (take {take} of {args.takes}): {line}")
            if not warnings:
                break
    elif args.step == "model":
        if args.model is None:
            parser.error("model: name the model")
        print(f"# {shlex.join([sys.executable, *sys.argv])}")
        step_model(args.model, out, profile_path, args.dtype, batches)
    elif args.step == "summary":
        runs = [Path(r) for r in (args.runs or "").split(",") if r]
        if not runs or (missing := [str(r) for r in runs if not (r / "table.json").is_file()]):
            parser.error("--runs: give the runs' folders, comma-separated, each with its table.json"
                         + (f" (none in {', '.join(missing)})" if runs else ""))
        step_summary(out, runs)
    else:
        try:
            step_table(out, profile_path)
        except MoespecError as e:  # a profile that does not load: one line naming it
            parser.error(str(e))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

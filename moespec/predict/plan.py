"""`moespec plan`: whole-model verify time, the kernel saving with its band, the crossover, the best draft length
and the speedup, from a bench (bandwidths) and a trace (bytes); with an engine's runs.json, also the calibrated
version. The numbers and their error bounds are computed in `moespec.predict.verify` (physics in its docstring); this
module reads the inputs, assembles plan.json and prints it.

Physics first. A verification pass of n tokens costs the one-token pass plus what the expert operation of every
MoE layer adds when it serves n tokens instead of one (22):

    tau_hat_p(n) = tau_meas(1) + sum_l (t_bar_{p,l}(n) - t_bar_l(1)),   p in {slot, dedup},

with t_bar_{p,l}(n) the layer's op time averaged over recorded windows: the fit at each window's bytes (the
PREDICTION) or the measured per-window median (the MEASURED-TIME version); t_bar_l(1) is the per-slot kernel's,
since both engines run it on one token. The sum covers the first L MoE layers of the model (--moe-layers: all of
them, or the shape-faithful prefix an engine runs with fewer layers). The bench times only some MoE layers; each
covered layer takes the timed layers' time per expert byte, scaled by its own w_l (sum over the L layers =
(W_L / W_timed) x sum over timed ones). Given the whole-model verify times an engine measured with dedup off
(--runs), the CALIBRATED version takes the growth with n of the time outside the expert operation from them:

    tau_cal_p(n) = tau_meas_slot(n) - sum_l t_bar_{slot,l}(n) + sum_l t_bar_{p,l}(n)   (fits),

so tau_cal_slot is the measured time and tau_cal_dedup inherits its growth outside the expert operation.

The saving S_hat(n) = tau_slot(n) - tau_dedup(n) carries the band (18): with every bandwidth off by |e| <= eps,
|S_hat - S| <= eps/(1-eps) (M^e_slot + M^e_dedup), M^e_p the summed expert-op times (here the predicted ones,
for which the bound holds with factor eps <= eps/(1-eps)). Which kernel is faster is decided where the margin
(19) |ln r(n) - ln u(n)| - ln((1+eps)/(1-eps)) is positive. The crossover is the smallest n >= 2 from which
S_hat > 0 at every larger n; the AUTO policy runs at each n the kernel of smaller predicted time (per-slot below
the crossover and dedup from it, when the saving changes sign once). Step times V_hat(k) = tau_p(k+1) + h(k), h
the draft and host time per step, give k_hat*(a), the exact step points and the speedup, whose true value lies
in the band (21) for the step-time delta of its version and policy (needs eps < 1/2; see moespec.predict.verify). For
comparison, the one-bandwidth byte model of published cost models: reuse threshold rho*_k(a) (16) against the
trace's rho_bar_k, both for the model of L MoE layers, and "dedup is faster wherever u(n) < 1", which bytes alone
cannot decide (the two-bandwidth sign is that of r(n) - u(n), (7)).

plan.json: its keys are documented in moespec.formats.planfile, which owns the format.

What plan reads from runs.json (written by `moespec run`): format "moespec-runs", format_version 1; model,
device_kind, dtype (must be the bench's); moe_layers (int, MoE layers of the model the engine ran: the default
--moe-layers) and depth (int: the default --depth); verify_time_s.slot {n: median s} for n = 1..kmax+1 (--runs; n
= 1 is the default --tau1); draft_time_s {k: median draft + host time per step} for k = 0..kmax (--draft-time).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from moespec import MoespecError, theory
from moespec.defaults import DEPTH, KERNELS, KMAX, KMAX_LIMIT, POLICIES
from moespec.formats.benchfile import as_pair_roles, check_pass_sizes, load_bench, too_small
from moespec.formats.files import holds_outputs, provenance, write_json
from moespec.formats.planfile import FORMAT_NAME, FORMAT_VERSION, VERSION_SUFFIX, Plan, input_records
from moespec.formats.runsfile import RATES, Runs, load_runs
from moespec.formats.trace import Trace, load_trace
from moespec.measure.level import pinned_of
from moespec.model.spec import ModelSpec
from moespec.predict.checks import rerun_bench, too_small_line
from moespec.predict.measured import (
    BASIS_BENCH,
    BASIS_RUNS,
    half_widths,
    has_both_kernels,
    measured_policy,
    measured_times,
    saving_intervals,
    saving_row,
)
from moespec.predict.acceptance import DEFAULT_RATE
from moespec.predict.batch_map import NotPositive, batch_block, predictable, predicted_block
from moespec.predict.staircase import for_llama_cpp
from moespec.predict.verdict import build_verdict
from moespec.predict.verify import anchored, expert_times, kernel_by_n, layer_times, steps, whole_pass, with_auto
from moespec.routing.reuse import derive, reuse_stats

RUNS_CALIBRATE = "runs calibrate only a plan of their own model, device kind and dtype"
LLAMA_CPP_POLICY = "dedup"  # llama.cpp's CPU MUL_MAT_ID reads each selected expert once


@dataclass(frozen=True)
class PlanConfig:
    """What `make_plan` plans from: a bench (its path), a trace, the one-token pass time `tau1` (seconds) or an
    engine's runs (their dedup-off verify times calibrate the plan and supply tau1, the MoE layers and the depth),
    the largest draft `kmax`, the draft + host time per step `draft_time` (one number, kmax + 1 numbers, or a
    runs.json path), the context depth, the MoE layers covered and the device the plan is for (the bench's), and
    the batch sizes of the plan's batch map (moespec.predict.batch_map; they need runs measured at them) and the
    throughput rate its score reads (moespec.predict.acceptance); written to `out` when given."""

    bench: str
    trace: str
    tau1: float | None = None
    runs: str | None = None
    kmax: int = KMAX
    draft_time: str = "0"
    depth: int | None = None
    moe_layers: int | None = None
    device: str | None = None
    out: str | None = None
    batch: tuple[int, ...] = ()
    rate: str = DEFAULT_RATE


def _spec_of(bench: Mapping[str, Any], bench_path: str, trace: Trace, trace_path: str) -> ModelSpec:
    """The bench's model spec, after checking the trace routes that model."""
    try:
        spec = ModelSpec.from_dict(bench["spec"]) if isinstance(bench.get("spec"), dict) else \
            ModelSpec.from_name(bench["model"])
    except (MoespecError, TypeError, ValueError) as e:
        raise MoespecError(f"{bench_path}: its model or spec: {' '.join(str(e).split())}") from None
    trace.check_fits(spec, trace_path, model=bench["model"])
    return spec




def _check_timeable(bench: Mapping[str, Any], where: str) -> None:
    """Refuse a bench whose expert operation is too small to time (moespec.formats.benchfile.too_small) when no
    runs of both kernels can stand in for it (moespec.predict.measured). A refusal, not a warning: every number
    (22) adds to a measured pass time (the saving and its band (18), the crossover, AUTO, the step times and the
    bands (21)) comes from the bench's expert-op times, and where those are fixed per-call costs and noise a plan
    would print an answer with no measurement behind it, which a reader of its verdict alone would deploy."""
    if line := too_small_line(bench, where):
        raise MoespecError(line)


def _eps(bench: Mapping[str, Any], where: str) -> float:
    """Engine eps = max over the two kernels; eps >= 1/2 leaves (21) without a band."""
    missing = [k for k in KERNELS if k not in bench["eps"]]
    if missing:
        raise MoespecError(f"{where}: no fit error eps for kernel(s) {', '.join(missing)}: its fits need chosen ids "
                           f"at two or more n >= 2 and recorded windows; rerun `moespec bench --fresh` with --n 1-9 "
                           f"and both kernels of the pair in --kernels")
    eps = float(max(bench["eps"][k] for k in KERNELS))
    if not eps < theory.EPS_LIMIT:
        raise MoespecError(f"{where}: eps = {eps:.3g} >= 1/2: the speedup band (21) needs eps < 1/2; "
                           f"{rerun_bench(bench)}")
    return eps


def reduced_model(spec: ModelSpec, moe_layers: int) -> ModelSpec:
    """The first `moe_layers` MoE layers of `spec` with the dense layers before them: the shape-faithful model an
    engine runs when it keeps fewer layers (`spec` itself when it keeps them all)."""
    if moe_layers == spec.L:
        return spec
    last = spec.moe_layers[moe_layers - 1]
    return replace(spec, layers=last + 1, dense_layers=tuple(i for i in spec.dense_layers if i <= last),
                   sliding_layers=tuple(i for i in spec.sliding_layers if i <= last))


def _moe_layers(spec: ModelSpec, given: int | None, runs: Runs | None, runs_path: str) -> int:
    """L: --moe-layers, else the runs' moe_layers, else the model's; the calibration needs the runs' own L."""
    ran = None if runs is None else runs.moe_layers
    if given is not None and ran is not None and given != ran:
        raise MoespecError(f"--moe-layers {given} differs from the {ran} MoE layers of the model {runs_path} "
                           f"timed: the calibrated version needs that model")
    L = given if given is not None else ran if ran is not None else spec.L
    if not 1 <= L <= spec.L:
        raise MoespecError(f"{L} MoE layers (--moe-layers or {runs_path}) is outside 1..{spec.L}, the MoE layers "
                           f"of {spec.name}")
    return L


def _is_numbers(text: str) -> bool:
    """Whether --draft-time's `text` is numbers (one, or comma-separated), not a runs.json path."""
    try:
        [float(x) for x in text.split(",")]
    except ValueError:
        return False
    return True


def draft_times(text: str, kmax: int, bench: Mapping[str, Any], bench_path: str) -> list[float]:
    """h(0..kmax), seconds >= 0: one number (every step), kmax+1 comma-separated numbers, or a runs.json path
    (its draft_time_s: the measured median draft + host time per step at each draft length k)."""
    if not _is_numbers(text):
        if not Path(text).is_file():
            raise MoespecError(f"--draft-time {text!r}: not a number, a comma-separated list of numbers or a "
                               f"runs.json file")
        runs = load_runs(text)
        runs.check_identity(bench, bench_path, RUNS_CALIBRATE)
        return runs.series("draft_time_s", range(kmax + 1), positive=False).tolist()
    values = [float(x) for x in text.split(",")]
    if len(values) == 1:
        values *= kmax + 1
    if len(values) != kmax + 1 or not all(np.isfinite(v) and v >= 0 for v in values):
        raise MoespecError(f"--draft-time needs one or {kmax + 1} finite times >= 0 (h(0..{kmax})), got {text!r}")
    return values


# ---- the plan ------------------------------------------------------------------------------------------------
def _crossover(saving: np.ndarray) -> int | None:
    """The crossover (theory.crossover) of a saving indexed by n - 1."""
    return theory.crossover(dict(enumerate(saving.tolist(), start=1)))


def _n_map(values: Sequence[float]) -> dict[str, float]:
    return {str(n): float(v) for n, v in enumerate(values, start=1)}


def inputs_ceiling(bench: Mapping[str, Any], runs: Runs | None) -> dict[str, float]:
    """The streaming-read ceiling (GB/s) the plan's measured inputs were taken at: the bench's, and the verify-only
    runs' (the median of their before, between and after) where the plan read some. Score compares them with the
    scored runs' own, to say when the machine was in another state (moespec.predict.score.MACHINE_DRIFT)."""
    out = {"bench": float(bench["ceiling_gbps"])}
    ceilings = (runs or {}).get("ceiling_gbps") or {}
    if ceilings:
        out["runs"] = float(np.median(list(ceilings.values())))
    return out


def inputs_level(bench: Mapping[str, Any], runs: Runs | None) -> float | None:
    """The bandwidth level (moespec.measure.level) the plan's measured inputs were kept at: the verify-only runs'
    pinned level where they pinned one (they calibrate the plan), else the bench's; None where neither did."""
    for doc in (runs or {}, bench):
        if (pinned := pinned_of(doc.get("level"))) is not None:
            return pinned
    return None


def llama_cpp_flags(step: Mapping[str, Any], version: str) -> dict[str, Any]:
    """The plan in llama.cpp's words: its CPU expert kernel deduplicates, so the dedup policy's staircase of
    `version` (the calibrated one where the plan was made from llama.cpp's own runs: its measured step times) as
    the flags that make llama.cpp draft k tokens per step, per acceptance interval and per acceptance of the
    paper's grid with the speedup band (21)."""
    rows = [row for row in step[version]["table"] if row["policy"] == LLAMA_CPP_POLICY]
    return {"version": version, "policy": LLAMA_CPP_POLICY,
            "intervals": for_llama_cpp(step[version]["staircase"][LLAMA_CPP_POLICY]["intervals"]),
            "table": [row | {"flags": for_llama_cpp([{"k": row["k_hat"]}])[0]["flags"]} for row in rows]}


def _bench_versions(bench: Mapping[str, Any], bench_path: str, ns: range, scale: float, tau1: float, tau1_from: str,
                    delta: float, runs: Runs | None, runs_path: str, tau_runs: np.ndarray | None,
                    tau_outside: np.ndarray | None, measured: str
                    ) -> tuple[dict, np.ndarray, np.ndarray, dict, dict, list[str]]:
    """The versions on the bench's expert-op times (22): the prediction, the measured-time version (the bench's
    measured per-window op times in place of the fits, the paper's primary version; its bound is the prediction's,
    delta (M_p(n) + M_slot(1))), and with runs the calibrated one (the measured-time version with the measured
    growth of the pass outside the expert operation, as the paper's Section 4.2) and the whole-pass one (on the
    fits, as the prediction; left out, with a line saying why, where its times are not positive); returns
    (measured-time version's tau, predicted saving, its band (18), AUTO policy, versions, those lines)."""
    times = layer_times(bench, bench_path, ns)
    M, M_meas = expert_times(times, "predicted", scale), expert_times(times, "measured", scale)
    pred = anchored(tau1, M, delta, per_n=False)
    measured_time = anchored(tau1, M_meas, delta, per_n=False)
    meas = measured_time.tau
    if min(v.min() for v in (*pred.tau.values(), *meas.values())) <= 0:
        whose = "give (in seconds)" if tau1_from == "--tau1" else "time"
        raise MoespecError(f"{tau1_from} = {tau1} s is shorter than the time the expert operations of "
                           f"{bench_path} drop below one token's: a predicted verify time is not positive; "
                           f"{whose} the one-token pass of the model the plan covers (--moe-layers), or "
                           f"{rerun_bench(bench)}")
    s_pred = pred.tau["slot"] - pred.tau["dedup"]
    band = delta * (M["slot"] + M["dedup"])  # (18)
    policy = kernel_by_n(s_pred)
    versions = {"prediction": with_auto(pred, policy), "measured-time": with_auto(measured_time, policy)}
    if tau_runs is not None:
        cal = anchored(tau_runs, M_meas, delta, per_n=True, measured=measured)  # the paper's: the measured-time
        short = [p for p in KERNELS if cal.tau[p].min() <= 0]
        if short:
            raise MoespecError(f"{runs_path}: a {measured} verify time is shorter than the predicted saving: a "
                               f"calibrated {short[0]} verify time is not positive; the runs timed a smaller model "
                               f"than the plan covers (check --moe-layers), or {rerun_bench(bench)}")
        cal.bound[measured] = half_widths(runs, measured, tau_runs, ns)  # measured: known to their interval
        versions["calibrated"] = with_auto(cal, policy)
    left_out = []
    if tau_outside is not None:
        whole = whole_pass(tau1, tau_outside, M, delta)
        if min(t.min() for t in whole.tau.values()) > 0:
            versions["whole-pass"] = with_auto(whole, policy)
        else:  # an extra version: the plan stands on the others, and says why this one is missing
            kernel = min(KERNELS, key=lambda p: whole.tau[p].min())
            n = int(np.argmin(whole.tau[kernel]))  # index n - 1
            left_out.append(f"{runs_path}: the whole-pass version is left out: its {kernel} verify time at n = {n + 1} "
                            f"is {1e3 * whole.tau[kernel][n]:.3g} ms (the outside time "
                            f"{1e3 * tau_outside[0]:.3g} ms at n = 1, {1e3 * tau_outside[n]:.3g} ms at n = {n + 1}; "
                            f"a noisy outside time or fit: rerun with more --reps)")
    return meas, s_pred, band, policy, versions, left_out


def build_plan(bench: Mapping[str, Any], trace: Trace, tau1: float | None = None, kmax: int = KMAX,
               draft_time: Sequence[float] | None = None, depth: int | None = None, bench_path: str = "bench",
               trace_path: str = "trace", runs: Mapping[str, Any] | None = None, runs_path: str = "runs",
               moe_layers: int | None = None, warnings: Sequence[str] = ()) -> dict[str, Any]:
    """The plan document (keys in moespec.formats.planfile) from a validated bench and a trace; tau1 = tau_meas(1)
    in seconds (default: the runs' dedup-off n = 1); runs (a runs.json document, checked where read) add the
    calibrated version and the defaults of depth and moe_layers; `warnings` (lines about the inputs the caller
    found) join the verdict's input checks (moespec.predict.verdict)."""
    if runs is not None and not isinstance(runs, Runs):
        runs = Runs(dict(runs), runs_path)
    if isinstance(kmax, bool) or not isinstance(kmax, int) or not 1 <= kmax <= KMAX_LIMIT:
        raise MoespecError(f"--kmax must be an integer in 1..{KMAX_LIMIT}, got {kmax!r}")
    if bench.get("batch", 1) != 1:
        raise MoespecError(f"{bench_path}: a bench of B = {bench['batch']} sequences per pass (`bench --batch`); a "
                           f"plan reads the passes of one sequence: give a bench made without --batch")
    on_runs = too_small(bench)["flag"] and has_both_kernels(runs)  # the basis of moespec.predict.measured
    if not on_runs:
        check_pass_sizes(bench, bench_path, kmax)
        _check_timeable(bench, bench_path)
    bench = as_pair_roles(bench)  # ggml's pair, where the bench timed it, plays slot and dedup
    if tau1 is None and runs is None:
        raise MoespecError("the one-token pass time is needed: give --tau1 or --runs")
    spec = _spec_of(bench, bench_path, trace, trace_path)
    eps = 0.0 if on_runs else _eps(bench, bench_path)  # measured times: their bounds are their intervals
    delta = float(theory.delta_from_eps(eps))
    ns = range(1, kmax + 2)
    # the runs' kernel: slot (moespec's engine, dedup off), or dedup where it is the only one (llama.cpp's CPU)
    measured = "dedup" if runs is not None and runs.kernels == ["dedup"] else "slot"
    tau_runs = None if runs is None else runs.series(f"verify_time_s.{measured}", ns, positive=True)
    measured_outside = runs is not None and "outside" in (runs.get("verify_time_s") or {})
    tau_outside = runs.series("verify_time_s.outside", ns, positive=True) if measured_outside else None
    tau1_from = "--tau1" if tau1 is not None else f"{runs_path}: verify_time_s.{measured}.1"  # what an error blames
    tau1 = float(tau_runs[0]) if tau1 is None else tau1
    if not (np.isfinite(tau1) and tau1 > 0):
        raise MoespecError(f"{tau1_from} = {tau1} must be a positive time in seconds (the one-token pass)")
    h = list(draft_time) if draft_time is not None else [0.0] * (kmax + 1)
    depth = depth if depth is not None else runs.depth if runs is not None else DEPTH
    L = _moe_layers(spec, moe_layers, runs, runs_path)
    model = reduced_model(spec, L)
    fmt = bench["dtype"]
    bad = [layer for layer in bench["layers"] if not 0 <= layer < spec.L]
    if bad:
        raise MoespecError(f"{bench_path}: timed layers {bad} outside the model's MoE layers 0..{spec.L - 1}")
    w = np.array([model.expert_bytes(layer, fmt) for layer in range(L)], dtype=float)
    scale = float(w.sum() / sum(spec.expert_bytes(layer, fmt) for layer in bench["layers"]))
    if on_runs:
        base = measured_times(runs, ns)
        intervals = saving_intervals(runs, base, ns)
        policy = measured_policy(base, intervals)
        meas, s_pred = base.tau, base.tau["slot"] - base.tau["dedup"]
        # the measured times are the calibration's result: one version under both names, so a run scored by its
        # calibrated version (the recipe's) reads them
        versions = {"prediction": with_auto(base, policy), "calibrated": with_auto(base, policy)}
        left_out = []
    else:
        meas, s_pred, band, policy, versions, left_out = _bench_versions(
            bench, bench_path, ns, scale, tau1, tau1_from, delta, runs, runs_path, tau_runs, tau_outside, measured)
    s_meas = meas["slot"] - meas["dedup"]
    step = {v: steps(t, h, v) for v, t in versions.items()}
    stats = reuse_stats(trace, n_max=ns[-1], bootstrap=0)
    reuse = derive(stats.rho[:L], stats.union[:L], w, trace.m)  # byte quantities of the L covered layers
    saving = {}
    for n in ns[1:]:
        u, r = float(reuse["u"][n]), bench["r"].get(str(n))
        if on_runs:
            saving[str(n)] = saving_row(n, base, intervals[n], u)
            continue
        margin = None if r is None else float(theory.kernel_margin(u, r, eps))
        saving[str(n)] = {
            "predicted_s": float(s_pred[n - 1]), "measured_s": float(s_meas[n - 1]), "band_s": float(band[n - 1]),
            "lo_s": float(s_pred[n - 1] - band[n - 1]), "hi_s": float(s_pred[n - 1] + band[n - 1]),
            "u": u, "r": r, "margin": margin, "decided": margin is not None and margin > 0,
            "byte_model": "dedup" if u < 1 else "slot",
            "two_bandwidth": None if r is None else "dedup" if u < r else "slot"}
    mW, D, kv = model.byte_model(fmt, depth, kmax)
    rho_bar = [float(reuse["rho_bar"][k]) for k in range(1, kmax + 1)]
    V_bytes = theory.byte_step_times(mW, D, kv, rho_bar)
    pass_bytes = {"slot": _n_map([D + mW * n + kv[n - 1] for n in ns]), "dedup": _n_map(V_bytes)}
    grid = [float(a) for a in theory.PAPER_ACCEPTANCES]
    plan = {
        "format": FORMAT_NAME, "format_version": FORMAT_VERSION, "model": bench["model"],
        "device": bench["device"], "device_kind": bench["device_kind"], "dtype": fmt, "eps": eps, "delta": delta,
        "kmax": kmax, "tau1_s": tau1, "draft_time_s": h,
        "coverage": {"timed_layers": bench["layers"], "num_moe_layers": L, "model_moe_layers": spec.L,
                     "scale": scale,
                     "rule": f"each of the first {L} MoE layers takes the timed layers' op time per expert byte "
                             f"times its w_l: sum over them = (W_{L} / W_timed) x sum over timed layers"},
        "basis": {"kind": BASIS_RUNS if on_runs else BASIS_BENCH,
                  "why": too_small(bench)["reason"] if on_runs else None},
        # on measured times the crossover is the policy's (decided savings), not a median's sign
        "crossover": _crossover(np.array([1.0 if policy[n] == "dedup" else -1.0 for n in ns]) if on_runs
                                else s_pred),
        "crossover_measured": _crossover(s_meas),
        "kernel_by_n": {str(n): k for n, k in policy.items()},
        "tau_hat": {p: _n_map(versions["prediction"].tau[p]) for p in POLICIES},
        "tau_measured": {p: _n_map(meas[p]) for p in KERNELS},
        "saving": saving, "delta_steps": {v: s["delta"] for v, s in step.items()},
        "step_times": step["prediction"]["step_times"], "staircase": step["prediction"]["staircase"],
        "table": step["prediction"]["table"],
        "reuse_threshold": {
            "depth": depth, "rho_bar": {str(k): rb for k, rb in enumerate(rho_bar, start=1)},
            "rho_star": {str(a): {str(k): float(theory.reuse_threshold_bytes(a, k, mW, D, kv))
                                  for k in range(1, kmax + 1)} for a in grid},
            "k_hat_bytes": {str(a): int(theory.best_draft_length(V_bytes, a)) for a in grid}},
        "runs": None if runs is None else {"path": runs_path, "moe_layers": runs.moe_layers, "depth": runs.depth},
        "inputs_ceiling_gbps": inputs_ceiling(bench, runs), "pass_bytes": pass_bytes,
        "level_gbps": inputs_level(bench, runs),
        "llama_cpp": llama_cpp_flags(step, "calibrated" if "calibrated" in step else "prediction"),
        "kernels": bench.get("pair_kernels") or dict(zip(KERNELS, KERNELS)),
        "provenance": provenance(device=bench["device"], dtype=fmt),
    }
    for version in [v for v in versions if v != "prediction"]:
        suffix = VERSION_SUFFIX[version]
        tau = versions[version].tau
        s_version = tau["slot"] - tau["dedup"]
        for n in ns[1:]:
            saving[str(n)][f"{suffix[1:]}_s"] = float(s_version[n - 1])
        plan.update({f"tau{suffix}": {p: _n_map(tau[p]) for p in POLICIES},
                     f"crossover{suffix}": _crossover(s_version),
                     f"step_times{suffix}": step[version]["step_times"],
                     f"staircase{suffix}": step[version]["staircase"],
                     f"table{suffix}": step[version]["table"]})
    plan["verdict"] = build_verdict(plan, runs, warnings=[*warnings, *left_out], bench=bench, runs_path=runs_path,
                                    bench_path=bench_path).to_json()  # the plain answer, printed first
    return plan


@holds_outputs(lambda config: [config.out or None])
def make_plan(config: PlanConfig) -> Plan:
    """Load and check the inputs, build the plan (build_plan) and write it to config.out when given (locked while
    the plan is made, moespec.formats.lock)."""
    if config.rate not in RATES:
        raise ValueError(f"rate must be one of {', '.join(RATES)}, got {config.rate!r}")
    bench = load_bench(config.bench)
    if config.device is not None and config.device != bench.device_kind:
        raise MoespecError(f"{config.bench} was measured on {bench.device_kind}; a {config.device} plan needs a "
                           f"bench run with --device {config.device}")
    trace = load_trace(config.trace)
    runs = None
    if config.batch and config.runs is None:
        raise MoespecError("--batch plans from verify times measured at each batch size: give --runs, a runs.json "
                           f"of `moespec run --batch {','.join(map(str, config.batch))} --no-throughput`")
    if config.runs is not None:
        runs = load_runs(config.runs)
        runs.check_identity(bench, config.bench, RUNS_CALIBRATE)
    h = draft_times(config.draft_time, config.kmax, bench, config.bench)
    inputs = input_records({"bench": config.bench, "trace": config.trace, "runs": config.runs,
                            "draft_time": None if _is_numbers(config.draft_time) else config.draft_time})
    doc = build_plan(bench, trace, config.tau1, config.kmax, h, config.depth, bench_path=config.bench,
                     trace_path=config.trace, runs=runs, runs_path=config.runs or "runs", moe_layers=config.moe_layers)
    doc["provenance"]["inputs"] = inputs  # what a reader checks the files beside the plan against
    doc["throughput_rate"] = config.rate
    if config.batch:
        batches, roles = sorted(set(config.batch)), as_pair_roles(bench)
        predicted = None
        if predictable(roles, runs, config.kmax):
            try:
                predicted = predicted_block(roles, trace, runs, config.runs, batches, config.kmax, h,
                                            doc["coverage"]["scale"])
            except NotPositive as e:  # the measured map stands without the prediction beside it, and says why
                doc["verdict"] = build_verdict(doc, runs, warnings=[f"the batch map's prediction is left out: {e}"],
                                               bench=roles, runs_path=config.runs,
                                               bench_path=config.bench).to_json()
        doc["batch"] = batch_block(runs, config.runs, batches, config.kmax, h, predicted)
    if config.out:
        write_json(config.out, doc)
    return Plan(doc, config.out)

"""`moespec plan`: whole-model verify time, the kernel saving with its band, the crossover, the best draft length
and the speedup, from a bench (bandwidths) and a trace (bytes); with an engine's runs.json, also the calibrated
version. The numbers and their error bounds are computed in `moespec.predict` (physics in its docstring); this
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
in the band (21) for the step-time delta of its version and policy (needs eps < 1/2; see moespec.predict). For
comparison, the one-bandwidth byte model of published cost models: reuse threshold rho*_k(a) (16) against the
trace's rho_bar_k, both for the model of L MoE layers, and "dedup is faster wherever u(n) < 1", which bytes alone
cannot decide (the two-bandwidth sign is that of r(n) - u(n), (7)).

plan.json (FORMAT_NAME, FORMAT_VERSION; n and k keys are strings):
  model, device, device_kind, dtype   the bench's ("cpu" or "cuda": a plan holds for the device its bench timed)
  eps (engine eps: max over slot and dedup), delta = eps/(1-eps) (relative error of each expert-op time (17)),
  kmax, tau1_s, draft_time_s [h(0..kmax)]
  coverage     {timed_layers, num_moe_layers (L, the MoE layers the sums cover), model_moe_layers, scale, rule}
  crossover    n or null;  crossover_measured: the same on the measured-time version
  kernel_by_n  {n: "slot"|"dedup"} for n = 1..kmax+1 (the AUTO policy)
  tau_hat      {slot|dedup|auto: {n: s}} prediction (22);  tau_measured: {slot|dedup: {n: s}}
  saving       {n: {predicted_s, measured_s, band_s, lo_s, hi_s, u, r, margin, decided, byte_model, two_bandwidth}}
  delta_steps  {version: {policy: d}}: (1-d) V <= V_hat <= (1+d) V, the delta of the version's bands (21); d
               is null where the error bound reaches half of V(k) (a noisy bench, a calibration): no band, and
               that version's rows carry speedup_lo = speedup_hi = null
  step_times   {policy: [V_hat(0..kmax)]}
  staircase    {policy: {k_at_zero, step_points: [a_1..a_kmax], intervals: [{k, lo, hi}]}}: k_hat* = k on (lo, hi]
  table        [{a, policy, version, k_hat, speedup, speedup_lo, speedup_hi}] per acceptance of the paper's grid
               and policy; version "prediction" (a row without it is one)
  reuse_threshold {depth, rho_bar: {k: v}, rho_star: {a: {k: v}}, k_hat_bytes: {a: k}}  (16)
  runs         null, or {path, moe_layers, depth} of --runs; then the calibrated version too:
  tau_calibrated {slot|dedup|auto: {n: s}};  saving.{n}.calibrated_s;  crossover_calibrated (the last two equal
               the predicted ones: the calibration adds the same measured time to both kernels)
  step_times_calibrated, staircase_calibrated   as step_times and staircase
  table_calibrated  rows as table's with version "calibrated", speedup_lo and speedup_hi null where d is null: a
               list of its own, so that a reader that keys `table` by (policy, a) keeps reading the prediction
  provenance

What plan reads from runs.json (written by `moespec run`): format "moespec-runs", format_version 1; model,
device_kind, dtype (must be the bench's); moe_layers (int, MoE layers of the model the engine ran: the default
--moe-layers) and depth (int: the default --depth); verify_time_s.slot {n: median s} for n = 1..kmax+1 (--runs; n
= 1 is the default --tau1); draft_time_s {k: median draft + host time per step} for k = 0..kmax (--draft-time).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from moespec import MoespecError, theory
from moespec.benchfile import DEVICE_KINDS, load_bench
from moespec.io import console as console_
from moespec.io import provenance, read_json, write_json
from moespec.predict import (KERNELS, POLICIES, anchored, crossover, expert_times, kernel_by_n, layer_times, steps,
                             with_auto)
from moespec.reuse import derive, reuse_stats
from moespec.spec import ModelSpec
from moespec.trace import Trace, load_trace

FORMAT_NAME = "moespec-plan"
FORMAT_VERSION = 1
DEFAULT_KMAX = 8  # the paper drafts up to 8 tokens (passes of up to 9)
DEFAULT_DEPTH = 512  # context depth for kv(k) in the byte model (16), the paper's shorter depth
EPS_LIMIT = 0.5  # (21) needs delta = eps/(1-eps) < 1
RUNS_IDENTITY = ("model", "device_kind", "dtype")  # runs of another model, device or dtype cannot calibrate a plan
# key -> type(s) every plan.json must carry (the engine and external checks read them)
REQUIRED = {"format_version": int, "model": str, "device": str, "dtype": str, "eps": float, "kmax": int,
            "crossover": (int, type(None)), "kernel_by_n": dict, "tau_hat": dict, "saving": dict,
            "staircase": dict, "table": list, "provenance": dict}
ROW_KEYS = ("a", "policy", "k_hat", "speedup", "speedup_lo", "speedup_hi")
# table key -> the version of its rows, and the verify times they come from
TABLES = {"table": ("prediction", "tau_hat"), "table_calibrated": ("calibrated", "tau_calibrated")}


# ---- inputs --------------------------------------------------------------------------------------------------
def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and bool(np.isfinite(x))


def _spec_of(bench: dict[str, Any], trace: Trace, bench_path: str, trace_path: str) -> ModelSpec:
    """The bench's model spec, after checking the trace records the same model (name, or else N, m, L)."""
    spec = ModelSpec.from_dict(bench["spec"]) if isinstance(bench.get("spec"), dict) else \
        ModelSpec.from_name(bench["model"])
    named = trace.meta.get("model")
    if named is not None and named != bench["model"]:
        raise MoespecError(f"{bench_path} is a bench of model {bench['model']!r} but {trace_path} records "
                           f"{named!r}")
    if (spec.N, spec.m, spec.L) != (trace.num_experts, trace.m, trace.num_layers):
        raise MoespecError(f"{trace_path}: N={trace.num_experts}, m={trace.m}, L={trace.num_layers} differ from "
                           f"model {spec.name} of {bench_path} (N={spec.N}, m={spec.m}, L={spec.L})")
    return spec


def _eps(bench: dict[str, Any], where: str) -> float:
    """Engine eps = max over the two kernels; eps >= 1/2 leaves (21) without a band."""
    missing = [k for k in KERNELS if k not in bench["eps"]]
    if missing:
        raise MoespecError(f"{where}: no fit error eps for kernel(s) {', '.join(missing)}")
    eps = float(max(bench["eps"][k] for k in KERNELS))
    if not eps < EPS_LIMIT:
        raise MoespecError(f"{where}: eps = {eps:.3g} >= 1/2: the speedup band (21) needs eps < 1/2")
    return eps


def reduced_model(spec: ModelSpec, moe_layers: int) -> ModelSpec:
    """The first `moe_layers` MoE layers of `spec` with the dense layers before them: the shape-faithful model an
    engine runs when it keeps fewer layers (`spec` itself when it keeps them all)."""
    if moe_layers == spec.L:
        return spec
    last = spec.moe_layers[moe_layers - 1]
    return replace(spec, layers=last + 1, dense_layers=tuple(i for i in spec.dense_layers if i <= last),
                   sliding_layers=tuple(i for i in spec.sliding_layers if i <= last))


def _moe_layers(spec: ModelSpec, given: int | None, runs: dict[str, Any] | None, runs_path: str) -> int:
    """L: --moe-layers, else the runs' moe_layers, else the model's; the calibration needs the runs' own L."""
    ran = None if runs is None else runs["moe_layers"]
    if given is not None and ran is not None and given != ran:
        raise MoespecError(f"--moe-layers {given} differs from the {ran} MoE layers of the model {runs_path} "
                           f"timed: the calibrated version needs that model")
    L = given if given is not None else ran if ran is not None else spec.L
    if not 1 <= L <= spec.L:
        raise MoespecError(f"{L} MoE layers (--moe-layers or {runs_path}) is outside 1..{spec.L}, the MoE layers "
                           f"of {spec.name}")
    return L


def load_runs(path: str, bench: dict[str, Any], bench_path: str) -> dict[str, Any]:
    """runs.json of `moespec run`, checked for what plan reads at once (format, the bench's model, device kind and
    dtype, integer moe_layers >= 1 and depth >= 0); `runs_series` checks a series where it is read."""
    from moespec.run import read_runs

    doc = read_runs(path)
    for key in RUNS_IDENTITY:
        if doc.get(key) != bench[key]:
            raise MoespecError(f"{path}: {key} {doc.get(key)!r} differs from {bench_path}'s {bench[key]!r}: runs "
                               f"calibrate only a plan of their own model, device kind and dtype")
    for key, least in (("moe_layers", 1), ("depth", 0)):
        value = doc.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise MoespecError(f"{path}: {key} = {value!r} must be an integer >= {least}")
    return doc


def runs_series(runs: dict[str, Any], path: str, key: str, index: range, positive: bool) -> np.ndarray:
    """runs[key] ("verify_time_s.slot" by n, "draft_time_s" by k) at every index, seconds: positive, or >= 0."""
    node: Any = runs
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    if not isinstance(node, dict):
        raise MoespecError(f"{path}: no {key} (an object of seconds keyed by n or k)")
    missing = [i for i in index if str(i) not in node]
    if missing:
        raise MoespecError(f"{path}: {key} lacks {', '.join(map(str, missing))}; the plan needs "
                           f"{index[0]}..{index[-1]} (--kmax {index[-1] - index[0]})")
    for i in index:
        value = node[str(i)]
        if not (_number(value) and (value > 0 if positive else value >= 0)):
            raise MoespecError(f"{path}: {key}.{i} = {value!r} must be a {'positive' if positive else 'non-negative'}"
                               f" time in seconds")
    return np.array([node[str(i)] for i in index], dtype=float)


def draft_times(text: str, kmax: int, bench: dict[str, Any], bench_path: str) -> list[float]:
    """h(0..kmax), seconds >= 0: one number (every step), kmax+1 comma-separated numbers, or a runs.json path
    (its draft_time_s: the measured median draft + host time per step at each draft length k)."""
    try:
        values = [float(x) for x in text.split(",")]
    except ValueError:
        if not Path(text).is_file():
            raise MoespecError(f"--draft-time {text!r}: not a number, a comma-separated list of numbers or a "
                               f"runs.json file") from None
        return runs_series(load_runs(text, bench, bench_path), text, "draft_time_s", range(kmax + 1),
                           positive=False).tolist()
    if len(values) == 1:
        values *= kmax + 1
    if len(values) != kmax + 1 or not all(np.isfinite(v) and v >= 0 for v in values):
        raise MoespecError(f"--draft-time needs one or {kmax + 1} finite times >= 0 (h(0..{kmax})), got {text!r}")
    return values


# ---- the plan ------------------------------------------------------------------------------------------------
def _n_map(values: Sequence[float]) -> dict[str, float]:
    return {str(n): float(v) for n, v in enumerate(values, start=1)}


def build_plan(bench: dict[str, Any], trace: Trace, tau1: float | None = None, kmax: int = DEFAULT_KMAX,
               draft_time: Sequence[float] | None = None, depth: int | None = None, bench_path: str = "bench",
               trace_path: str = "trace", runs: dict[str, Any] | None = None, runs_path: str = "runs",
               moe_layers: int | None = None) -> dict[str, Any]:
    """The plan document (see the module docstring) from a validated bench and a trace; tau1 = tau_meas(1) in
    seconds (default: the runs' dedup-off n = 1); runs (from load_runs) add the calibrated version and the
    defaults of depth and moe_layers."""
    if kmax < 1:
        raise MoespecError(f"--kmax must be >= 1, got {kmax}")
    if tau1 is None and runs is None:
        raise MoespecError("the one-token pass time is needed: give --tau1 or --runs")
    spec = _spec_of(bench, trace, bench_path, trace_path)
    eps = _eps(bench, bench_path)
    delta = float(theory.delta_from_eps(eps))
    ns = range(1, kmax + 2)
    tau_runs = None if runs is None else runs_series(runs, runs_path, "verify_time_s.slot", ns, positive=True)
    tau1 = float(tau_runs[0]) if tau1 is None else tau1
    if not (np.isfinite(tau1) and tau1 > 0):
        raise MoespecError(f"--tau1 = {tau1} must be a positive time in seconds (the one-token pass)")
    h = list(draft_time) if draft_time is not None else [0.0] * (kmax + 1)
    depth = depth if depth is not None else runs["depth"] if runs is not None else DEFAULT_DEPTH
    L = _moe_layers(spec, moe_layers, runs, runs_path)
    model = reduced_model(spec, L)
    times = layer_times(bench, bench_path, ns)
    fmt = bench["dtype"]
    bad = [layer for layer in bench["layers"] if not 0 <= layer < spec.L]
    if bad:
        raise MoespecError(f"{bench_path}: timed layers {bad} outside the model's MoE layers 0..{spec.L - 1}")
    w = np.array([model.expert_bytes(layer, fmt) for layer in range(L)], dtype=float)
    scale = float(w.sum() / sum(spec.expert_bytes(layer, fmt) for layer in bench["layers"]))
    M = expert_times(times, "predicted", scale)
    pred = anchored(tau1, M, delta, per_n=False)
    meas = anchored(tau1, expert_times(times, "measured", scale), 0.0, per_n=False).tau
    if min(v.min() for v in (*pred.tau.values(), *meas.values())) <= 0:
        raise MoespecError(f"--tau1 = {tau1} s is shorter than the time the bench's expert operations drop "
                           f"below one token's: a predicted verify time is not positive")
    s_pred, s_meas = pred.tau["slot"] - pred.tau["dedup"], meas["slot"] - meas["dedup"]
    band = delta * (M["slot"] + M["dedup"])  # (18)
    policy = kernel_by_n(s_pred)
    versions = {"prediction": with_auto(pred, policy)}
    if tau_runs is not None:
        cal = anchored(tau_runs, M, delta, per_n=True)
        if cal.tau["dedup"].min() <= 0:
            raise MoespecError(f"{runs_path}: a dedup-off verify time is shorter than the predicted saving: a "
                               f"calibrated dedup verify time is not positive")
        versions["calibrated"] = with_auto(cal, policy)
    step = {v: steps(t, h, v) for v, t in versions.items()}
    stats = reuse_stats(trace, n_max=ns[-1], bootstrap=0)
    reuse = derive(stats.rho[:L], stats.union[:L], w, trace.m)  # byte quantities of the L covered layers
    saving = {}
    for n in ns[1:]:
        u, r = float(reuse["u"][n]), bench["r"].get(str(n))
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
    grid = [float(a) for a in theory.PAPER_ACCEPTANCES]
    plan = {
        "format": FORMAT_NAME, "format_version": FORMAT_VERSION, "model": bench["model"],
        "device": bench["device"], "device_kind": bench["device_kind"], "dtype": fmt, "eps": eps, "delta": delta,
        "kmax": kmax, "tau1_s": tau1, "draft_time_s": h,
        "coverage": {"timed_layers": bench["layers"], "num_moe_layers": L, "model_moe_layers": spec.L,
                     "scale": scale,
                     "rule": f"each of the first {L} MoE layers takes the timed layers' op time per expert byte "
                             f"times its w_l: sum over them = (W_{L} / W_timed) x sum over timed layers"},
        "crossover": crossover(s_pred), "crossover_measured": crossover(s_meas),
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
        "runs": None if runs is None else {"path": runs_path, "moe_layers": runs["moe_layers"],
                                           "depth": runs["depth"]},
        "provenance": provenance(device=bench["device"], dtype=fmt),
    }
    if runs is not None:
        tau_cal = versions["calibrated"].tau
        s_cal = tau_cal["slot"] - tau_cal["dedup"]
        for n in ns[1:]:
            saving[str(n)]["calibrated_s"] = float(s_cal[n - 1])
        plan.update({"tau_calibrated": {p: _n_map(tau_cal[p]) for p in POLICIES},
                     "crossover_calibrated": crossover(s_cal),
                     "step_times_calibrated": step["calibrated"]["step_times"],
                     "staircase_calibrated": step["calibrated"]["staircase"],
                     "table_calibrated": step["calibrated"]["table"]})
    return plan


# ---- plan.json -------------------------------------------------------------------------------------------------
def _check_rows(rows: Any, key: str, version: str, kmax: int) -> str | None:
    """The first problem with the table rows under `key`, or None."""
    if not isinstance(rows, list):
        return f"{key} must be a list of rows"
    for i, row in enumerate(rows):
        if not isinstance(row, dict) or any(k not in row for k in ROW_KEYS):
            return f"{key}[{i}] must carry {', '.join(ROW_KEYS)}"
        if row.get("version", "prediction") != version:
            return f"{key}[{i}]: version {row.get('version')!r} is not {version!r}"
        if row["policy"] not in POLICIES or not (_number(row["a"]) and 0 <= row["a"] < 1):
            return f"{key}[{i}]: policy {row['policy']!r} or acceptance {row['a']!r} is invalid"
        if isinstance(row["k_hat"], bool) or not isinstance(row["k_hat"], int) or not 0 <= row["k_hat"] <= kmax:
            return f"{key}[{i}]: k_hat {row['k_hat']!r} is outside 0..{kmax}"
        if row["speedup_lo"] is None and row["speedup_hi"] is None:
            continue  # no band: the step times' error bound reaches half of V(k) (a noisy bench, a calibration)
        if not all(_number(row[k]) for k in ROW_KEYS[3:]) or \
                not row["speedup_lo"] <= row["speedup"] <= row["speedup_hi"]:
            return f"{key}[{i}]: need speedup_lo <= speedup <= speedup_hi"
    return None


def _check_plan(doc: Any) -> str | None:
    """The first problem with a plan document, or None."""
    if not isinstance(doc, dict) or doc.get("format") != FORMAT_NAME:
        return f"not a moespec plan file (format is not {FORMAT_NAME!r})"
    if doc.get("format_version") != FORMAT_VERSION:
        return f"plan format version {doc.get('format_version')!r} is not supported (this moespec reads " \
               f"version {FORMAT_VERSION})"
    for key, kind in REQUIRED.items():
        if key not in doc:
            return f"missing key {key!r}"
        if isinstance(doc[key], bool) or not isinstance(doc[key], kind):
            return f"{key} has the wrong type ({type(doc[key]).__name__})"
    kmax, ns = doc["kmax"], {str(n) for n in range(1, doc["kmax"] + 2)}
    if kmax < 1 or not 0 <= doc["eps"] < EPS_LIMIT:
        return f"kmax = {kmax} must be >= 1 and eps = {doc['eps']} in [0, 1/2)"
    if doc["crossover"] is not None and not 2 <= doc["crossover"] <= kmax + 1:
        return f"crossover {doc['crossover']} is outside n = 2..{kmax + 1}"
    if set(doc["kernel_by_n"]) != ns or not all(v in KERNELS for v in doc["kernel_by_n"].values()):
        return f"kernel_by_n must map every n = 1..{kmax + 1} to one of {', '.join(KERNELS)}"
    for table, (version, times) in TABLES.items():
        if table not in doc and times not in doc:
            continue  # a plan made without --runs has no calibrated version
        for p in POLICIES:
            per_n = doc.get(times, {}).get(p)
            if not isinstance(per_n, dict) or set(per_n) != ns or \
                    not all(_number(v) and v > 0 for v in per_n.values()):
                return f"{times}.{p} must give a positive time for every n = 1..{kmax + 1}"
        problem = _check_rows(doc.get(table), table, version, kmax)
        if problem:
            return problem
    return None


def load_plan(path: str | Path) -> dict[str, Any]:
    """Read and validate a plan.json (format, version, keys and types, kernel names, n ranges, the verify times
    and table rows of each version present); raises MoespecError naming the file and the problem."""
    doc = read_json(path, "plan")
    problem = _check_plan(doc)
    if problem:
        raise MoespecError(f"{path}: {problem}")
    return doc


# ---- command -------------------------------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bench", required=True, help="bench.json from `moespec bench`")
    parser.add_argument("--trace", required=True, help="routing trace (.npz) of the same model")
    parser.add_argument("--tau1", type=float,
                        help="measured one-token pass time tau(1), seconds (default: --runs' dedup-off n = 1)")
    parser.add_argument("--runs", metavar="RUNS",
                        help="runs.json from `moespec run`: its dedup-off verify times give the calibrated version")
    parser.add_argument("--moe-layers", type=int, metavar="L",
                        help="MoE layers of the model the plan is for, the first L of the bench's model "
                             "(default: --runs' moe_layers, else all)")
    parser.add_argument("--device", choices=DEVICE_KINDS,
                        help="the device the plan is for; must be the one the bench timed (default: the bench's)")
    parser.add_argument("--out", help="write plan.json here")
    parser.add_argument("--kmax", type=int, default=DEFAULT_KMAX, help="largest draft length k (default 8)")
    parser.add_argument("--draft-time", default="0", metavar="H",
                        help="draft + host time per step h(k), seconds: one number, h(0..kmax), or a runs.json "
                             "(its measured draft_time_s) (default 0: oracle)")
    parser.add_argument("--depth", type=int,
                        help=f"context depth for kv(k) in (16) (default: --runs' depth, else {DEFAULT_DEPTH})")
    parser.add_argument("--json", action="store_true", help="print one JSON document")


def run(args: argparse.Namespace) -> int:
    bench = load_bench(args.bench)
    if args.device is not None and args.device != bench["device_kind"]:
        raise MoespecError(f"{args.bench} was measured on {bench['device_kind']}; a {args.device} plan needs a "
                           f"bench run with --device {args.device}")
    trace = load_trace(args.trace)
    runs = None if args.runs is None else load_runs(args.runs, bench, args.bench)
    h = draft_times(args.draft_time, args.kmax, bench, args.bench)
    plan = build_plan(bench, trace, args.tau1, args.kmax, h, args.depth, bench_path=args.bench, trace_path=args.trace,
                      runs=runs, runs_path=args.runs or "runs", moe_layers=args.moe_layers)
    if args.out:
        write_json(args.out, plan)
    if args.json:
        print(json.dumps(plan))
    else:
        print_summary(plan, args.out)
    return 0


def _speedup_table(plan: dict[str, Any], table: str, title: str, bytes_column: bool) -> Any:
    """k_hat* and speedup [band (21)] per acceptance (rows) and policy (columns) of one version's table."""
    from rich.table import Table

    t = Table(title=title, caption="bytes: k_hat* of the one-bandwidth byte model (16)" if bytes_column else None)
    for name in ("a", *POLICIES, *(["bytes"] if bytes_column else [])):
        t.add_column(name, justify="right")
    rows: dict[float, dict[str, str]] = {}
    for row in plan[table]:
        band = "(no band)" if row["speedup_lo"] is None else f"({row['speedup_lo']:.3f}, {row['speedup_hi']:.3f})"
        rows.setdefault(row["a"], {})[row["policy"]] = f"{row['k_hat']}: {row['speedup']:.3f} {band}"
    for a, cells in rows.items():
        extra = [str(plan["reuse_threshold"]["k_hat_bytes"][str(a)])] if bytes_column else []
        t.add_row(f"{a:g}", *(cells[p] for p in POLICIES), *extra)
    return t


def print_summary(plan: dict[str, Any], out: str | None) -> None:
    """Verify times and saving per n, then k_hat* and speedup per acceptance and policy, for each version."""
    from rich.table import Table

    con = console_()
    cov = plan["coverage"]
    calibrated = plan["runs"] is not None
    con.print(f"[bold]{plan['model']}[/] {plan['dtype']} on {plan['device']}: tau(1) = {plan['tau1_s'] * 1e3:.3f} ms,"
              f" eps = {plan['eps']:.4f} (delta = {plan['delta']:.4f}); MoE layers {cov['timed_layers']} timed, "
              f"{cov['num_moe_layers']} of {cov['model_moe_layers']} covered: {cov['rule']} (x{cov['scale']:.3g})")
    if calibrated:
        con.print(f"calibrated version from {plan['runs']['path']} (depth {plan['runs']['depth']}): the dedup-off "
                  f"verify times give the growth outside the expert operation")
    t = Table(title="Verify time (22) and saving S = tau_slot - tau_dedup with band (18), ms",
              caption="decided: margin (19) > 0. bytes: the one-bandwidth model (dedup wherever u < 1); "
                      "2-bw: dedup where u < r (7)" + ("; cal.: calibrated version" if calibrated else ""))
    for name in ("n", "tau slot", "tau dedup", *(["cal. slot", "cal. dedup"] if calibrated else []), "S_hat",
                 "± (18)", "S meas.", "u(n)", "r(n)", "(19)", "decided", "bytes", "2-bw", "auto"):
        t.add_column(name, justify="right")
    ms = lambda x: f"{x * 1e3:.3f}"  # noqa: E731
    for n in plan["kernel_by_n"]:
        s = plan["saving"].get(n)
        cells = ["-"] * 9 if s is None else [
            f"{s['predicted_s'] * 1e3:+.3f}", f"{s['band_s'] * 1e3:.3f}", f"{s['measured_s'] * 1e3:+.3f}",
            f"{s['u']:.3f}", "-" if s["r"] is None else f"{s['r']:.3f}",
            "-" if s["margin"] is None else f"{s['margin']:+.3f}", "yes" if s["decided"] else "no",
            s["byte_model"], s["two_bandwidth"] or "-"]
        cal = [ms(plan["tau_calibrated"][k][n]) for k in KERNELS] if calibrated else []
        t.add_row(n, *(ms(plan["tau_hat"][k][n]) for k in KERNELS), *cal, *cells, plan["kernel_by_n"][n])
    con.print(t)
    split = [n for n, s in plan["saving"].items() if s["two_bandwidth"] not in (None, s["byte_model"])]
    con.print(f"one-bandwidth byte model vs two-bandwidth prediction: "
              f"{'disagree at n = ' + ', '.join(split) if split else 'agree at every n'}")
    con.print(f"predicted crossover: n = {plan['crossover']} (measured-time version: {plan['crossover_measured']});"
              f" AUTO runs the kernel of smaller predicted time at each n")
    for table, (version, _) in TABLES.items():
        if table in plan:
            deltas = ", ".join(f"{p} {'none' if d is None else f'{d:.4f}'}"
                               for p, d in plan["delta_steps"][version].items())
            con.print(_speedup_table(plan, table, f"Best draft length k_hat*(a) and {version} speedup (band (21); "
                                                  f"delta {deltas})", bytes_column=version == "prediction"))
    reuse = plan["reuse_threshold"]
    b = Table(title=f"One-bandwidth reuse threshold (16) at depth {reuse['depth']}: the trace's rho_bar_k vs "
                    f"rho*_k(a)", caption="*: rho_bar_k > rho*_k(a), the byte model says drafting k beats plain")
    for name in ("k", "rho_bar_k", *(f"a={a}" for a in reuse["rho_star"])):
        b.add_column(name, justify="right")
    for k, rb in reuse["rho_bar"].items():
        b.add_row(k, f"{rb:.3f}", *(f"{per_k[k]:.3f}{'*' if rb > per_k[k] else ''}"
                                    for per_k in reuse["rho_star"].values()))
    con.print(b)
    for suffix in ("", "_calibrated") if calibrated else ("",):
        for p in POLICIES:
            pts = ", ".join(f"{x:.4f}" for x in plan[f"staircase{suffix}"][p]["step_points"])
            con.print(f"step points (B.31) {p}{suffix.replace('_', ' ')}: {pts}")
    if out:
        con.print(f"plan -> {out}")

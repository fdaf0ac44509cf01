"""`moespec plan`: whole-model verify time, the kernel saving with its band, the crossover, the best draft length
and the speedup, from a bench (bandwidths) and a trace (bytes).

Physics first. A verification pass of n tokens costs the one-token pass plus what the expert operation of every
MoE layer adds when it serves n tokens instead of one (22):

    tau_hat_p(n) = tau_meas(1) + sum_l (t_bar_{p,l}(n) - t_bar_l(1)),   p in {slot, dedup},

with t_bar_{p,l}(n) the layer's op time averaged over recorded windows: the fit at each window's bytes (the
PREDICTION) or the measured per-window median (the MEASURED-TIME version); t_bar_l(1) is the per-slot kernel's,
since both engines run it on one token. The bench times only some MoE layers; every other layer takes the timed
layers' time per expert byte, scaled by its own w_l (sum over all layers = (W / W_timed) x sum over timed ones).

The saving S_hat(n) = tau_slot(n) - tau_dedup(n) carries the band (18): with every bandwidth off by |e| <= eps,
|S_hat - S| <= eps/(1-eps) (M^e_slot + M^e_dedup), M^e_p the summed expert-op times (here the predicted ones,
for which the bound holds with factor eps <= eps/(1-eps)). Which kernel is faster is decided where the margin
(19) |ln r(n) - ln u(n)| - ln((1+eps)/(1-eps)) is positive. The crossover is the smallest n >= 2 from which
S_hat > 0 at every larger n; the AUTO policy runs per-slot below it and dedup from it. Step times
V_hat(k) = tau_hat_p(k+1) + h(k) give k_hat*(a), the exact step points and the speedup, whose true value lies in
the band (21) for delta = eps/(1-eps) (needs eps < 1/2). For comparison, the one-bandwidth byte model of
published cost models: reuse threshold rho*_k(a) (16) against the trace's rho_bar_k, and "dedup is faster
wherever u(n) < 1", which bytes alone cannot decide (the two-bandwidth sign is that of r(n) - u(n), (7)).

plan.json (FORMAT_NAME, FORMAT_VERSION; n and k keys are strings):
  model, device, device_kind, dtype   the bench's ("cpu" or "cuda": a plan holds for the device its bench timed)
  eps (engine eps: max over slot and dedup), delta, kmax, tau1_s, draft_time_s [h(0..kmax)]
  coverage     {timed_layers, num_moe_layers, scale, rule}: how untimed MoE layers are covered
  crossover    n or null;  crossover_measured: the same on the measured-time version
  kernel_by_n  {n: "slot"|"dedup"} for n = 1..kmax+1 (the AUTO policy)
  tau_hat      {slot|dedup|auto: {n: s}} prediction (22);  tau_measured: {slot|dedup: {n: s}}
  saving       {n: {predicted_s, measured_s, band_s, lo_s, hi_s, u, r, margin, decided, byte_model, two_bandwidth}}
  step_times   {policy: [V_hat(0..kmax)]}
  staircase    {policy: {k_at_zero, step_points: [a_1..a_kmax], intervals: [{k, lo, hi}]}}: k_hat* = k on (lo, hi]
  table        [{a, policy, k_hat, speedup, speedup_lo, speedup_hi}] per acceptance of the paper's grid and policy
  reuse_threshold {depth, rho_bar: {k: v}, rho_star: {a: {k: v}}, k_hat_bytes: {a: k}}  (16)
  provenance
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from moespec import MoespecError, theory
from moespec.benchfile import DEVICE_KINDS, load_bench
from moespec.io import console as console_
from moespec.io import provenance, write_json
from moespec.reuse import reuse_stats
from moespec.spec import ModelSpec
from moespec.trace import Trace, load_trace

FORMAT_NAME = "moespec-plan"
FORMAT_VERSION = 1
KERNELS = ("slot", "dedup")
POLICIES = (*KERNELS, "auto")
DEFAULT_KMAX = 8  # the paper drafts up to 8 tokens (passes of up to 9)
DEFAULT_DEPTH = 512  # context depth for kv(k) in the byte model (16), the paper's shorter depth
EPS_LIMIT = 0.5  # (21) needs delta = eps/(1-eps) < 1
# key -> type(s) every plan.json must carry (the engine and external checks read them)
REQUIRED = {"format_version": int, "model": str, "device": str, "dtype": str, "eps": float, "kmax": int,
            "crossover": (int, type(None)), "kernel_by_n": dict, "tau_hat": dict, "saving": dict,
            "staircase": dict, "table": list, "provenance": dict}
ROW_KEYS = ("a", "policy", "k_hat", "speedup", "speedup_lo", "speedup_hi")


# ---- inputs --------------------------------------------------------------------------------------------------
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


def _layer_times(bench: dict[str, Any], where: str, ns: Sequence[int]) -> dict[str, np.ndarray]:
    """Per timed layer and n: t_bar_{p,l}(n) ("{version}_{p}", [layers, len(ns)]) and t_bar_l(1) ("{version}_one",
    [layers]), version "predicted" or "measured". Entry n = 1 of each kernel is the one-token time."""
    out: dict[str, list] = {}
    for layer in map(str, bench["layers"]):
        entry = bench["per_layer"].get(layer)
        if not isinstance(entry, dict) or not all(k in entry.get("kernels", {}) for k in KERNELS):
            raise MoespecError(f"{where}: per_layer has no slot and dedup op times for MoE layer {layer}")
        one = entry["one_token_s"]
        for version, key in (("predicted", "predicted_s"), ("measured", "measured_s")):
            out.setdefault(f"{version}_one", []).append(one[key])
        for kernel in KERNELS:
            times = entry["kernels"][kernel]
            absent = [n for n in ns if str(n) not in times]
            if absent:
                timed = sorted(int(n) for n in times)
                raise MoespecError(f"{where}: layer {layer} {kernel} times n = {timed[0]}..{timed[-1]}; "
                                   f"--kmax {ns[-1] - 1} needs n up to {ns[-1]}")
            for version in ("predicted", "measured"):
                row = [times[str(n)][f"{version}_mean_s"] for n in ns]
                out.setdefault(f"{version}_{kernel}", []).append(row)
    return {key: np.asarray(v, dtype=float) for key, v in out.items()}


# ---- the prediction ------------------------------------------------------------------------------------------
def verify_times(times: dict[str, np.ndarray], version: str, tau1: float, scale: float) -> dict[str, np.ndarray]:
    """(22) for n = 1..: tau1 + scale x sum over timed layers of (t_{p,l}(n) - t_l(1)); both kernels share n = 1."""
    one = times[f"{version}_one"]
    out = {}
    for kernel in KERNELS:
        growth = scale * (times[f"{version}_{kernel}"] - one[:, None]).sum(axis=0)
        growth[0] = 0.0  # a one-token pass runs the per-slot kernel either way: tau(1) has no kernel index
        out[kernel] = tau1 + growth
    return out


def crossover(saving: np.ndarray) -> int | None:
    """Smallest n >= 2 from which the saving (indexed by n - 1) is positive at every larger n; None if none."""
    n = None
    for i in range(len(saving) - 1, 0, -1):
        if saving[i] <= 0:
            break
        n = i + 1
    return n


def kernel_by_n(cross: int | None, n_max: int) -> dict[int, str]:
    """The AUTO policy: per-slot below the crossover (and at n = 1), dedup from it."""
    return {n: "dedup" if cross is not None and n >= cross else "slot" for n in range(1, n_max + 1)}


def _draft_times(text: str, kmax: int) -> list[float]:
    """h(0..kmax) from one number (every step) or kmax+1 comma-separated numbers, seconds >= 0."""
    try:
        values = [float(x) for x in text.split(",")]
    except ValueError:
        raise MoespecError(f"--draft-time {text!r}: not a number or a comma-separated list of numbers") from None
    if len(values) == 1:
        values *= kmax + 1
    if len(values) != kmax + 1 or not all(np.isfinite(v) and v >= 0 for v in values):
        raise MoespecError(f"--draft-time needs one or {kmax + 1} finite times >= 0 (h(0..{kmax})), got {text!r}")
    return values


def _staircase(V: Sequence[float]) -> dict[str, Any]:
    k0, steps = theory.staircase_intervals(V)
    return {"k_at_zero": int(k0), "step_points": [float(b) for b in theory.step_points(V)],
            "intervals": [{"k": s.k, "lo": float(s.lo), "hi": float(s.hi)} for s in steps]}


def build_plan(bench: dict[str, Any], trace: Trace, tau1: float, kmax: int = DEFAULT_KMAX,
               draft_time: Sequence[float] | None = None, depth: int = DEFAULT_DEPTH,
               bench_path: str = "bench", trace_path: str = "trace") -> dict[str, Any]:
    """The plan document (see the module docstring) from a validated bench, a trace and tau_meas(1) in seconds."""
    if not (np.isfinite(tau1) and tau1 > 0):
        raise MoespecError(f"--tau1 = {tau1} must be a positive time in seconds (the one-token pass)")
    if kmax < 1:
        raise MoespecError(f"--kmax must be >= 1, got {kmax}")
    h = list(draft_time) if draft_time is not None else [0.0] * (kmax + 1)
    spec = _spec_of(bench, trace, bench_path, trace_path)
    eps = _eps(bench, bench_path)
    delta = float(theory.delta_from_eps(eps))
    ns = list(range(1, kmax + 2))
    times = _layer_times(bench, bench_path, ns)
    fmt = bench["dtype"]
    w = np.array([spec.expert_bytes(layer, fmt) for layer in range(spec.L)], dtype=float)
    bad = [layer for layer in bench["layers"] if not 0 <= layer < spec.L]
    if bad:
        raise MoespecError(f"{bench_path}: timed layers {bad} outside the model's MoE layers 0..{spec.L - 1}")
    scale = float(w.sum() / w[bench["layers"]].sum())
    pred = verify_times(times, "predicted", tau1, scale)
    meas = verify_times(times, "measured", tau1, scale)
    if min(v.min() for v in (*pred.values(), *meas.values())) <= 0:
        raise MoespecError(f"--tau1 = {tau1} s is shorter than the time the bench's expert operations drop "
                           f"below one token's: a predicted verify time is not positive")
    s_pred, s_meas = pred["slot"] - pred["dedup"], meas["slot"] - meas["dedup"]
    expert = {k: scale * times[f"predicted_{k}"].sum(axis=0) for k in KERNELS}  # M^e_p(n)
    band = delta * (expert["slot"] + expert["dedup"])  # (18)
    stats = reuse_stats(trace, n_max=ns[-1], bootstrap=0, expert_bytes=w, units=f"bytes ({fmt})")
    cross = crossover(s_pred)
    policy = kernel_by_n(cross, ns[-1])
    pred["auto"] = np.array([pred[policy[n]][n - 1] for n in ns])
    saving = {}
    for n in ns[1:]:
        u, r = float(stats.u[n]), bench["r"].get(str(n))
        margin = None if r is None else float(theory.kernel_margin(u, r, eps))
        saving[str(n)] = {
            "predicted_s": float(s_pred[n - 1]), "measured_s": float(s_meas[n - 1]), "band_s": float(band[n - 1]),
            "lo_s": float(s_pred[n - 1] - band[n - 1]), "hi_s": float(s_pred[n - 1] + band[n - 1]),
            "u": u, "r": r, "margin": margin, "decided": margin is not None and margin > 0,
            "byte_model": "dedup" if u < 1 else "slot",
            "two_bandwidth": None if r is None else "dedup" if u < r else "slot"}
    V = {p: [float(pred[p][k]) + h[k] for k in range(kmax + 1)] for p in POLICIES}
    table = []
    for a in map(float, theory.PAPER_ACCEPTANCES):
        for p in POLICIES:
            k = int(theory.best_draft_length(V[p], a))
            s = float(theory.speedup(V[p], a, k))
            lo, hi = theory.speedup_band(s, delta)
            table.append({"a": a, "policy": p, "k_hat": k, "speedup": s, "speedup_lo": lo, "speedup_hi": hi})
    mW, D, kv = spec.byte_model(fmt, depth, kmax)
    rho_bar = [float(stats.rho_bar[k]) for k in range(1, kmax + 1)]
    V_bytes = theory.byte_step_times(mW, D, kv, rho_bar)
    grid = [float(a) for a in theory.PAPER_ACCEPTANCES]
    return {
        "format": FORMAT_NAME, "format_version": FORMAT_VERSION, "model": bench["model"],
        "device": bench["device"], "device_kind": bench["device_kind"], "dtype": fmt, "eps": eps, "delta": delta,
        "kmax": kmax, "tau1_s": tau1, "draft_time_s": h,
        "coverage": {"timed_layers": bench["layers"], "num_moe_layers": spec.L, "scale": scale,
                     "rule": "each untimed MoE layer takes the timed layers' op time per expert byte times its "
                             "w_l: sum over all layers = (W / W_timed) x sum over timed layers"},
        "crossover": cross, "crossover_measured": crossover(s_meas),
        "kernel_by_n": {str(n): k for n, k in policy.items()},
        "tau_hat": {p: {str(n): float(pred[p][n - 1]) for n in ns} for p in POLICIES},
        "tau_measured": {p: {str(n): float(meas[p][n - 1]) for n in ns} for p in KERNELS},
        "saving": saving, "step_times": V, "staircase": {p: _staircase(V[p]) for p in POLICIES}, "table": table,
        "reuse_threshold": {
            "depth": depth, "rho_bar": {str(k): rb for k, rb in enumerate(rho_bar, start=1)},
            "rho_star": {str(a): {str(k): float(theory.reuse_threshold_bytes(a, k, mW, D, kv))
                                  for k in range(1, kmax + 1)} for a in grid},
            "k_hat_bytes": {str(a): int(theory.best_draft_length(V_bytes, a)) for a in grid}},
        "provenance": provenance(device=bench["device"], dtype=fmt),
    }


# ---- plan.json -------------------------------------------------------------------------------------------------
def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and bool(np.isfinite(x))


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
    for p in POLICIES:
        per_n = doc["tau_hat"].get(p)
        if not isinstance(per_n, dict) or set(per_n) != ns or not all(_number(v) and v > 0 for v in per_n.values()):
            return f"tau_hat.{p} must give a positive time for every n = 1..{kmax + 1}"
    for i, row in enumerate(doc["table"]):
        if not isinstance(row, dict) or any(k not in row for k in ROW_KEYS):
            return f"table[{i}] must carry {', '.join(ROW_KEYS)}"
        if row["policy"] not in POLICIES or not (_number(row["a"]) and 0 <= row["a"] < 1):
            return f"table[{i}]: policy {row['policy']!r} or acceptance {row['a']!r} is invalid"
        if isinstance(row["k_hat"], bool) or not isinstance(row["k_hat"], int) or not 0 <= row["k_hat"] <= kmax:
            return f"table[{i}]: k_hat {row['k_hat']!r} is outside 0..{kmax}"
        if not all(_number(row[k]) for k in ROW_KEYS[3:]) or \
                not row["speedup_lo"] <= row["speedup"] <= row["speedup_hi"]:
            return f"table[{i}]: need speedup_lo <= speedup <= speedup_hi"
    return None


def load_plan(path: str | Path) -> dict[str, Any]:
    """Read and validate a plan.json (format, version, keys and types, kernel names, n ranges, table rows);
    raises MoespecError naming the file and the problem."""
    try:
        doc = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise MoespecError(f"{path}: no such plan file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise MoespecError(f"{path}: not readable JSON ({' '.join(str(e).split())[:120]})") from None
    problem = _check_plan(doc)
    if problem:
        raise MoespecError(f"{path}: {problem}")
    return doc


# ---- command -------------------------------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bench", required=True, help="bench.json from `moespec bench`")
    parser.add_argument("--trace", required=True, help="routing trace (.npz) of the same model")
    parser.add_argument("--tau1", type=float, required=True, help="measured one-token pass time tau(1), seconds")
    parser.add_argument("--device", choices=DEVICE_KINDS,
                        help="the device the plan is for; must be the one the bench timed (default: the bench's)")
    parser.add_argument("--out", help="write plan.json here")
    parser.add_argument("--kmax", type=int, default=DEFAULT_KMAX, help="largest draft length k (default 8)")
    parser.add_argument("--draft-time", default="0", metavar="H",
                        help="draft + host time per step h(k), seconds: one number or h(0..kmax) (default 0: oracle)")
    parser.add_argument("--depth", type=int, default=DEFAULT_DEPTH, help="context depth for kv(k) in (16)")
    parser.add_argument("--json", action="store_true", help="print one JSON document")


def run(args: argparse.Namespace) -> int:
    bench = load_bench(args.bench)
    if args.device is not None and args.device != bench["device_kind"]:
        raise MoespecError(f"{args.bench} was measured on {bench['device_kind']}; a {args.device} plan needs a "
                           f"bench run with --device {args.device}")
    trace = load_trace(args.trace)
    plan = build_plan(bench, trace, args.tau1, args.kmax, _draft_times(args.draft_time, args.kmax), args.depth,
                      bench_path=args.bench, trace_path=args.trace)
    if args.out:
        write_json(args.out, plan)
    if args.json:
        print(json.dumps(plan))
    else:
        print_summary(plan, args.out)
    return 0


def print_summary(plan: dict[str, Any], out: str | None) -> None:
    """Verify times and saving per n, then k_hat* and speedup per acceptance and policy."""
    from rich.table import Table

    con = console_()
    cov = plan["coverage"]
    con.print(f"[bold]{plan['model']}[/] {plan['dtype']} on {plan['device']}: tau(1) = {plan['tau1_s'] * 1e3:.3f} ms,"
              f" eps = {plan['eps']:.4f} (delta = {plan['delta']:.4f}); MoE layers {cov['timed_layers']} timed of "
              f"{cov['num_moe_layers']}: {cov['rule']} (x{cov['scale']:.3g})")
    t = Table(title="Verify time (22) and saving S = tau_slot - tau_dedup with band (18), ms",
              caption="decided: margin (19) > 0. bytes: the one-bandwidth model (dedup wherever u < 1); "
                      "2-bw: dedup where u < r (7)")
    for name in ("n", "tau slot", "tau dedup", "S_hat", "± (18)", "S meas.", "u(n)", "r(n)", "(19)", "decided",
                 "bytes", "2-bw", "auto"):
        t.add_column(name, justify="right")
    ms = lambda x: f"{x * 1e3:.3f}"  # noqa: E731
    for n in plan["kernel_by_n"]:
        s = plan["saving"].get(n)
        cells = ["-"] * 9 if s is None else [
            f"{s['predicted_s'] * 1e3:+.3f}", f"{s['band_s'] * 1e3:.3f}", f"{s['measured_s'] * 1e3:+.3f}",
            f"{s['u']:.3f}", "-" if s["r"] is None else f"{s['r']:.3f}",
            "-" if s["margin"] is None else f"{s['margin']:+.3f}", "yes" if s["decided"] else "no",
            s["byte_model"], s["two_bandwidth"] or "-"]
        t.add_row(n, ms(plan["tau_hat"]["slot"][n]), ms(plan["tau_hat"]["dedup"][n]), *cells,
                  plan["kernel_by_n"][n])
    con.print(t)
    split = [n for n, s in plan["saving"].items() if s["two_bandwidth"] not in (None, s["byte_model"])]
    con.print(f"one-bandwidth byte model vs two-bandwidth prediction: "
              f"{'disagree at n = ' + ', '.join(split) if split else 'agree at every n'}")
    con.print(f"predicted crossover: n = {plan['crossover']} (measured-time version: {plan['crossover_measured']});"
              f" AUTO runs per-slot below it, dedup from it")
    k = Table(title="Best draft length k_hat*(a) and predicted speedup [band (21)]",
              caption="bytes: k_hat* of the one-bandwidth byte model (16)")
    for name in ("a", *(f"{p}" for p in POLICIES), "bytes"):
        k.add_column(name, justify="right")
    rows: dict[float, dict[str, str]] = {}
    for row in plan["table"]:
        rows.setdefault(row["a"], {})[row["policy"]] = \
            f"{row['k_hat']}: {row['speedup']:.3f} [{row['speedup_lo']:.3f}, {row['speedup_hi']:.3f}]"
    for a, cells in rows.items():
        k.add_row(f"{a:g}", *(cells[p] for p in POLICIES), str(plan["reuse_threshold"]["k_hat_bytes"][str(a)]))
    con.print(k)
    reuse = plan["reuse_threshold"]
    b = Table(title=f"One-bandwidth reuse threshold (16) at depth {reuse['depth']}: the trace's rho_bar_k vs "
                    f"rho*_k(a)", caption="*: rho_bar_k > rho*_k(a), the byte model says drafting k beats plain")
    for name in ("k", "rho_bar_k", *(f"a={a}" for a in reuse["rho_star"])):
        b.add_column(name, justify="right")
    for k, rb in reuse["rho_bar"].items():
        b.add_row(k, f"{rb:.3f}", *(f"{per_k[k]:.3f}{'*' if rb > per_k[k] else ''}"
                                    for per_k in reuse["rho_star"].values()))
    con.print(b)
    for p in POLICIES:
        pts = ", ".join(f"{x:.4f}" for x in plan["staircase"][p]["step_points"])
        con.print(f"step points (B.31) {p}: {pts}")
    if out:
        con.print(f"plan -> {out}")

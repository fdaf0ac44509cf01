"""The numbers behind a plan: whole-model verify times (22) in three versions, the bound on each one's
error, the saving and its band (18), the crossover and the AUTO policy, and per version the step times, the
staircase and the best draft length with its speedup band (20)-(21).

Physics first. A verification pass of n tokens costs its time outside the expert operations (attention, dense
weights, KV cache, launches) plus the expert operation of every MoE layer. Each version starts from a MEASURED
pass time and swaps the whole-model expert time of that pass for the one kernel p spends at n:

    tau_p(n) = tau_meas + (M_p(n) - M_anchor),    M_p(n) = sum over the MoE layers of t_bar_{p,l}(n),

  prediction (22)  tau_meas = tau_meas(1), M_anchor = M_slot(1): the one-token pass. Both engines run the
                   per-slot kernel on one token, so M_p(1) = M_slot(1) = sum_l t_bar_l(1) for both kernels and
                   tau_p(1) = tau_meas(1). t_bar: the fit at each recorded window's bytes, averaged.
  measured-time    the same with the measured per-window op times in place of the fits.
  whole-pass       (22) plus the growth with n of the time outside the expert operation, measured with the
                   expert operation taken out: tau_meas = tau_meas(1) + tau_out(n) - tau_out(1), M_anchor = M_slot(1)
                   (`whole_pass`).
  calibrated       the measured-time version with one change, as the paper's (Section 4.2): tau_meas =
                   tau_meas_slot(n), the whole-model verify time measured with dedup off, M_anchor = M_slot(n) of the
                   measured op times, so the growth with n of the time outside the expert operation comes from that
                   measurement: tau_cal_slot(n) = tau_meas_slot(n) and tau_cal_dedup(n) = tau_meas_slot(n) -
                   S_meas(n), S_meas the measured-time version's saving. Both kernels gain the same measured time,
                   so the calibrated saving, and with it the crossover, is the measured-time version's.

Errors. With every bandwidth off by |e| <= eps, an expert-op time moves by at most delta = eps/(1-eps) of itself
(17), so tau_p(n) is off by at most b_p(n) = delta (M_p(n) + M_anchor), and by nothing where p's expert time is
the anchor's own (n = 1; the calibrated per-slot time). The saving's kernels share the anchor, which cancels:
|S_hat - S| <= delta (M_slot + M_dedup) (18). A step time V(k) = tau(k+1) + h(k) (h exact) with
|V_hat - V| <= b(k) obeys (1-d) V <= V_hat <= (1+d) V for d = max_k b(k)/(V_hat(k) - b(k)), since V >= V_hat - b:
that d, per version and policy, is the delta for which (20) and (21) hold. A bare eps/(1-eps) would not do:
V(0) is measured, but V(k) carries two expert terms' errors, and they need not be small beside V(k). Where
d >= 1 (the bound reaches half of V_hat(k)) there is no band: a prediction is refused, calibrated rows carry none.

AUTO runs, at each n, the kernel of smaller predicted verify time (per-slot on ties and at n = 1, where both
engines run it): its predicted time is the smaller of the two, and its true time exceeds the faster kernel's by
at most the band (18). When the saving changes sign once, that is per-slot below the crossover and dedup from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from moespec import MoespecError, theory
from moespec.defaults import KERNELS, POLICIES


@dataclass(frozen=True)
class VerifyTimes:
    """One version of the whole-model verify times over n = 1..: tau[p][n - 1] and the bound[p][n - 1] on its
    error from bandwidth errors (where the time is measured: 0, or its 95% interval's half-width)."""

    tau: dict[str, np.ndarray]
    bound: dict[str, np.ndarray]


def layer_times(bench: dict[str, Any], where: str, ns: Sequence[int]) -> dict[str, np.ndarray]:
    """Per timed layer and n: t_bar_{p,l}(n) ("{version}_{p}", [layers, len(ns)]) and t_bar_l(1) ("{version}_one",
    [layers]), version "predicted" or "measured", from bench.json's per_layer entries."""
    out: dict[str, list] = {}
    for layer in map(str, bench["layers"]):
        entry = bench["per_layer"].get(layer)
        if not isinstance(entry, dict) or not all(k in entry.get("kernels", {}) for k in KERNELS):
            raise MoespecError(f"{where}: per_layer has no slot and dedup op times for MoE layer {layer}")
        one = entry["one_token_s"]
        for version, key in (("predicted", "predicted_s"), ("measured", "measured_s")):
            out.setdefault(f"{version}_one", []).append(_op_time(one, key, where, f"{layer}.one_token_s"))
        for kernel in KERNELS:
            times = entry["kernels"][kernel]
            absent = [n for n in ns if str(n) not in times]
            if absent:
                timed = sorted(int(n) for n in times)
                raise MoespecError(f"{where}: layer {layer} {kernel} times n = {timed[0]}..{timed[-1]}; "
                                   f"--kmax {ns[-1] - 1} needs n up to {ns[-1]}")
            for version in ("predicted", "measured"):
                row = [_op_time(times[str(n)], f"{version}_mean_s", where, f"{layer}.kernels.{kernel}.{n}")
                       for n in ns]
                out.setdefault(f"{version}_{kernel}", []).append(row)
    return {key: np.asarray(v, dtype=float) for key, v in out.items()}


def _op_time(entry: Any, key: str, where: str, path: str) -> float:
    """An operation time of bench.json's per_layer; a prediction is null where its kernel has no fit, which a
    plan cannot use: one line naming the file and the key."""
    value = entry.get(key) if isinstance(entry, dict) else None
    if value is None:
        raise MoespecError(f"{where}: per_layer.{path}.{key} is null (no fit of that kernel: too few pass sizes "
                           f"n >= 2 were timed); rerun `moespec bench` with --n 1-9")
    return float(value)


def expert_times(times: dict[str, np.ndarray], version: str, scale: float) -> dict[str, np.ndarray]:
    """Whole-model expert-op time M_p(n) = scale x sum over timed layers of t_bar_{p,l}(n), with M_p(1) the
    one-token time sum_l t_bar_l(1) for both kernels (one token runs the per-slot kernel either way)."""
    one = scale * times[f"{version}_one"].sum()
    out = {}
    for kernel in KERNELS:
        M = scale * times[f"{version}_{kernel}"].sum(axis=0)
        M[0] = one
        out[kernel] = M
    return out


def anchored(tau_meas: float | np.ndarray, M: dict[str, np.ndarray], delta: float, per_n: bool,
             measured: str = "slot") -> VerifyTimes:
    """tau_p(n) = tau_meas + (M_p(n) - M_q(n0)) with bound delta (M_p(n) + M_q(n0)): n0 = 1 (the one-token anchor
    of (22), where both kernels run one token alike; tau_meas a number, q = slot) or, per_n, n0 = n (the calibrated
    version; tau_meas per n, the verify times of kernel q = `measured`: slot for moespec's engine with dedup off,
    dedup for an engine that has only it, llama.cpp's CPU MUL_MAT_ID)."""
    if measured not in KERNELS:
        raise ValueError(f"measured: {measured!r} is not one of {', '.join(KERNELS)}")
    anchor = M[measured] if per_n else M["slot"][0]
    first = np.arange(len(M["slot"])) == 0
    tau = {p: tau_meas + (M[p] - anchor) for p in KERNELS}
    bound = {p: np.where(first | (per_n and p == measured), 0.0, delta * (M[p] + anchor)) for p in KERNELS}
    return VerifyTimes(tau, bound)


def whole_pass(tau1: float, tau_outside: np.ndarray, M: dict[str, np.ndarray], delta: float) -> VerifyTimes:
    """The WHOLE-PASS version: (22) with the growth of the time outside the expert operation added,

        tau_p(n) = tau_meas(1) + (tau_out(n) - tau_out(1)) + (M_p(n) - M_slot(1)),

    tau_out the engine's pass with the expert operation taken out, measured at each n. Beyond the paper: (22)
    carries the one-token pass's outside time to every n, so it misses how attention, the dense weights and the
    head grow with n; this version measures that growth instead of assuming it away. Like (22) it starts from the
    measured one-token pass, so only the expert op's growth comes from the bench: the sum tau_out(n) + M_p(n)
    took its level from the bench, which runs a minute before the engine, and missed the engine's pass by 15-35%
    where the host had moved between them (all six rules in 6 of 19 `make demo` runs against 8 of 19 anchored,
    rescored; results/demo-cpu.md). The bound is (22)'s, delta (M_p(n) + M_slot(1)), 0 at n = 1."""
    return anchored(tau1 + tau_outside - tau_outside[0], M, delta, per_n=False)


def kernel_by_n(saving: np.ndarray) -> dict[int, str]:
    """The AUTO policy: dedup at each n >= 2 where the predicted saving (indexed by n - 1) is positive, else
    per-slot."""
    return {n: "dedup" if n > 1 and saving[n - 1] > 0 else "slot" for n in range(1, len(saving) + 1)}


def with_auto(times: VerifyTimes, policy: dict[int, str]) -> VerifyTimes:
    """The times and bounds of AUTO added: at each n those of the kernel the policy runs there."""
    def pick(per_kernel: dict[str, np.ndarray]) -> np.ndarray:
        return np.array([per_kernel[policy[n]][n - 1] for n in sorted(policy)])

    return VerifyTimes({**times.tau, "auto": pick(times.tau)}, {**times.bound, "auto": pick(times.bound)})


def step_delta(V: np.ndarray, bound: np.ndarray) -> float:
    """d = max_k b(k)/(V_hat(k) - b(k)): every V within b of V_hat has (1-d) V <= V_hat <= (1+d) V."""
    if np.any(bound >= V):
        return float("inf")
    return float(np.max(bound / (V - bound)))


def staircase(V: Sequence[float]) -> dict[str, Any]:
    """k*(0), the step points (B.31) and the intervals on which k* is constant, as JSON."""
    k0, steps = theory.staircase_intervals(V)
    return {"k_at_zero": int(k0), "step_points": [float(b) for b in theory.step_points(V)],
            "intervals": [{"k": s.k, "lo": float(s.lo), "hi": float(s.hi)} for s in steps]}


def steps(times: VerifyTimes, h: Sequence[float], version: str) -> dict[str, Any]:
    """Per policy: V_hat(k) = tau(k+1) + h(k) for k = 0..kmax, its delta (step_delta), its staircase; and a table
    row {a, policy, version, k_hat, speedup, speedup_lo, speedup_hi} (band (21)) per acceptance of the paper's
    grid and policy. Where the error bound leaves no band (delta >= 1: a noisy bench, or a calibration that
    subtracts a large uncertain time), delta and the rows' band are None: the plan still holds its staircase."""
    out: dict[str, Any] = {"step_times": {}, "delta": {}, "staircase": {}, "table": []}
    for p in POLICIES:
        V = times.tau[p] + np.asarray(h, dtype=float)
        d: float | None = step_delta(V, times.bound[p])
        if not d < 1:
            d = None
        out["step_times"][p], out["delta"][p], out["staircase"][p] = V.tolist(), d, staircase(V.tolist())
    for a in map(float, theory.PAPER_ACCEPTANCES):
        for p in POLICIES:
            V, d = out["step_times"][p], out["delta"][p]
            k = int(theory.best_draft_length(V, a))
            s = float(theory.speedup(V, a, k))
            lo, hi = (None, None) if d is None else map(float, theory.speedup_band(s, d))
            out["table"].append({"a": a, "policy": p, "version": version, "k_hat": k, "speedup": s,
                                 "speedup_lo": lo, "speedup_hi": hi})
    return out

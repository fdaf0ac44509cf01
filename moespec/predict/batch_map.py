"""The plan at batch sizes B: per B the step times V_B(k), the AUTO kernel and crossover, k_hat*(a, B), the
throughput and speedup, and B_stop(a), the batch from which speculation stops paying (plan.json `batch`).

Physics (DESIGN "Batch B > 1"). A step of B sequences verifies B (k + 1) tokens in one pass: V_B(k) = tau_p(B, k + 1)
+ h(k). Each sequence accepts on its own, so a step emits B G_a(k) tokens on average and T_{a,B}(k) = B G_a(k) /
V_B(k): B is a constant factor, so k*(a, B), the step points and the bounds are Section 3's results on the vector
V_B (moespec.theory), unchanged. What B changes is V_B: the pass's expert bytes are the union U^B(k + 1) of B
sequences' experts, which grows toward all N with B n, while the dense weights are read once per pass, so the
first drafted token's price V_B(1) / V_B(0) rises with B and k* falls, until the union nears all N experts: past
that a drafted token adds few expert bytes and the price falls again (the demo's model on the 2-core Xeon: V_B(1) /
V_B(0) of the verify pass 1.19, 1.31, 1.29, 1.21 at B = 1, 2, 4, 8), so k*(a, B) need not fall monotonically in B.
B_stop(a), the batch from which speculation stops paying, is the least B of the grid from which k*(a, B) = 0 at every
larger B of the grid too, None where the largest B drafts. Dedup is faster at batch B where u_B(n) < r(B n) (7), so
each B has its own crossover and AUTO policy.

Two versions of V_B:
- measured (the map's, `per_batch`): the engine's verify times at each B (`moespec run --batch`, verify-only: passes
  of B x n tokens with each kernel); the scored run measures the throughput afterwards (pre-registered);
- prediction (`predicted`, from the bench, every B of the grid): (22)'s whole pass at B n tokens. The fits (4) and
  (E.1) of each timed layer at the pass's B n tokens and its expected union U_l^B(n) of the trace
  (moespec.routing.batch; both fits are linear in U, so the fit at the mean union is the mean time), scaled to the
  plan's MoE layers as (22) is; the time outside the expert operation grows along the line through the batch-one
  run's outside times tau_out(n) (least squares over n), taken to B n tokens:
      tau_p(B, n) = tau_meas(1) + beta_out (B n - 1) + M_p(B n, U^B(n)) - M_slot(1, m).
  Past the bench's largest pass the fits extrapolate (a CPU turns compute-bound at some tens of tokens: E.1's
  per-token term carries that); the measured version at the B it was run shows how far.
The prediction is extra: where one of its times is not positive (a noisy outside time tilts the line; runs of a
smaller model than the fits cover) the plan keeps the measured map, and its verdict names the batch, n and times.
Each version's AUTO runs dedup where its saving is positive: at n >= 2 at batch one (one token reads the same
experts with either kernel), at every n at B > 1 (a pass carries B tokens even at n = 1).

Rule (7) at batch B (the prediction's `union_share` and `r`, byte_ratios): on the bench's timed layers, the ones
the prediction times and scales, u_B(n) = E_dedup^B(n) / E_slot^B(n) of their union U_l^B(n) with w_l their expert
bytes (moespec.routing.reuse.union_bytes), and r(B n) the ratio of the two kernels' effective bandwidths on
requested bytes, as the bench's r (moespec.measure.fits.analyze), with each kernel's time from the fits at the
pass's B n tokens and U_l^B(n) (expert_times, the times of tau_p(B, n) above): r = (E_dedup / M_dedup) / (E_slot /
M_slot). So u_B(n) < r(B n) exactly where the prediction's dedup saving is positive. r is null where a kernel's
fitted time is not positive (no bandwidth to speak of: the fits extrapolate far past the bench). At B = 1 u_B(n) is
the batch-one u(n) (the plan's saving.{n}.u, the bench's u) wherever the timed layers route as the layers that one
covers, and r(n) differs from the bench's measured r(n), a ratio of medians over recorded windows, by the fits'
error.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from moespec import MoespecError, theory
from moespec.defaults import BATCH_LIMIT, KERNELS
from moespec.formats.trace import Trace
from moespec.measure.fits import recorded_time
from moespec.routing.batch import BatchUnion, batch_union
from moespec.routing.reuse import union_bytes

POLICY = "auto"  # the policy whose step times the map reads: the kernel the plan runs at each pass


class NotPositive(MoespecError):
    """A predicted batch verify time is not positive: the measured map stands without the prediction beside it."""


def _verify_times(block: Mapping[str, Any], where: str, ns: range) -> dict[str, np.ndarray]:
    """slot and dedup verify times over n = 1..kmax + 1 of one batch size (a runs.json's, or one B of its batch)."""
    times = block.get("verify_time_s") or {}
    out = {}
    for kernel in KERNELS:
        per_n = times.get(kernel) or {}
        absent = [n for n in ns if str(n) not in per_n]
        if absent:
            raise MoespecError(f"{where}: no {kernel} verify time at n = {absent[0]}; the plan's --kmax "
                               f"{ns[-1] - 1} needs n up to {ns[-1]} (run with --n 1-{ns[-1]})")
        out[kernel] = np.array([float(per_n[str(n)]) for n in ns])
    return out


def batch_entry(tau: Mapping[str, np.ndarray], h: Sequence[float], batch: int,
                acceptances: Sequence[float]) -> dict[str, Any]:
    """One batch size's entry: step times per policy, AUTO, crossover, and per acceptance k_hat*, the throughput
    B G_a(k)/V_B(k) and the speedup over plain decoding at the same B (plan.json `batch.per_batch`)."""
    tau = {kernel: np.asarray(tau[kernel], dtype=float) for kernel in KERNELS}
    saving = tau["slot"] - tau["dedup"]
    # one token reads the same experts with either kernel; a pass of B > 1 sequences carries B tokens even at n = 1
    auto = {n: "dedup" if (n > 1 or batch > 1) and saving[n - 1] > 0 else "slot" for n in range(1, len(saving) + 1)}
    times = {**tau, POLICY: np.array([tau[auto[n]][n - 1] for n in sorted(auto)])}
    steps = {p: (v + np.asarray(h, dtype=float)).tolist() for p, v in times.items()}
    V = steps[POLICY]
    k_hat = [int(theory.best_draft_length(V, a)) for a in acceptances]
    return {"step_time_s": steps, "kernel_by_n": {str(n): k for n, k in auto.items()},
            "crossover": theory.crossover({n: float(saving[n - 1]) for n in range(1, len(saving) + 1)}),
            "k_hat": k_hat,
            "tokens_per_s": [batch * float(theory.throughput(V, a, k)) for a, k in zip(acceptances, k_hat)],
            "speedup": [float(theory.speedup(V, a, k)) for a, k in zip(acceptances, k_hat)]}


def b_stop(batches: Sequence[int], k_hat: Mapping[int, Sequence[int | None]], count: int) -> list[int | None]:
    """Per acceptance i: the least batch size of the ascending grid from which k_hat[B][i] = 0 at every larger B too,
    or None where the largest B drafts (any k_hat other than 0, None included, drafts)."""
    stops: list[int | None] = []
    for i in range(count):
        stop = None
        for b in reversed(batches):
            if k_hat[b][i] != 0:
                break
            stop = b
        stops.append(stop)
    return stops


def batch_block(runs: Mapping[str, Any], runs_path: str, batches: Sequence[int], kmax: int,
                h: Sequence[float], predicted: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """plan.json's `batch` block from a runs.json measured at these batch sizes (B = 1: its own verify times;
    B > 1: its `batch` block), h(k) the draft and host time per step, and the prediction version beside it
    (`predicted_block`, or None where the runs lack what it needs or a predicted time is not positive; the plan's
    verdict then says why) (module docstring)."""
    if not batches or any(type(b) is not int or not 1 <= b <= BATCH_LIMIT for b in batches) \
            or list(batches) != sorted(set(batches)):
        raise ValueError(f"batches must be batch sizes in 1..{BATCH_LIMIT}, ascending and distinct, got {batches!r}")
    if len(h) != kmax + 1:
        raise ValueError(f"h must give kmax + 1 = {kmax + 1} times, got {len(h)}")
    measured = (runs.get("batch") or {}).get("per_batch", {})
    missing = [b for b in batches if b > 1 and str(b) not in measured]
    if missing:
        raise MoespecError(f"{runs_path}: no verify times at batch {missing[0]}; measure them with `moespec run "
                           f"--batch {','.join(map(str, batches))} --no-throughput`")
    ns = range(1, kmax + 2)
    acceptances = [float(a) for a in theory.PAPER_ACCEPTANCES]
    per_batch = {}
    for b in batches:
        block, where = (runs, runs_path) if b == 1 else (measured[str(b)], f"{runs_path}: batch {b}")
        per_batch[str(b)] = batch_entry(_verify_times(block, where, ns), h, b, acceptances)
    return {"batches": list(batches), "kmax": kmax, "policy": POLICY,
            "source": f"verify times measured at each batch size in {runs_path} (moespec run --batch)",
            "acceptances": acceptances, "per_batch": per_batch,
            "b_stop": b_stop(batches, {b: per_batch[str(b)]["k_hat"] for b in batches}, len(acceptances)),
            "predicted": None if predicted is None else dict(predicted)}


def predictable(bench: Mapping[str, Any], runs: Mapping[str, Any], kmax: int) -> bool:
    """The runs hold what the prediction anchors on (the one-token pass and the outside times at n = 1..kmax + 1),
    and the bench (its pair in the slot and dedup roles, moespec.formats.benchfile.as_pair_roles) a fit of both
    kernels at every timed layer."""
    times = runs.get("verify_time_s") or {}
    fits = bench.get("fits") or {}
    outside = times.get("outside") or {}
    return "1" in (times.get("slot") or {}) and all(str(n) in outside for n in range(1, kmax + 2)) \
        and all((fits.get(str(layer)) or {}).get(kind) for layer in bench["layers"] for kind in KERNELS)


def _timed(bench: Mapping[str, Any]) -> tuple[list[int], np.ndarray]:
    """The bench's timed layers and their expert bytes b_l."""
    layers = [int(layer) for layer in bench["layers"]]
    return layers, np.array([float(bench["expert_bytes"][str(layer)]) for layer in layers])


def _check_reach(union: BatchUnion, batch: int, kmax: int) -> None:
    """ValueError naming the argument unless `union` holds `batch` and windows of up to kmax + 1 tokens."""
    if batch not in union.union:
        raise ValueError(f"batch must be one of the union's batch sizes {union.batches}, got {batch!r}")
    if type(kmax) is not int or not 1 <= kmax < union.n_max:
        raise ValueError(f"kmax must lie in 1..{union.n_max - 1} (the union's windows reach {union.n_max} tokens), "
                         f"got {kmax!r}")


def expert_times(bench: Mapping[str, Any], union: BatchUnion, batch: int, kmax: int) -> dict[str, np.ndarray]:
    """Per kernel over n = 1..kmax + 1, the timed layers' expert-operation time [s] on a pass of B n tokens: the sum
    over them of their fit (4) or (E.1) at (B n, U_l^B(n)) (recorded_time), before (22)'s scaling to the plan's MoE
    layers."""
    _check_reach(union, batch, kmax)
    layers, b = _timed(bench)
    tokens = batch * np.arange(1, kmax + 2, dtype=float)
    unions = union.union[batch][:, 1:kmax + 2]
    return {kind: sum(recorded_time(bench["fits"][str(layer)][kind], kind, tokens, unions[layer], union.m, w)
                      for layer, w in zip(layers, b)) for kind in KERNELS}


def predicted_times(bench: Mapping[str, Any], union: BatchUnion, runs: Mapping[str, Any], runs_path: str,
                    kmax: int, scale: float) -> dict[int, dict[str, np.ndarray]]:
    """tau_p(B, n) of the prediction version (module docstring) per B of `union` (the trace's U_l^B, windows of up
    to kmax + 1 tokens or more) and kernel over n = 1..kmax + 1."""
    ns = np.arange(1, kmax + 2)
    outside = (runs.get("verify_time_s") or {}).get("outside") or {}
    if not predictable(bench, runs, kmax):
        raise MoespecError(f"{runs_path}: the batch prediction needs the one-token pass and the time outside the "
                           f"expert operation at n = 1..{kmax + 1} (a verify-only `moespec run`, which measures both)")
    beta = float(np.polyfit(ns, [float(outside[str(n)]) for n in ns], 1)[0])
    tau1 = float(runs["verify_time_s"]["slot"]["1"])
    m = union.m
    layers, b = _timed(bench)
    anchor = scale * sum(recorded_time(bench["fits"][str(layer)]["slot"], "slot", np.array(1.0), np.array(float(m)),
                                       m, w) for layer, w in zip(layers, b))
    out = {}
    for batch in union.batches:
        tokens = batch * ns.astype(float)
        M = expert_times(bench, union, batch, kmax)
        out[batch] = {kind: tau1 + beta * (tokens - 1) + scale * M[kind] - anchor for kind in KERNELS}
    return out


def byte_ratios(bench: Mapping[str, Any], union: BatchUnion, batch: int, kmax: int) -> dict[str, list]:
    """u_B(n) (`union_share`) and r(B n) (`r`, None where a kernel's fitted time is not positive) over n = 1..kmax + 1
    on the bench's timed layers: rule (7) at batch B (module docstring)."""
    _check_reach(union, batch, kmax)
    layers, b = _timed(bench)
    found = union_bytes(union.union[batch][layers, :kmax + 2], b, union.m, batch)
    times = expert_times(bench, union, batch, kmax)
    r = [float((e_dedup / t_dedup) / (e_slot / t_slot)) if t_dedup > 0 and t_slot > 0 else None
         for e_slot, e_dedup, t_slot, t_dedup in zip(found["E_slot"][1:], found["E_dedup"][1:], times["slot"],
                                                     times["dedup"])]
    return {"union_share": found["u"][1:].tolist(), "r": r}


def predicted_block(bench: Mapping[str, Any], trace: Trace, runs: Mapping[str, Any], runs_path: str,
                    batches: Sequence[int], kmax: int, h: Sequence[float], scale: float) -> dict[str, Any]:
    """The batch block's `predicted`: per B the entry of batch_entry on the prediction's verify times with u_B(n)
    and r(B n) beside it (byte_ratios), and B_stop; NotPositive where a predicted time is not positive."""
    acceptances = [float(a) for a in theory.PAPER_ACCEPTANCES]
    union = batch_union(trace, batches, kmax + 1)
    times = predicted_times(bench, union, runs, runs_path, kmax, scale)
    b, kernel = min(((b, kernel) for b in times for kernel in KERNELS), key=lambda bk: times[bk[0]][bk[1]].min())
    if times[b][kernel].min() <= 0:
        n = int(np.argmin(times[b][kernel])) + 1
        outside = {k: round(1e3 * float(t), 3) for k, t in runs["verify_time_s"]["outside"].items()}
        raise NotPositive(f"{runs_path}: a predicted batch verify time is not positive ({kernel} at B = {b}, n = {n}: "
                          f"{1e3 * times[b][kernel][n - 1]:.3g} ms; outside times {outside} ms): a noisy outside "
                          f"time (rerun with more --reps), or runs of a smaller model than the bench's fits cover "
                          f"(check --moe-layers)")
    per_batch = {str(b): batch_entry(times[b], h, b, acceptances) | byte_ratios(bench, union, b, kmax)
                 for b in batches}
    return {"per_batch": per_batch,
            "b_stop": b_stop(batches, {b: per_batch[str(b)]["k_hat"] for b in batches}, len(acceptances))}

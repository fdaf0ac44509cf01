"""The plan at batch sizes B: per B the step times V_B(k), the AUTO kernel and crossover, k_hat*(a, B), the
throughput and speedup, and B_stop(a), the batch from which speculation stops paying (plan.json `batch`).

Physics (DESIGN "Batch B > 1"). A step of B sequences verifies B (k + 1) tokens in one pass: V_B(k) = tau_p(B, k + 1)
+ h(k). Each sequence accepts on its own, so a step emits B G_a(k) tokens on average and T_{a,B}(k) = B G_a(k) /
V_B(k): B is a constant factor, so k*(a, B), the step points and the bounds are Section 3's results on the vector
V_B (moespec.theory), unchanged. What B changes is V_B: the pass's expert bytes are the union U^B(k + 1) of B
sequences' experts, which grows toward all N with B n, while the dense weights are read once per pass, so the
first drafted token's price V_B(1) / V_B(0) rises with B and k* falls; B_stop(a) is the least B of the grid at which
k*(a, B) = 0. Dedup is faster at batch B where u_B(n) < r(B n) (7), so each B has its own crossover and AUTO policy.

The step times here are the engine's verify times measured at each B (`moespec run --batch`, verify-only: the
times of passes of B x n tokens with each kernel), the plan's measured version at batch; the scored run that the
plan is compared with measures the throughput afterwards (pre-registered). Each B's AUTO runs dedup where the
measured saving's median is positive: at n >= 2 at batch one (one token reads the same experts with either kernel),
at every n at B > 1 (a pass carries B tokens even at n = 1).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from moespec import MoespecError, theory
from moespec.defaults import BATCH_LIMIT, KERNELS

POLICY = "auto"  # the policy whose step times the map reads: the kernel the plan runs at each pass


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


def b_stop(batches: Sequence[int], k_hat: Mapping[int, Sequence[int]], count: int) -> list[int | None]:
    """Per acceptance i: the least batch size of the grid at which k_hat[B][i] = 0, or None where every B drafts."""
    return [next((b for b in batches if k_hat[b][i] == 0), None) for i in range(count)]


def batch_block(runs: Mapping[str, Any], runs_path: str, batches: Sequence[int], kmax: int,
                h: Sequence[float]) -> dict[str, Any]:
    """plan.json's `batch` block from a runs.json measured at these batch sizes (B = 1: its own verify times;
    B > 1: its `batch` block), h(k) the draft and host time per step (module docstring)."""
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
            "b_stop": b_stop(batches, {b: per_batch[str(b)]["k_hat"] for b in batches}, len(acceptances))}

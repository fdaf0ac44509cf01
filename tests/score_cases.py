"""Hand-made plan.json and runs.json documents that score against each other (every rule holds), shared by the
score tests and the bad-input tests (test modules do not import each other)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

NS = range(1, 10)  # kmax = 8: passes of 1..9 tokens
ACCEPTANCES = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 0.98)
POLICIES = ("slot", "dedup", "auto")
IDENTITY = {"model": "deepseek-v2-lite", "device_kind": "cuda", "dtype": "q4_k_m"}
T0 = 100.0  # tokens per second at k = 0
PEAK = 150.0  # at k_hat*: best speedup 1.5, inside the band [1.2, 1.8]


def k_hat_of(a: float) -> int:
    return int(a * 8)


def slot_time(n: int) -> float:
    return 0.25 + n / 64  # binary fractions: the savings below are exact


def dedup_time(n: int) -> float:
    """Saving slot - dedup = (n - 4)/128: negative to n = 3, zero at 4, positive from 5 (the crossover)."""
    return slot_time(n) if n == 1 else 0.25 + 1 / 32 + n / 128


def step_time(policy: str, k: int) -> float:
    """The measured step time V(k) of a cell: the plan's predicted one exactly (h = 0), so rule 6's delta is 0."""
    times = {"slot": slot_time(k + 1), "dedup": dedup_time(k + 1)}
    return times.get(policy, min(times.values()))


def make_plan() -> dict[str, Any]:
    """A plan.json document that passes load_plan."""
    tau = {"slot": {str(n): slot_time(n) for n in NS}, "dedup": {str(n): dedup_time(n) for n in NS}}
    tau["auto"] = {str(n): min(tau["slot"][str(n)], tau["dedup"][str(n)]) for n in NS}
    table = [{"a": a, "policy": p, "k_hat": k_hat_of(a), "speedup": 1.5, "speedup_lo": 1.2, "speedup_hi": 1.8}
             for a in ACCEPTANCES for p in POLICIES]
    return {"format": "moespec-plan", "format_version": 1, **IDENTITY, "device": "test gpu", "eps": 0.05,
            "delta": 0.05 / 0.95, "delta_steps": {"prediction": {"slot": 0.06, "dedup": 0.07, "auto": 0.065}},
            "kmax": 8, "crossover": 5,
            "kernel_by_n": {str(n): "dedup" if n >= 5 else "slot" for n in NS}, "tau_hat": tau,
            "saving": {str(n): {"predicted_s": slot_time(n) - dedup_time(n)} for n in NS[1:]},
            "staircase": {}, "table": table, "provenance": {"timestamp": "2026-10-01T12:00:00+00:00"},
            "step_times": {p: [tau[p][str(k + 1)] for k in range(9)] for p in POLICIES}}


def curve(k_hat: int) -> dict[int, float]:
    """Measured throughput over k = 0..8 peaking at k_hat (k_hat >= 1)."""
    return {k: T0 if k == 0 else PEAK - 5 * abs(k - k_hat) for k in range(9)}


def make_runs() -> dict[str, Any]:
    """A runs.json document measuring exactly what make_plan predicts, started after the plan was written."""
    saving = {str(n): slot_time(n) - dedup_time(n) for n in NS[1:]}
    return {"format": "moespec-runs", "format_version": 1, **IDENTITY, "depth": 512,
            "verify_time_s": {"slot": {str(n): slot_time(n) for n in NS}, "dedup": {str(n): dedup_time(n) for n in NS}},
            "saving_s": {n: {"median": s, "lo": s - 0.001, "hi": s + 0.001} for n, s in saving.items()},
            "throughput": [{"policy": p, "k": k, "a": a, "tokens_per_s": t, "realized_acceptance": None,
                            "step_time_s": step_time(p, k)}
                           for p in POLICIES for a in ACCEPTANCES for k, t in curve(k_hat_of(a)).items()],
            "provenance": {"timestamp": "2026-10-02T08:00:00+00:00"}}


def ran(plan_path: Path) -> dict[str, str]:
    """The runs.json `plan` block of a run made with --plan plan_path."""
    return {"path": str(plan_path), "sha256": hashlib.sha256(plan_path.read_bytes()).hexdigest()}

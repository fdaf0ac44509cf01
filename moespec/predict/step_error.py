"""Rule 6 as the paper scores it: the best speedup inside (21) with delta the largest relative error of the predicted
step time (Section 4.3, Table 8: "The speedup rule uses delta, the largest relative error of the predicted step
time"), beside the variant whose delta is fixed in advance from the bench's eps (the plan's delta_steps).

(21) holds for any delta with (1 - delta) V(k) <= V_hat(k) <= (1 + delta) V(k) at every k. The paper sets delta,
after the runs, to the largest relative error of each configuration's predicted step time: over the draft lengths
the runs measured, max_k |V_hat(k) - V(k)| / V(k), V(k) the measured median step time of the cell (policy, k). It
is the smallest delta for which the hypothesis of (21) holds on the measured k, so the rule tests the bound itself;
the variant tests whether the plan's own error budget, set before any run, was wide enough. Where delta >= 1 the
band is unbounded and the acceptance is not decidable (as a row without a band).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from moespec import MoespecError, theory


def measured_step_times(rows: Sequence[Mapping[str, Any]], runs_path: str) -> dict[str, dict[int, float]]:
    """policy -> k -> the measured step time V(k) of the cell (policy, k), from the runs' throughput rows (each row of
    a cell carries the cell's median step time; the median over them is that time)."""
    found: dict[str, dict[int, list[float]]] = {}
    for row in rows:
        value = row.get("step_time_s")
        if value is None:
            continue
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
            raise MoespecError(f"{runs_path}: a throughput row's step_time_s is not a positive time ({value!r})")
        found.setdefault(row["policy"], {}).setdefault(int(row["k"]), []).append(float(value))
    return {p: {k: float(np.median(v)) for k, v in by_k.items()} for p, by_k in found.items()}


def step_time_delta(predicted: Sequence[float], measured: Mapping[int, float]) -> float:
    """max over the measured k of |V_hat(k) - V(k)| / V(k) (module docstring); V_hat indexed by k = 0..kmax."""
    if not isinstance(predicted, Sequence) or not predicted:
        raise ValueError("predicted: a non-empty list of step times V_hat(0..kmax)")
    ks = [k for k in measured if 0 <= k < len(predicted)]
    if not ks:
        raise ValueError("measured: no draft length the predicted step times cover")
    for k in ks:
        if not measured[k] > 0 or not predicted[k] > 0:
            raise ValueError(f"step times must be positive, got V_hat({k}) = {predicted[k]}, V({k}) = {measured[k]}")
    return max(abs(predicted[k] - measured[k]) / measured[k] for k in ks)


def banded(rows: list[dict], delta: float, slack: float) -> list[dict]:
    """The acceptance rows with the band (21) of each row's planned speedup at this delta: lo, hi and inside
    (None where delta >= 1: no band)."""
    out = []
    for row in rows:
        if delta < 1:
            lo, hi = map(float, theory.speedup_band(row["planned_speedup"], delta))
            out.append(row | {"lo": lo, "hi": hi, "inside": lo - slack <= row["speedup"] <= hi + slack})
        else:
            out.append(row | {"lo": None, "hi": None, "inside": None})
    return out


def paper_rows(per_policy: Mapping[str, list[dict]], steps: Mapping[str, Sequence[float]],
               measured: Mapping[str, Mapping[int, float]], slack: float) -> tuple[dict[str, list[dict]],
                                                                                     dict[str, float]]:
    """Per policy both hold step times for: the rows banded at the paper's delta, and that delta."""
    rows, deltas = {}, {}
    for policy, policy_rows in per_policy.items():
        if policy in steps and measured.get(policy):
            deltas[policy] = step_time_delta(list(steps[policy]), measured[policy])
            rows[policy] = banded(policy_rows, deltas[policy], slack)
    return rows, deltas

"""The paper's scoring rules (Table 8, Section 4.4) as judgments shared by every score: the limits, a rule's
verdict, and the checks on acceptance rows and on the saving's sign that moespec.predict.score applies at batch one
and moespec.predict.batch_score at each batch size."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np

from moespec.predict.acceptance import SLACK

CROSSOVER_WITHIN = 1  # rule 1: |predicted - measured| <= 1
K_WITHIN = 1  # rule 2: |k_hat* - k*| <= 1 ...
K_SHARE = Fraction(9, 11)  # ... at >= 9 of the paper's 11 acceptances, scaled to the acceptances present
LOSS_LIMIT = 0.06  # rule 3: at most 6% of the best measured throughput lost by drafting k_hat*
VERIFY_LIMIT = 0.15  # rule 5: verify time within 15%
BAND_KEYS = ("k_star", "speedup", "planned_speedup", "lo", "hi", "inside")  # what rule 6 lists per acceptance


@dataclass
class Verdict:
    """One scoring rule: its Table 8 wording, measured value, verdict, details for JSON and the table's cells."""
    name: str
    rule: str
    value: Any
    holds: bool | None  # None: not applicable (a rule on the saving, for runs of one kernel)
    detail: dict[str, Any] = field(default_factory=dict)
    shown: tuple[str, str] = ("", "")  # (predicted, measured) as printed

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "rule": self.rule, "value": self.value, "holds": self.holds, **self.detail}


def judge_k_hat(rows: list[dict]) -> tuple[int, bool, dict[str, Any], str]:
    within = sum(abs(r["k_hat"] - r["k_star"]) <= K_WITHIN for r in rows)
    needed = math.ceil(K_SHARE * len(rows))
    return within, within >= needed, {"of": len(rows), "needed": needed}, f"{within} of {len(rows)} (need {needed})"


def judge_loss(rows: list[dict]) -> tuple[float, bool, dict[str, Any], str]:
    worst = max(rows, key=lambda r: r["loss"])
    return worst["loss"], worst["loss"] <= LOSS_LIMIT + SLACK, {"at_a": worst["a"], "limit": LOSS_LIMIT}, \
        f"{worst['loss']:.1%} at a = {worst['a']:g}"


def judge_band(rows: list[dict]) -> tuple[int, bool, dict[str, Any], str]:
    """Acceptances without a band are not decidable: holds when every decidable one is inside and there is one."""
    decidable = [r for r in rows if r["inside"] is not None]
    inside = sum(r["inside"] for r in decidable)
    no_band = len(rows) - len(decidable)
    text = f"{inside} of {len(decidable)} inside" + (f", {no_band} no band" if no_band else "")
    return inside, bool(decidable) and inside == len(decidable), {"of": len(decidable), "no_band": no_band}, text


def sign_verdict(rule: str, intervals: Mapping[int, tuple[float, float, Callable[[], float]]]) -> Verdict:
    """Rule 4: at every n whose measured 95% interval [lo, hi] of the saving excludes 0, the predicted saving (read
    only there: predicted()) has the measured sign; a predicted 0 has none. Vacuously true where none excludes 0."""
    per_n = []
    for n, (lo, hi, predicted) in intervals.items():
        if lo > 0 or hi < 0:
            s = predicted()
            per_n.append({"n": n, "lo": lo, "hi": hi, "predicted_s": s, "right": bool(np.sign(s) == np.sign(lo))})
    right = sum(p["right"] for p in per_n)
    vacuous = not per_n
    wrong = ", ".join(str(p["n"]) for p in per_n if not p["right"])
    return Verdict("saving_sign", rule, right, right == len(per_n),
                   {"of": len(per_n), "vacuous": vacuous, "per_n": per_n},
                   ("sign of S_hat(n)", "no interval excludes 0 (vacuous)" if vacuous else
                    f"{right} of {len(per_n)} right" + (f", wrong at n = {wrong}" if wrong else "")))


def verify_verdict(rule: str, errors: Mapping[str, Mapping[str, float]], shown: tuple[str, str] | None = None
                   ) -> Verdict:
    """Rule 5 on the relative verify-time errors {kernel: {n: |tau_hat - tau| / tau}}: the largest within
    VERIFY_LIMIT; with no error to compare, it does not hold (nothing decided)."""
    scored = [(p, n) for p in errors for n in errors[p]]
    if not scored:
        return Verdict("verify_time", rule, None, False, {"at": None, "limit": VERIFY_LIMIT, "errors": errors,
                                                           "reason": "no measured verify time to compare"})
    kernel, n = max(scored, key=lambda pn: errors[pn[0]][pn[1]])
    worst = errors[kernel][n]
    return Verdict("verify_time", rule, worst, worst <= VERIFY_LIMIT + SLACK,
                   {"at": {"kernel": kernel, "n": int(n)}, "limit": VERIFY_LIMIT, "errors": errors},
                   shown or ("", f"{worst:.1%} ({kernel}, n = {n})"))

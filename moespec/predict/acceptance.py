"""Where each version of a plan lies in plan.json, and the acceptance rows the rules on acceptances read (moespec.
predict.score's rules 2, 3 and 6, the report's Figure 5): per policy and acceptance both files hold, k_hat* of the
version's table against the measured best k, the throughput lost, the measured best speedup and the plan's band.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from moespec import MoespecError
from moespec.formats.runsfile import RATES
from moespec.predict.draft_score import draft_model_rows

# A value at its limit to float precision counts as within: 1 - 0.94/1 is 0.06000000000000005 in floats.
SLACK = 1e-9
# Both files write acceptances as floats; 6 digits keep the paper's grid (0.95 vs 0.98) apart and absorb printing.
ACCEPTANCE_DIGITS = 6


class Keys(NamedTuple):
    """Where one version of the prediction lies in plan.json."""
    tau: str  # {slot|dedup|auto: {n: s}}
    saving: str  # saving.{n}.<this>
    crossover: str
    table: str
    delta: str  # delta_steps.<this>


VERSIONS = {"prediction": Keys("tau_hat", "predicted_s", "crossover", "table", "prediction"),
            "measured-time": Keys("tau_measured", "measured_s", "crossover_measured", "table_measured",
                                  "measured-time"),
            "calibrated": Keys("tau_calibrated", "calibrated_s", "crossover_calibrated", "table_calibrated",
                               "calibrated"),
            "whole-pass": Keys("tau_whole_pass", "whole_pass_s", "crossover_whole_pass", "table_whole_pass",
                               "whole-pass")}
DEFAULT_VERSION = "prediction"

# The throughput rules 2, 3 and 6 read (moespec.formats.runsfile.RATES), by default the paper's: COUNTED, every
# emitted token over the steps' measured time, where the oracle's own shortfall shows; COMPUTED, G_a(k) over the
# median step time (B.1), ranks k on short cells, blind to what the steps lose outside V(k).
DEFAULT_RATE = "counted"
# Plans that name no rate were scored on the computed one.
UNNAMED_RATE = "computed"


def plan_rate(plan: dict[str, Any]) -> str:
    """The throughput rate a plan pre-registered (a key of RATES)."""
    return plan.get("throughput_rate", UNNAMED_RATE)


def _curves(rows: list[dict[str, Any]], runs_path: str, rate: str) -> dict[str, dict[float, dict[int, float]]]:
    """policy -> a -> k -> measured tokens per second at `rate` (a key of RATES; one row per policy, k and a; a
    row without that rate, an acceptance no prompt decoded, is left out)."""
    out: dict[str, dict[float, dict[int, float]]] = {}
    for row in rows:
        if row.get(RATES[rate]) is None:
            continue
        curve = out.setdefault(row["policy"], {}).setdefault(round(row["a"], ACCEPTANCE_DIGITS), {})
        if row["k"] in curve:
            raise MoespecError(f"{runs_path}: two throughput rows for policy {row['policy']}, k = {row['k']}, "
                               f"a = {row['a']}")
        curve[row["k"]] = row[RATES[rate]]
    return out


def acceptance_rows(plan: dict[str, Any], runs: dict[str, Any], runs_path: str,
                    keys: Keys = VERSIONS[DEFAULT_VERSION], rate: str | None = None) -> dict[str, list[dict]]:
    """Per policy both files hold and per acceptance both hold: k_hat* (the version's table), k* (measured at `rate`, a
    key of RATES, default the plan's; smallest on ties; on the counted rate over the k whose prompts decoded at that
    a, an acceptance where plain decoding's or k_hat*'s did not left out), the throughput lost at k_hat*, the
    measured best speedup and the plan's band (21); inside is None where the row has no band. Runs drafted by a
    draft model are scored at its acceptance (draft_model_rows), on its counted rate (the only one it has)."""
    rate = plan_rate(plan) if rate is None else rate
    if rate not in RATES:
        raise ValueError(f"rate must be one of {', '.join(RATES)}, got {rate!r}")
    if not runs["throughput"] and runs.get("throughput_draft_model"):
        return draft_model_rows(plan, runs, runs_path, keys.table, keys.delta, SLACK)
    table = {(row["policy"], round(row["a"], ACCEPTANCE_DIGITS)): row for row in plan[keys.table]}
    out = {}
    for policy, by_a in _curves(runs["throughput"], runs_path, rate).items():
        rows = []
        for a, curve in sorted(by_a.items()):
            planned = table.get((policy, a))
            if planned is None:
                continue
            k_hat = planned["k_hat"]
            missing = sorted({0, k_hat} - set(curve))
            if missing and rate == "counted":  # no prompt of that cell decoded at a: no emitted tokens to count
                continue
            if missing:
                raise MoespecError(f"{runs_path}: no throughput for policy {policy} at a = {a}, k = {missing[0]} "
                                   f"({'plain decoding' if missing[0] == 0 else 'the plan k_hat*'})")
            k_star = max(sorted(curve), key=lambda k: curve[k])  # the first, i.e. smallest, maximizer
            best = curve[k_star] / curve[0]
            lo, hi = planned["speedup_lo"], planned["speedup_hi"]
            rows.append({"a": a, "k_hat": k_hat, "k_star": k_star, "loss": 1 - curve[k_hat] / curve[k_star],
                         "speedup": best, "planned_speedup": planned["speedup"], "lo": lo, "hi": hi,
                         "inside": None if lo is None or hi is None else lo - SLACK <= best <= hi + SLACK})
        if rows:
            out[policy] = rows
    if not out:
        raise MoespecError(f"{runs_path}: no throughput row matches a (policy, acceptance) of the plan's table")
    return out

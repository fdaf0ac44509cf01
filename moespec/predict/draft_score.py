"""Score's rules on acceptances for runs drafted by a real draft model (runs.json throughput_draft_model): the
draft's acceptance is what it measured, not a nominal a, so the plan is read at that acceptance (moespec.predict.score
calls draft_model_rows where the runs hold no oracle rows)."""

from __future__ import annotations

from typing import Any

from moespec import MoespecError, theory
from moespec.formats.files import field


def pooled_acceptance(rows: list[dict[str, Any]]) -> float | None:
    """A draft model's per-position acceptance over its cells: the cells' rates (acceptance_rate) weighted by the
    positions each tested (steps x k), None where no cell drafted."""
    weights = [(r["realized_acceptance"], r["steps"] * r["k"]) for r in rows
               if r["k"] and r.get("realized_acceptance") is not None]
    total = sum(w for _, w in weights)
    return None if not total else sum(a * w for a, w in weights) / total


def measured_profile(rows: list[dict[str, Any]], kmax: int) -> list[float] | None:
    """The draft's per-position acceptance a_1..a_kmax: the acceptance_profile of the longest-drafting cell that
    has one (it tests the most positions), positions it never tested taking the last tested one's; None where no
    cell recorded a profile (older files)."""
    rows = [r for r in rows if r.get("acceptance_profile")]
    if not rows:
        return None
    values = max(rows, key=lambda r: r["k"])["acceptance_profile"][:kmax]
    known = [a for a in values if a is not None]
    if not known:
        return None
    profile, last = [], known[0]  # leading untested positions take the first tested one's
    for a in values:
        last = a if a is not None else last
        profile.append(last)
    return profile + [last] * (kmax - len(profile))


def draft_model_rows(plan: dict[str, Any], runs: dict[str, Any], runs_path: str, table: str, delta: str,
                     slack: float) -> dict[str, list[dict]]:
    """The rules on acceptances for runs drafted by a real draft model (throughput_draft_model): one row per
    policy at the draft's measured acceptance, its per-position profile (measured_profile: G(k) = 1 + a_1 +
    a_1 a_2 + ..., moespec.theory.profile) where the runs recorded one, else its pooled rate a
    (pooled_acceptance, geometric). The plan's step times of the version give k_hat* and the band (21) of its
    speedup; the measured tokens/s over k give k* and the loss. The plan's V_hat should carry the draft's time per
    step (plan --draft-time RUNS). `table` and `delta` name the version's keys (moespec.predict.score.VERSIONS);
    `slack` is score's tolerance on the band."""
    suffix = "" if table == "table" else table.removeprefix("table")
    steps = field(plan, "plan", f"step_times{suffix}", dict)
    deltas = field(plan, "plan", f"delta_steps.{delta}", dict)
    out = {}
    by_policy: dict[str, list[dict]] = {}
    for row in field(runs, runs_path, "throughput_draft_model", list):
        by_policy.setdefault(row.get("policy"), []).append(row)
    for policy, rows in by_policy.items():
        a = pooled_acceptance(rows)
        curve = {r["k"]: r["tokens_per_s"] for r in rows}
        if policy not in steps or a is None or 0 not in curve:
            continue
        V = steps[policy]
        profile = measured_profile(rows, len(V) - 1)
        k_hat = int(theory.best_draft_length(V, a) if profile is None else theory.best_draft_length_for(V, profile))
        if k_hat not in curve:
            raise MoespecError(f"{runs_path}: no draft-model throughput for policy {policy} at the plan's "
                               f"k_hat* = {k_hat} (a = {a:.3f})")
        k_star = max(sorted(curve), key=lambda k: curve[k])
        best = curve[k_star] / curve[0]
        d = deltas.get(policy)
        planned = theory.speedup(V, a, k_hat) if profile is None else theory.profile_speedup(V, profile, k_hat)
        lo, hi = (None, None) if d is None else map(float, theory.speedup_band(planned, d))
        out[policy] = [{"a": a, "profile": profile, "k_hat": k_hat, "k_star": k_star,
                        "loss": 1 - curve[k_hat] / curve[k_star],
                        "speedup": best, "planned_speedup": float(planned), "lo": lo, "hi": hi,
                        "inside": None if lo is None else lo - slack <= best <= hi + slack}]
    if not out:
        raise MoespecError(f"{runs_path}: no draft-model throughput row matches a policy of the plan")
    return out

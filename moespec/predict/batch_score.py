"""Score a plan's batch map against a run at the same batch sizes: per batch size B the six rules of Table 8
(Section 4.4; moespec.predict.score at batch one) on that B's step times, verify times, saving and throughput, and
over the grid B_stop(a) against the batch at which the run's best k first is 0 (issue rules beyond the paper,
whose Table 8 is at batch one).

What is read (the plan's batch block, moespec.predict.batch_map; the run's, moespec.measure.batch_run): per B the
version's entry (`per_batch`, or `predicted.per_batch`) with step_time_s {policy: [V_B(0..kmax)]}, k_hat, crossover
and speedup per acceptance, and the plan's h = draft_time_s [h(0..kmax)]; the run's verify_time_s, saving_s and
throughput rows at B (B = 1: runs.json's own keys; B > 1: its batch.per_batch.B). V_B(k) = tau_p(B, k + 1) + h(k),
so the version's verify time is tau_p(B, n) = V_B,p(n - 1) - h(n - 1) and its saving S_B(n) = V_B,slot(n - 1) -
V_B,dedup(n - 1) (h cancels).

Rules per B (the JSON names of moespec.predict.score, the same limits and slack):
- k_hat: k_hat*(a, B) within one of the measured best draft length at >= 9 of 11 acceptances (the same share of
  another grid): the measured best is the k of the largest throughput among the run's rows of the plan's policy
  (the smallest k on ties); the acceptances scored are the plan's that the run measured at every batch size;
- crossover: the plan's crossover at B within one of the run's (both none also holds);
- throughput_loss: at every scored acceptance, 1 - T_B(k_hat*(a, B)) / max_k T_B(k) <= 6% (LOSS_LIMIT), T_B the
  measured throughput of the plan's policy; an acceptance whose k_hat* the run did not measure is listed under
  `unmeasured` and the rule does not hold (batch one refuses such runs);
- saving_sign: wherever the run's 95% interval of S_B(n) excludes 0, the version's S_B(n) has its sign (a predicted
  0 has none); vacuously true where no interval excludes 0; not applicable (holds null) where the run at B holds
  no saving (runs of one kernel);
- verify_time: max over slot and dedup and the run's n of |tau_p(B, n) - tau_meas(B, n)| / tau_meas(B, n) <= 15%
  (VERIFY_LIMIT), n up to kmax + 1. At B = 1 n = 1 is left out, as the paper's rule 5: the prediction starts from
  the measured one-token pass (tau_hat(1) is that measurement). At B > 1 n = 1 is scored: its pass carries B tokens,
  and the prediction reaches it through the outside line and the fits at B tokens (batch_map), not the anchor; the
  measured version is read the same way, so both versions score the same n. The sign rule takes the same n: at
  B = 1 one token reads the same experts with either kernel, at B > 1 the B tokens of n = 1 read a union (the plan's
  AUTO decides n = 1 there too). With no n to compare the rule does not hold (nothing decided);
- speedup_band: the measured best speedup max_k T_B(k) / T_B(0) inside the band (21) of the planned speedup at
  k_hat*(a, B), delta the largest relative error of the version's step time V_B,p(k) against the run's measured
  step_time_s of the policy at B over the measured k (moespec.predict.step_error, as score's rule 6); an acceptance
  is not decidable where delta >= 1 ("no band"); holds when every decidable acceptance is inside and one is; one
  without plain decoding (k = 0) measured is `unmeasured` and the rule does not hold; not applicable (holds null)
  where the run at B recorded no step times;
and over the grid:
- b_stop: at every acceptance, the plan's B_stop(a) within one grid step of the measured one, each from its k map
  over the scored batch sizes (moespec.predict.batch_map.b_stop; no B_stop counts as one step past the largest B).
Rules 3, 4, 5 and 6 are objects {name, rule, value, holds, ...} (moespec.predict.score.Verdict.to_json) in each
per-B entry; `all_hold`: every rule at every B and b_stop hold (holds null, not applicable, does not count).
The measured rate scored is the one the plan names (plan.json throughput_rate, as the batch-one rules read it):
counted, emitted tokens over the steps' time, or computed, B G_a(k) / V_B(k) with the measured V_B; the best k by
each is reported (measured_best_by_rate).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any


from moespec import MoespecError
from moespec.defaults import KERNELS
from moespec.formats.files import field, positive
from moespec.formats.runsfile import RATES
from moespec.predict.acceptance import SLACK, plan_rate
from moespec.predict.batch_map import b_stop
from moespec.predict.rules import (
    BAND_KEYS,
    CROSSOVER_WITHIN,
    K_SHARE,
    K_WITHIN,
    LOSS_LIMIT,
    Verdict,
    judge_band,
    judge_loss,
    sign_verdict,
    verify_verdict,
)
from moespec.predict.step_error import measured_step_times, paper_rows



def measured_block(runs: Mapping[str, Any], batch: int) -> Mapping[str, Any]:
    """The run's measurements at batch B: runs.json itself at B = 1, its batch.per_batch.B at B > 1 (the same keys)."""
    if type(batch) is not int or batch < 1:
        raise ValueError(f"batch must be a batch size >= 1, got {batch!r}")
    if batch == 1:
        return runs
    return ((runs.get("batch") or {}).get("per_batch") or {}).get(str(batch)) or {}


def measured_rows(runs: Mapping[str, Any], batch: int, policy: str) -> list[Mapping[str, Any]]:
    """The run's throughput rows of `policy` at batch B (B = 1: its oracle rows, those with an acceptance)."""
    return [r for r in measured_block(runs, batch).get("throughput") or []
            if r.get("policy") == policy and r.get("a") is not None]


def _curve(rows: list[Mapping[str, Any]], a: float, rate: str) -> dict[int, float]:
    """k -> the `rate` (a row key) of the rows at acceptance a that hold it."""
    return {r["k"]: r[rate] for r in rows if math.isclose(r["a"], a, abs_tol=1e-9) and r.get(rate) is not None}


def _best(curve: Mapping[int, float]) -> int | None:
    """The k of the largest throughput (the smallest k on ties), None for an empty curve."""
    return min(curve, key=lambda k: (-curve[k], k)) if curve else None


def measured_best(rows: list[Mapping[str, Any]], acceptances: list[float], rate: str) -> list[int | None]:
    """Per acceptance: the k of the largest `rate` (a row key) among the rows at that a (the smallest k on ties),
    or None."""
    return [_best(_curve(rows, a, rate)) for a in acceptances]


def acceptance_rows(rows: list[Mapping[str, Any]], acceptances: Sequence[float], k_hat: Sequence[int],
                    planned: Sequence[float], rate: str) -> list[dict[str, Any]]:
    """Per acceptance: k_hat*(a, B), the measured best k_star, the throughput lost at k_hat* and the measured best
    speedup max_k T(k) / T(0) at `rate` (a row key; loss and speedup None where the run lacks k_hat* or k = 0), and
    the planned speedup (the rows rules 3 and 6 read)."""
    if not len(k_hat) == len(planned) == len(acceptances):
        raise ValueError(f"k_hat and planned must give one entry per acceptance ({len(acceptances)}), got "
                         f"{len(k_hat)} and {len(planned)}")
    out = []
    for a, kh, s in zip(acceptances, k_hat, planned):
        curve = _curve(rows, a, rate)
        best = _best(curve)
        out.append({"a": a, "k_hat": kh, "k_star": best,
                    "loss": 1 - curve[kh] / curve[best] if kh in curve else None,
                    "speedup": curve[best] / curve[0] if 0 in curve else None, "planned_speedup": s})
    return out


def loss_rule(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Rule 3 at B on acceptance_rows: the shared judge (moespec.predict.rules, LOSS_LIMIT) on the measured losses; any
    unmeasured one fails."""
    measured = [r for r in rows if r["loss"] is not None]
    unmeasured = [r["a"] for r in rows if r["loss"] is None]
    value, holds, detail, _ = judge_loss(measured) if measured else \
        (None, False, {"at_a": None, "limit": LOSS_LIMIT}, "")
    return Verdict("throughput_loss", "throughput lost at k_hat*(a, B) <= 6% at every acceptance", value,
                   holds and not unmeasured,
                   {**detail, "unmeasured": unmeasured,
                    "per_acceptance": [{k: r[k] for k in ("a", "k_hat", "k_star", "loss")} for r in rows]}).to_json()


def _check_steps(steps: Mapping[str, Sequence[float]], h: Sequence[float] | None = None) -> None:
    """ValueError naming the argument unless steps gives slot and dedup step times V(0..kmax) (and h as many)."""
    if not isinstance(steps, Mapping) or not all(isinstance(steps.get(p), Sequence) for p in KERNELS) or \
            len(steps["slot"]) != len(steps["dedup"]) or not steps["slot"]:
        raise ValueError(f"steps must give slot and dedup step times V(0..kmax) alike long, got {steps!r}")
    if h is not None and len(h) != len(steps["slot"]):
        raise ValueError(f"h must give kmax + 1 = {len(steps['slot'])} draft times, got {len(h)}")


def _ns(block: Mapping[str, Any], key: str, batch: int, kmax: int) -> list[int]:
    """The n the run holds under `key` that the rules on n score: 1..kmax + 1, n = 1 left out at B = 1 (module
    docstring)."""
    first = 2 if batch == 1 else 1
    return sorted(int(n) for n in block.get(key) or {} if str(n).isdigit() and first <= int(n) <= kmax + 1)


def sign_rule(steps: Mapping[str, Sequence[float]], block: Mapping[str, Any], batch: int, where: str
              ) -> dict[str, Any]:
    """Rule 4 at B: the version's S_B(n) = V_slot(n - 1) - V_dedup(n - 1) against the run's saving_s at B."""
    _check_steps(steps)
    rule = "sign of S_B(n) right wherever its 95% interval excludes 0"
    if not block.get("saving_s"):
        return Verdict("saving_sign", rule, None, None, {"reason": "the run holds no saving at this batch size "
                                                                   "(one expert kernel)"}).to_json()
    intervals = {n: (*(field(block, where, f"saving_s.{n}.{key}") for key in ("lo", "hi")),
                     lambda n=n: steps["slot"][n - 1] - steps["dedup"][n - 1])
                 for n in _ns(block, "saving_s", batch, len(steps["slot"]) - 1)}
    return sign_verdict(rule, intervals).to_json()


def verify_rule(steps: Mapping[str, Sequence[float]], h: Sequence[float], block: Mapping[str, Any], batch: int,
                where: str) -> dict[str, Any]:
    """Rule 5 at B: tau_p(B, n) = V_B,p(n - 1) - h(n - 1) against the run's verify_time_s at B, both kernels."""
    _check_steps(steps, h)
    rule = "verify time within 15%, both kernels"
    times = block.get("verify_time_s") or {}
    errors = {}
    for p in (p for p in KERNELS if p in times):
        errors[p] = {}
        for n in _ns(times, p, batch, len(steps[p]) - 1):
            tau = positive(block, where, f"verify_time_s.{p}.{n}")
            errors[p][str(n)] = abs(steps[p][n - 1] - h[n - 1] - tau) / tau
    return verify_verdict(rule, errors).to_json()


def speedup_rule(rows: list[dict[str, Any]], steps: Mapping[str, Sequence[float]], measured: list[Mapping[str, Any]],
                 policy: str, where: str) -> dict[str, Any]:
    """Rule 6 at B on acceptance_rows: score's band (21) at the paper's delta (step_error.paper_rows) of the
    version's V_B of `policy` against the measured step times of the run's rows `measured`, and score's judge."""
    if policy not in steps:
        raise ValueError(f"policy must be one of the step times' policies {', '.join(steps)}, got {policy!r}")
    rule = "best speedup inside (21), delta the largest relative error of the predicted step time"
    times = {k: v for k, v in measured_step_times(measured, where).get(policy, {}).items() if k < len(steps[policy])}
    if not times:
        return Verdict("speedup_band", rule, None, None,
                       {"reason": "the run recorded no step time at this batch size at a k of the plan's"}).to_json()
    unmeasured = [r["a"] for r in rows if r["speedup"] is None]
    banded, deltas = paper_rows({policy: [r for r in rows if r["speedup"] is not None]}, steps, {policy: times}, SLACK)
    value, holds, detail, _ = judge_band(banded[policy])
    return Verdict("speedup_band", rule, value, holds and not unmeasured,
                   {**detail, "delta": deltas[policy], "unmeasured": unmeasured,
                    "per_acceptance": [{k: r[k] for k in ("a", *BAND_KEYS)} for r in banded[policy]]}).to_json()


RULES = ("throughput_loss", "saving_sign", "verify_time", "speedup_band")  # the per-B rule objects, Table 8's order
# what each of the six rules per B says, in the short form the score's table and the report print
WORDING = {"k_hat": "k_hat*(a, B) within one of the measured best at >= 9 of 11 acceptances",
           "crossover": "crossover at B (planned/measured) within one",
           "throughput_loss": "throughput lost at k_hat*(a, B) <= 6% at every acceptance (the largest)",
           "saving_sign": "sign of S_B(n) right wherever the run's 95% interval excludes 0",
           "verify_time": "tau_p(B, n) within 15% of the measured, both kernels (the largest error)",
           "speedup_band": "best speedup inside (21), delta the largest step-time error at B"}


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def shown(entry: Mapping[str, Any]) -> list[tuple[str, str, bool | None]]:
    """The six rules of one per-B entry of score_batches in Table 8's order: (name, value as printed, holds)."""
    if not isinstance(entry, Mapping) or not all(key in entry for key in ("k_hat_holds", *RULES)):
        raise ValueError("entry must be a per_batch entry of score_batches")
    none = lambda x: "none" if x is None else str(x)  # noqa: E731
    loss, sign, verify, band = (entry[name] for name in RULES)
    unmeasured = lambda rule: f", {len(rule['unmeasured'])} unmeasured" if rule.get("unmeasured") else ""  # noqa: E731
    if band["holds"] is None:
        band_text = "n/a"
    else:
        band_text = f"{band['value']}/{band['of']}, delta {band['delta']:.2g}" + \
            (f", {band['no_band']} no band" if band["no_band"] else "") + unmeasured(band)
    return [("k_hat", f"{entry['k_hat_within_one']}/{entry['acceptances']}", entry["k_hat_holds"]),
            ("crossover", f"{none(entry['crossover'])}/{none(entry['measured_crossover'])}", entry["crossover_holds"]),
            ("throughput_loss", _percent(loss["value"]) + unmeasured(loss), loss["holds"]),
            ("saving_sign", "n/a" if sign["holds"] is None else "vacuous" if sign["vacuous"] else
             f"{sign['value']}/{sign['of']}", sign["holds"]),
            ("verify_time", _percent(verify["value"]), verify["holds"]),
            ("speedup_band", band_text, band["holds"])]


def _step(batches: list[int], b: int | None) -> int:
    return len(batches) if b is None else batches.index(b)


VERSIONS = ("measured", "prediction")  # the batch map's versions: per_batch, and predicted (from the bench)


def score_batches(plan: Mapping[str, Any], runs: Mapping[str, Any], version: str = "measured",
                  plan_path: str = "plan", runs_path: str = "runs") -> dict[str, Any]:
    """The batch rules (module docstring) of one version of a validated plan's batch map (load_plan) on a validated
    run (load_runs), per B and over the grid; the paths name the files in its one-line errors."""
    if version not in VERSIONS:
        raise ValueError(f"version must be one of {', '.join(VERSIONS)}, got {version!r}")
    block = plan.get("batch")
    if block is None:
        raise MoespecError(f"{plan_path} has no batch block: make it with `moespec plan --batch`")
    source = block if version == "measured" else block.get("predicted")
    if source is None:
        raise MoespecError(f"{plan_path}: the batch block has no prediction (its runs lacked the outside times)")
    batches, acceptances, policy = block["batches"], block["acceptances"], block["policy"]
    h = field(plan, plan_path, "draft_time_s", list)
    if len(h) != block["kmax"] + 1:
        raise MoespecError(f"{plan_path}: draft_time_s must list batch.kmax + 1 = {block['kmax'] + 1} times")
    rate = plan_rate(plan)
    run_batches = [1] + ((runs.get("batch") or {}).get("batches") or [])
    scored = [b for b in batches if b in run_batches and measured_rows(runs, b, policy)]
    if not scored:
        raise MoespecError(f"{runs_path} measured no throughput of policy {policy} at the plan's batch sizes "
                           f"{batches} (run with --batch {','.join(map(str, batches))} --plan PLAN)")
    index = [i for i, a in enumerate(acceptances)
             if all(any(math.isclose(r["a"], a, abs_tol=1e-9) for r in measured_rows(runs, b, policy)) for b in scored)]
    if not index:
        raise MoespecError(f"{runs_path} measured none of the plan's acceptances {acceptances} at every batch size")
    acceptances = [acceptances[i] for i in index]
    per_batch, measured_k = {}, {}
    for b in scored:
        entry, rows, measured = source["per_batch"][str(b)], measured_rows(runs, b, policy), measured_block(runs, b)
        where = runs_path if b == 1 else f"{runs_path}: batch {b}"
        best = measured_best(rows, acceptances, RATES[rate])
        measured_k[b] = best
        k_hat = [entry["k_hat"][i] for i in index]
        near = [k is not None and abs(k - kh) <= K_WITHIN for k, kh in zip(best, k_hat)]
        crossover, planned = measured.get("crossover"), entry["crossover"]
        by_a = acceptance_rows(rows, acceptances, k_hat, [entry["speedup"][i] for i in index], RATES[rate])
        steps = entry["step_time_s"]
        per_batch[str(b)] = {
            "k_hat": k_hat, "measured_best": best,
            "measured_best_by_rate": {name: measured_best(rows, acceptances, key) for name, key in RATES.items()},
            "k_hat_within_one": sum(near), "acceptances": len(acceptances),
            "k_hat_holds": sum(near) >= math.ceil(K_SHARE * len(acceptances)),
            "crossover": planned, "measured_crossover": crossover,
            "crossover_holds": planned == crossover or (planned is not None and crossover is not None
                                                        and abs(planned - crossover) <= CROSSOVER_WITHIN),
            "throughput_loss": loss_rule(by_a), "saving_sign": sign_rule(steps, measured, b, where),
            "verify_time": verify_rule(steps, h, measured, b, where),
            "speedup_band": speedup_rule(by_a, steps, rows, policy, where)}
    stops = b_stop(scored, measured_k, len(acceptances))
    planned_stops = b_stop(scored, {b: per_batch[str(b)]["k_hat"] for b in scored}, len(acceptances))
    b_stop_holds = [abs(_step(scored, p) - _step(scored, m)) <= 1 for p, m in zip(planned_stops, stops)]
    return {"version": version, "rate": rate, "batches": scored, "policy": policy, "acceptances": acceptances,
            "per_batch": per_batch, "b_stop": planned_stops, "measured_b_stop": stops,
            "b_stop_holds": all(b_stop_holds),
            "all_hold": all(b_stop_holds) and all(e["k_hat_holds"] and e["crossover_holds"] and
                                                  all(e[name]["holds"] is not False for name in RULES)
                                                  for e in per_batch.values())}

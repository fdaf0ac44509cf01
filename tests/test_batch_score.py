"""moespec.predict.batch_score: the six rules of Table 8 at each batch size and B_stop on hand-made plans and runs,
each rule where it holds and where it fails, the 6% and 15% limits exactly, n = 1 left out at B = 1 only, and the
per-B entries score_batches writes."""

from __future__ import annotations

import copy

import pytest

from moespec import MoespecError, theory
from moespec.predict.batch_score import (acceptance_rows, loss_rule, measured_best, score_batches, shown, sign_rule,
                                         speedup_rule, verify_rule)

A = [0.5, 0.9]
H = [0.1, 0.2, 0.3]  # h(0..kmax), kmax = 2
RATE = "tokens_per_s"  # the computed rate: the rate of a plan that names none


def _row(policy, k, a, rate, batch=True, step=1.0):
    row = {"policy": policy, "k": k, "a": a, "step_time_s": step, "tokens_per_s": rate}
    return row | ({"counted_tokens_per_s": rate, "steps": 3, "greedy_exact": True} if batch else {})


def _curve_rows(curves: dict[float, dict[int, float]], steps=(1.0, 1.0, 1.0)):
    """Rows of policy auto: per acceptance a, k -> throughput; each cell's step time steps[k]."""
    return [_row("auto", k, a, t, step=steps[k]) for a, by_k in curves.items() for k, t in by_k.items()]


# ---- k_hat, crossover and B_stop ---------------------------------------------------------------------------
def _entry(k_hat, crossover, kmax=4):
    V = [1.0] * (kmax + 1)
    return {"k_hat": k_hat, "crossover": crossover, "speedup": [1.0] * len(k_hat),
            "step_time_s": {"slot": V, "dedup": V, "auto": V}}


def test_k_hat_crossover_and_b_stop_by_hand():
    plan = {"draft_time_s": [0.0] * 5,
            "batch": {"batches": [1, 2, 4], "kmax": 4, "policy": "auto", "acceptances": A, "b_stop": [2, None],
                      "per_batch": {"1": _entry([1, 3], 3), "2": _entry([0, 2], 2), "4": _entry([0, 2], None)}}}
    best = {1: [1, 4], 2: [1, 2], 4: [0, 0]}  # measured best k per acceptance and B

    def rows(b, batch):
        return [_row("auto", k, a, 10.0 - abs(k - best[b][i]), batch) for i, a in enumerate(A) for k in range(5)]
    runs = {"throughput": rows(1, False), "crossover": 4,
            "batch": {"batches": [2, 4], "per_batch": {"2": {"throughput": rows(2, True), "crossover": 4},
                                                       "4": {"throughput": rows(4, True), "crossover": None}}}}
    result = score_batches(plan, runs)
    per = result["per_batch"]
    assert [per[b]["measured_best"] for b in ("1", "2", "4")] == [best[1], best[2], best[4]]
    assert per["1"]["k_hat_holds"] and per["1"]["crossover_holds"]  # |3 - 4| = 1 both
    assert per["2"]["k_hat_holds"] and not per["2"]["crossover_holds"]  # 2 against 4
    assert not per["4"]["k_hat_holds"] and per["4"]["crossover_holds"]  # k 2 against 0; both none
    assert result["measured_b_stop"] == [4, 4] and result["b_stop"] == [2, None]
    assert result["b_stop_holds"] and not result["all_hold"]  # 2 vs 4 one step; none vs 4 one step
    assert measured_best([_row("auto", 0, 0.5, 2.0), _row("auto", 1, 0.5, 2.0)], A, RATE) == [0, None]
    assert result["rate"] == "computed"  # the plan names none
    for entry in runs["batch"]["per_batch"].values():  # the counted rate peaks at k = 4 everywhere
        for row in entry["throughput"]:
            row["counted_tokens_per_s"] = 10.0 - abs(row["k"] - 4)
    counted = score_batches(plan | {"throughput_rate": "counted"}, runs)
    assert counted["rate"] == "counted" and counted["per_batch"]["4"]["measured_best"] == [4, 4]
    assert counted["per_batch"]["4"]["measured_best_by_rate"] == {"counted": [4, 4], "computed": [0, 0]}
    with pytest.raises(MoespecError, match="no batch block"):
        score_batches({}, runs)
    with pytest.raises(MoespecError, match="no throughput"):
        score_batches(plan | {"batch": plan["batch"] | {"policy": "slot"}}, runs)
    with pytest.raises(MoespecError, match="draft_time_s"):
        score_batches(plan | {"draft_time_s": [0.0]}, runs)
    with pytest.raises(ValueError, match="version"):
        score_batches(plan, runs, "calibrated")


def test_b_stop_is_where_no_draft_pays_from_that_batch_on():
    """A measured best k of 0 at B = 2 and 1 at B = 4 (the union nearing all experts makes a draft cheap again)
    leaves no B_stop; the plan's B_stop comes from its own k map, not the b_stop it stored."""
    plan = {"draft_time_s": [0.0] * 5,
            "batch": {"batches": [1, 2, 4], "kmax": 4, "policy": "auto", "acceptances": A, "b_stop": [1, 1],
                      "per_batch": {"1": _entry([0, 2], 3), "2": _entry([0, 2], 2), "4": _entry([0, 0], 2)}}}
    best = {1: [1, 2], 2: [0, 2], 4: [1, 0]}

    def rows(b, batch):
        return [_row("auto", k, a, 10.0 - abs(k - best[b][i]), batch) for i, a in enumerate(A) for k in range(5)]
    runs = {"throughput": rows(1, False), "crossover": 3,
            "batch": {"batches": [2, 4], "per_batch": {"2": {"throughput": rows(2, True), "crossover": 2},
                                                       "4": {"throughput": rows(4, True), "crossover": 2}}}}
    result = score_batches(plan, runs)
    assert result["measured_b_stop"] == [None, 4] and result["b_stop"] == [1, 4]
    assert not result["b_stop_holds"]  # a = 0.5: B = 1 against none, three steps


# ---- rule 3: throughput lost at k_hat* ---------------------------------------------------------------------
def test_loss_holds_at_exactly_six_percent_and_fails_past_it():
    # a = 0.5: best k = 2, k_hat 1 loses 1 - 0.94 = 6% exactly; a = 0.9: k_hat = k* = 2 loses nothing
    curves = {0.5: {0: 0.5, 1: 0.94, 2: 1.0}, 0.9: {0: 0.5, 1: 0.8, 2: 1.2}}
    rule = loss_rule(acceptance_rows(_curve_rows(curves), A, [1, 2], [1.5, 2.0], RATE))
    assert rule["holds"] and rule["value"] == pytest.approx(0.06) and rule["at_a"] == 0.5
    assert [r["loss"] for r in rule["per_acceptance"]] == [pytest.approx(0.06), 0.0]
    assert rule["name"] == "throughput_loss" and rule["limit"] == 0.06 and rule["unmeasured"] == []
    curves[0.5][1] = 0.9399  # 6.01% lost, of the best (against plain decoding it would be a gain)
    rule = loss_rule(acceptance_rows(_curve_rows(curves), A, [1, 2], [1.5, 2.0], RATE))
    assert not rule["holds"] and rule["value"] == pytest.approx(0.0601)


def test_loss_fails_where_the_run_lacks_k_hat():
    curves = {0.5: {0: 0.5, 1: 1.0}, 0.9: {0: 0.5, 1: 0.8, 2: 1.2}}
    rows = acceptance_rows(_curve_rows(curves), A, [2, 2], [1.5, 2.0], RATE)  # k = 2 not measured at a = 0.5
    rule = loss_rule(rows)
    assert not rule["holds"] and rule["unmeasured"] == [0.5] and rule["value"] == 0.0  # a = 0.9 alone is measured
    assert rows[0]["loss"] is None and rows[0]["k_star"] == 1
    rule = loss_rule(rows[:1])
    assert not rule["holds"] and rule["value"] is None


# ---- rule 4: the sign of S_B(n) ------------------------------------------------------------------------------
STEPS = {"slot": [1.1, 1.4, 1.8], "dedup": [1.1, 1.3, 1.9], "auto": [1.1, 1.3, 1.8]}  # S = 0, +0.1, -0.1 at n = 1..3


def _saving(*intervals):
    return {"saving_s": {str(n): {"median": (lo + hi) / 2, "lo": lo, "hi": hi}
                         for n, (lo, hi) in enumerate(intervals, start=1)}}


def test_sign_right_where_the_interval_excludes_zero():
    block = _saving((-0.05, 0.05), (0.02, 0.2), (-0.3, -0.01))
    rule = sign_rule(STEPS, block, 2, "runs")
    assert rule["holds"] and rule["value"] == 2 and rule["of"] == 2 and not rule["vacuous"]
    assert [(p["n"], p["predicted_s"]) for p in rule["per_n"]] == [(2, pytest.approx(0.1)), (3, pytest.approx(-0.1))]
    rule = sign_rule(STEPS, _saving((-0.05, 0.05), (0.02, 0.2), (0.01, 0.3)), 2, "runs")  # n = 3: S_hat < 0 < lo
    assert not rule["holds"] and rule["value"] == 1 and [p["right"] for p in rule["per_n"]] == [True, False]


def test_sign_scores_n_1_at_batch_only():
    block = _saving((0.01, 0.02), (0.02, 0.2), (-0.3, -0.01))  # S_hat(1) = 0 has no sign: wrong where scored
    assert sign_rule(STEPS, block, 1, "runs")["holds"]  # B = 1: n = 2..kmax + 1
    rule = sign_rule(STEPS, block, 2, "runs")
    assert not rule["holds"] and rule["per_n"][0]["n"] == 1 and not rule["per_n"][0]["right"]


def test_sign_vacuous_and_not_applicable():
    rule = sign_rule(STEPS, _saving((-0.1, 0.1), (-0.1, 0.1), (-0.1, 0.1)), 2, "runs")
    assert rule["holds"] is True and rule["vacuous"] and rule["of"] == 0
    assert sign_rule(STEPS, {"saving_s": {}}, 1, "runs")["holds"] is None  # runs of one kernel
    with pytest.raises(MoespecError, match=r"runs: batch 2: saving_s.2.lo has the wrong type"):
        sign_rule(STEPS, {"saving_s": {"2": {"median": 0.1, "lo": "x", "hi": 0.2}}}, 2, "runs: batch 2")


# ---- rule 5: verify time within 15% ----------------------------------------------------------------------------
TAU = {"slot": {"1": 1.0, "2": 1.2, "3": 1.5}, "dedup": {"1": 1.0, "2": 1.1, "3": 1.6}}


def _steps_from(tau, factor=None):
    """V_B,p(k) = tau_p(B, k + 1) + h(k), tau scaled at (kernel, n) by factor {(kernel, n): f}."""
    factor = factor or {}
    return {p: [tau[p][str(k + 1)] * factor.get((p, k + 1), 1.0) + H[k] for k in range(3)] for p in tau}


def test_verify_holds_at_exactly_fifteen_percent_and_fails_past_it():
    block = {"verify_time_s": TAU}
    # 15% below at slot n = 3: 0.15000000000000005 in floats, within the limit as score's rule 5 takes it
    rule = verify_rule(_steps_from(TAU, {("slot", 3): 0.85}), H, block, 2, "runs")
    assert rule["holds"] and rule["value"] == pytest.approx(0.15) and rule["at"] == {"kernel": "slot", "n": 3}
    assert rule["errors"]["dedup"] == {"1": pytest.approx(0), "2": pytest.approx(0), "3": pytest.approx(0)}
    rule = verify_rule(_steps_from(TAU, {("slot", 2): 0.8499}), H, block, 2, "runs")
    assert not rule["holds"] and rule["value"] == pytest.approx(0.1501) and rule["at"] == {"kernel": "slot", "n": 2}


def test_verify_leaves_n_1_out_at_batch_one_only():
    steps = _steps_from(TAU, {("slot", 1): 2.0})  # tau_hat(1) twice the measured: the batch-one anchor
    rule = verify_rule(steps, H, {"verify_time_s": TAU}, 1, "runs")
    assert rule["holds"] and set(rule["errors"]["slot"]) == {"2", "3"}
    rule = verify_rule(steps, H, {"verify_time_s": TAU}, 2, "runs")
    assert not rule["holds"] and rule["value"] == pytest.approx(1.0) and rule["at"] == {"kernel": "slot", "n": 1}
    rule = verify_rule(steps, H, {"verify_time_s": {"slot": {"1": 1.0}, "dedup": {"1": 1.0}}}, 1, "runs")
    assert rule["holds"] is False and rule["value"] is None  # nothing to compare decides nothing


# ---- rule 6: best speedup inside (21) --------------------------------------------------------------------------
def test_speedup_inside_the_band_at_the_step_time_delta():
    planned = 1.5
    measured_steps = (1.0, 1.0, 1.2)  # against V_hat (1.0, 1.1, 1.2): delta = 0.1 at k = 1
    steps = {"auto": [1.0, 1.1, 1.2]}
    lo, hi = theory.speedup_band(planned, 0.1)
    curves = {0.5: {0: 1.0, 1: hi, 2: 1.0}, 0.9: {0: 1.0, 1: 1.2, 2: lo}}  # best speedups at the band's edges
    rows = _curve_rows(curves, measured_steps)
    rule = speedup_rule(acceptance_rows(rows, A, [1, 2], [planned] * 2, RATE), steps, rows, "auto", "runs")
    assert rule["holds"] and rule["value"] == 2 and rule["of"] == 2 and rule["delta"] == pytest.approx(0.1)
    assert [r["speedup"] for r in rule["per_acceptance"]] == [pytest.approx(hi), pytest.approx(lo)]
    curves[0.5][1] = hi * (1 + 1e-6)  # just past the band
    rows = _curve_rows(curves, measured_steps)
    rule = speedup_rule(acceptance_rows(rows, A, [1, 2], [planned] * 2, RATE), steps, rows, "auto", "runs")
    assert not rule["holds"] and rule["value"] == 1 and [r["inside"] for r in rule["per_acceptance"]] == [False, True]
    # a delta of 0.2 would take it in: the rule reads the step-time error, not a fixed delta
    assert theory.speedup_band(planned, 0.2)[1] > hi * (1 + 1e-6)


def test_speedup_no_band_unmeasured_and_not_applicable():
    curves = {0.5: {0: 1.0, 1: 1.4}, 0.9: {0: 1.0, 1: 1.6}}
    rows = _curve_rows(curves, (1.0, 1.0, 1.0))
    by_a = acceptance_rows(rows, A, [1, 1], [1.5, 1.5], RATE)
    rule = speedup_rule(by_a, {"auto": [1.0, 2.5, 1.2]}, rows, "auto", "runs")  # delta 1.5: no band anywhere
    assert rule["holds"] is False and rule["no_band"] == 2 and rule["of"] == 0 and rule["delta"] == pytest.approx(1.5)
    rows = [r for r in rows if not (r["a"] == 0.5 and r["k"] == 0)]  # no plain decoding at a = 0.5
    by_a = acceptance_rows(rows, A, [1, 1], [1.5, 1.5], RATE)
    rule = speedup_rule(by_a, {"auto": [1.0, 1.0, 1.0]}, rows, "auto", "runs")
    assert rule["holds"] is False and rule["unmeasured"] == [0.5] and rule["value"] == 0  # a = 0.9: 1.6 > 1.5
    bare = [r | {"step_time_s": None} for r in rows]  # batch-one rows of older runs: no step times
    assert speedup_rule(by_a, {"auto": [1.0] * 3}, bare, "auto", "runs")["holds"] is None


# ---- score_batches: every rule in each per-B entry -------------------------------------------------------------
def _case():
    """A plan of two batch sizes whose six rules all hold on its run: the run's times are the plan's."""
    steps = _steps_from(TAU)
    steps["auto"] = [min(slot, dedup) for slot, dedup in zip(steps["slot"], steps["dedup"])]
    curves = {0.5: {0: 1.0, 1: 1.3, 2: 1.2}, 0.9: {0: 1.0, 1: 1.4, 2: 1.5}}
    entry = {"step_time_s": steps, "k_hat": [1, 2], "crossover": 3, "speedup": [1.3, 1.5], "tokens_per_s": [1, 1]}
    rows = _curve_rows(curves, steps["auto"])
    measured = {"verify_time_s": TAU, **_saving((-0.05, 0.05), (0.02, 0.2), (-0.3, -0.01)), "crossover": 3}
    plan = {"draft_time_s": H, "batch": {"batches": [1, 2], "kmax": 2, "policy": "auto", "acceptances": A,
                                         "b_stop": [None, None], "per_batch": {"1": entry, "2": copy.deepcopy(entry)}}}
    runs = {**copy.deepcopy(measured), "throughput": [r | {"counted_tokens_per_s": None} for r in rows],
            "batch": {"batches": [2], "per_batch": {"2": {**copy.deepcopy(measured), "throughput": rows}}}}
    return plan, runs


def test_score_batches_holds_each_rule_per_batch():
    plan, runs = _case()
    result = score_batches(plan, runs)
    assert result["all_hold"]
    for b in ("1", "2"):
        e = result["per_batch"][b]
        assert [e[name]["holds"] for name in ("throughput_loss", "saving_sign", "verify_time", "speedup_band")] \
            == [True] * 4
        assert [name for name, _, _ in shown(e)] == ["k_hat", "crossover", "throughput_loss", "saving_sign",
                                                     "verify_time", "speedup_band"]
    assert [p["n"] for p in result["per_batch"]["1"]["saving_sign"]["per_n"]] == [2, 3]  # n = 1 at B = 2 only ...
    assert result["per_batch"]["2"]["saving_sign"]["of"] == 2  # ... whose interval holds 0 there
    runs["batch"]["per_batch"]["2"]["verify_time_s"]["dedup"]["2"] = 1.1 / 1.2  # tau_hat 20% above it
    result = score_batches(plan, runs)
    assert not result["all_hold"] and result["per_batch"]["1"]["verify_time"]["holds"]
    bad = result["per_batch"]["2"]["verify_time"]
    assert not bad["holds"] and bad["value"] == pytest.approx(0.2) and bad["at"] == {"kernel": "dedup", "n": 2}
    assert ("verify_time", "20.0%", False) in shown(result["per_batch"]["2"])
    with pytest.raises(ValueError, match="entry"):
        shown({})

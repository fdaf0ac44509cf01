"""moespec.predict.verify, function by function, against hand computations on small hand-made inputs: the per-layer
times a bench records, the whole-model expert time M_p(n), the four versions of (22) (prediction, measured-time,
whole-pass, calibrated) with their error bounds b_p(n) = delta (M_p(n) + M_anchor), the saving and its band (18),
the AUTO policy (per-slot on ties and at n = 1) and the crossover, the step-time band d and the per-version steps
with the speedup band (21); edge shapes: n = 1 alone, a saving that never changes sign, d >= 1 (no band)."""

from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np
import pytest
from plan_cases import make_bench

from moespec import MoespecError, theory
from moespec.predict.verify import (
    VerifyTimes,
    anchored,
    expert_times,
    kernel_by_n,
    layer_times,
    staircase,
    step_delta,
    steps,
    whole_pass,
    with_auto,
)

MS = 1e-3
EPS = 0.05
DELTA = EPS / (1 - EPS)  # (17): 1/19
SCALE = 8.0  # OLMoE: 16 MoE layers of equal w_l, two of them timed
TAU1 = 0.1
NS = [1, 2, 3]


def _errors(kernel: str, n: int) -> float:
    """Measured = predicted x (1 + e): slot +2% per token (+2% at the one-token pass), dedup -10%."""
    return 0.02 * n if kernel == "slot" else -0.1


@pytest.fixture(scope="module")
def times() -> dict[str, np.ndarray]:
    return layer_times(make_bench(_errors), "bench.json", NS)


# Hand values, per timed layer: slot(n) = n ms, dedup(n) = 1.5 + n/2 ms, the one-token (slot) time 1 ms.
# Whole model (x SCALE, two timed layers): M_slot = 16 n ms; M_dedup = 16 (1.5 + n/2) ms for n >= 2 and, at n = 1,
# the one-token per-slot time 16 ms (both engines run the per-slot kernel on one token).
M_SLOT = np.array([16.0, 32.0, 48.0]) * MS
M_DEDUP = np.array([16.0, 40.0, 48.0]) * MS
M = {"slot": M_SLOT, "dedup": M_DEDUP}


def test_layer_times_reads_the_benchs_per_layer_times(times: dict[str, np.ndarray]) -> None:
    assert set(times) == {"predicted_one", "measured_one", "predicted_slot", "predicted_dedup", "measured_slot",
                          "measured_dedup"}
    np.testing.assert_allclose(times["predicted_one"], [1 * MS, 1 * MS], rtol=1e-12)
    np.testing.assert_allclose(times["measured_one"], [1.02 * MS, 1.02 * MS], rtol=1e-12)
    assert times["predicted_slot"].shape == (2, 3)  # [timed layers, len(ns)]
    np.testing.assert_allclose(times["predicted_slot"], [[1 * MS, 2 * MS, 3 * MS]] * 2, rtol=1e-12)
    np.testing.assert_allclose(times["predicted_dedup"], [[2 * MS, 2.5 * MS, 3 * MS]] * 2, rtol=1e-12)
    np.testing.assert_allclose(times["measured_slot"], [[1.02 * MS, 2 * 1.04 * MS, 3 * 1.06 * MS]] * 2, rtol=1e-12)
    np.testing.assert_allclose(times["measured_dedup"], [[1.8 * MS, 2.25 * MS, 2.7 * MS]] * 2, rtol=1e-12)


def test_layer_times_takes_any_subset_of_pass_sizes() -> None:
    out = layer_times(make_bench(), "bench.json", [1, 9])
    np.testing.assert_allclose(out["predicted_slot"], [[1 * MS, 9 * MS]] * 2, rtol=1e-12)
    np.testing.assert_allclose(out["predicted_dedup"], [[2 * MS, 6 * MS]] * 2, rtol=1e-12)


def test_layer_times_refuses_a_missing_kernel_or_pass_size() -> None:
    bench = make_bench()
    del bench["per_layer"]["7"]["kernels"]["dedup"]
    with pytest.raises(MoespecError, match="bench.json: per_layer has no slot and dedup op times for MoE layer 7"):
        layer_times(bench, "bench.json", NS)
    bench = make_bench()
    del bench["per_layer"]["0"]
    with pytest.raises(MoespecError, match="for MoE layer 0"):
        layer_times(bench, "bench.json", NS)
    with pytest.raises(MoespecError, match=r"bench.json: layer 0 slot times n = 1\.\.9; --kmax 9 needs n up to 10"):
        layer_times(make_bench(), "bench.json", list(range(1, 11)))


def test_expert_times_sum_the_layers_and_anchor_n1_on_the_slot_kernel(times: dict[str, np.ndarray]) -> None:
    pred = expert_times(times, "predicted", SCALE)
    np.testing.assert_allclose(pred["slot"], M_SLOT, rtol=1e-12)
    np.testing.assert_allclose(pred["dedup"], M_DEDUP, rtol=1e-12)  # not 16 x 2 ms = 32 ms at n = 1
    meas = expert_times(times, "measured", SCALE)
    np.testing.assert_allclose(meas["slot"], np.array([16.32, 33.28, 50.88]) * MS, rtol=1e-12)
    np.testing.assert_allclose(meas["dedup"], np.array([16.32, 36.0, 43.2]) * MS, rtol=1e-12)
    # the scale multiplies every entry, the one-token one too
    np.testing.assert_allclose(expert_times(times, "predicted", 1.0)["dedup"], np.array([2.0, 5.0, 6.0]) * MS)


def test_prediction_22_and_its_bound() -> None:
    pred = anchored(TAU1, M, DELTA, per_n=False)
    # tau_p(n) = tau_meas(1) + M_p(n) - M_slot(1)
    np.testing.assert_allclose(pred.tau["slot"], [0.100, 0.116, 0.132], rtol=1e-12)
    np.testing.assert_allclose(pred.tau["dedup"], [0.100, 0.124, 0.132], rtol=1e-12)
    # b_p(n) = delta (M_p(n) + M_slot(1)), 0 at n = 1 (the measured pass itself)
    np.testing.assert_allclose(pred.bound["slot"], np.array([0.0, 48 / 19, 64 / 19]) * MS, rtol=1e-12)
    np.testing.assert_allclose(pred.bound["dedup"], np.array([0.0, 56 / 19, 64 / 19]) * MS, rtol=1e-12)


def test_measured_time_version(times: dict[str, np.ndarray]) -> None:
    meas = anchored(TAU1, expert_times(times, "measured", SCALE), 0.0, per_n=False)
    # anchor: the measured one-token time 16.32 ms
    np.testing.assert_allclose(meas.tau["slot"], TAU1 + np.array([0.0, 16.96, 34.56]) * MS, rtol=1e-12)
    np.testing.assert_allclose(meas.tau["dedup"], TAU1 + np.array([0.0, 19.68, 26.88]) * MS, rtol=1e-12)
    assert all(np.all(b == 0.0) for b in meas.bound.values())  # delta = 0: no bandwidth bound


def test_whole_pass_version_adds_the_growth_outside_the_expert_op() -> None:
    tau_out = np.array([0.050, 0.060, 0.075])
    wp = whole_pass(TAU1, tau_out, M, DELTA)
    # tau_p(n) = tau_meas(1) + (tau_out(n) - tau_out(1)) + (M_p(n) - M_slot(1))
    np.testing.assert_allclose(wp.tau["slot"], [0.100, 0.126, 0.157], rtol=1e-12)
    np.testing.assert_allclose(wp.tau["dedup"], [0.100, 0.134, 0.157], rtol=1e-12)
    pred = anchored(TAU1, M, DELTA, per_n=False)
    for p in ("slot", "dedup"):  # the bound is (22)'s
        np.testing.assert_allclose(wp.bound[p], pred.bound[p], rtol=1e-12)
    # n = 1: the measured pass (to the last bit but one: (tau1 + tau_out(1)) - tau_out(1) rounds)
    assert wp.tau["slot"][0] == pytest.approx(TAU1, rel=1e-15) and wp.tau["dedup"][0] == wp.tau["slot"][0]


def test_calibrated_version_from_dedup_off_runs() -> None:
    tau_runs = np.array([0.100, 0.130, 0.170])
    cal = anchored(tau_runs, M, DELTA, per_n=True)
    # the slot time is the measured one, exact; dedup = measured - (M_slot(n) - M_dedup(n))
    np.testing.assert_allclose(cal.tau["slot"], [0.100, 0.130, 0.170], rtol=1e-12)
    np.testing.assert_allclose(cal.tau["dedup"], [0.100, 0.138, 0.170], rtol=1e-12)
    np.testing.assert_array_equal(cal.bound["slot"], [0.0, 0.0, 0.0])
    # anchor M_slot(n): b_dedup(n) = delta (M_dedup(n) + M_slot(n)), 0 at n = 1
    np.testing.assert_allclose(cal.bound["dedup"], np.array([0.0, 72 / 19, 96 / 19]) * MS, rtol=1e-12)


def test_calibrated_version_from_an_engine_that_runs_dedup_alone() -> None:
    tau_runs = np.array([0.100, 0.130, 0.170])
    cal = anchored(tau_runs, M, DELTA, per_n=True, measured="dedup")
    np.testing.assert_allclose(cal.tau["dedup"], [0.100, 0.130, 0.170], rtol=1e-12)
    np.testing.assert_allclose(cal.tau["slot"], [0.100, 0.122, 0.170], rtol=1e-12)
    np.testing.assert_array_equal(cal.bound["dedup"], [0.0, 0.0, 0.0])
    np.testing.assert_allclose(cal.bound["slot"], np.array([0.0, 72 / 19, 96 / 19]) * MS, rtol=1e-12)
    with pytest.raises(ValueError, match="measured: 'auto' is not one of slot, dedup"):
        anchored(tau_runs, M, DELTA, per_n=True, measured="auto")


def test_every_version_is_the_measured_pass_at_n1() -> None:
    """n = 1: tau_p(1) = tau_meas(1) for both kernels in every version, with bound 0."""
    tau_runs = np.array([0.093, 0.130, 0.170])
    versions = {"prediction": anchored(TAU1, M, DELTA, per_n=False),
                "whole-pass": whole_pass(TAU1, np.array([0.05, 0.06, 0.07]), M, DELTA),
                "calibrated": anchored(tau_runs, M, DELTA, per_n=True)}
    for name, v in versions.items():
        expected = tau_runs[0] if name == "calibrated" else TAU1
        for p in ("slot", "dedup"):
            assert v.tau[p][0] == pytest.approx(expected, rel=1e-15) and v.bound[p][0] == 0.0, (name, p)


def test_a_pass_of_one_token_only() -> None:
    one = {"slot": np.array([0.02]), "dedup": np.array([0.02])}
    v = anchored(0.1, one, DELTA, per_n=False)
    assert v.tau["slot"].tolist() == [0.1] and v.tau["dedup"].tolist() == [0.1]
    assert v.bound["slot"].tolist() == [0.0] and v.bound["dedup"].tolist() == [0.0]
    policy = kernel_by_n(v.tau["slot"] - v.tau["dedup"])
    assert policy == {1: "slot"}
    auto = with_auto(v, policy)
    assert auto.tau["auto"].tolist() == [0.1] and auto.bound["auto"].tolist() == [0.0]
    assert theory.crossover({1: 0.0}) is None


def test_saving_and_its_band_18() -> None:
    pred = anchored(TAU1, M, DELTA, per_n=False)
    saving = pred.tau["slot"] - pred.tau["dedup"]
    # the anchor cancels: S_hat(n) = M_slot(n) - M_dedup(n)
    np.testing.assert_allclose(saving, np.array([0.0, -8.0, 0.0]) * MS, atol=1e-15)
    band = np.array([theory.saving_bound(EPS, M_SLOT[i], M_DEDUP[i]) for i in range(3)])
    np.testing.assert_allclose(band, np.array([32 / 19, 72 / 19, 96 / 19]) * MS, rtol=1e-12)  # delta (M_s + M_d)
    # the two verify-time bounds together count the shared anchor twice; the saving's band does not
    np.testing.assert_allclose((pred.bound["slot"] + pred.bound["dedup"])[1:] - band[1:], 2 * DELTA * M_SLOT[0],
                               rtol=1e-12)
    # every true saving with bandwidth errors |e| <= eps lies in the band: the estimate M_hat = M/(1+e)
    for e_s, e_d in itertools.product((-EPS, 0.0, EPS), repeat=2):
        true = M_SLOT * (1 + e_s) - M_DEDUP * (1 + e_d)
        assert np.all(np.abs(true[1:] - saving[1:]) <= band[1:] * (1 + 1e-12)), (e_s, e_d)


@pytest.mark.parametrize("saving, policy, crossover", [
    ([0.0, -8.0, 0.0, 8.0, 16.0], ["slot", "slot", "slot", "dedup", "dedup"], 4),  # a tie (n = 3) runs per-slot
    ([5.0, 1.0, 2.0], ["slot", "dedup", "dedup"], 2),  # never changes sign; n = 1 runs per-slot anyway
    ([-5.0, -1.0, -2.0], ["slot", "slot", "slot"], None),  # never positive: no crossover
    ([0.0, 0.0, 0.0], ["slot", "slot", "slot"], None),  # ties everywhere
    ([0.0, 1.0, -1.0, 1.0], ["slot", "dedup", "slot", "dedup"], 4),  # two sign changes: AUTO follows the sign
])
def test_auto_choice_and_crossover(saving: list[float], policy: list[str], crossover: int | None) -> None:
    assert kernel_by_n(np.array(saving) * MS) == dict(enumerate(policy, start=1))
    assert theory.crossover(dict(enumerate(saving, start=1))) == crossover


def test_with_auto_takes_time_and_bound_of_the_kernel_it_runs() -> None:
    t = VerifyTimes({"slot": np.array([1.0, 2.0, 3.0]), "dedup": np.array([1.0, 2.5, 2.0])},
                    {"slot": np.array([0.0, 0.1, 0.2]), "dedup": np.array([0.0, 0.3, 0.4])})
    auto = with_auto(t, {1: "slot", 2: "slot", 3: "dedup"})
    assert auto.tau["auto"].tolist() == [1.0, 2.0, 2.0]
    assert auto.bound["auto"].tolist() == [0.0, 0.1, 0.4]
    assert auto.tau["slot"] is t.tau["slot"] and set(auto.tau) == {"slot", "dedup", "auto"}
    assert set(t.tau) == {"slot", "dedup"}  # the input is left as it was


def test_auto_on_a_tie_takes_the_per_slot_bound() -> None:
    """Calibrated, dedup-off runs: on a tie the per-slot time is the measured one (bound 0, not dedup's)."""
    M_tie = {"slot": np.array([16.0, 32.0, 48.0]) * MS, "dedup": np.array([16.0, 32.0, 40.0]) * MS}
    cal = anchored(np.array([0.1, 0.13, 0.17]), M_tie, DELTA, per_n=True)
    policy = kernel_by_n(cal.tau["slot"] - cal.tau["dedup"])
    assert policy == {1: "slot", 2: "slot", 3: "dedup"}
    auto = with_auto(cal, policy)
    assert auto.bound["auto"][1] == 0.0 and cal.bound["dedup"][1] == pytest.approx(64 / 19 * MS, rel=1e-12)
    np.testing.assert_allclose(auto.tau["auto"], [0.1, 0.13, 0.162], rtol=1e-12)
    np.testing.assert_allclose(auto.bound["auto"], [0.0, 0.0, 88 / 19 * MS], rtol=1e-12)


def test_auto_is_never_slower_than_the_faster_kernel_by_more_than_the_band() -> None:
    Ms = {"slot": np.array([10.0, 20.0, 30.0, 40.0]) * MS, "dedup": np.array([10.0, 21.0, 29.0, 30.0]) * MS}
    pred = anchored(TAU1, Ms, DELTA, per_n=False)
    policy = kernel_by_n(pred.tau["slot"] - pred.tau["dedup"])
    assert policy == {1: "slot", 2: "slot", 3: "dedup", 4: "dedup"}
    band = DELTA * (Ms["slot"] + Ms["dedup"])
    for e_a, e_s, e_d in itertools.product((-EPS, EPS), repeat=3):  # errors of the anchor and of each kernel
        true = {p: TAU1 + Ms[p] * (1 + e) - Ms["slot"][0] * (1 + e_a) for p, e in (("slot", e_s), ("dedup", e_d))}
        for n in range(2, 5):
            excess = true[policy[n]][n - 1] - min(true["slot"][n - 1], true["dedup"][n - 1])
            assert 0 <= excess <= band[n - 1], (n, e_a, e_s, e_d)


def test_step_delta() -> None:
    # d = max_k b(k)/(V_hat(k) - b(k)): 0, 1/11, 3/12
    assert step_delta(np.array([10.0, 12.0, 15.0]), np.array([0.0, 1.0, 3.0])) == pytest.approx(0.25, rel=1e-15)
    assert step_delta(np.array([10.0, 12.0]), np.zeros(2)) == 0.0
    assert step_delta(np.array([4.0]), np.array([2.0])) == 1.0  # the bound reaches half of V_hat: d = 1
    assert step_delta(np.array([4.0, 5.0]), np.array([0.0, 5.0])) == float("inf")  # b >= V_hat: no band at all
    # every V within b of V_hat has (1-d) V <= V_hat <= (1+d) V, with equality at the worst k, V = V_hat - b
    V_hat, b = np.array([10.0, 12.0, 15.0]), np.array([0.0, 1.0, 3.0])
    d = step_delta(V_hat, b)
    for V in (V_hat - b, V_hat + b):
        assert np.all((1 - d) * V <= V_hat + 1e-12) and np.all(V_hat <= (1 + d) * V + 1e-12)
    assert V_hat[2] == pytest.approx((1 + d) * (V_hat - b)[2], rel=1e-15)


def test_staircase_as_json() -> None:
    # V = (2, 1, 3): k*(0) = 1 (the smallest argmin); a_1 = alpha_{1,0} = 0 (V(1) < V(0)); a_2 = 1, since
    # T_a(2) > T_a(1) needs (1 + a + a^2)/3 > 1 + a, which no a in [0, 1) meets. One interval: k* = 1 on (0, 1].
    assert staircase([2.0, 1.0, 3.0]) == {"k_at_zero": 1, "step_points": [0.0, 1.0],
                                           "intervals": [{"k": 1, "lo": 0.0, "hi": 1.0}]}
    # V = (4, 5, 7): a_1 = c_1/V(0) = 1/4 (B.36); a_2 = max(alpha_{2,0}, alpha_{2,1}) = max(1/2, (1 + sqrt 11)/5)
    out = staircase([4.0, 5.0, 7.0])
    a2 = (1 + 11**0.5) / 5
    assert out["k_at_zero"] == 0
    assert out["step_points"] == pytest.approx([0.25, a2], abs=1e-12)
    assert [row["k"] for row in out["intervals"]] == [0, 1, 2]
    bounds = [x for row in out["intervals"] for x in (row["lo"], row["hi"])]
    assert bounds == pytest.approx([0, 0.25, 0.25, a2, a2, 1], abs=1e-12)
    assert all(type(x) is float for x in out["step_points"])


def _best(V: list[float], a: float) -> int:
    """The smallest maximizer of (1 + a + ... + a^k)/V(k), by brute force."""
    T = [sum(a**j for j in range(k + 1)) / V[k] for k in range(len(V))]
    return T.index(max(T))


# kmax = 2: verify times and bounds at n = 1..3, AUTO from the saving (0, -1, +0.5): slot, slot, dedup
TAU = {"slot": np.array([10.0, 12.0, 14.0]), "dedup": np.array([10.0, 13.0, 13.5])}
BOUND = {"slot": np.array([0.0, 0.5, 1.0]), "dedup": np.array([0.0, 0.6, 0.9])}
H = [1.0, 1.5, 2.0]


def _times() -> VerifyTimes:
    t = VerifyTimes(TAU, BOUND)
    return with_auto(t, kernel_by_n(TAU["slot"] - TAU["dedup"]))


def test_steps_step_times_deltas_and_staircases() -> None:
    out = steps(_times(), H, "prediction")
    assert out["step_times"] == {"slot": [11.0, 13.5, 16.0], "dedup": [11.0, 14.5, 15.5], "auto": [11.0, 13.5, 15.5]}
    # d = max_k b(k)/(V(k) - b(k))
    assert out["delta"]["slot"] == pytest.approx(max(0.5 / 13.0, 1.0 / 15.0), rel=1e-15)
    assert out["delta"]["dedup"] == pytest.approx(max(0.6 / 13.9, 0.9 / 14.6), rel=1e-15)
    assert out["delta"]["auto"] == pytest.approx(max(0.5 / 13.0, 0.9 / 14.6), rel=1e-15)
    for p in ("slot", "dedup", "auto"):
        assert out["staircase"][p] == staircase(out["step_times"][p])
    # V_slot = (11, 13.5, 16): a_1 = alpha_{1,0} = 13.5/11 - 1 = 5/22 (alpha_{2,0} is larger)
    assert out["staircase"]["slot"]["step_points"][0] == pytest.approx(5 / 22, abs=1e-12)


def test_steps_table_rows_follow_9_and_21() -> None:
    out = steps(_times(), H, "whole-pass")
    grid = [float(a) for a in theory.PAPER_ACCEPTANCES]
    policies = ("slot", "dedup", "auto")
    assert [(row["a"], row["policy"]) for row in out["table"]] == [(a, p) for a in grid for p in policies]
    for row in out["table"]:
        V, d = out["step_times"][row["policy"]], out["delta"][row["policy"]]
        k = _best(V, row["a"])
        s = sum(row["a"] ** j for j in range(k + 1)) * V[0] / V[k]  # (9)
        assert row["version"] == "whole-pass" and row["k_hat"] == k
        assert row["speedup"] == pytest.approx(s, rel=1e-12)
        assert row["speedup_lo"] == pytest.approx(s * (1 - d) / (1 + d), rel=1e-12)  # (21)
        assert row["speedup_hi"] == pytest.approx(s * (1 + d) / (1 - d), rel=1e-12)
    by = {(row["a"], row["policy"]): row for row in out["table"]}
    # hand values on V_slot = (11, 13.5, 16): T = (1/11, 1.2/13.5, 1.24/16) at a = 0.2: k = 0
    assert by[0.2, "slot"]["k_hat"] == 0 and by[0.2, "slot"]["speedup"] == 1.0
    assert by[0.5, "slot"]["k_hat"] == 1 and by[0.5, "slot"]["speedup"] == pytest.approx(1.5 * 11 / 13.5)
    assert by[0.98, "slot"]["k_hat"] == 2
    assert by[0.98, "slot"]["speedup"] == pytest.approx((1 + 0.98 + 0.98**2) * 11 / 16, rel=1e-12)


def test_steps_refuse_a_band_where_d_reaches_one() -> None:
    """d >= 1 (a bound of half of V_hat(k) or more): delta None and rows without band; the staircase remains."""
    bound = {"slot": np.array([0.0, 6.75, 1.0]), "dedup": np.array([0.0, 0.6, 20.0])}  # 6.75/(13.5-6.75) = 1
    t = with_auto(VerifyTimes(TAU, bound), {1: "slot", 2: "slot", 3: "dedup"})
    out = steps(t, H, "calibrated")
    assert out["delta"] == {"slot": None, "dedup": None, "auto": None}
    assert all(row["speedup_lo"] is None and row["speedup_hi"] is None for row in out["table"])
    assert out["staircase"]["slot"] == staircase([11.0, 13.5, 16.0])
    assert all(row["k_hat"] == _best(out["step_times"][row["policy"]], row["a"]) for row in out["table"])
    # just below 1 the band is kept
    bound["slot"][1] = 6.7
    out = steps(with_auto(VerifyTimes(TAU, bound), {1: "slot", 2: "slot", 3: "slot"}), H, "calibrated")
    assert out["delta"]["slot"] == pytest.approx(6.7 / 6.8, rel=1e-12) and out["delta"]["auto"] is not None
    assert out["delta"]["dedup"] is None


def test_steps_exact_fractions_stay_consistent() -> None:
    """Float inputs give the same k_hat as exact arithmetic on the same step times (no float-only tie flips)."""
    out = steps(_times(), H, "prediction")
    for row in out["table"]:
        V = [Fraction(v).limit_denominator(1000) for v in out["step_times"][row["policy"]]]
        assert row["k_hat"] == theory.best_draft_length(V, Fraction(row["a"]).limit_denominator(1000))

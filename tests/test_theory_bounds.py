"""moespec.theory.bounds against hand-computed values of Table 2: delta = eps/(1-eps), (17) attained exactly by the
worst bandwidth error, (18) for a hand-made saving, the margin (19) and what its sign means, (20) and (21) each
attained with equality on a two-step example, the separation condition of (20) at its boundary, the paper's
"10% bandwidth error, 25% speedup" (1/(1-2 eps)), and the refusal of delta >= 1. The random property test of every
bound is in test_bounds.py."""

from __future__ import annotations

import math
from fractions import Fraction as F

import pytest

from moespec import theory


def test_delta_from_eps() -> None:
    assert theory.delta_from_eps(F(1, 10)) == F(1, 9)
    assert theory.delta_from_eps(F(1, 3)) == F(1, 2)
    assert theory.delta_from_eps(0) == 0
    assert theory.delta_from_eps(0.2) == pytest.approx(0.25, rel=1e-15)
    assert theory.EPS_LIMIT == 0.5 and theory.delta_from_eps(F(1, 2)) == 1  # where (21) loses its band


def test_verify_time_bound_17_is_attained() -> None:
    eps = F(1, 10)
    t0, D, bD, E, b, phi = F(1, 2), 9, 3, 18, 2, F(1, 4)
    M = F(D, bD) + F(E, b)  # memory part: 3 + 9 = 12
    bound = theory.verify_time_bound(eps, M)
    assert bound == F(12, 9)
    tau = theory.verify_time(t0, D, bD, E, b, phi)
    # every bandwidth underestimated by eps: each memory term grows by eps/(1-eps) of itself, the bound exactly
    low = theory.verify_time(t0, D, bD * (1 - eps), E, b * (1 - eps), phi)
    assert low - tau == bound
    # overestimated: it shrinks by eps/(1+eps) of itself, inside the bound
    high = theory.verify_time(t0, D, bD * (1 + eps), E, b * (1 + eps), phi)
    assert tau - high == M * eps / (1 + eps) == F(12, 11) < bound
    assert theory.verify_time_bound(eps, 0) == 0


def test_saving_bound_18_by_hand() -> None:
    eps = F(1, 10)
    # expert times 9 (slot) and 11 (dedup), the dense term shared: S = -2
    t0, D, bD = 1, 6, 2
    S = theory.verify_time(t0, D, bD, 18, 2) - theory.verify_time(t0, D, bD, 33, 3)
    assert S == -2
    # the worst case: slot's bandwidth low by eps, dedup's high by eps; the dense one's error cancels
    S_hat = (theory.verify_time(t0, D, bD * (1 + eps), 18, 2 * (1 - eps))
             - theory.verify_time(t0, D, bD * (1 + eps), 33, 3 * (1 + eps)))
    assert S_hat - S == 9 * F(1, 9) + 11 * F(1, 11) == 2  # the saving's sign flips to 0
    assert theory.saving_bound(eps, 9, 11) == F(20, 9) > 2
    # relative to the saving the bound is amplified by (M_slot + M_dedup)/|S| = 10
    assert theory.saving_bound(eps, 9, 11) / abs(S) == 10 * theory.delta_from_eps(eps)


def test_kernel_margin_19_by_hand() -> None:
    # |ln 0.8 - ln 0.5| - ln(1.1/0.9) = ln 1.6 - ln(11/9)
    assert theory.kernel_margin(0.5, 0.8, 0.1) == pytest.approx(0.47000362924573563 - 0.20067069546215124, abs=1e-14)
    assert theory.kernel_margin(0.8, 0.5, 0.1) == theory.kernel_margin(0.5, 0.8, 0.1)  # symmetric in u and r
    assert theory.kernel_margin(0.5, 0.8, 0.0) == pytest.approx(math.log(1.6), rel=1e-15)
    assert theory.kernel_margin(0.7, 0.7, 0.0) == 0.0
    # positive margin: every r within the factor (1 +- eps)/(1 -+ eps) of r_hat = 0.8 stays above u = 0.5
    assert 0.8 * 0.9 / 1.1 > 0.5
    # negative margin (u = 0.75): r_hat = 0.8 says dedup is faster, yet r = 0.8 x 0.9/1.1 = 0.655 < u would not
    assert theory.kernel_margin(0.75, 0.8, 0.1) < 0 and 0.8 * 0.9 / 1.1 < 0.75


def test_throughput_floor_and_loss_20_and_the_band_21() -> None:
    delta = F(1, 9)  # eps = 1/10
    assert theory.throughput_floor(delta) == F(4, 5)
    assert theory.throughput_loss_bound(delta) == F(1, 5) == 1 - theory.throughput_floor(delta)
    assert theory.speedup_band(2, delta) == (F(8, 5), F(5, 2))
    assert theory.speedup_band(F(3, 2), 0) == (F(3, 2), F(3, 2))  # exact step times: no band


@pytest.mark.parametrize("eps", [F(1, 10), F(1, 4), F(3, 10), F(49, 100)])
def test_speedup_factor_is_one_over_one_minus_two_eps(eps: F) -> None:
    """From bandwidth errors alone (1 + delta)/(1 - delta) = 1/(1 - 2 eps): 1.25 at eps = 0.1 (Section 3.5)."""
    lo, hi = theory.speedup_band(1, theory.delta_from_eps(eps))
    assert hi == 1 / (1 - 2 * eps) and lo == 1 - 2 * eps
    if eps == F(1, 10):
        assert hi == F(5, 4)


def test_bounds_20_and_21_are_attained() -> None:
    """V = (1, 1), a = 1/2: T = (1, 3/2), k* = 1. V_hat = ((1-d) V(0), (1+d) V(1)) with d = 1/5 makes
    T_hat = (5/4, 5/4): k_hat* = 0 (the smaller k on the tie), which loses 1 - 1/(3/2) = 1/3 = 2d/(1+d) of the best
    throughput, and the predicted best speedup 1 is 3/2 = (1+d)/(1-d) times below the true one."""
    d = F(1, 5)
    V, V_hat = [F(1), F(1)], [1 - d, 1 + d]
    a = F(1, 2)
    k, k_hat = theory.best_draft_length(V, a), theory.best_draft_length(V_hat, a)
    assert (k, k_hat) == (1, 0)
    loss = 1 - theory.throughput(V, a, k_hat) / theory.throughput(V, a, k)
    assert loss == theory.throughput_loss_bound(d) == F(1, 3)  # (20) with equality
    lo, hi = theory.speedup_band(theory.speedup(V_hat, a, k_hat), d)
    assert theory.speedup(V, a, k) == hi == F(3, 2)  # (21) with equality
    assert not theory.separated(V_hat, a, d) and not theory.separated(V, a, d)


def test_separation_condition_20_at_its_boundary() -> None:
    # V = (1, 1, 1), a = 1/2: T = (1, 3/2, 7/4), k* = 2; separated while (1+d)/(1-d) x 3/2 < 7/4, i.e. d < 1/13
    V, a = [1, 1, 1], F(1, 2)
    assert theory.separated(V, a, F(1, 14))  # 15/13 x 3/2 = 45/26 < 7/4
    assert not theory.separated(V, a, F(1, 13))  # 7/6 x 3/2 = 7/4: equality is not separation
    assert theory.separated(V, a, 0)


@pytest.mark.parametrize("call", [
    lambda: theory.throughput_floor(1), lambda: theory.throughput_loss_bound(F(3, 2)),
    lambda: theory.speedup_band(2, 1), lambda: theory.verify_time_bound(1, 5),
    lambda: theory.saving_bound(F(-1, 10), 1, 1), lambda: theory.kernel_margin(0.5, 0.8, 1.0),
    lambda: theory.separated([1, 1], F(1, 2), 1),
])
def test_no_bound_for_delta_or_eps_at_one(call) -> None:
    with pytest.raises(ValueError):
        call()

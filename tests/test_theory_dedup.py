"""moespec.theory.dedup against hand-computed values: the step time (5), the saving (6) as the difference of two (5)
times and its sign (7), requested bytes (3) at the edges (one expert for every token, m = N - 1 at prime N, n = 1),
the crossover, the drafted reuse (11) over weighted layers, the union bytes (12) against U(n) = N (1 - q^n) of
uniform routing, and the engine's step time (13) against (5), its threshold (14) at equality and its speedup (15).
The equivalences (14) <=> (8), (15) = (9), (16) and Appendix B.2's example are in test_dedup_theory.py."""

from __future__ import annotations

from fractions import Fraction as F

import pytest

from moespec import theory


def test_verify_time_5() -> None:
    # t0 + D(n)/beta_D + E(n)/beta(n) + phi = 1/2 + 30/10 + 12/4 + 1/4
    assert theory.verify_time(F(1, 2), 30, 10, 12, 4, F(1, 4)) == F(27, 4)
    assert theory.verify_time(0, 0, 1, 12, 4) == 3  # no fixed work by default


def test_saving_6_is_the_difference_of_two_step_times() -> None:
    # E_slot = 100 at beta_slot = 10; dedup requests u E_slot = 70 at r beta_slot = 5: S = 10 (1 - 7/5) = -4
    assert theory.saving(100, 10, F(7, 10), F(1, 2)) == -4
    t0, D, bD, phi = F(1, 3), 20, 8, F(1, 5)
    slot = theory.verify_time(t0, D, bD, 100, 10, phi)
    dedup = theory.verify_time(t0, D, bD, 70, 5, phi + 1)  # one more unit of fixed work: dphi = 1
    assert theory.saving(100, 10, F(7, 10), F(1, 2), dphi=1) == slot - dedup == -5
    # u = 2/5 < r = 1/2: S = 10 (1 - 4/5) = 2 > 0, the dedup kernel faster (7)
    assert theory.saving(100, 10, F(2, 5), F(1, 2)) == 2 and theory.dedup_faster(F(2, 5), F(1, 2))
    # bytes alone do not decide: u < 1 yet u > r
    assert theory.saving(100, 10, F(9, 10), F(3, 5)) == -5 and not theory.dedup_faster(F(9, 10), F(3, 5))


@pytest.mark.parametrize("n, U, m, N", [
    (4, 1, 1, 8),  # all tokens on one expert: U = 1 for any n
    (2, 7, 6, 7),  # m = N - 1 at prime N = 7: two tokens name every expert
    (3, 7, 6, 7),
    (1, 6, 6, 7),  # n = 1: U = m, both kernels request one token's experts
    (5, 13, 3, 13),  # prime N, the union capped at N
])
def test_requested_bytes_3(n: int, U: int, m: int, N: int) -> None:
    b = F(3, 2)
    slot, dedup = theory.requested_bytes("slot", n, U, m, b), theory.requested_bytes("dedup", n, U, m, b)
    assert slot == n * m * b and dedup == U * b
    assert slot - dedup >= 0  # (3): the per-slot kernel never requests fewer
    if n == 1:
        assert slot == dedup
    if U == N and n * m > N:
        assert dedup / slot == F(N, n * m)  # u(n) = N/(n m) once the union is every expert


@pytest.mark.parametrize("saving, expected", [
    ({1: 5, 2: -1, 3: 0, 4: 2, 5: 3}, 4),  # S(3) = 0 is not positive; n = 1 is left out
    ({2: 1, 3: 1}, 2),  # never changes sign
    ({2: -1, 3: -1}, None),  # never positive
    ({1: 1}, None),  # one token only
    ({}, None),
    ({5: 1, 2: -1, 4: 1, 3: 1}, 3),  # keys in any order
    ({2: 1, 3: -1, 4: 1}, 4),  # positive at n = 2 but not from there on
    ({2: 1, 3: 1, 4: -1}, None),  # positive, then negative at the largest n
])
def test_crossover(saving: dict, expected: int | None) -> None:
    assert theory.crossover(saving) == expected


def test_mean_drafted_reuse_11_weights_layers_by_their_bytes() -> None:
    rho = [[None, 0, F(1, 2), F(3, 4)], [None, 0, F(1, 4), F(1, 2)]]
    w = [3, 1]
    # k = 1: (3 x 1/2 + 1 x 1/4)/(1 x 4) = 7/16; k = 2: (3 (1/2 + 3/4) + (1/4 + 1/2))/(2 x 4) = 9/16
    assert theory.mean_drafted_reuse(rho, w, 1) == F(7, 16)
    assert theory.mean_drafted_reuse(rho, w, 2) == F(9, 16)
    assert theory.mean_drafted_reuse(rho, [0, 5], 2) == F(3, 8)  # a layer of zero bytes does not count


def _uniform_rho(N: int, m: int, n_max: int) -> list:
    """rho(n) of uniform independent routing: 1 - rho(n) = q^(n-1), q = 1 - m/N; entry 0 unused."""
    q = 1 - F(m, N)
    return [None] + [1 - q ** (n - 1) for n in range(1, n_max + 1)]


@pytest.mark.parametrize("N, m", [(7, 6), (13, 1), (64, 8), (2, 1)])  # m = N - 1 at prime N, prime N, OLMoE
def test_union_bytes_12_equal_the_expected_union_of_uniform_routing(N: int, m: int) -> None:
    w = F(5)  # one layer, W = w
    q = 1 - F(m, N)
    rho = _uniform_rho(N, m, 9)
    for k in range(1, 9):
        rho_bar = theory.mean_drafted_reuse([rho], [w], k)
        # (2): U(k+1) = m sum_{j=1..k+1} q^(j-1) = N (1 - q^(k+1)); E_dedup = w U
        assert theory.union_bytes(m * w, k, rho_bar) == w * N * (1 - q ** (k + 1))
    assert theory.union_bytes(m * w, 1, F(6, 7)) == m * w * (1 + F(1, 7))


def test_all_tokens_on_one_expert() -> None:
    """Full reuse: rho(n) = 1 for n >= 2, so rho_bar_k = 1 and k drafts add no expert bytes (12); with B_k = beta(1)
    and no other growth a step costs V(0) and the speedup (15) is G_a(k)."""
    rho = [None, 0] + [1] * 8
    for k in range(1, 9):
        rb = theory.mean_drafted_reuse([rho], [4], k)
        assert rb == 1 and theory.union_bytes(4, k, rb) == 4
    engine = theory.DedupEngine(mW=4, tau1=10, beta1=2, betaD=1, B=[2] * 4, dD=[0] * 4, dphi=[0] * 4)
    assert engine.step_times([1, 1, 1]) == [10, 10, 10, 10]
    assert engine.speedup(F(1, 2), 3, 1) == F(15, 8)
    assert engine.threshold(F(1, 2), 3) < 0  # any reuse suffices


# A deduplicating engine built from the time model (5): t0 = 1, D(n) = 2 + n at beta_D = 1, mW = 4 at beta(1) = 2,
# phi(1) = 1/2; at n = 2, 3: B = 3, 4 and phi_dedup = 1, 3/2. tau(1) = 1 + 3 + 2 + 1/2 = 13/2.
T0, MW, BETA1, BETAD = 1, 4, 2, 1
D = {1: 3, 2: 4, 3: 5}
BETA = {1: 2, 2: 3, 3: 4}
PHI = {1: F(1, 2), 2: 1, 3: F(3, 2)}
ENGINE = theory.DedupEngine(mW=MW, tau1=F(13, 2), beta1=BETA1, betaD=BETAD, B=[BETA[1], BETA[2], BETA[3]],
                            dD=[0, D[2] - D[1], D[3] - D[1]], dphi=[0, PHI[2] - PHI[1], PHI[3] - PHI[1]])


def test_engine_step_times_13_follow_the_time_model_5() -> None:
    rho_bars = [F(1, 4), F(1, 2)]
    expected = [theory.verify_time(T0, D[1], BETAD, MW, BETA[1], PHI[1])]
    for k, rb in enumerate(rho_bars, start=1):
        E = MW + MW * k * (1 - rb)  # (12): 7, then 8
        expected.append(theory.verify_time(T0, D[k + 1], BETAD, E, BETA[k + 1], PHI[k + 1]))
    assert expected == [F(13, 2), F(25, 3), F(19, 2)]
    assert ENGINE.step_times(rho_bars) == expected
    assert ENGINE.step_increase(0, F(1, 2)) == 0
    assert ENGINE.step_increase(1, F(1, 4)) == F(25, 3) - F(13, 2)


def test_engine_threshold_14_by_hand() -> None:
    # k = 1, a = 1/5: slack = (G - 1) tau(1) - dD_1/beta_D - dphi_1 = 13/10 - 1 - 1/2 = -1/5;
    # rho* = 1 - (3/4)(-1/5) - (3/2 - 1) = 13/20
    assert ENGINE.threshold(F(1, 5), 1) == F(13, 20)
    # at rho_bar_1 = rho*: V(1) - V(0) = 1 + 1/2 + (4 + 4 x 7/20)/3 - 2 = 13/10 = (G - 1) V(0): no speedup (8)
    V = ENGINE.step_times([F(13, 20)])
    assert V[1] - V[0] == F(13, 10) and not theory.beats_plain(V, F(1, 5), 1)
    assert theory.beats_plain(ENGINE.step_times([F(66, 100)]), F(1, 5), 1)
    # k = 1, a = 1/2: slack = 13/4 - 3/2 = 7/4; rho* = 1 - 21/16 - 1/2 = -13/16: no reuse needed
    assert ENGINE.threshold(F(1, 2), 1) == F(-13, 16)
    with pytest.raises(ValueError):
        ENGINE.threshold(F(1, 2), 0)


def test_engine_speedup_15_by_hand() -> None:
    # k = 2, a = 1/2, rho_bar_2 = 1/2: G = 7/4, V(2) = 19/2: (7/4)(13/2)/(19/2) = 91/76
    assert ENGINE.speedup(F(1, 2), 2, F(1, 2)) == F(91, 76)
    assert ENGINE.speedup(F(1, 2), 0, F(0)) == 1


def test_byte_step_times_without_drafts() -> None:
    assert theory.byte_step_times(8, 100, [3], []) == [111]  # kmax = 0: D + mW + kv(0)
    # kmax = 1: D + E_dedup(2) + kv(1) = 100 + 8 + 8 (1 - 1/4) + 4
    assert theory.byte_step_times(8, 100, [3, 4], [F(1, 4)]) == [111, 118]

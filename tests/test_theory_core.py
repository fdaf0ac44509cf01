"""moespec.theory.core against hand-computed values of the paper's equations: G_a (B.1), T_a and k*(a) (the
smallest maximizer, on exact and float ties), the speedup condition (8) at its boundary, the speedup (9), a0 (B.4),
(B.3), alpha_{k,i} and the step points (B.31) where the min over k or the max over i decides, the convex criterion
(10) and a_1 (B.36) with its cap at 1, the staircase on the paper's grid, the Bracket type, and kmax = 0. The
property tests over random V are in test_theory.py, the domain checks in test_theory_domain.py."""

from __future__ import annotations

from fractions import Fraction as F

import numpy as np
import pytest

from moespec import theory
from moespec.theory.core import Bracket


def test_geometric_sum_B1() -> None:
    assert theory.geometric_sum(F(1, 2), 3) == F(15, 8)  # 1 + 1/2 + 1/4 + 1/8
    assert theory.geometric_sum(F(2, 3), 4) == (1 - F(2, 3) ** 5) / (1 - F(2, 3)) == F(211, 81)
    assert theory.geometric_sum(F(9, 10), 0) == 1
    assert theory.geometric_sum(0.5, 3) == 1.875
    np.testing.assert_allclose(theory.geometric_sum(np.array([0.0, 0.5, 0.9]), 2), [1.0, 1.75, 2.71], rtol=1e-15)


def test_throughput_and_the_smallest_maximizer() -> None:
    V = [F(2), F(3), F(5)]
    a = F(1, 2)
    assert [theory.throughput(V, a, k) for k in range(3)] == [F(1, 2), F(1, 2), F(7, 20)]
    assert theory.best_draft_length(V, a) == 0  # T_a(0) = T_a(1) exactly: the smaller k
    assert theory.best_draft_length([2.0, 3.0, 5.0], 0.5) == 0  # the same tie on floats: the first maximum
    # a tie between k = 1 and k = 2 above T_a(0): T = (1, 3/2, (7/4)/(7/6) = 3/2)
    assert theory.best_draft_length([F(1), F(1), F(7, 6)], a) == 1
    assert theory.best_draft_length([F(1), F(1), F(7, 6)], F(51, 100)) == 2


def test_best_draft_length_at_zero_is_the_smallest_argmin() -> None:
    assert theory.best_draft_length([F(2), F(1), F(1)], 0) == 1
    k0, steps = theory.staircase_intervals([F(2), F(1), F(1)])
    assert k0 == 1


def test_speedup_9_and_condition_8_at_their_boundary() -> None:
    V = [F(4), F(5), F(7)]
    assert theory.speedup(V, F(9, 10), 2) == F(271, 175)  # G = 271/100, V(0)/V(2) = 4/7
    assert theory.speedup(V, F(1, 2), 1) == F(6, 5)
    assert theory.speedup(V, F(1, 2), 0) == 1
    np.testing.assert_allclose(theory.speedup([4.0, 5.0, 7.0], np.array([0.0, 0.5]), 1), [0.8, 1.2], rtol=1e-15)
    # (8) at k = 1: V(1) - V(0) = 1 < a V(0) = 4a  <=>  a > 1/4 = a0; equality is not a speedup
    assert theory.first_draft_threshold(V) == F(1, 4)
    assert not theory.beats_plain(V, F(1, 4), 1)
    assert theory.beats_plain(V, F(26, 100), 1)
    # at k = 2: 3 < (a + a^2) 4  <=>  a > 1/2
    assert not theory.beats_plain(V, F(1, 2), 2) and theory.beats_plain(V, F(51, 100), 2)


def test_first_draft_threshold_B4_outside_the_unit_interval() -> None:
    assert theory.first_draft_threshold([F(4), F(3)]) == F(-1, 4)  # one draft is faster at every a
    assert theory.first_draft_threshold([F(2), F(5)]) == F(3, 2)  # at no a
    assert theory.first_draft_threshold([2.0, 3.0]) == 0.5
    assert theory.best_draft_length([F(4), F(3)], 0) == 1 and theory.step_points([F(2), F(5)])[0].value == 1


def test_speculation_helps_B3() -> None:
    V = [F(4), F(5), F(7)]
    assert not theory.speculation_helps(V, F(1, 4))  # a = a_1: neither k = 1 nor k = 2 (which needs a > 1/2)
    assert theory.speculation_helps(V, F(3, 10))
    # V = (1, 2, 2): k = 1 never beats plain decoding, k = 2 does at a = 9/10: helps through k = 2 alone
    assert not theory.beats_plain([1, 2, 2], F(9, 10), 1) and theory.speculation_helps([1, 2, 2], F(9, 10))
    assert not theory.speculation_helps([F(1)], F(1, 2))  # kmax = 0: nothing to draft


def test_crossing_acceptances() -> None:
    V = [F(4), F(5), F(7)]
    assert theory.crossing_acceptance(V, 1, 0) == Bracket(F(1, 4), F(1, 4))
    assert theory.crossing_acceptance(V, 2, 0) == Bracket(F(1, 2), F(1, 2))  # 4 (1 + a + a^2) = 7
    alpha = theory.crossing_acceptance(V, 2, 1)  # 5a^2 - 2a - 2 = 0: (1 + sqrt 11)/5
    assert not alpha.exact and alpha.value is None
    assert abs(float(alpha) - (1 + 11**0.5) / 5) < 1e-15
    assert alpha.hi - alpha.lo <= F(1, 2**50)
    assert theory.crossing_acceptance([F(2), F(1), F(3)], 1, 0).value == 0  # V(1) < V(0): from a = 0 on
    assert theory.crossing_acceptance([F(2), F(1), F(3)], 2, 1).value == 1  # (1 + a + a^2)/3 > 1 + a never
    with pytest.raises(ValueError):
        theory.crossing_acceptance(V, 1, 1)


def test_step_points_B31_min_over_k_decides() -> None:
    # V = (1, 9/5, 7/4): alpha_{1,0} = 4/5 but alpha_{2,0} = 1/2 ((2a + 3)(2a - 1) = 0), so a_1 = min = 1/2; with
    # alpha_{2,1} = 0 (V(2) < V(1)) a_2 = max(1/2, 0) = 1/2: a rational jump from 0 to 2, k* = 1 never occurs
    V = [F(1), F(9, 5), F(7, 4)]
    a1, a2 = theory.step_points(V)
    assert a1.value == a2.value == F(1, 2)
    k0, steps = theory.staircase_intervals(V)
    assert k0 == 0 and [(s.k, s.lo.value, s.hi.value) for s in steps] == [(0, 0, F(1, 2)), (2, F(1, 2), 1)]
    assert theory.best_draft_length(V, F(1, 2)) == 0  # T_a(0) = T_a(2) = 1 at the step point: the smaller k
    assert theory.best_draft_length(V, F(51, 100)) == 2


def test_step_points_B31_max_over_i_decides() -> None:
    # V = (4, 5, 7): a_2 = max(alpha_{2,0}, alpha_{2,1}) = max(1/2, (1 + sqrt 11)/5) = (1 + sqrt 11)/5
    a1, a2 = theory.step_points([F(4), F(5), F(7)])
    assert a1.value == F(1, 4)
    assert not a2.exact and abs(float(a2) - (1 + 11**0.5) / 5) < 1e-14
    assert theory.best_draft_length([F(4), F(5), F(7)], F(863, 1000)) == 1
    assert theory.best_draft_length([F(4), F(5), F(7)], F(864, 1000)) == 2


def test_convex_criterion_10_and_first_step_point_B36() -> None:
    V = [F(4), F(5), F(7)]  # c_1 = 1, c_2 = 2
    assert theory.convex_increments(V)
    # k*(a) >= 2 <=> a^2 V(1) > G_a(1) c_2: at 9/10, 4.05 > 3.8; at 4/5, 3.2 < 3.6
    assert theory.convex_at_least(V, F(9, 10), 2) and not theory.convex_at_least(V, F(4, 5), 2)
    # j = 1: a V(0) > c_1 <=> a > 1/4
    assert not theory.convex_at_least(V, F(1, 4), 1) and theory.convex_at_least(V, F(26, 100), 1)
    assert theory.first_step_point_convex(V) == F(1, 4)
    assert theory.first_step_point_convex([F(1), F(3), F(6)]) == 1  # c_1/V(0) = 2, capped at 1
    assert theory.first_step_point_convex([F(2), F(2), F(3)]) == 0  # c_1 = 0: from a = 0 on


@pytest.mark.parametrize("V", [[F(1), F(3), F(4)], [F(2), F(1), F(3)]])  # c_2 < c_1; c_1 < 0
def test_convex_criterion_refuses_other_step_times(V: list) -> None:
    assert not theory.convex_increments(V)
    with pytest.raises(ValueError, match="convex"):
        theory.convex_at_least(V, F(1, 2), 1)
    with pytest.raises(ValueError, match="convex"):
        theory.first_step_point_convex(V)


def test_staircase_on_the_papers_grid() -> None:
    grid = theory.PAPER_ACCEPTANCES
    assert len(grid) == 11 and grid[0] == F(1, 5) and grid[-1] == F(49, 50)
    assert list(grid) == sorted(grid)
    # V = (4, 5, 7): k* = 0 up to 1/4, 1 up to (1 + sqrt 11)/5 = 0.863, then 2
    assert theory.staircase([F(4), F(5), F(7)]) == [(a, 0 if a <= F(1, 4) else 1 if a < F(863, 1000) else 2)
                                                     for a in grid]
    assert [k for _, k in theory.staircase([F(4), F(5), F(7)], [F(0), F(99, 100)])] == [0, 2]


def test_bracket() -> None:
    b = Bracket(F(1, 3), F(1, 3))
    assert b.exact and b.value == F(1, 3) and float(b) == 1 / 3 and F(1, 3) in b and F(1, 2) not in b
    assert repr(b) == "Bracket(1/3)"
    c = Bracket(F(1, 4), F(1, 2))
    assert not c.exact and c.value is None and float(c) == 0.375 and F(1, 4) in c and F(1, 2) in c
    assert repr(c) == "Bracket(~0.375)"


def test_a_single_step_time() -> None:
    """kmax = 0: plain decoding only."""
    assert theory.best_draft_length([F(3)], F(9, 10)) == 0
    assert theory.speedup([F(3)], F(9, 10), 0) == 1
    assert theory.throughput([F(3)], F(1, 2), 0) == F(1, 3)

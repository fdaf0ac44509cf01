"""Property tests of the staircase theory (Section 3.2-3.3, Appendix B.1, B.3) on random positive rational V."""

from fractions import Fraction as F

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moespec import theory

positive = st.builds(F, st.integers(1, 60), st.integers(1, 12))
step_times = st.lists(positive, min_size=2, max_size=9)  # kmax <= 8
acceptance = st.builds(F, st.integers(0, 999), st.just(1000))
GRID = [F(p, 240) for p in range(240)]  # fine exact grid of [0, 1)


def brute_kstar(V, a):
    T = [theory.geometric_sum(a, k) / V[k] for k in range(len(V))]
    return T.index(max(T))


@settings(max_examples=60, deadline=None)
@given(step_times)
def test_kstar_is_monotone_staircase(V):
    ks = [theory.best_draft_length(V, a) for a in GRID]
    assert ks == sorted(ks)
    assert ks == [brute_kstar(V, a) for a in GRID]


@settings(max_examples=60, deadline=None)
@given(step_times)
def test_step_points_match_brute_force(V):
    points = theory.step_points(V)
    assert len(points) == len(V) - 1
    for lower, upper in zip(points, points[1:]):  # nested sets {k* >= j}: a_1 <= a_2 <= ...
        assert lower.lo <= upper.hi
    probes = {a: theory.best_draft_length(V, a) for a in GRID + [x for p in points for x in (p.lo, p.hi) if x < 1]}
    for j, p in enumerate(points, start=1):
        assert 0 <= p.lo <= p.hi <= 1 and p.hi - p.lo <= F(1, 2**50)
        for a, k in probes.items():
            if a > p.hi:
                assert k >= j, (V, j, a)
            elif a < p.lo:
                assert k < j, (V, j, a)
            elif p.exact and a == p.value and a > 0:
                assert k < j  # the set {k* >= j} is open at a positive step point


@settings(max_examples=40, deadline=None)
@given(step_times)
def test_staircase_intervals_agree_with_kstar(V):
    k0, steps = theory.staircase_intervals(V)
    assert k0 == brute_kstar(V, F(0))
    assert [s.k for s in steps] == sorted({s.k for s in steps})
    for a in GRID[1:]:
        inside = [s.k for s in steps if s.lo.hi < a <= s.hi.lo]
        if inside:
            assert inside == [theory.best_draft_length(V, a)]


@settings(max_examples=60, deadline=None)
@given(positive, st.lists(st.builds(F, st.integers(0, 30), st.integers(1, 6)), min_size=1, max_size=8), acceptance)
def test_convex_criterion_equals_brute_force(V0, increments, a):
    c = sorted(increments)  # 0 <= c_1 <= c_2 <= ...: V convex and non-decreasing
    V = [V0]
    for x in c:
        V.append(V[-1] + x)
    assert theory.convex_increments(V)
    k = brute_kstar(V, a)
    for j in range(1, len(V)):
        assert theory.convex_at_least(V, a, j) == (k >= j)
    a1 = theory.step_points(V)[0]
    assert a1.exact and a1.value == theory.first_step_point_convex(V)


@settings(max_examples=80, deadline=None)
@given(step_times, acceptance)
def test_speedup_condition_and_helps(V, a):
    T0 = theory.throughput(V, a, 0)
    for k in range(1, len(V)):
        assert theory.beats_plain(V, a, k) == (theory.throughput(V, a, k) > T0)
        assert theory.speedup(V, a, k) == theory.throughput(V, a, k) / T0
    assert theory.speculation_helps(V, a) == (theory.best_draft_length(V, a) >= 1)
    a0 = theory.first_draft_threshold(V)
    assert (theory.throughput(V, a, 1) > T0) == (a > a0)
    assert (theory.throughput(V, a, 1) == T0) == (a == a0)


def test_jump_example_of_appendix_b3():
    V = [1, 2, 2]
    assert theory.best_draft_length(V, F(1, 2)) == 0
    assert theory.best_draft_length(V, F(9, 10)) == 2
    assert all(theory.best_draft_length(V, F(p, 1000)) != 1 for p in range(1000))
    a1, a2 = theory.step_points(V)
    golden = (5**0.5 - 1) / 2  # 1 + a + a^2 = 2 at a = (sqrt 5 - 1)/2: irrational, returned as a bracket
    assert not a1.exact and a1 == a2 and abs(float(a1) - golden) < 1e-12
    k0, steps = theory.staircase_intervals(V)
    assert k0 == 0 and [s.k for s in steps] == [0, 2]


def test_step_points_exact_where_rational():
    V = [F(1), F(3, 2), F(2), F(5, 2)]  # linear: a_1 = c_1/V(0) = 1/2
    points = theory.step_points(V)
    assert points[0].exact and points[0].value == F(1, 2)
    # T_a(2) > T_a(1) <=> (1+a+a^2)/2 > (1+a)/(3/2) <=> 3a^2 - a - 1 > 0: root (1+sqrt 13)/6, irrational
    assert not points[1].exact and abs(float(points[1]) - (1 + 13**0.5) / 6) < 1e-12
    # a root with a large denominator is still recognized exactly: V(1)/V(0) - 1 = 123456/1000003
    V = [F(1000003), F(1123459)]
    assert theory.step_points(V)[0].value == F(123456, 1000003)
    # no acceptance makes k = 1 worth it: V(1) >= 2 V(0) -> a_1 = 1
    assert theory.step_points([1, 2])[0].value == 1


def test_float_inputs_and_numpy_acceptances():
    V = [1.0, 1.3, 1.7, 2.2]
    acc = np.linspace(0, 0.99, 100)
    ks = theory.best_draft_length(V, acc)
    assert ks.shape == acc.shape and np.all(np.diff(ks) >= 0)
    exact = [theory.best_draft_length([F(v) for v in V], F(a)) for a in acc]
    assert list(ks) == exact
    assert np.allclose(theory.speedup(V, acc, 2), (1 + acc + acc**2) * 1.0 / 1.7)
    assert abs(float(theory.step_points(V)[0]) - 0.3) < 1e-12


@pytest.mark.parametrize(
    "V, a",
    [([1, 0], F(1, 2)), ([1, -2], F(1, 2)), ([1], F(1, 2)), ([1, 2], F(1)), ([1, 2], F(-1, 10)), ([1, "x"], 0)],
)
def test_invalid_inputs_raise(V, a):
    with pytest.raises(ValueError):
        theory.best_draft_length(V, a)
        theory.step_points(V)

"""Non-geometric acceptance (moespec.theory.profile): a constant profile is the geometric case exactly (property
tests on Fractions), a decreasing profile drafts less, the estimate from step records, domain errors."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moespec import theory

fractions = st.fractions(min_value=Fraction(1, 50), max_value=5, max_denominator=50)
acceptances = st.fractions(min_value=0, max_value=Fraction(49, 50), max_denominator=50)


@settings(max_examples=150, deadline=None)
@given(st.lists(fractions, min_size=2, max_size=9), acceptances)
def test_a_constant_profile_is_the_geometric_case(V, a):
    profile = [a] * (len(V) - 1)
    assert theory.best_draft_length_for(V, profile) == theory.best_draft_length(V, a)
    for k in range(len(V)):
        assert theory.expected_tokens(profile, k) == theory.geometric_sum(a, k)
        assert theory.profile_speedup(V, profile, k) == theory.speedup(V, a, k)
        assert theory.profile_beats_plain(V, profile, k) == theory.beats_plain(V, a, k)
        assert theory.profile_throughput(V, profile, k) == theory.throughput(V, a, k)


@settings(max_examples=150, deadline=None)
@given(st.lists(fractions, min_size=2, max_size=9), st.lists(acceptances, min_size=8, max_size=8))
def test_k_star_maximizes_the_profile_throughput(V, profile):
    k = theory.best_draft_length_for(V, profile)
    T = [theory.expected_tokens(profile, i) / V[i] for i in range(len(V))]
    assert T[k] == max(T) and all(t < T[k] for t in T[:k])  # the smallest maximizer, exactly


def test_a_draft_that_drifts_drafts_less():
    V = [Fraction(10), *(Fraction(10) + Fraction(3, 2) * k for k in range(1, 9))]
    flat = [Fraction(4, 5)] * 8
    drifting = [Fraction(4, 5) * Fraction(9, 10) ** j for j in range(8)]  # a_1 = 0.8, then 10% worse each position
    assert theory.best_draft_length_for(V, drifting) < theory.best_draft_length_for(V, flat)
    assert theory.expected_tokens([1, 1, 1], 3) == 4
    assert theory.expected_tokens([Fraction(1, 2), 0, 1], 3) == Fraction(3, 2)


def test_estimate_from_steps():
    steps = [(3, 3), (3, 1), (3, 0), (2, 2), (1, 0)]  # (drafted, accepted)
    got = theory.estimate_profile(steps, 3)
    # position 1: every step tested it, 3 passed; position 2: steps with drafted >= 2 and accepted >= 1: (3,3),
    # (3,1), (2,2) -> passed (3,3), (2,2); position 3: (3,3) only, passed
    assert got == [3 / 5, 2 / 3, 1.0]
    assert theory.estimate_profile([], 2) == [None, None]
    assert theory.estimate_profile([], 2, prior=(1, 1)) == [0.5, 0.5]
    rng = np.random.default_rng(0)  # geometric at 0.7: every position estimates 0.7
    draws = []
    for _ in range(4000):
        j = 0
        while j < 4 and rng.random() < 0.7:
            j += 1
        draws.append((4, j))
    assert np.allclose(theory.estimate_profile(draws, 4), 0.7, atol=0.03)


@pytest.mark.parametrize("call, needle", [
    (lambda: theory.expected_tokens([0.5, 1.5], 2), "profile: position 2"),
    (lambda: theory.expected_tokens([0.5], 2), "a draft of k = 2 needs 2"),
    (lambda: theory.best_draft_length_for([1, 2, 3], [0.5]), "needs 2"),
    (lambda: theory.estimate_profile([(1, 2)], 2), "accepted 2 outside"),
    (lambda: theory.estimate_profile([], -1), "kmax"),
    (lambda: theory.profile_speedup([1, 0], [0.5], 1), r"V\(1\) = 0"),
])
def test_domain_errors_name_the_argument(call, needle):
    with pytest.raises(ValueError, match=needle):
        call()

"""The theory API checks its domain (issue 14, class 5): acceptances in [0, 1) (G_a(k) also at a = 1), draft
lengths in 0..kmax, positive finite step times, reuse in [0, 1], bytes >= 0; a ValueError naming the argument
otherwise. Examples, then property tests (hypothesis) over random arguments inside and outside the domain."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from moespec import theory

V = [Fraction(1), Fraction(2), Fraction(2)]


@pytest.mark.parametrize("call, needle", [
    (lambda: theory.best_draft_length(V, float("nan")), "acceptance a = nan"),
    (lambda: theory.best_draft_length(V, np.array([0.5, np.nan])), "acceptance a"),
    (lambda: theory.speedup(V, 1.5, 1), "acceptance a = 1.5"),
    (lambda: theory.speedup(V, 0.5, -1), "draft length k = -1"),
    (lambda: theory.speedup(V, 0.5, 3), "draft length k = 3 is outside 0..2"),
    (lambda: theory.geometric_sum(2, 3), "acceptance a = 2 is outside [0, 1]"),
    (lambda: theory.geometric_sum(0.5, -1), "draft length k = -1"),
    (lambda: theory.beats_plain(V, 2, 1), "acceptance a = 2"),
    (lambda: theory.throughput(V, 0.5, 5), "draft length k = 5"),
    (lambda: theory.mean_drafted_reuse([[None, 0, 5]], [1], 1), "reuse rho[0][2] = 5"),
    (lambda: theory.mean_drafted_reuse([[None, 0, 0.5]], [1], 2), "k = 2 needs n up to 3"),
    (lambda: theory.mean_drafted_reuse([[None, 0, 0.5]], [-1], 1), "expert bytes w"),
    (lambda: theory.reuse_threshold_bytes(0.5, 1, -1, 1, [1, 1]), "bytes mW = -1"),
    (lambda: theory.reuse_threshold_bytes(0.5, 1, 1, float("nan"), [1, 1]), "bytes D = nan"),
    (lambda: theory.reuse_threshold_bytes(0.5, 2, 1, 1, [1, 1]), "k in 1..1"),
])
def test_out_of_domain_raises_value_error_naming_the_argument(call, needle):
    with pytest.raises(ValueError, match=needle.replace("[", r"\[").replace("(", r"\(").replace(".", r"\.")):
        call()


def test_the_domain_ends_still_compute():
    assert theory.geometric_sum(1, 3) == 4  # a draft that is always accepted: k + 1 tokens a step
    assert theory.geometric_sum(0, 3) == 1 and theory.best_draft_length(V, 0) == 0
    assert theory.speedup(V, Fraction(9, 10), 2) == Fraction(271, 200)
    np.testing.assert_array_equal(theory.best_draft_length(V, np.array([0.0, 0.9])), [0, 2])
    assert theory.mean_drafted_reuse([[None, 0, 0.5, 1]], [3], 2) == Fraction(3, 4)


# -- property tests (hypothesis): every call inside the domain computes, every call outside raises ValueError --

PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
ANY_NUMBER = st.one_of(st.floats(allow_nan=True, allow_infinity=True, width=64), st.integers(-10, 10),
                       st.fractions(min_value=-3, max_value=3, max_denominator=50))
STEP_TIMES = st.lists(st.one_of(st.fractions(min_value=Fraction(1, 100), max_value=100, max_denominator=100),
                                st.sampled_from([Fraction(0), Fraction(-1)])), min_size=1, max_size=6)


def _in_unit(a, closed: bool) -> bool:
    try:
        return bool(np.isfinite(float(a))) and 0 <= a and (a <= 1 if closed else a < 1)
    except (TypeError, OverflowError):
        return False


@PROPERTY
@given(V=STEP_TIMES, a=ANY_NUMBER, k=st.integers(-3, 9))
def test_any_inputs_compute_or_raise_value_error(V, a, k):
    """For random step times, acceptances and draft lengths: the call computes when every argument is in its
    domain (positive step times, a in [0, 1), k in 0..kmax) and raises ValueError otherwise, never another
    exception."""
    in_domain = all(v > 0 for v in V) and _in_unit(a, closed=False)
    for name, call, needs_k in (("best_draft_length", lambda: theory.best_draft_length(V, a), False),
                                ("speedup", lambda: theory.speedup(V, a, k), True),
                                ("throughput", lambda: theory.throughput(V, a, k), True),
                                ("beats_plain", lambda: theory.beats_plain(V, a, k), True)):
        ok = in_domain and (not needs_k or 0 <= k <= len(V) - 1)
        if ok:
            call()
        else:
            with pytest.raises(ValueError):
                call()


@PROPERTY
@given(a=ANY_NUMBER, k=st.integers(-3, 40))
def test_geometric_sum_domain(a, k):
    """G_a(k): a in [0, 1] (a = 1 allowed: k + 1 tokens a step) and k >= 0, else ValueError."""
    if _in_unit(a, closed=True) and k >= 0:
        g = theory.geometric_sum(a, k)
        assert 1 <= g <= k + 1
    else:
        with pytest.raises(ValueError):
            theory.geometric_sum(a, k)

"""The theory API checks its domain (issue 14, class 5 in part): acceptances in [0, 1) (G_a(k) also at a = 1),
draft lengths in 0..kmax, reuse in [0, 1], bytes >= 0; a ValueError naming the argument otherwise."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

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

"""moespec.demo's sizing of the scored grid by the verify-only run's pass times (the whole demo runs in
test_cli_theory, test_lost_work and test_level)."""

from __future__ import annotations

import pytest

from moespec import demo as D
from moespec import theory


def verify_times(slot: list[float], dedup: list[float]) -> dict:
    return {"verify_time_s": {"slot": {str(n): t for n, t in enumerate(slot, 1)},
                              "dedup": {str(n): t for n, t in enumerate(dedup, 1)}}}


def test_the_scored_grid_decodes_as_many_prompts_as_fit_its_seconds():
    """Equal pass times t at every n: a prompt costs 3 policies x (plain decoding's TOKENS + KMAX + 1 passes + at
    each k the mean over the paper's acceptances of TOKENS / G_a(k) passes) x t; the prompts are the seconds over
    that, within [MIN, MAX]."""
    kmax = 8
    steps = sum(sum(D.ENGINE_TOKENS / float(theory.geometric_sum(float(a), k)) for a in theory.PAPER_ACCEPTANCES)
                / len(theory.PAPER_ACCEPTANCES) for k in range(kmax + 1))
    per_t = 3 * (D.ENGINE_TOKENS + D.KMAX + 1 + steps)
    for want in (D.ENGINE_MIN_PROMPTS, 11, 17, D.ENGINE_PROMPTS):
        t = D.ENGINE_DECODE_S / per_t / (want + 0.5)
        assert D.scored_prompts(verify_times([t] * 9, [t] * 9), kmax) == want
    assert D.scored_prompts(verify_times([1e-6] * 9, [1e-6] * 9), kmax) == D.ENGINE_PROMPTS  # a fast CPU: all
    assert D.scored_prompts(verify_times([10.0] * 9, [10.0] * 9), kmax) == D.ENGINE_MIN_PROMPTS  # never fewer


def test_auto_costs_the_faster_kernel_of_each_size():
    """Slot slow at every n and dedup fast: AUTO prices at dedup's times, so the prompts are those of a grid of
    one slow and two fast policies; swapping the kernels gives the same count."""
    kmax, scale = 8, D.ENGINE_DECODE_S / 90  # passes of 30 and 100 ms against 90 s of decoding
    slow, fast = 0.1 * scale, 0.03 * scale
    one_slow = D.scored_prompts(verify_times([slow] * 9, [fast] * 9), kmax)
    assert one_slow == D.scored_prompts(verify_times([fast] * 9, [slow] * 9), kmax)
    assert D.scored_prompts(verify_times([fast] * 9, [fast] * 9), kmax) > one_slow > \
        D.scored_prompts(verify_times([slow] * 9, [slow] * 9), kmax)


@pytest.mark.parametrize("kmax", [1, 3])
def test_a_smaller_grid_reads_only_its_sizes(kmax):
    """kmax + 1 pass sizes are read: a slow n past them changes nothing."""
    base = [0.03] * (kmax + 1)
    assert D.scored_prompts(verify_times(base + [9.0], base + [9.0]), kmax) == \
        D.scored_prompts(verify_times(base, base), kmax)

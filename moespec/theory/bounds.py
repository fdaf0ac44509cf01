"""Error bounds of Table 2 (paper Section 3.5, Appendix C): how a bandwidth error moves each prediction.

Physics first. Every bandwidth in the step time (5) is estimated as beta_hat = beta (1 + e) with |e| <= eps < 1
and every other term exact. A memory term M/beta then moves by at most eps/(1-eps) of itself, so a verify time
moves by at most that share of its memory part (17). The saving is a difference of two expert times and its
error is bounded by the SUM of both (18): relative to the saving it is amplified without limit near the
crossover. Which kernel is faster is decided where ln r and ln u are further apart than the worst
distortion of r, ln((1+eps)/(1-eps)) (19). A relative error delta on every step time costs at most a share
2 delta/(1+delta) of the best throughput (20) and moves the best speedup by a factor within (21); a common
factor on every V(k) leaves k* unchanged. From bandwidth errors alone delta = eps/(1-eps).
"""

from __future__ import annotations

import math
from typing import Sequence

from moespec import ArgumentError
from moespec.arguments import real, show
from moespec.theory.core import Number, best_draft_length, check_acceptance, check_step_times, q, throughput


def _check_eps(eps: Number, limit: Number = 1) -> None:
    if not 0 <= real("bandwidth error bound eps", eps) < limit:
        raise ArgumentError(f"bandwidth error bound eps = {show(eps)} must lie in [0, {limit})")


EPS_LIMIT = 0.5  # (21) needs delta = eps/(1-eps) < 1, i.e. eps < 1/2


def delta_from_eps(eps: Number) -> Number:
    """delta = eps/(1 - eps): the relative step-time error that bandwidth errors |e| <= eps can cause."""
    _check_eps(eps)
    return eps / q(1 - eps)


def verify_time_bound(eps: Number, memory_time: Number) -> Number:
    """(17): |tau_hat_p(n) - tau_p(n)| <= eps/(1-eps) M_p(n), M_p(n) = D(n)/beta_D + E_p(n)/beta_p(n)."""
    real("memory_time", memory_time, least=0)
    return delta_from_eps(eps) * memory_time


def saving_bound(eps: Number, expert_time_slot: Number, expert_time_dedup: Number) -> Number:
    """(18): |S_hat(n) - S(n)| <= eps/(1-eps) (M^e_slot(n) + M^e_dedup(n)), M^e_p = E_p(n)/beta_p(n)."""
    real("expert_time_slot", expert_time_slot, least=0)
    real("expert_time_dedup", expert_time_dedup, least=0)
    return delta_from_eps(eps) * (expert_time_slot + expert_time_dedup)


def kernel_margin(u: float, r: float, eps: float) -> float:
    """(19): |ln r(n) - ln u(n)| - ln((1+eps)/(1-eps)). Positive: the predicted and the true faster kernel
    agree (r may be the estimate or the truth: each is within that factor of the other)."""
    _check_eps(eps)
    u, r = real("u", u, positive=True), real("r", r, positive=True)
    return abs(math.log(r) - math.log(u)) - math.log((1 + eps) / (1 - eps))


def throughput_floor(delta: Number) -> Number:
    """(20): T_a(k_hat*) >= (1-delta)/(1+delta) T_a(k*) when (1-delta)V <= V_hat <= (1+delta)V at every k."""
    _check_eps(delta)
    return (1 - delta) / q(1 + delta)


def throughput_loss_bound(delta: Number) -> Number:
    """(20): the throughput lost by drafting k_hat* instead of k* is at most 2 delta/(1+delta) of the best."""
    _check_eps(delta)
    return 2 * delta / q(1 + delta)  # = 1 - (1-delta)/(1+delta), without the cancellation at small delta


def separated(V: Sequence[Number], a: Number, delta: Number) -> bool:
    """(20): k_hat* = k* is guaranteed when ((1+delta)/(1-delta)) T_a(i) < T_a(k*) for every i != k*.

    The condition is symmetric: checked on the predicted V_hat it equally guarantees that k_hat* is the true
    best, since T and T_hat are within the factors 1/(1+delta) and 1/(1-delta) of each other."""
    _check_eps(delta)
    V = check_step_times(V)
    check_acceptance(a)
    best = best_draft_length(V, a)
    top = throughput(V, a, best)
    factor = (1 + delta) / q(1 - delta)
    return all(factor * throughput(V, a, i) < top for i in range(len(V)) if i != best)


def speedup_band(speedup_hat: Number, delta: Number) -> tuple[Number, Number]:
    """(21): the true best speedup T_a(k*)/T_a(0) lies in speedup_hat x [(1-delta)/(1+delta), (1+delta)/(1-delta)],
    where speedup_hat = T_hat_a(k_hat*)/T_hat_a(0)."""
    real("speedup_hat", speedup_hat, positive=True)
    floor = throughput_floor(delta)
    return speedup_hat * floor, speedup_hat / floor

"""Non-geometric acceptance: the theory of Section 3 for a per-position acceptance PROFILE (beyond the paper;
its second open extension, real draft models).

Physics first. A real draft is not accepted geometrically: its first token is easier to get right than its fifth
(the draft drifts from the target the longer it runs alone). Write a_j for the probability that drafted token j is
accepted given that tokens 1..j-1 were. A step drafting k tokens then emits

    G(k) = 1 + a_1 + a_1 a_2 + ... + a_1 a_2 ... a_k                                              (B.1, profile)

tokens on average (the target's own token always, drafted token j when the first j all pass), and everything the
paper derives from G_a carries over with G in its place: throughput T(k) = G(k)/V(k), the best draft length
k* = the smallest maximizer of T, the speedup G(k) V(0)/V(k) (9) and the speedup condition V(k) - V(0) <
(G(k) - 1) V(0) (8). A constant profile a_j = a is the geometric case exactly (G(k) = G_a(k)); the property
tests check that reduction. What does not carry over is the staircase in one variable a: a profile has kmax of
them, so k* is computed per profile, not read off step points.

Estimating a profile from decoding (estimate_profile): step records (drafted k, accepted j) give, per position
j, the steps that tested token j (those with k >= j that accepted j - 1) and those that passed it (accepted >= j);
a_j is their ratio, the maximum-likelihood estimate of the conditional acceptance. The online policy
(moespec.model.adaptive) keeps a Beta posterior per position from the same counts.

Exact on ints and Fractions (ties decided exactly), fast on floats. A profile entry may be 1 (a position the
draft never misses): G stays finite for finite k.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from fractions import Fraction

from moespec import ArgumentError
from moespec.arguments import items, reals, show, whole
from moespec.defaults import DRAFT_LIMIT
from moespec.theory.core import Number, check_acceptance, check_draft_length, check_step_times, q


def check_profile(profile: Sequence[Number], k: int | None = None) -> list[Number]:
    """The profile as a list (ints as Fractions), each a_j in [0, 1], at least `k` entries when given; raises
    ValueError naming the argument and position."""
    profile = items("profile", profile)
    if k is not None:
        check_draft_length(k)
    for j, a in enumerate(profile, start=1):
        try:
            check_acceptance(a, closed=True)
        except ValueError as e:
            raise ArgumentError(f"profile: position {j}: {e}") from None
    if k is not None and len(profile) < k:
        raise ArgumentError(f"profile: {len(profile)} positions, a draft of k = {k} needs {k}")
    return [q(a) for a in profile]


def expected_tokens(profile: Sequence[Number], k: int) -> Number:
    """G(k) = 1 + a_1 + a_1 a_2 + ... + a_1 ... a_k, the tokens a step drafting k emits on average."""
    check_draft_length(k)
    profile = check_profile(profile, k)
    total, survive = Fraction(1), Fraction(1)
    for a in profile[:k]:
        survive = survive * a
        total = total + survive
    return total


def profile_throughput(V: Sequence[Number], profile: Sequence[Number], k: int) -> Number:
    """T(k) = G(k)/V(k) for the profile (tokens per unit of V's time)."""
    V = check_step_times(V)
    check_draft_length(k, V)
    return expected_tokens(profile, k) / q(V[k])


def best_draft_length_for(V: Sequence[Number], profile: Sequence[Number]) -> int:
    """k*: the SMALLEST maximizer of T(k) = G(k)/V(k) over k = 0..kmax (the profile must cover kmax positions);
    exact ties on ints and Fractions."""
    V = check_step_times(V)
    profile = check_profile(profile, len(V) - 1)
    T = [profile_throughput(V, profile, k) for k in range(len(V))]
    return T.index(max(T))


def profile_speedup(V: Sequence[Number], profile: Sequence[Number], k: int) -> Number:
    """T(k)/T(0) = G(k) V(0)/V(k) (9, profile)."""
    V = check_step_times(V)
    check_draft_length(k, V)
    return expected_tokens(profile, k) * V[0] / q(V[k])


def profile_beats_plain(V: Sequence[Number], profile: Sequence[Number], k: int) -> bool:
    """(8) for the profile: T(k) > T(0) <=> V(k) - V(0) < (G(k) - 1) V(0)."""
    V = check_step_times(V)
    check_draft_length(k, V)
    return V[k] - V[0] < (expected_tokens(profile, k) - 1) * V[0]


def estimate_profile(steps: Iterable[tuple[int, int]], kmax: int, prior: tuple[float, float] = (0.0, 0.0)
                     ) -> list[float | None]:
    """a_1..a_kmax from step records (drafted, accepted): per position j, (passed + prior[0]) / (tested + prior[0]
    + prior[1]), passed = steps that accepted >= j, tested = steps that drafted >= j and accepted >= j - 1 (the
    maximum-likelihood estimate with prior (0, 0); a Beta(alpha, beta) prior gives its posterior mean). None where
    no step tested the position and there is no prior."""
    kmax = whole("kmax", kmax, 0, DRAFT_LIMIT)
    prior = reals("prior", prior, least=0)
    if len(prior) != 2:
        raise ArgumentError(f"prior: two pseudo-counts >= 0 (alpha, beta), got {show(prior)}")
    tested, passed = [0] * kmax, [0] * kmax
    for i, step in enumerate(items("steps", steps)):
        step = items(f"steps[{i}]", step)
        if len(step) != 2:
            raise ArgumentError(f"steps[{i}] must be a pair (drafted, accepted), got {show(step)}")
        drafted, accepted = whole(f"steps[{i}] drafted", step[0], 0), whole(f"steps[{i}] accepted", step[1], 0)
        if not 0 <= accepted <= drafted:
            raise ArgumentError(f"steps: accepted {accepted} outside 0..drafted {drafted}")
        for j in range(1, min(drafted, kmax) + 1):
            if accepted >= j - 1:
                tested[j - 1] += 1
                passed[j - 1] += accepted >= j
    alpha, beta = prior
    return [None if t + alpha + beta == 0 else (p + alpha) / (t + alpha + beta) for t, p in zip(tested, passed)]

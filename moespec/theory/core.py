"""Exact theory of speculative decoding on a step time V (paper Section 3, Appendices B and C).

Physics first. A step drafts k tokens and verifies k+1 in one pass; under geometric acceptance at rate a it
emits G_a(k) = 1 + a + ... + a^k tokens on average and costs V(k) seconds, so its throughput is
T_a(k) = G_a(k)/V(k). Everything here holds for ANY positive step-time vector V = (V(0), ..., V(kmax)):
measured times, the byte model, or the two-bandwidth time model (5).

Arithmetic. Every function is exact when its inputs are ints/`fractions.Fraction` (ties between draft lengths
are decided exactly) and fast on floats; `geometric_sum`, `throughput`, `speedup` and `best_draft_length`
also take numpy arrays of acceptances. Step points are roots of polynomials, irrational in general: they come
back as a certified `Bracket` (lo <= a_j <= hi, width <= 2^-50, found by bisection on exact integer signs)
that is exact (lo == hi) exactly when the step point is rational.

Contents, by equation: G_a (B.1); T_a, k*(a); speedup condition (8); speedup (9); a0 (B.4); speculation
helps (B.3); alpha_{k,i} and step points (B.31); convex criterion (10) and a_1 (B.36); the staircase as grid
and intervals. The time model and the deduplicating engine (5)-(16) are in `moespec.theory.dedup`, the error
bounds (17)-(21) in `moespec.theory.bounds`; `moespec.theory` re-exports all three.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from math import gcd, lcm
from typing import Sequence, Union

import numpy as np

from moespec import ArgumentError
from moespec.arguments import items, real, show, whole
from moespec.defaults import DIGITS_LIMIT, DRAFT_LIMIT

Number = Union[int, float, Fraction]

# The paper's acceptance grid: 11 values from 0.2 to 0.98 (Section 4). The paper names the ends and the
# count; the interior points are ours, denser near 1 where k* moves fastest.
PAPER_ACCEPTANCES: tuple[Fraction, ...] = tuple(
    Fraction(s) for s in ("0.2", "0.3", "0.4", "0.5", "0.6", "0.7", "0.8", "0.85", "0.9", "0.95", "0.98")
)

# Bisection stops once a bracket is this narrow (2^-50 < 1e-15), well inside the promised 1e-12.
BRACKET_BITS = 50


def _exact(*xs: object) -> bool:
    return all(isinstance(x, (int, Fraction)) and not isinstance(x, bool) for x in xs)


def q(x):
    """ints (numpy's too) become Fractions so that `/` stays exact; floats, Fractions and arrays pass through."""
    if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
        return Fraction(int(x))
    return float(x) if isinstance(x, np.floating) else x


def check_step_times(V: Sequence[Number], min_len: int = 1) -> list[Number]:
    """Return V as a list (ints as Fractions) after checking it holds min_len..DRAFT_LIMIT + 1 finite positive
    numbers (moespec.arguments.real)."""
    V = items("step times V", V)
    min_len = whole("min_len", min_len, 0, DRAFT_LIMIT + 1)
    if not min_len <= len(V) <= DRAFT_LIMIT + 1:
        raise ArgumentError(f"need {min_len}..{DRAFT_LIMIT + 1} step times (V(0), ..., V(kmax)), got {len(V)}")
    return [q(real(f"V({k})", v, positive=True)) for k, v in enumerate(V)]


def check_acceptance(a: Number | np.ndarray, closed: bool = False) -> None:
    """Acceptance must lie in [0, 1), the domain of geometric acceptance (at a = 1 no draft is ever rejected), or
    with `closed` in [0, 1] (G_1(k) = k + 1: a draft that is always accepted); NaN lies in neither. Compared
    exactly on ints and Fractions, elementwise on arrays; raises ValueError naming the argument."""
    if isinstance(a, np.ndarray):
        if a.dtype.kind not in "iuf":
            raise ArgumentError(f"acceptance a: an array of {a.dtype}, not of numbers")
        ok = bool(np.all((a >= 0) & ((a <= 1) if closed else (a < 1))))
    else:
        a = real("acceptance a", a)
        ok = 0 <= a <= 1 if closed else 0 <= a < 1
    if not ok:
        raise ArgumentError(f"acceptance a = {a} is outside [0, 1{']' if closed else ')'}")


def check_draft_length(k: int, V: Sequence[Number] | None = None) -> None:
    """A draft length k: an integer in 0..DRAFT_LIMIT and, given the step times V(0..kmax), at most kmax."""
    top = DRAFT_LIMIT if V is None else min(len(V) - 1, DRAFT_LIMIT)
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 0 <= k <= top:
        raise ArgumentError(f"draft length k = {show(k)} is outside 0..{top}")


def geometric_sum(a: Number | np.ndarray, k: int) -> Number | np.ndarray:
    """G_a(k) = 1 + a + ... + a^k = (1 - a^(k+1))/(1 - a), the expected tokens a step emits (B.1).

    Horner's form, so it is exact on Fractions and works elementwise on arrays. a in [0, 1], k in 0..DRAFT_LIMIT."""
    check_acceptance(a, closed=True)
    check_draft_length(k)
    a = q(a)
    g = a * 0 + 1
    for _ in range(k):
        g = 1 + a * g
    return g


def throughput(V: Sequence[Number], a: Number | np.ndarray, k: int) -> Number | np.ndarray:
    """T_a(k) = G_a(k)/V(k), tokens per unit of V's time (Section 1); a in [0, 1), k in 0..kmax."""
    V = check_step_times(V)
    check_acceptance(a)
    check_draft_length(k, V)
    return geometric_sum(a, k) / q(V[k])


def best_draft_length(V: Sequence[Number], a: Number | np.ndarray) -> int | np.ndarray:
    """k*(a): the SMALLEST maximizer of T_a(k) over k = 0..kmax (Section 1).

    Exact ties on ints/Fractions; on floats (or a numpy array of acceptances) the first maximum wins."""
    V = check_step_times(V)
    check_acceptance(a)
    if isinstance(a, np.ndarray) or not _exact(a, *V):
        acc = np.asarray(a, dtype=float)
        powers = acc[..., None] ** np.arange(len(V))
        T = np.cumsum(powers, axis=-1) / np.asarray(V, dtype=float)
        k = np.argmax(T, axis=-1)
        return k if isinstance(a, np.ndarray) else int(k)
    a, g, power, T = q(a), 0, 1, []
    for v in V:  # G_a(k) = G_a(k - 1) + a^k: T_a(k) for every k in one pass, V checked once
        g, power = g + power, power * a
        T.append(g / v)
    return T.index(max(T))


def speedup(V: Sequence[Number], a: Number | np.ndarray, k: int) -> Number | np.ndarray:
    """T_a(k)/T_a(0) = G_a(k) V(0)/V(k) (9); a in [0, 1), k in 0..kmax."""
    V = check_step_times(V)
    check_acceptance(a)
    check_draft_length(k, V)
    return geometric_sum(a, k) * V[0] / q(V[k])


def beats_plain(V: Sequence[Number], a: Number, k: int) -> bool:
    """Speedup condition (8): T_a(k) > T_a(0) <=> V(k) - V(0) < (a + ... + a^k) V(0); a in [0, 1), k in 0..kmax."""
    V = check_step_times(V)
    check_acceptance(a)
    check_draft_length(k, V)
    return V[k] - V[0] < (geometric_sum(a, k) - 1) * V[0]


def speculation_helps(V: Sequence[Number], a: Number) -> bool:
    """(B.3): k*(a) >= 1 <=> some k in 1..kmax satisfies (8)."""
    V = check_step_times(V)
    check_acceptance(a)
    return any(beats_plain(V, a, k) for k in range(1, len(V)))


def first_draft_threshold(V: Sequence[Number]) -> Number:
    """a0 = V(1)/V(0) - 1 (B.4): one draft beats none exactly when a > a0 (a0 may fall outside [0, 1))."""
    V = check_step_times(V, min_len=2)
    return V[1] / q(V[0]) - 1


def _as_fraction(x: Number) -> Fraction:
    return x if isinstance(x, Fraction) else Fraction(x)


@dataclass(frozen=True)
class Bracket:
    """A certified enclosure lo <= x <= hi of a real number; exact (lo == hi) when x is known exactly."""

    lo: Fraction
    hi: Fraction

    @property
    def exact(self) -> bool:
        return self.lo == self.hi

    @property
    def value(self) -> Fraction | None:
        """The exact value, or None when only the bracket is known (x is then irrational)."""
        return self.lo if self.exact else None

    def __float__(self) -> float:
        return float((self.lo + self.hi) / 2)

    def __contains__(self, x: Fraction) -> bool:
        return self.lo <= x <= self.hi

    def __repr__(self) -> str:
        return f"Bracket({self.lo})" if self.exact else f"Bracket(~{float(self):.15g})"


class _Crossing:
    """alpha_{k,i}: the least acceptance above which draft length k beats i (Appendix B.3).

    T_a(k) > T_a(i) <=> Q(a) = V(i) P_k(a) - V(k) P_i(a) > 0, and Q/P_i is strictly increasing on [0, 1)
    (B.26), so Q changes sign at most once, from <= 0 to > 0. Q is scaled to integer coefficients and signs are
    evaluated exactly at dyadic points p/2^b. A rational root p/q has q | (leading coefficient) (rational root
    theorem), so once the bracket is narrower than 1/(2 q_max^2) the closest fraction with denominator <= q_max
    is the only rational candidate; testing it exactly decides rational vs irrational.
    """

    def __init__(self, V: Sequence[Fraction], k: int, i: int):
        vi, vk = V[i], V[k]
        scale = lcm(vi.denominator, vk.denominator)
        ci, ck = int(vi * scale), int(vk * scale)
        if max(ci, ck) >= 10**DIGITS_LIMIT:
            raise ArgumentError(f"V({i}) and V({k}) on their common denominator are integers of more than "
                                f"{DIGITS_LIMIT} digits, past what the exact step points take (DIGITS_LIMIT): round "
                                f"the step times")
        # coefficients of Q, low degree first: V(i) - V(k) for s <= i, V(i) for i < s <= k
        coeffs = [ci - ck] * (i + 1) + [ci] * (k - i)
        g = 0
        for c in coeffs:
            g = gcd(g, c)
        self.coeffs = [c // g for c in coeffs] if g else coeffs
        self.exact: Fraction | None = None
        self.num, self.bits = 0, 0  # bracket [num/2^bits, (num+1)/2^bits]
        if ci >= ck:  # Q(0) >= 0: T_a(k) > T_a(i) on (0, 1) at least, infimum 0
            self.exact = Fraction(0)
        elif vk * (i + 1) >= vi * (k + 1):  # the ratio G_a(k)/G_a(i) never exceeds its limit (k+1)/(i+1)
            self.exact = Fraction(1)
        else:
            self._locate()

    def _sign(self, x: int, bits: int) -> int:
        """Sign of Q(x / 2^bits), computed exactly in integers (Horner on Q(x/D) D^deg)."""
        D = 1 << bits
        deg = len(self.coeffs) - 1
        acc = self.coeffs[deg]
        scale = 1
        for s in range(deg - 1, -1, -1):
            scale *= D
            acc = acc * x + self.coeffs[s] * scale
        return (acc > 0) - (acc < 0)

    def _bisect_to(self, bits: int) -> None:
        while self.exact is None and self.bits < bits:
            mid, b = 2 * self.num + 1, self.bits + 1
            s = self._sign(mid, b)
            if s == 0:
                self.exact = Fraction(mid, 1 << b)
            elif s > 0:
                self.num, self.bits = 2 * self.num, b
            else:
                self.num, self.bits = mid, b

    def _locate(self) -> None:
        lead = abs(self.coeffs[-1])
        q_bits = 2 * lead.bit_length() + 2  # 2^-q_bits < 1/(2 lead^2): at most one candidate fits
        self._bisect_to(q_bits)
        if self.exact is None:
            lo = Fraction(self.num, 1 << self.bits)
            candidate = (lo + Fraction(1, 1 << (self.bits + 1))).limit_denominator(lead)
            if self._sign_at(candidate) == 0 and lo <= candidate <= lo + Fraction(1, 1 << self.bits):
                self.exact = candidate
        self._bisect_to(BRACKET_BITS)

    def _sign_at(self, x: Fraction) -> int:
        acc = Fraction(0)
        for c in reversed(self.coeffs):
            acc = acc * x + c
        return (acc > 0) - (acc < 0)

    def bracket(self) -> Bracket:
        if self.exact is not None:
            return Bracket(self.exact, self.exact)
        return Bracket(Fraction(self.num, 1 << self.bits), Fraction(self.num + 1, 1 << self.bits))

    def exclude(self, x: Fraction) -> None:
        """Refine until x lies outside the bracket (terminates: an inexact root is irrational, x rational)."""
        while self.exact is None and x in self.bracket():
            self._bisect_to(self.bits + 8)


def crossing_acceptance(V: Sequence[Number], k: int, i: int) -> Bracket:
    """alpha_{k,i} = inf{a in [0,1): T_a(k) > T_a(i)}, 1 if the set is empty, for i < k (Appendix B.3)."""
    V = [_as_fraction(v) for v in check_step_times(V, min_len=2)]
    k = whole("draft length k", k, 1, len(V) - 1)
    i = whole("draft length i", i, 0, k - 1)
    return _Crossing(V, k, i).bracket()


def step_points(V: Sequence[Number]) -> list[Bracket]:
    """[a_1, ..., a_kmax] by the max-min formula (B.31): a_j = max_{i<j} min_{k>=j} alpha_{k,i}.

    k*(a) >= j for a in (a_j, 1) and k*(a) < j for a in [0, a_j); a_j = 1 when no acceptance reaches j.
    Each a_j is a certified Bracket, exact when a_j is rational (then a_j equals one of the alpha_{k,i})."""
    V = [_as_fraction(v) for v in check_step_times(V, min_len=2)]
    K = len(V) - 1
    cross = {(k, i): _Crossing(V, k, i) for k in range(1, K + 1) for i in range(k)}
    # Separate each irrational alpha from every rational one, so bracket arithmetic below is exact on them.
    rationals = {c.exact for c in cross.values() if c.exact is not None}
    for c in cross.values():
        for x in rationals:
            c.exclude(x)
    points = []
    for j in range(1, K + 1):
        mins = []
        for i in range(j):
            bs = [cross[k, i].bracket() for k in range(j, K + 1)]
            mins.append(Bracket(min(b.lo for b in bs), min(b.hi for b in bs)))
        points.append(Bracket(max(b.lo for b in mins), max(b.hi for b in mins)))
    return points


def convex_increments(V: Sequence[Number]) -> bool:
    """True when 0 <= c_1 <= c_2 <= ... (c_i = V(i) - V(i-1)): V convex and non-decreasing, the case of (10)."""
    V = check_step_times(V)
    c = [V[i] - V[i - 1] for i in range(1, len(V))]
    return all(x >= 0 for x in c[:1]) and all(c[i] <= c[i + 1] for i in range(len(c) - 1))


def convex_at_least(V: Sequence[Number], a: Number, j: int) -> bool:
    """(10): for convex non-decreasing V, k*(a) >= j <=> a^j V(j-1) > G_a(j-1) c_j."""
    V = check_step_times(V, min_len=2)
    check_acceptance(a)
    j = whole("draft length j", j, 1, len(V) - 1)
    if not convex_increments(V):
        raise ArgumentError("criterion (10) needs 0 <= c_1 <= c_2 <= ... (V convex and non-decreasing)")
    return a**j * V[j - 1] > geometric_sum(a, j - 1) * (V[j] - V[j - 1])


def first_step_point_convex(V: Sequence[Number]) -> Number:
    """a_1 = min(c_1/V(0), 1) (B.36), valid when V is convex and non-decreasing."""
    V = check_step_times(V, min_len=2)
    if not convex_increments(V):
        raise ArgumentError("a_1 = min(c_1/V(0), 1) needs V convex and non-decreasing")
    return min((V[1] - V[0]) / q(V[0]), 1)


@dataclass(frozen=True)
class Step:
    """k*(a) = k for every acceptance a in the interval (lo, hi] (hi = 1 is excluded: a < 1)."""

    k: int
    lo: Bracket
    hi: Bracket


def staircase(V: Sequence[Number], acceptances: Sequence[Number] = PAPER_ACCEPTANCES) -> list[tuple[Number, int]]:
    """k*(a) on a grid of acceptances (default: the paper's 11 values 0.2..0.98)."""
    return [(a, best_draft_length(V, a)) for a in items("acceptances", acceptances)]


def staircase_intervals(V: Sequence[Number], points: Sequence[Bracket] | None = None) -> tuple[int, list[Step]]:
    """The whole staircase from the step points (`points`: step_points(V) when already computed, the costly part):
    (k*(0), [Step(k, a_k, a_{k+1}) for each k that occurs]).

    With a_0 = 0 and a_{kmax+1} = 1, k*(a) = k on (a_k, a_{k+1}]; a k with a_k == a_{k+1} never occurs,
    so the staircase jumps by more than one there (Appendix B.3, "Jumps"); equal brackets count as equal
    (two distinct step points closer than 2^-50 would lose the sliver between them). k*(0) is the smallest
    argmin of V."""
    V = check_step_times(V, min_len=2)
    if points is None:
        points = step_points(V)
    elif not isinstance(points, (list, tuple)) or len(points) != len(V) - 1 or \
            not all(isinstance(p, Bracket) for p in points):
        raise ArgumentError(f"points must be step_points(V): {len(V) - 1} brackets")
    pts = [Bracket(Fraction(0), Fraction(0)), *points, Bracket(Fraction(1), Fraction(1))]
    steps = [Step(k, pts[k], pts[k + 1]) for k in range(len(V)) if pts[k] != pts[k + 1]]
    return best_draft_length(V, 0), steps

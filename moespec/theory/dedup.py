"""The time model (5)-(7) and the deduplicating engine (11)-(16) (paper Sections 3.1 and 3.4, Appendix B.2).

Physics first. A verification pass of n tokens reads D(n) bytes whatever the routing (attention, dense parts,
key-value cache) at bandwidth beta_D, and E_p(n) expert bytes at the effective bandwidth beta_p(n) of its
expert kernel p: per-slot requests m n W bytes, deduplicating requests only the union of the experts the n
tokens select, E_dedup(n) = sum_l w_l U_l(n). Fewer bytes do not make a faster pass by themselves: the saving
(6) changes sign where the byte share u(n) = E_dedup/E_slot crosses the bandwidth ratio r(n) (7).

For a deduplicating engine (f_l = 1, h = 0) routing enters the step time only through the byte-weighted mean
reuse of the drafted tokens rho_bar_k (11), and draft length k beats plain decoding exactly when rho_bar_k
exceeds the reuse threshold rho*_k(a) (14); with one bandwidth and no fixed work that threshold is a pure byte
count (16). Exact on Fractions, plain arithmetic on floats.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from fractions import Fraction
from typing import Sequence

import numpy as np

from moespec.defaults import KERNELS
from moespec.theory.core import Number, geometric_sum, q


def verify_time(t0: Number, D_n: Number, beta_D: Number, E_n: Number, beta_n: Number, phi: Number = 0) -> Number:
    """tau_p(n) = t0 + D(n)/beta_D + E_p(n)/beta_p(n) + phi_p(n) (5)."""
    return t0 + D_n / q(beta_D) + E_n / q(beta_n) + phi


def saving(E_slot: Number, beta_slot: Number, u: Number, r: Number, dphi: Number = 0) -> Number:
    """S(n) = tau_slot(n) - tau_dedup(n) = (E_slot/beta_slot)(1 - u/r) - (phi_dedup - phi_slot) (6), f_l = 1."""
    return E_slot / q(beta_slot) * (1 - u / q(r)) - dphi


def dedup_faster(u: Number, r: Number) -> bool:
    """(7): with f_l = 1 and equal fixed work the deduplicating kernel is faster exactly when u(n) < r(n)."""
    return u < r


def _finite(x: object) -> bool:
    """A finite int, float or Fraction (not a bool)."""
    return isinstance(x, (int, float, Fraction, np.integer, np.floating)) and not isinstance(x, bool) and \
        bool(np.isfinite(float(x)))


def requested_bytes(kind: str, n: int, U: int, m: int, b: Number) -> Number:  # noqa: N803
    """Expert bytes one MoE layer's kernel of `kind` requests on a pass of n tokens naming U distinct experts, b
    bytes each: n m b per-slot ("slot"), U b deduplicating ("dedup") (3)."""
    if kind not in KERNELS:
        raise ValueError(f"kind must be 'slot' or 'dedup', got {kind!r}")
    return n * m * b if kind == "slot" else U * b


def crossover(saving: Mapping[int, Number]) -> int | None:
    """The crossover: the smallest n >= 2 from which the saving S(n) = tau_slot(n) - tau_dedup(n) is positive at
    every larger n given (None if none). n = 1 is left out: one token runs the per-slot kernel either way. The bench
    gives S(n) the sign of r(n) - u(n) (7), the plan its predicted saving, the engine its measured one."""
    first = None
    for n in sorted((n for n in saving if n >= 2), reverse=True):
        if not saving[n] > 0:
            break
        first = n
    return first


def mean_drafted_reuse(rho: Sequence[Sequence[Number]], w: Sequence[Number], k: int) -> Number:
    """rho_bar_k = (1/(kW)) sum_{j=2..k+1} sum_l w_l rho_l(j) (11).

    rho[l][n] is layer l's reuse at n consecutive tokens (entry 0 unused, rho[l][1] = 0); w[l] = w_l >= 0, not all
    0; each rho_l(j) used in [0, 1]."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"rho_bar_k needs a draft length k >= 1, got k = {k!r}")
    if any(not (_finite(w_l) and w_l >= 0) for w_l in w) or not sum(w) > 0:
        raise ValueError(f"expert bytes w must be finite, >= 0 and not all 0, got {list(w)}")
    for layer, rho_l in enumerate(rho):
        if len(rho_l) < k + 2:
            raise ValueError(f"rho[{layer}] holds reuse up to n = {len(rho_l) - 1}; k = {k} needs n up to {k + 1}")
        bad = [j for j in range(2, k + 2) if not (_finite(rho_l[j]) and 0 <= rho_l[j] <= 1)]
        if bad:
            raise ValueError(f"reuse rho[{layer}][{bad[0]}] = {rho_l[bad[0]]} is outside [0, 1]")
    W = sum(w)
    total = sum(w_l * sum(rho_l[j] for j in range(2, k + 2)) for w_l, rho_l in zip(w, rho, strict=True))
    return total / q(k * W)


def union_bytes(mW: Number, k: int, rho_bar_k: Number) -> Number:
    """E_dedup(k+1) = mW + mW k (1 - rho_bar_k) (12): one token's experts plus the new experts of k drafts."""
    return mW + mW * k * (1 - rho_bar_k)


@dataclass(frozen=True)
class DedupEngine:
    """A deduplicating engine's time model for the results of Section 3.4 (f_l = 1, h = 0).

    Per-k sequences are indexed by k = 0..kmax (entry 0 is the plain step: dD[0] = dphi[0] = 0).
      mW    bytes of one token's experts, m sum_l w_l
      tau1  V(0) = tau(1), the time of a plain one-token step
      beta1 beta(1), the expert bandwidth of a one-token pass (both kernels run the same one there)
      betaD bandwidth of the bytes read once per pass
      B     B_k = beta_dedup(k+1)
      dD    dD_k = D(k+1) - D(1)
      dphi  dphi_k = phi_dedup(k+1) - phi(1)
    """

    mW: Number
    tau1: Number
    beta1: Number
    betaD: Number
    B: Sequence[Number]
    dD: Sequence[Number]
    dphi: Sequence[Number]

    def __post_init__(self) -> None:  # ints become Fractions so that every result stays exact
        for f in fields(self):
            value = getattr(self, f.name)
            object.__setattr__(self, f.name, [q(x) for x in value] if isinstance(value, (list, tuple)) else q(value))

    def step_increase(self, k: int, rho_bar_k: Number) -> Number:
        """V(k) - V(0) = dD_k/beta_D + dphi_k + E_dedup(k+1)/B_k - mW/beta(1) (13), E_dedup from (12)."""
        if k == 0:
            return 0 * self.tau1
        E = union_bytes(self.mW, k, rho_bar_k)
        return self.dD[k] / self.betaD + self.dphi[k] + E / self.B[k] - self.mW / self.beta1

    def step_times(self, rho_bars: Sequence[Number]) -> list[Number]:
        """V(0..kmax) for the drafted reuse rho_bars = [rho_bar_1, ..., rho_bar_kmax]."""
        return [self.tau1] + [self.tau1 + self.step_increase(k, rb) for k, rb in enumerate(rho_bars, start=1)]

    def threshold(self, a: Number, k: int) -> Number:
        """Reuse threshold in time form (14): T_a(k) > T_a(0) <=> rho_bar_k > rho*_k(a), with
        rho*_k(a) = 1 - (B_k/(mW k)) [(G_a(k) - 1) tau(1) - dD_k/beta_D - dphi_k] - (1/k)(B_k/beta(1) - 1)."""
        if k < 1:
            raise ValueError("the reuse threshold needs k >= 1")
        B = self.B[k]
        slack = (geometric_sum(a, k) - 1) * self.tau1 - self.dD[k] / self.betaD - self.dphi[k]
        return 1 - B / (self.mW * k) * slack - (B / self.beta1 - 1) / k

    def speedup(self, a: Number, k: int, rho_bar_k: Number) -> Number:
        """T_a(k)/T_a(0) = G_a(k) V(0) / (V(0) + dD_k/beta_D + dphi_k + E_dedup(k+1)/B_k - mW/beta(1)) (15)."""
        return geometric_sum(a, k) * self.tau1 / (self.tau1 + self.step_increase(k, rho_bar_k))


def byte_step_times(mW: Number, D: Number, kv: Sequence[Number], rho_bars: Sequence[Number]) -> list[Number]:
    """One-bandwidth byte cost V_dedup(k) = D + E_dedup(k+1) + kv(k) (Appendix B.2), for k = 0..kmax.

    Any common bandwidth divides every V(k) alike and changes no comparison of throughputs."""
    return [D + mW + kv[0]] + [D + union_bytes(mW, k, rb) + kv[k] for k, rb in enumerate(rho_bars, start=1)]


def reuse_threshold_bytes(a: Number, k: int, mW: Number, D: Number, kv: Sequence[Number]) -> Number:
    """Reuse threshold with one bandwidth and t0 = phi = 0 (16):
    rho*_k(a) = 1 - [(G_a(k) - 1) V_dedup(0) - (kv(k) - kv(0))]/(mW k), V_dedup(0) = D + mW + kv(0);
    kv = [kv(0), ..., kv(kmax)] bytes of key-value cache a step verifying k+1 tokens reads."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1 or k >= len(kv):
        raise ValueError(f"the reuse threshold needs a draft length k in 1..{len(kv) - 1} (kv's), got k = {k!r}")
    for name, value in (("mW", mW), ("D", D), *((f"kv({j})", v) for j, v in enumerate(kv))):
        if not (_finite(value) and value >= 0):
            raise ValueError(f"bytes {name} = {value!r} must be finite and >= 0")
    if not mW > 0:
        raise ValueError(f"bytes mW = {mW!r} must be positive")
    V0 = D + mW + kv[0]
    return 1 - ((geometric_sum(a, k) - 1) * V0 - (kv[k] - kv[0])) / q(mW * k)

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
from typing import Sequence

import numpy as np

from moespec import ArgumentError
from moespec.arguments import is_real, items, real, reals, show, whole
from moespec.defaults import DRAFT_LIMIT, KERNELS
from moespec.theory.core import Number, check_draft_length, geometric_sum, q


def verify_time(t0: Number, D_n: Number, beta_D: Number, E_n: Number, beta_n: Number, phi: Number = 0) -> Number:
    """tau_p(n) = t0 + D(n)/beta_D + E_p(n)/beta_p(n) + phi_p(n) (5)."""
    for name, x in (("t0", t0), ("D_n", D_n), ("E_n", E_n), ("phi", phi)):
        real(name, x)
    real("beta_D", beta_D, positive=True)
    real("beta_n", beta_n, positive=True)
    return t0 + D_n / q(beta_D) + E_n / q(beta_n) + phi


def saving(E_slot: Number, beta_slot: Number, u: Number, r: Number, dphi: Number = 0) -> Number:
    """S(n) = tau_slot(n) - tau_dedup(n) = (E_slot/beta_slot)(1 - u/r) - (phi_dedup - phi_slot) (6), f_l = 1."""
    real("E_slot", E_slot, least=0)
    real("u", u, least=0)
    real("dphi", dphi)
    real("beta_slot", beta_slot, positive=True)
    real("r", r, positive=True)
    return E_slot / q(beta_slot) * (1 - u / q(r)) - dphi


def dedup_faster(u: Number, r: Number) -> bool:
    """(7): with f_l = 1 and equal fixed work the deduplicating kernel is faster exactly when u(n) < r(n)."""
    return real("u", u, least=0) < real("r", r, least=0)


def requested_bytes(kind: str, n: int, U: int, m: int, b: Number) -> Number:  # noqa: N803
    """Expert bytes one MoE layer's kernel of `kind` requests on a pass of n tokens naming U distinct experts, b
    bytes each: n m b per-slot ("slot"), U b deduplicating ("dedup") (3)."""
    if kind not in KERNELS:
        raise ArgumentError(f"kind must be 'slot' or 'dedup', got {show(kind)}")
    n, U, m = whole("n", n, 0), whole("U", U, 0), whole("m", m, 0)
    b = real("b", b, least=0)
    return n * m * b if kind == "slot" else U * b


def crossover(saving: Mapping[int, Number]) -> int | None:
    """The crossover: the smallest n >= 2 from which the saving S(n) = tau_slot(n) - tau_dedup(n) is positive at
    every larger n given (None if none). n = 1 is left out: one token runs the per-slot kernel either way. The bench
    gives S(n) the sign of r(n) - u(n) (7), the plan its predicted saving, the engine its measured one."""
    if not isinstance(saving, Mapping):
        raise ArgumentError(f"saving must map pass sizes n to savings, got {show(saving)}")
    for n, s in saving.items():
        whole("saving's pass size n", n, 1)
        real(f"saving[{n}]", s)
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
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= DRAFT_LIMIT:
        raise ArgumentError(f"rho_bar_k needs a draft length k in 1..{DRAFT_LIMIT}, got k = {show(k)}")
    w = items("expert bytes w", w)
    if any(not (is_real(w_l) and w_l >= 0) for w_l in w) or not sum(w) > 0:
        raise ArgumentError(f"expert bytes w must be finite, >= 0 and not all 0, got {show(w)}")
    rho = [items(f"rho[{layer}]", rho_l) for layer, rho_l in enumerate(items("rho", rho))]
    if len(rho) != len(w):
        raise ArgumentError(f"rho holds {len(rho)} layers, expert bytes w {len(w)}")
    for layer, rho_l in enumerate(rho):
        if len(rho_l) < k + 2:
            raise ArgumentError(f"rho[{layer}] holds reuse up to n = {len(rho_l) - 1}; k = {k} needs n up to {k + 1}")
        bad = [j for j in range(2, k + 2) if not (is_real(rho_l[j]) and 0 <= rho_l[j] <= 1)]
        if bad:
            raise ArgumentError(f"reuse rho[{layer}][{bad[0]}] = {show(rho_l[bad[0]])} is outside [0, 1]")
    W = sum(w)
    total = sum(w_l * sum(rho_l[j] for j in range(2, k + 2)) for w_l, rho_l in zip(w, rho, strict=True))
    return total / q(k * W)


def union_bytes(mW: Number, k: int, rho_bar_k: Number) -> Number:
    """E_dedup(k+1) = mW + mW k (1 - rho_bar_k) (12): one token's experts plus the new experts of k drafts."""
    real("mW", mW, least=0)
    check_draft_length(k)
    _check_reuse("rho_bar_k", rho_bar_k)
    return mW + mW * k * (1 - rho_bar_k)


def _check_reuse(name: str, rho: object) -> None:
    """A reuse: a number in [0, 1]."""
    if not 0 <= real(name, rho) <= 1:
        raise ArgumentError(f"reuse {name} = {show(rho)} is outside [0, 1]")


PER_K = ("B", "dD", "dphi")  # DedupEngine's sequences indexed by the draft length k


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
        positive = {"tau1", "beta1", "betaD", "B", "mW"}
        for f in fields(self):
            value, pos = getattr(self, f.name), f.name in positive
            value = reals(f.name, value, positive=pos) if f.name in PER_K else real(f.name, value, positive=pos)
            object.__setattr__(self, f.name, [q(x) for x in value] if f.name in PER_K else q(value))
        if not len(self.B) == len(self.dD) == len(self.dphi):
            raise ArgumentError(f"B, dD and dphi must each hold k = 0..kmax, got {len(self.B)}, {len(self.dD)}, "
                                f"{len(self.dphi)} entries")

    def _k(self, k: int, least: int = 0) -> int:
        """A draft length in least..kmax of this engine."""
        return whole("draft length k", k, least, len(self.B) - 1)

    def step_increase(self, k: int, rho_bar_k: Number) -> Number:
        """V(k) - V(0) = dD_k/beta_D + dphi_k + E_dedup(k+1)/B_k - mW/beta(1) (13), E_dedup from (12)."""
        if self._k(k) == 0:
            return 0 * self.tau1
        E = union_bytes(self.mW, k, rho_bar_k)
        return self.dD[k] / self.betaD + self.dphi[k] + E / self.B[k] - self.mW / self.beta1

    def step_times(self, rho_bars: Sequence[Number]) -> list[Number]:
        """V(0..kmax) for the drafted reuse rho_bars = [rho_bar_1, ..., rho_bar_kmax]."""
        rho_bars = items("rho_bars", rho_bars)
        if len(rho_bars) >= len(self.B):
            raise ArgumentError(f"rho_bars holds {len(rho_bars)} draft lengths, the engine {len(self.B) - 1}")
        return [self.tau1] + [self.tau1 + self.step_increase(k, rb) for k, rb in enumerate(rho_bars, start=1)]

    def threshold(self, a: Number, k: int) -> Number:
        """Reuse threshold in time form (14): T_a(k) > T_a(0) <=> rho_bar_k > rho*_k(a), with
        rho*_k(a) = 1 - (B_k/(mW k)) [(G_a(k) - 1) tau(1) - dD_k/beta_D - dphi_k] - (1/k)(B_k/beta(1) - 1)."""
        B = self.B[self._k(k, least=1)]
        slack = (geometric_sum(a, k) - 1) * self.tau1 - self.dD[k] / self.betaD - self.dphi[k]
        return 1 - B / (self.mW * k) * slack - (B / self.beta1 - 1) / k

    def speedup(self, a: Number, k: int, rho_bar_k: Number) -> Number:
        """T_a(k)/T_a(0) = G_a(k) V(0) / (V(0) + dD_k/beta_D + dphi_k + E_dedup(k+1)/B_k - mW/beta(1)) (15)."""
        self._k(k)
        return geometric_sum(a, k) * self.tau1 / (self.tau1 + self.step_increase(k, rho_bar_k))


def byte_step_times(mW: Number, D: Number, kv: Sequence[Number], rho_bars: Sequence[Number]) -> list[Number]:
    """One-bandwidth byte cost V_dedup(k) = D + E_dedup(k+1) + kv(k) (Appendix B.2), for k = 0..kmax.

    Any common bandwidth divides every V(k) alike and changes no comparison of throughputs."""
    real("mW", mW, least=0)
    real("D", D, least=0)
    kv, rho_bars = reals("kv", kv, least=0), items("rho_bars", rho_bars)
    if len(kv) <= len(rho_bars):
        raise ArgumentError(f"kv holds {len(kv)} entries, kv(0..kmax) for {len(rho_bars)} drafted reuses needs "
                            f"{len(rho_bars) + 1}")
    return [D + mW + kv[0]] + [D + union_bytes(mW, k, rb) + kv[k] for k, rb in enumerate(rho_bars, start=1)]


def reuse_threshold_bytes(a: Number, k: int, mW: Number, D: Number, kv: Sequence[Number]) -> Number:
    """Reuse threshold with one bandwidth and t0 = phi = 0 (16):
    rho*_k(a) = 1 - [(G_a(k) - 1) V_dedup(0) - (kv(k) - kv(0))]/(mW k), V_dedup(0) = D + mW + kv(0);
    kv = [kv(0), ..., kv(kmax)] bytes of key-value cache a step verifying k+1 tokens reads."""
    kv = items("kv", kv)
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1 or k >= len(kv):
        raise ArgumentError(f"the reuse threshold needs a draft length k in 1..{len(kv) - 1} (kv's), got k = "
                            f"{show(k)}")
    for name, value in (("mW", mW), ("D", D), *((f"kv({j})", v) for j, v in enumerate(kv))):
        if not (is_real(value) and value >= 0):
            raise ArgumentError(f"bytes {name} = {show(value)} must be finite and >= 0")
    if not mW > 0:
        raise ArgumentError(f"bytes mW = {show(mW)} must be positive")
    V0 = D + mW + kv[0]
    return 1 - ((geometric_sum(a, k) - 1) * V0 - (kv[k] - kv[0])) / q(mW * k)

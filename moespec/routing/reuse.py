"""Reuse statistics of a routing trace: rho_l(n), U_l(n) and the expert bytes they imply (paper Section 1, App. D.2).

Definitions. For layer l and a window of n consecutive tokens t .. t+n-1, the repeat count is
|S_{l,t+n-1} ∩ (S_{l,t} ∪ ... ∪ S_{l,t+n-2})| (how many of the last token's m experts an earlier token of the
window selected) and the union is X_{l,t}(n) = |S_{l,t} ∪ ... ∪ S_{l,t+n-1}|. The reuse (1) is
rho_l(n) = E[repeats]/m, rho_l(1) = 0, and U_l(n) = E X_{l,t}(n). By linearity, U_l(n) = m Σ_{j=1..n} (1 - rho_l(j))
(2) for every stationary process: a window's union grows by m minus the repeats each time it is extended by one
token.

Estimator (App. D.2). Over every window of n consecutive tokens inside one document (never across documents),
sum the repeat counts and divide by m x (number of windows); U_l(n) is the mean union over the same windows.
On a finite trace the two sides of (2) differ by edge effects (windows of different n cover slightly different
tokens); they agree exactly on a periodic trace whose documents start at every phase (tests check this).

Bytes. With w_l the bytes of one expert of layer l and W = Σ_l w_l: a per-slot kernel requests E_slot(n) = m n W, a
deduplicating one E_dedup(n) = Σ_l w_l U_l(n); their byte share is u(n) = E_dedup(n)/E_slot(n), the gap (3) is
E_slot(n) - E_dedup(n) = m Σ_l w_l Σ_{j=1..n} rho_l(j), and the mean reuse of a draft of length k is
rho_bar_k = (1/(kW)) Σ_{j=2..k+1} Σ_l w_l rho_l(j) (11). Here the gap is computed from rho by (3), so on a trace it
differs from E_slot - E_dedup by the same edge effects as (2).

Intervals. Bootstrap over documents (the paper: 2000 resamples). Each document contributes sufficient statistics:
per layer and n, its summed repeat counts, summed unions and window count. A resample draws D documents with
replacement; its statistics are (counts of each document) @ (per-document statistics), one matrix product for all
resamples, and every derived quantity is recomputed from them. Intervals are percentile intervals.

Speed. Expert sets are bitsets (moespec.formats.trace bitsets, ceil(N/64) uint64 words), so a window's union is an
OR accumulated as the window grows, and a repeat count a popcount of an AND. The trace is processed in chunks of
tokens, all layers at once (chunks small enough to stay in cache); per-document sums come from segment sums
between the offsets where windows of each length stop fitting in their document.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

import numpy as np

from moespec import ArgumentError, MoespecError
from moespec.arguments import real, reals, show, whole
from moespec.console import progress
from moespec.defaults import BOOTSTRAP_LIMIT, FORMAT, N_MAX, WINDOW_LIMIT
from moespec.formats.trace import Trace, chunk_masks, popcount
from moespec.model.spec import ModelSpec
from moespec.model.weights import check_format

DEFAULT_BOOTSTRAP = 2000  # resamples, as in App. D.2
DEFAULT_LEVEL = 0.95
# Tokens per chunk: [words, chunk, L] uint64 masks of a 48-layer, 128-expert model take ~1.5 MB, which stays in
# the L2/L3 cache; larger chunks fall out of it and run about twice as slow.
_CHUNK_TOKENS = 2048
# Bootstrap resamples per matrix product: caps the [resamples, D] count matrix at 2^24 entries (128 MB).
_BOOT_ENTRIES = 1 << 24


# quantities derived from rho and union by `derive`, in the order they are reported
DERIVED = ("rho_mean", "union_mean", "E_slot", "E_dedup", "u", "gap", "rho_bar")


@dataclass
class ReuseStats:
    """App. D.2 estimates. rho[l][n], union[l][n]: arrays [L, n_max + 1] (entry 0 unused, 0); rho_mean, union_mean:
    layer means [n_max + 1]; E_slot, E_dedup, gap (3), u: [n_max + 1] in `units`; rho_bar (11): [n_max] indexed by
    the draft length k. ci[name] = (lo, hi): bootstrap interval of rho, union or any of those (empty if none)."""

    n_max: int
    num_experts: int
    m: int
    num_tokens: int
    num_documents: int
    windows: np.ndarray  # [n_max + 1] windows of each length
    rho: np.ndarray
    union: np.ndarray
    expert_bytes: np.ndarray  # w_l, [L]
    units: str  # what w_l is measured in
    rho_mean: np.ndarray
    union_mean: np.ndarray
    E_slot: np.ndarray  # noqa: N815 - the paper's symbols
    E_dedup: np.ndarray  # noqa: N815
    u: np.ndarray
    gap: np.ndarray
    rho_bar: np.ndarray
    ci: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    bootstrap: int = 0
    level: float = DEFAULT_LEVEL
    seed: int = 0

    @property
    def num_layers(self) -> int:
        return int(self.rho.shape[0])

    def to_json(self) -> dict[str, Any]:
        """One JSON-ready document; per-n lists are indexed by n (rho_bar by k), entry 0 null (unused)."""
        out: dict[str, Any] = {
            "n_max": self.n_max, "num_experts": self.num_experts, "m": self.m, "num_layers": self.num_layers,
            "num_tokens": self.num_tokens, "num_documents": self.num_documents, "windows": indexed(self.windows),
            "units": self.units, "expert_bytes": self.expert_bytes.tolist(), "W": float(self.expert_bytes.sum()),
            "rho": indexed(self.rho), "union": indexed(self.union),
            **{name: indexed(getattr(self, name)) for name in DERIVED},
            "uniform_rho": indexed(uniform_rho(self.n_max, self.num_experts, self.m)),
            "bootstrap": self.bootstrap, "level": self.level, "seed": self.seed,
            "intervals": {name: {"lo": indexed(lo), "hi": indexed(hi)} for name, (lo, hi) in self.ci.items()},
        }
        return out


def indexed(a: np.ndarray) -> list:
    """A per-n array (or a stack of them) as JSON lists with entry 0 replaced by null; NaN also becomes null."""
    a = np.asarray(a, dtype=float)
    if a.ndim > 1:
        return [indexed(row) for row in a]
    return [None] + [float(x) if np.isfinite(x) else None for x in a[1:]]


def uniform_rho(n_max: int, num_experts: int, m: int) -> np.ndarray:
    """Reuse under independent uniform routing, 1 - q^(n-1) with q = 1 - m/N, for n = 0..n_max (entry 0 unused)."""
    n_max = whole("n_max", n_max, 1, WINDOW_LIMIT)
    num_experts = whole("num_experts", num_experts, 1)
    m = whole("m", m, 1, num_experts)
    n = np.arange(n_max + 1)
    rho = 1.0 - (1.0 - m / num_experts) ** np.maximum(n - 1, 0)
    rho[0] = 0.0
    return rho


def union_bytes(union: np.ndarray, w: np.ndarray, m: int, batch: int = 1) -> dict[str, np.ndarray]:
    """Layer mean, E_slot = B n m W, E_dedup = Σ_l w_l U_l and u [..., n_max + 1] of a pass of `batch` sequences of
    n tokens with union U [..., L, n_max + 1] (leading axes broadcast: one per bootstrap resample); entry 0 unused."""
    n = np.arange(union.shape[-1])
    e_slot = np.broadcast_to(batch * n * m * float(w.sum()), union.shape[:-2] + n.shape).astype(float)
    e_dedup = np.einsum("...ln,l->...n", union, w)
    u = np.divide(e_dedup, e_slot, out=np.zeros_like(e_dedup), where=e_slot > 0)
    return {"union_mean": union.mean(axis=-2), "E_slot": e_slot, "E_dedup": e_dedup, "u": u}


def derive(rho: np.ndarray, union: np.ndarray, w: np.ndarray, m: int) -> dict[str, np.ndarray]:
    """Layer means and byte quantities from rho, union [..., L, n_max + 1] and w_l [L]; leading axes broadcast
    (one per bootstrap resample). Entry 0 of every result is unused (0)."""
    n_max = rho.shape[-1] - 1
    total_w = float(w.sum())
    weighted = np.einsum("...ln,l->...n", rho, w)  # Σ_l w_l rho_l(n)
    cum = np.cumsum(weighted, axis=-1)  # Σ_{j<=n} Σ_l w_l rho_l(j)  (rho(0) = 0 unused, rho(1) = 0)
    k = np.arange(n_max)  # rho_bar_k for k = 1..n_max-1 uses rho up to k + 1
    rho_bar = np.zeros(weighted.shape[:-1] + (n_max,))
    rho_bar[..., 1:] = cum[..., 2:] / (k[1:] * total_w)
    return {"rho_mean": rho.mean(axis=-2), **union_bytes(union, w, m), "gap": m * cum, "rho_bar": rho_bar}


# ---- per-document sufficient statistics ------------------------------------------------------------------
def document_stats(trace: Trace, n_max: int, show_progress: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per document: repeat sums [L, D, n_max+1], union sums [L, D, n_max+1] and window counts [D, n_max+1].

    R_j(d, n) = Σ of repeat counts of the j-token windows that start where an n-token window of document d
    starts (j <= n). Then the repeats of n-token windows are R_n(d, n) and, since a window's union is m per
    token minus its repeats, the union sum is m n W_d(n) - Σ_{j=2..n} R_j(d, n)."""
    _check_trace(trace)
    n_max = whole("n_max", n_max, 1, WINDOW_LIMIT)
    num_t, num_l, m = trace.experts.shape
    starts, ends = trace.doc_starts[:-1], trace.doc_starts[1:]
    n_axis = np.arange(n_max + 1)
    windows = np.maximum(ends[:, None] - starts[:, None] - n_axis + 1, 0)  # [D, n_max+1]
    windows[:, 0] = 0
    # last start (exclusive) of an n-token window in each document, never before the document's start
    stops = np.maximum(ends[:, None] - n_axis + 1, starts[:, None])  # [D, n_max+1]
    chunk_starts = np.arange(0, num_t, _CHUNK_TOKENS)
    marks = np.unique(np.concatenate([starts, stops[:, 1:].ravel(), chunk_starts, [num_t]]))
    # seg[j, k, l] = summed repeat counts of the j-token windows starting in [marks_k, marks_k+1), layer l
    seg = np.zeros((n_max + 1, marks.size, num_l), dtype=np.int64)
    overlap = n_max - 1
    with progress(f"reuse n<={n_max}", num_t, enabled=show_progress) as advance:
        for a in chunk_starts:
            c = min(_CHUNK_TOKENS, num_t - a)
            masks = chunk_masks(trace.experts[a:a + c + overlap], trace.num_experts, length=c + overlap)
            lo, hi = np.searchsorted(marks, [a, a + c])
            local = marks[lo:hi] - a
            union = masks[:, :c].copy()
            inter = np.empty_like(union)
            for j in range(2, n_max + 1):
                following = masks[:, j - 1:j - 1 + c]
                np.bitwise_and(union, following, out=inter)
                counts = popcount(inter).sum(axis=0, dtype=np.uint16 if m > 255 else np.uint8)
                seg[j, lo:hi] = np.add.reduceat(counts, local, axis=0, dtype=np.int64)
                union |= following
            advance(c)
    prefix = np.zeros_like(seg)
    np.cumsum(seg[:, :-1], axis=1, out=prefix[:, 1:])  # prefix[j, k] = repeats of j-windows starting before marks_k
    at_start = np.searchsorted(marks, starts)  # [D]
    at_stop = np.searchsorted(marks, stops)  # [D, n_max+1]
    repeats = np.zeros((num_l, starts.size, n_max + 1), dtype=np.int64)
    union_sums = (m * n_axis * windows)[None].repeat(num_l, axis=0)
    for j in range(2, n_max + 1):
        r_j = (prefix[j][at_stop[:, j:]] - prefix[j][at_start][:, None]).transpose(2, 0, 1)  # R_j(d, n), n >= j
        repeats[:, :, j] = r_j[:, :, 0]
        union_sums[:, :, j:] -= r_j
    return repeats, union_sums, windows


def _estimates(repeats: np.ndarray, union_sums: np.ndarray, windows: np.ndarray,
               m: int) -> tuple[np.ndarray, np.ndarray]:
    """rho, union [..., L, n_max+1] from summed statistics repeats/union_sums [..., L, n+1], windows [..., n+1]."""
    w = windows[..., None, :].astype(float)
    with np.errstate(divide="ignore", invalid="ignore"):
        rho = np.where(w > 0, repeats / (m * w), np.nan)
        union = np.where(w > 0, union_sums / w, np.nan)
    rho[..., 0] = 0.0
    union[..., 0] = 0.0
    return rho, union


# ---- the estimator ---------------------------------------------------------------------------------------
def estimator_args(trace: Trace, bootstrap: int, seed: int, level: float, expert_bytes: Sequence[float] | None,
                   units: str | None) -> tuple[int, int, float, np.ndarray, str]:
    """The arguments every estimator over a trace's windows shares, checked: bootstrap, seed, level, w_l (default 1
    per layer) and its units label; ArgumentError naming the argument otherwise."""
    _check_trace(trace)
    return _estimator_args(trace.num_layers, bootstrap, seed, level, expert_bytes, units)


def _estimator_args(num_layers: int, bootstrap: int, seed: int, level: float, expert_bytes: Sequence[float] | None,
                    units: str | None) -> tuple[int, int, float, np.ndarray, str]:
    seed = whole("seed", seed, 0)
    if units is not None and not isinstance(units, str):
        raise ArgumentError(f"units must be a label or None, got {show(units)}")
    bootstrap = whole("bootstrap", bootstrap, 0, BOOTSTRAP_LIMIT)
    if not 0 < real("interval level", level) < 1:
        raise ArgumentError(f"interval level must lie in (0, 1), got {level!r}")
    if expert_bytes is None:
        return bootstrap, seed, float(level), np.ones(num_layers), units or "relative units (w_l = 1 per layer)"
    w = np.array(reals("expert_bytes", expert_bytes, positive=True), dtype=float)
    if w.shape != (num_layers,):
        raise ArgumentError(f"expert bytes must be {num_layers} positive numbers (one per layer), "
                            f"got shape {w.shape}")
    return bootstrap, seed, float(level), w, units or "bytes"


def reuse_stats(trace: Trace, n_max: int = N_MAX, bootstrap: int = DEFAULT_BOOTSTRAP, seed: int = 0,
                level: float = DEFAULT_LEVEL, expert_bytes: Sequence[float] | None = None, units: str | None = None,
                show_progress: bool = False) -> ReuseStats:
    """App. D.2 estimates of rho_l(n), U_l(n) for n = 1..n_max, byte quantities with w_l = expert_bytes (default 1
    per layer: relative units) and percentile bootstrap intervals over documents (`bootstrap` resamples)."""
    estimator_args(trace, bootstrap, seed, level, expert_bytes, units)  # every argument checked before any work
    return reuse_from(documents_of(trace, n_max, show_progress), bootstrap, seed, level, expert_bytes, units)


@dataclass(frozen=True)
class Documents:
    """The estimator's per-document sufficient statistics (document_stats) of one trace, or of several joined in
    order: all the reduction (reuse_from) reads, so a trace's shards can be counted apart and joined exactly."""

    repeats: np.ndarray  # [L, D, n_max + 1]
    union_sums: np.ndarray  # [L, D, n_max + 1]
    windows: np.ndarray  # [D, n_max + 1]
    num_experts: int
    m: int
    num_tokens: int
    longest: int  # tokens of the longest document


def documents_of(trace: Trace, n_max: int, show_progress: bool = False) -> Documents:
    """A trace's per-document sufficient statistics for windows of up to n_max tokens."""
    repeats, union_sums, windows = document_stats(trace, n_max, show_progress)
    return Documents(repeats, union_sums, windows, trace.num_experts, trace.m, trace.num_tokens,
                     int(trace.document_lengths.max(initial=0)))


def joined(parts: Sequence[Documents]) -> Documents:
    """Several traces' statistics as one trace's, their documents in order; ValueError naming `parts` unless they
    count the same layers, experts, m and window lengths."""
    if not parts or len({(p.repeats.shape[0], p.repeats.shape[2], p.num_experts, p.m) for p in parts}) != 1:
        raise ValueError("parts must be one or more statistics of the same layers, experts, m and n_max")
    return Documents(np.concatenate([p.repeats for p in parts], axis=1),
                     np.concatenate([p.union_sums for p in parts], axis=1),
                     np.concatenate([p.windows for p in parts]), parts[0].num_experts, parts[0].m,
                     sum(p.num_tokens for p in parts), max(p.longest for p in parts))


def reuse_from(docs: Documents, bootstrap: int = DEFAULT_BOOTSTRAP, seed: int = 0, level: float = DEFAULT_LEVEL,
               expert_bytes: Sequence[float] | None = None, units: str | None = None) -> ReuseStats:
    """reuse_stats from per-document statistics (the reduction: sums over documents, and the bootstrap's resamples
    of them, which depend on the seed and the document count alone)."""
    if not isinstance(docs, Documents):
        raise ArgumentError(f"docs must be Documents (documents_of, joined), got {show(docs)}")
    n_max = docs.windows.shape[1] - 1
    bootstrap, seed, level, w, units = _estimator_args(docs.repeats.shape[0], bootstrap, seed, level, expert_bytes,
                                                       units)
    total_windows = docs.windows.sum(axis=0)
    if total_windows[n_max] == 0:
        raise MoespecError(f"no window of {n_max} tokens fits inside one document (longest document: "
                           f"{docs.longest} tokens); lower n_max")
    rho, union = _estimates(docs.repeats.sum(axis=1), docs.union_sums.sum(axis=1), total_windows, docs.m)
    stats = ReuseStats(n_max=int(n_max), num_experts=docs.num_experts, m=docs.m, num_tokens=docs.num_tokens,
                       num_documents=int(docs.windows.shape[0]), windows=total_windows, rho=rho, union=union,
                       expert_bytes=w, units=units, **derive(rho, union, w, docs.m),
                       bootstrap=int(bootstrap), level=float(level), seed=int(seed))
    if bootstrap:
        stats.ci = _bootstrap(docs.repeats, docs.union_sums, docs.windows, w, docs.m, int(bootstrap), seed, level)
    return stats


def resample_counts(num_d: int, resamples: int, seed: int, columns: int) -> Iterator[np.ndarray]:
    """Document resamples as count matrices [b, D] (how often each document is drawn), in blocks whose product with
    per-document statistics [D, columns] stays near _BOOT_ENTRIES entries. The draws depend only on (D, resamples,
    seed): every statistic bootstrapped with one seed sees the same resamples."""
    rng = np.random.default_rng(seed)
    per_block = max(1, _BOOT_ENTRIES // num_d)
    rows = max(1, _BOOT_ENTRIES // max(columns, 1))
    for lo in range(0, resamples, per_block):
        b = min(per_block, resamples - lo)
        picks = rng.integers(0, num_d, size=(b, num_d)) + num_d * np.arange(b)[:, None]
        counts = np.bincount(picks.ravel(), minlength=b * num_d).reshape(b, num_d).astype(float)
        for first in range(0, b, rows):
            yield counts[first:first + rows]


def _check_trace(trace: object) -> None:
    if not isinstance(trace, Trace):
        raise ArgumentError(f"trace must be a Trace (moespec.formats.trace), got {show(trace)}")


def _bootstrap(repeats: np.ndarray, union_sums: np.ndarray, windows: np.ndarray, w: np.ndarray, m: int,
               resamples: int, seed: int, level: float) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Percentile intervals of rho, union and every derived quantity over document resamples."""
    num_l, num_d, width = repeats.shape
    # per-document statistics as one matrix [D, 2 L (n+1) + (n+1)]: a resample is counts @ stats
    stats = np.concatenate([repeats.transpose(1, 0, 2).reshape(num_d, -1),
                            union_sums.transpose(1, 0, 2).reshape(num_d, -1), windows], axis=1).astype(float)
    sums = np.concatenate([draws @ stats for draws in resample_counts(num_d, resamples, seed, stats.shape[1])])
    block = num_l * width
    rep_b = sums[:, :block].reshape(-1, num_l, width)
    uni_b = sums[:, block:2 * block].reshape(-1, num_l, width)
    rho_b, union_b = _estimates(rep_b, uni_b, sums[:, 2 * block:], m)
    replicates = {"rho": rho_b, "union": union_b, **derive(rho_b, union_b, w, m)}
    tail = 100 * (1 - level) / 2
    with np.errstate(invalid="ignore"):
        return {name: (np.nanpercentile(v, tail, axis=0), np.nanpercentile(v, 100 - tail, axis=0))
                for name, v in replicates.items()}


# ---- bytes from the trace's model --------------------------------------------------------------------------
def trace_expert_bytes(trace: Trace, fmt: str = FORMAT) -> tuple[np.ndarray | None, str]:
    """w_l of the model the trace names (its stored spec, else a preset of that name) in format `fmt`, with a
    units label; (None, reason) when the trace names no known model or its shape differs from the model's."""
    _check_trace(trace)
    if not isinstance(fmt, str):
        raise ArgumentError(f"fmt must be a weight format's name, got {show(fmt)}")
    check_format(fmt)
    meta = trace.meta
    try:
        spec = ModelSpec.from_dict(meta["spec"]) if isinstance(meta.get("spec"), dict) else \
            ModelSpec.from_name(str(meta.get("model")))
    except (MoespecError, TypeError, ValueError, KeyError, AttributeError):  # a malformed stored spec
        return None, "relative units (w_l = 1 per layer; the trace names no known model)"
    try:
        trace.check_fits(spec, "the trace")
    except MoespecError as e:
        return None, f"relative units (w_l = 1 per layer; {e})"
    return np.array([spec.expert_bytes(layer, fmt) for layer in range(spec.L)], dtype=float), \
        f"bytes ({spec.name}, {fmt} experts)"



"""Expert union and bytes of a verification pass that carries B sequences (docs/theory.md, "A pass of B sequences").

B sequences, each from its own document, each verify a window of n consecutive tokens in one pass of B n tokens.
The experts the pass must read at layer l are the union of the B windows' expert sets.

Window inclusion. pi_{l,e}(n) = P(expert e is selected by some token of a window of n consecutive tokens at layer
l); Σ_e pi_{l,e}(n) = U_l(n). Estimator: the fraction of the trace's n-token windows inside one document (the
windows of App. D.2) whose union holds e.

Independent sequences. The B windows are independent draws, so expert e is missed by all of them with probability
(1 - pi_{l,e}(n))^B and U_l^B(n) = Σ_e [1 - (1 - pi_{l,e}(n))^B]; U_l^1(n) = U_l(n). Uniform iid routing has
pi = 1 - q^n, q = 1 - m/N, and U^B(n) = N (1 - q^(n B)).

Estimator. Windows of one document that overlap share tokens, so they are not independent draws; windows that
start n apart are disjoint. The n-token windows of the trace fall into n classes by their start's offset from their
document's start, modulo n; the windows of one class are pairwise disjoint. In class r, of W_r windows M_{r,e} miss
expert e, and the chance that B distinct windows of the class all miss e is Π_{i<B} (M_{r,e} - i)/(W_r - i), an
unbiased estimate of (1 - pi_e)^B wherever disjoint windows are independent (iid routing: exactly). U_l^B(n) is
Σ_e [1 - that chance] averaged over the classes with weights W_r: the mean union of the ordered B-tuples of distinct
windows of one class (tests count them). At B = 1 it is the mean union over all windows, U_l(n) of
moespec.routing.reuse exactly. (The plug-in (count/W)^B is biased low by O(1/W), and the same formula over all
windows by the overlaps: either missed the closed form on a long uniform trace.) Each class needs W_r >= B.

Intervals: the bootstrap over documents of moespec.routing.reuse (the same resamples for the same seed), with the
per-document inclusion counts as sufficient statistics, one [L, n_max + 1, N] block per document. A resample holds
some documents twice, and the two copies' windows count as distinct, so for B >= 2 every replicate reads low by
the duplicates' share (on a uniform trace the whole percentile interval fell below the unbiased estimate). The
percentile interval is therefore moved by the estimate less the replicates' median; at B = 1 (linear in the
counts) it is left as it is, the interval of U_l(n).

Shapes: L layers, N experts, D documents, n_max the largest window; counts [D, L, n_max + 1, N], windows
[D, n_max + 1].
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from moespec import ArgumentError, MoespecError
from moespec.arguments import items, whole
from moespec.console import progress
from moespec.defaults import BATCH_LIMIT, WINDOW_LIMIT
from moespec.formats.trace import Trace, chunk_masks
from moespec.routing.reuse import DEFAULT_LEVEL, estimator_args, indexed, resample_counts, union_bytes

# Tokens per chunk of one document: its [words, chunk, L, 64] unpacked bits stay within tens of MB.
_CHUNK_TOKENS = 1024
# Per-document counts held for the bootstrap: 2^28 int32 entries (1 GiB); past it, intervals need fewer documents,
# a smaller n_max or --bootstrap 0 (the estimate itself needs only the summed counts).
STATS_LIMIT = 1 << 28


@dataclass
class BatchUnion:
    """U_l^B(n) per batch size. union[B]: [L, n_max + 1] (entry 0 unused, 0); union_mean[B], E_dedup[B], E_slot[B],
    u[B]: [n_max + 1]; ci[B][name] = (lo, hi) bootstrap intervals of union_mean, E_dedup and u."""

    batches: list[int]
    n_max: int
    m: int
    expert_bytes: np.ndarray  # w_l, [L]
    inclusion: np.ndarray  # pi_{l,e}(n), [L, n_max + 1, N]
    union: dict[int, np.ndarray]
    union_mean: dict[int, np.ndarray]
    E_slot: dict[int, np.ndarray]  # noqa: N815 - the paper's symbols
    E_dedup: dict[int, np.ndarray]  # noqa: N815
    u: dict[int, np.ndarray]
    ci: dict[int, dict[str, tuple[np.ndarray, np.ndarray]]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """JSON keys (batch sizes as strings, per-n lists indexed by n with entry 0 null): batch_union_mean,
        batch_union (per layer), batch_E_slot, batch_E_dedup, batch_u and batch_intervals."""
        per_b = lambda values: {str(b): indexed(values[b]) for b in self.batches}  # noqa: E731
        return {"batch_sizes": self.batches, "batch_union_mean": per_b(self.union_mean),
                "batch_union": per_b(self.union), "batch_E_slot": per_b(self.E_slot),
                "batch_E_dedup": per_b(self.E_dedup), "batch_u": per_b(self.u),
                "batch_intervals": {str(b): {name: {"lo": indexed(lo), "hi": indexed(hi)}
                                             for name, (lo, hi) in self.ci[b].items()} for b in self.ci}}


def check_batches(batches: Sequence[int]) -> list[int]:
    """Distinct batch sizes in 1..BATCH_LIMIT, ascending; ValueError naming `batches` otherwise."""
    found = items("batches", batches)
    if not found:
        raise ArgumentError("batches must hold one batch size or more, got none")
    return sorted({whole(f"batches[{i}]", b, 1, BATCH_LIMIT) for i, b in enumerate(found)})


def class_offsets(n_max: int) -> np.ndarray:
    """Where window length n's classes r = 0..n-1 start on the class axis: [n_max + 2], n's at offsets[n] + r
    (entry 0 holds the unused n = 0's single slot)."""
    return np.concatenate([[0], 1 + np.cumsum(np.arange(n_max + 1))])


def inclusion_counts(trace: Trace, n_max: int, per_document: bool,
                     show_progress: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Windows whose union holds each expert, per window class (module docstring): counts [D, L, K, N] per document
    (or [1, L, K, N] summed over documents when not `per_document`) and window counts [D or 1, K], on the class axis
    of class_offsets (K = 1 + n_max (n_max + 1) / 2)."""
    n_max = whole("n_max", n_max, 1, WINDOW_LIMIT)
    num_l, num_e = trace.num_layers, trace.num_experts
    offsets = class_offsets(n_max)
    rows, classes = (trace.num_documents if per_document else 1), int(offsets[-1])
    if per_document and rows * num_l * classes * num_e > STATS_LIMIT:
        raise MoespecError(f"the bootstrap of the batch union would hold {rows:,} x {num_l} x {classes} x {num_e} "
                           f"counts (past {STATS_LIMIT:,}); lower n_max or pass --bootstrap 0")
    counts = np.zeros((rows, num_l, classes, num_e), dtype=np.int32 if per_document else np.int64)
    windows = np.zeros((rows, classes), dtype=np.int64)
    with progress(f"batch union n<={n_max}", trace.num_tokens, enabled=show_progress) as advance:
        for d, (start, end) in enumerate(trace.documents()):
            row = d if per_document else 0
            for n in range(1, n_max + 1):
                starts = max(end - start - n + 1, 0)  # windows of n in the document; class r has every n-th
                windows[row, offsets[n]:offsets[n] + n] += (starts - np.arange(n) + n - 1) // n
            for a in range(start, end, _CHUNK_TOKENS):
                c = min(_CHUNK_TOKENS, end - a)
                stop = min(a + c + n_max - 1, end)  # tokens past the document's end stay empty sets
                masks = chunk_masks(trace.experts[a:stop], num_e, length=c + n_max - 1)  # [words, c+n-1, L]
                union = masks[:, :c].copy()
                for n in range(1, n_max + 1):
                    if n > 1:
                        union |= masks[:, n - 1:n - 1 + c]
                    valid = min(c, end - n + 1 - a)  # windows starting here that end inside the document
                    if valid <= 0:
                        break
                    bits = np.unpackbits(union[:, :valid].view(np.uint8).reshape(union.shape[0], valid, num_l, 8),
                                         axis=-1, bitorder="little")  # [words, valid, L, 64]
                    for r in range(n):
                        first = (r - (a - start)) % n  # the chunk's first window of class r
                        held = bits[:, first::n].sum(axis=1, dtype=np.int64)  # [words, L, 64]
                        counts[row, :, offsets[n] + r] += held.transpose(1, 0, 2).reshape(num_l, -1)[:, :num_e] \
                            .astype(counts.dtype)
                advance(c)
    return counts, windows


def per_length(reduce: np.ufunc, a: np.ndarray, n_max: int, axis: int = -1) -> np.ndarray:
    """`a` with its class axis (class_offsets) reduced over each window length's classes by `reduce` (np.add,
    np.minimum): [..., n_max + 1, ...] with entry 0 (no windows of 0 tokens) 0."""
    found = reduce.reduceat(a, class_offsets(n_max)[1:-1], axis=axis)
    zero = np.zeros_like(np.take(found, [0], axis=axis))
    return np.concatenate([zero, found], axis=axis)


def batch_unions(counts: np.ndarray, windows: np.ndarray, batches: Sequence[int], n_max: int) -> dict[int, np.ndarray]:
    """U^B [..., L, n_max + 1] from per-class inclusion counts [..., L, K, N] and window counts W_r [..., K]: per
    class Σ_e [1 - Π_{i<B} (M_e - i)/(W_r - i)] (M_e = W_r - count), averaged over n's classes with weights W_r.
    NaN where a class has fewer than B windows; entry 0 unused (0)."""
    total = windows[..., None, :, None].astype(float)
    missed = total - counts
    weights = windows[..., None, :].astype(float)  # [..., 1, K]
    fewest = per_length(np.minimum, windows, n_max)[..., None, :]  # [..., 1, n_max + 1]
    found = {}
    for b in batches:
        chance = np.ones(np.broadcast_shapes(missed.shape, total.shape))
        with np.errstate(divide="ignore", invalid="ignore"):
            for i in range(b):
                chance *= np.clip(missed - i, 0.0, None) / (total - i)
            per_class = (1.0 - chance).sum(axis=-1) * weights  # [..., L, K]
            union = per_length(np.add, per_class, n_max) / per_length(np.add, weights, n_max)
        union = np.where(fewest < b, np.nan, union)
        union[..., 0] = 0.0
        found[b] = union
    return found


def batch_union(trace: Trace, batches: Sequence[int], n_max: int, expert_bytes: Sequence[float] | None = None,
                bootstrap: int = 0, seed: int = 0, level: float = DEFAULT_LEVEL,
                show_progress: bool = False) -> BatchUnion:
    """U_l^B(n), E_dedup^B, u_B(n) for each batch size in `batches` and n = 1..n_max from the window-inclusion
    rates of `trace`, with w_l = expert_bytes (default 1 per layer) and, when `bootstrap` > 0, percentile intervals
    over document resamples (the resamples moespec.routing.reuse draws for the same seed)."""
    batches = check_batches(batches)
    bootstrap, seed, level, w, _ = estimator_args(trace, bootstrap, seed, level, expert_bytes, None)
    counts, windows = inclusion_counts(trace, n_max, per_document=bootstrap > 0, show_progress=show_progress)
    total = windows.sum(axis=0)
    fewest = int(per_length(np.minimum, total, n_max)[1:].min())  # the smallest class of any window length
    if fewest < batches[-1]:
        raise MoespecError(f"{fewest} disjoint window(s) of up to {n_max} tokens fit in one class of the trace's "
                           f"windows; B = {batches[-1]} needs as many (lower n_max or the batch, or trace more tokens)")
    summed = counts.sum(axis=0)
    unions = batch_unions(summed, total, batches, n_max)
    derived = {b: union_bytes(unions[b], w, trace.m, b) for b in batches}
    rates = per_length(np.add, summed, n_max, axis=1) / np.maximum(per_length(np.add, total, n_max), 1)[:, None]
    result = BatchUnion(batches=batches, n_max=int(n_max), m=trace.m, expert_bytes=w, inclusion=rates,
                        union=unions, **{name: {b: derived[b][name] for b in batches}
                                         for name in ("union_mean", "E_slot", "E_dedup", "u")})
    if bootstrap:
        result.ci = _bootstrap(counts, windows, w, trace.m, batches, n_max, bootstrap, seed, level, derived)
    return result


def _bootstrap(counts: np.ndarray, windows: np.ndarray, w: np.ndarray, m: int, batches: list[int], n_max: int,
               resamples: int, seed: int, level: float, estimates: dict[int, dict[str, np.ndarray]]
               ) -> dict[int, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """Percentile intervals of union_mean, E_dedup and u per batch size over document resamples, moved onto the
    `estimates` for B >= 2 (module docstring)."""
    num_d = counts.shape[0]
    stats = counts.reshape(num_d, -1).astype(float)
    replicates: dict[int, dict[str, list[np.ndarray]]] = {b: {"union_mean": [], "E_dedup": [], "u": []}
                                                         for b in batches}
    for draws in resample_counts(num_d, resamples, seed, stats.shape[1]):
        resampled = (draws @ stats).reshape((-1,) + counts.shape[1:])
        for b, union in batch_unions(resampled, draws @ windows.astype(float), batches, n_max).items():
            derived = union_bytes(union, w, m, b)
            for name, kept in replicates[b].items():
                kept.append(derived[name])
    tail = 100 * (1 - level) / 2
    found: dict[int, dict[str, tuple[np.ndarray, np.ndarray]]] = {}
    with np.errstate(invalid="ignore"):
        for b, kept in replicates.items():
            found[b] = {}
            for name, parts in kept.items():
                values = np.concatenate(parts)
                lo, mid, hi = np.nanpercentile(values, [tail, 50, 100 - tail], axis=0)
                shift = estimates[b][name] - mid if b > 1 else 0.0  # the duplicates' share (module docstring)
                found[b][name] = (lo + shift, hi + shift)
    return found

"""The passes the expert-op bench times (paper Section 2, Appendix E): chosen ids, whose n m slots name exactly U
distinct experts (every token m distinct ones), over the reachable U of each pass size; and windows of recorded
routing, n consecutive tokens of one document at one layer. moespec.measure.bench times them; moespec.measure.fits
fits the chosen ones and scores the fits on the windows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from moespec import MoespecError
from moespec.formats.trace import Trace
from moespec.model.spec import ModelSpec


# ---- chosen ids ------------------------------------------------------------------------------------------
def union_range(n: int, m: int, N: int) -> range:  # noqa: N803
    """Reachable U for n tokens of m distinct experts among N: m (all tokens alike) .. min(n m, N) (none repeat)."""
    return range(m, min(n * m, N) + 1)


def union_grid(n: int, m: int, N: int, size: int) -> list[int]:  # noqa: N803
    """`size` reachable U values evenly spread over the range, both ends included (all when fewer)."""
    lo, hi = m, min(n * m, N)
    if hi - lo + 1 <= size:
        return list(range(lo, hi + 1))
    return np.rint(np.linspace(lo, hi, size)).astype(int).tolist()  # step > 1: rounding keeps them distinct


def chosen_ids(n: int, m: int, N: int, U: int, rng: np.random.Generator) -> np.ndarray:  # noqa: N803
    """ids [n, m] (int64) whose n m slots name exactly U distinct experts, each token m distinct ones.

    A random set of U experts is laid out cyclically over the first ceil(U/m) tokens (m consecutive positions
    mod U are distinct because m <= U, and they cover all U because n m >= U); the other tokens draw random
    m-subsets of the same U; tokens and slots are then shuffled."""
    if not (1 <= m < N and n >= 1):
        raise MoespecError(f"chosen ids need n >= 1 and 1 <= m < N, got n={n}, m={m}, N={N}")
    if U not in union_range(n, m, N):
        raise MoespecError(f"U = {U} distinct experts is unreachable for n={n} tokens of m={m} among N={N}: "
                           f"need {m} <= U <= {min(n * m, N)}")
    experts = rng.permutation(N)[:U]
    cover = -(-U // m)
    first = experts[(np.arange(cover * m) % U).reshape(cover, m)]
    rest = experts[np.argsort(rng.random((n - cover, U)), axis=1)[:, :m]]
    ids = np.concatenate([first, rest])[rng.permutation(n)]
    return rng.permuted(ids, axis=1).astype(np.int64)


# ---- the plan: which passes each (layer, n) times -----------------------------------------------------------
@dataclass(frozen=True)
class Pass:
    """One pass to time: ids [n, m] with U distinct experts; `start` is a recorded window's first token."""

    source: str  # "chosen" or "window"
    ids: np.ndarray
    U: int  # noqa: N815
    start: int | None = None


def plan_unit(trace: Trace, spec: ModelSpec, layer: int, n: int, windows: int, u_values: int,
              seed: int, batch: int = 1) -> list[Pass]:
    """Chosen passes over the U grid, then up to `windows` recorded windows sampled without replacement. At
    `batch` B > 1 a pass carries B n tokens: chosen ids over B n tokens (U up to N), and recorded passes of B
    windows of n tokens, each from another document (B sequences verified together)."""
    rng = np.random.default_rng([seed, layer, n] if batch == 1 else [seed, layer, n, batch])
    total = batch * n
    passes = [Pass("chosen", chosen_ids(total, spec.m, spec.N, U, rng), U)
              for U in union_grid(total, spec.m, spec.N, u_values)]
    if batch > 1:
        return passes + _batched_windows(trace, layer, n, batch, windows, rng)
    starts = trace.window_starts(n)
    if starts.size == 0:
        raise MoespecError(f"the trace has no window of {n} tokens inside one document (longest document: "
                           f"{int(trace.document_lengths.max())} tokens); lower --n")
    for start in np.sort(rng.choice(starts, size=min(windows, starts.size), replace=False)).tolist():
        ids = trace.experts[start:start + n, layer].astype(np.int64)
        passes.append(Pass("window", ids, int(np.unique(ids).size), start))
    return passes


def documents_holding(trace: Trace, n: int, batch: int, where: str = "the trace") -> np.ndarray:
    """The documents holding a window of n tokens; one line when fewer than `batch` do (B sequences verified together
    come from B documents)."""
    holding = np.flatnonzero(trace.document_lengths >= n)
    if holding.size < batch:
        raise MoespecError(f"--batch {batch}: {where} has {holding.size} document(s) holding a window of {n} "
                           f"tokens; B sequences need B documents (trace more documents or lower --batch)")
    return holding


def starts_apart(trace: Trace, holding: np.ndarray, n: int, batch: int, rng: np.random.Generator) -> list[int]:
    """First tokens of `batch` windows of n tokens, each in another of the documents `holding`, at a uniform start
    inside it, in document order."""
    docs = np.sort(rng.choice(holding, size=batch, replace=False))
    return (trace.doc_starts[docs] + rng.integers(0, trace.document_lengths[docs] - n + 1)).tolist()


def _batched_windows(trace: Trace, layer: int, n: int, batch: int, windows: int,
                     rng: np.random.Generator) -> list[Pass]:
    """`windows` passes of `batch` windows of n tokens at `layer` (starts_apart); ids [batch n, m]."""
    holding = documents_holding(trace, n, batch)
    passes = []
    for _ in range(windows):
        starts = starts_apart(trace, holding, n, batch, rng)
        ids = np.concatenate([trace.experts[s:s + n, layer] for s in starts]).astype(np.int64)
        passes.append(Pass("window", ids, int(np.unique(ids).size), starts[0]))
    return passes

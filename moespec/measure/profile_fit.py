"""The rates of the structural model (moespec.kernels.structure) fitted from the timed calls of `moespec profile`
(moespec.measure.device_profile, which owns what is timed and the keys; this module owns how they become rates).

Keys of the timed calls (Item.key) and what info[key] holds beside them:
    ("cold" | "hot", kind, d, f, G, E)        a rate pass of `kind`'s kernel: E experts of shape (d, f), each applied to
                                              G tokens (each shape at two E where the sizes allow, so a pass's
                                              first bytes' cost F is fitted apart from its rate); info (expert bytes
                                              b, weight rows R, E)
    ("overhead", kind, tokens, m, "cold" | "hot")  tiny experts, distinct in every slot; info (b, R, (groups, nodes))
    ("check", kind, n, U)                     the self-check's passes of chosen ids; info (b, R, ids [n, m])
Rates are fitted per kernel kind: the deduplicating kind's rate passes give every G; where the per-slot kernel is a
program of its own (the Triton kernels on a GPU: a CUDA-core GEMV beside a tensor-core tile), its own rate passes give
its G = 1 rates and each kind's fixed costs come from its own overhead passes (`apart`); otherwise (the native CPU
kernels share one group loop; ggml's pair its vec_dot) one fit serves both kinds. A group's fixed seconds per weight
row r_G are told from its seconds per byte by shapes of different row lengths: ggml's over its cold rate shapes (a
vec_dot call per row and token), ours on the CPU over hot passes of long and short rows (ROW_SHAPES: per row and
token a horizontal sum and a store, which a short row does not hide behind its bytes).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from moespec import ArgumentError
from moespec.kernels.structure import Rates

# The stream's share s_G is fitted only where the profile's calls met more than one state of the host: 1 / C spread
# over at least this share of its median (10th to 90th percentile). A quiet run's calls spread 0.1-0.2; runs on this
# host while its streaming read moved between ~30 and ~55 GB/s spread ~0.5 (benchmarks/stream_share.py).
STATE_SPREAD = 0.25
# F, what a cold pass's first bytes cost past its rate, is fitted where the rate passes' bytes span at least this
# factor (the profile's two sizes: 8x); passes of one size leave it 0 (x and F could not be told apart)
RAMP_SPREAD = 2.0
# Alternating passes of the fixed costs and the rates: each corrects the other by a share of it, about half where
# rows as short as 32 weights make a group's fixed time and its per-row time nearly alike, so the per-row time
# reaches its fixed point to ~1e-9 within forty (~5e-3 within ten)
FIT_PASSES = 40
# Where a profile's per-row time r_G is fitted (fit_rates `rows`): over the cold rate passes (ggml's pair: rate shapes
# of many row lengths, each row a vec_dot call) or over the hot passes (our kernels on the CPU: long and short rows)
ROWS = ("cold", "hot")

Key = tuple[Any, ...]


@dataclass
class Item:
    """One timed call of a round: what it is (key), its work (fn), whether it runs cold (flushed) or hot (run just
    before), the weights it reads (expert slices, read once before a cold call's flush: Cores.cold_call), and the
    samples: seconds with the ceiling sampled after each cold call."""

    key: Key
    fn: Callable[[], object]
    cold: bool = True
    seconds: list[float] | None = None
    ceilings: list[float] | None = None
    reads: tuple[Any, ...] = ()


def fixed_costs(by_key: dict[Key, Item], info: dict[Key, Any], state: str, rates: Rates,
                kind: str | None = None) -> tuple[float, float, float, float]:
    """(pass_s, group_s, node_s, token_s) of the overhead passes run `state` ("cold" after a flush, "hot" right after
    the same call), of `kind`'s kernel (None: every kind's): least squares of the time left after the groups' bytes
    and rows (rates at G = 1, cold at each call's ceiling or hot) on the group count, the nodes past the first (node_s
    0 where every pass is one node: our kernels) and, where every pass is one node and their token counts differ, the
    tokens (else token_s 0: ggml's per-token work is its nodes'); none below 0 (nonneg_fit: a term clipped after an
    unconstrained fit would leave the others fitted beside its negative value)."""
    rows, left = [], []
    cold = state == "cold"
    for k, (b, r, groups) in info.items():
        if k[0] == "overhead" and k[-1] == state and kind in (None, k[1]):
            (count, nodes), item = groups, by_key[k]
            ceilings = item.ceilings or [1.0] * len(item.seconds)  # a hot call reads no memory: no ceiling
            rows.append([1.0, count, nodes - 1, k[2]])
            left.append(np.median([t - count * (b * rates.per_byte(1, c, cold) + r * rates.per_row(1))
                                   for t, c in zip(item.seconds, ceilings)]))
    design = np.array(rows, dtype=float)
    keep = [0, 1, 2] if design[:, 2].any() else [0, 1, 3] if np.ptp(design[:, 3]) > 0 else [0, 1]
    coef = dict(zip(keep, nonneg_fit(design[:, keep], np.array(left))))  # a term that would come out < 0 is left out
    pass_s, group_s, node_s, token_s = (float(coef.get(i, 0.0)) for i in range(4))
    return pass_s, group_s, node_s, token_s


def spans_sizes(inverse_bytes: np.ndarray) -> bool:
    """Whether passes of these 1 / bytes differ in size by RAMP_SPREAD or more: enough to fit time against bytes."""
    return bool(inverse_bytes.max() >= RAMP_SPREAD * inverse_bytes.min())


def _check_row_lengths(rows_per_byte: np.ndarray) -> None:
    if np.ptp(rows_per_byte) == 0:
        raise ArgumentError(f"a per-row time needs shapes of two or more row lengths, got {len(set(rows_per_byte))}")


def nonneg_fit(design: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares of y on the columns of design with every coefficient >= 0: the best fit among those on each
    subset of the columns whose coefficients all come out >= 0, the columns left out at 0 (all 0 where none does).
    A fit here has at most three columns, so trying every subset is exact and cheap."""
    design, y = np.asarray(design, dtype=float), np.asarray(y, dtype=float)
    columns = design.shape[1]
    best, out = float(y @ y), np.zeros(columns)
    for size in range(1, columns + 1):
        for keep in itertools.combinations(range(columns), size):
            coef = np.linalg.lstsq(design[:, keep], y, rcond=None)[0]
            left = y - design[:, keep] @ coef
            if (coef >= 0).all() and float(left @ left) < best:
                best, out = float(left @ left), np.zeros(columns)
                out[list(keep)] = coef
    return out


def stream_fit(passes: list[tuple[float, float, list[tuple[float, float]]]], per_row: bool,
               state_spread: float = STATE_SPREAD) -> tuple[float, float, float, float]:
    """(x, s, r, F) of a cold group's seconds per byte y = x + s / C + r u + F v (moespec.kernels.structure) from
    its calls: per rate pass (u: its expert's rows per byte, v: 1 / the pass's bytes, past the first W bytes that
    F is paid over: 1 / max(bytes, W); [(y, 1 / C) per call]).
    s is the least-squares coefficient of 1 / C, clipped to [0, 1], where the calls' 1 / C spread over state_spread
    of its median, else 1; then, with s fixed, x, r (where per_row) and F (where the passes' bytes span RAMP_SPREAD)
    by least squares over the passes' medians of y - s / C, none below 0 (nonneg_fit). F is what a pass's first W
    bytes cost past the rate x (an intercept in time against bytes); r needs shapes of two or more row lengths."""
    calls = [(u, v, y, w) for u, v, rows in passes for y, w in rows]
    u, v, y, w = (np.array(c, dtype=float) for c in zip(*calls))
    if per_row:
        _check_row_lengths(u)
    ramp = spans_sizes(v)
    extra = [c for c, on in ((u, per_row), (v, ramp)) if on]
    share = 1.0
    if (np.percentile(w, 90) - np.percentile(w, 10)) >= state_spread * np.median(w):
        design = np.column_stack([np.ones_like(w), w, *extra])
        share = float(np.clip(np.linalg.lstsq(design, y, rcond=None)[0][1], 0.0, 1.0))
    medians = [float(np.median([yi - share * wi for yi, wi in rows])) for _, _, rows in passes]
    pu, pv = np.array([p[0] for p in passes], dtype=float), np.array([p[1] for p in passes], dtype=float)
    columns = [c for c, on in ((pu, per_row), (pv, ramp)) if on]
    coef = iter(nonneg_fit(np.column_stack([np.ones_like(pu), *columns]), medians))
    x = float(next(coef))
    r = float(next(coef)) if per_row else 0.0
    return x, share, r, float(next(coef)) if ramp else 0.0


def hot_rate(points: list[tuple[float, float, float]], per_row: bool) -> tuple[float, float]:
    """(kappa, r) from hot passes' (u: their expert's rows per byte, v: 1 / the pass's bytes, seconds per byte past
    the hot fixed costs): y = kappa + r u + I v by least squares, none below 0 (nonneg_fit), r only where per_row (0
    otherwise; it needs shapes of two or more row lengths) and the intercept in time I (what is left of a hot pass's
    start) only where the passes' bytes span RAMP_SPREAD; without either, kappa is the median."""
    u, v, y = (np.array(c, dtype=float) for c in zip(*points))
    if per_row:
        _check_row_lengths(u)
    columns = [c for c, on in ((u, per_row), (v, spans_sizes(v))) if on]
    if not columns:
        return float(np.median(y)), 0.0
    coef = nonneg_fit(np.column_stack([np.ones_like(y), *columns]), y)
    return float(coef[0]), float(coef[1]) if per_row else 0.0


def fit_rates(by_key: dict[Key, Item], info: dict[Key, Any], g_values: Sequence[int], rows: str | None,
              state_spread: float = STATE_SPREAD, kind: str = "dedup", apart: bool = False) -> Rates:
    """kappa_G and r_G (hot_rate), x_G, s_G and F_G (stream_fit, at state_spread), the cold pass_s and group_s and a
    hit's group_s (hot_group_s: the hot overhead passes'), for G in g_values, from the rate passes of `kind`'s
    kernel (module docstring) and the overhead passes of every kind (of `kind` alone where `apart`). The fixed
    seconds per weight row r_G come from the rate passes of one state (ROWS): the cold ones ("cold": ggml's pair,
    over its rate shapes of many row lengths, subtracted before kappa), the hot ones ("hot": our kernels on the CPU,
    over hot shapes of long and short rows, subtracted before x) or none (None).
    A hot call has fixed costs of its own (its threads are awake and its code cached), taken from the hot overhead
    passes and subtracted before kappa; the fixed costs and the rates depend on each other only through small
    corrections, so alternating passes settle them (FIT_PASSES)."""
    if rows not in (*ROWS, None):
        raise ArgumentError(f"rows must be one of {ROWS} or None, got {rows!r}")
    g_values = tuple(g_values)
    zeros = (0.0,) * len(g_values)
    rates = Rates(g_values, (1e-12,) * len(g_values), zeros, 0.0, 0.0, row_s=zeros if rows else ())
    own = kind if apart else None
    # per G: the cold rate passes (key, b, rows, E), and the first bytes of a pass, which stream slower (ramp_bytes)
    cold = {g: [(k, b, r, e) for k, (b, r, e) in info.items() if k[:2] == ("cold", kind) and k[4] == g]
            for g in g_values}
    knee = {g: min(b * e for _, b, _, e in passes) for g, passes in cold.items()}
    for _ in range(FIT_PASSES):
        hot_pass, hot_group, _, hot_token = fixed_costs(by_key, info, "hot", rates, own)
        pass_s, group_s, node_s, token_s = fixed_costs(by_key, info, "cold", rates, own)
        kappa, excess, shares, row, ramp = [], [], [], [], []
        for g in g_values:  # a rate pass of kind dedup runs G tokens, of kind slot one (key[4] = 1 = its tokens)
            hot = [(n / b, 1 / (b * e), (np.median(by_key[k].seconds) - hot_pass - g * hot_token - e * hot_group)
                    / (b * e)) for k, (b, n, e) in info.items() if k[:2] == ("hot", kind) and k[4] == g]
            k_g, r = hot_rate(hot, per_row=True) if rows == "hot" else (0.0, 0.0)
            x, share, r_cold, start = stream_fit(
                [(n / b, 1 / max(b * e, knee[g]), [((t - pass_s - g * token_s - e * group_s) / (b * e) - r * n / b,
                                                    1 / (c * 1e9)) for t, c in zip(by_key[k].seconds,
                                                                                   by_key[k].ceilings)])
                 for k, b, n, e in cold[g]], rows == "cold", state_spread)
            if rows != "hot":
                r = r_cold
                k_g = hot_rate([(u, v, y - r * u) for u, v, y in hot], per_row=False)[0]
            kappa.append(max(k_g, 1e-15))
            excess.append(x)
            shares.append(share)
            row.append(r)
            ramp.append(start)
        rates = Rates(g_values, tuple(kappa), tuple(excess), group_s, pass_s, node_s,
                      tuple(row) if rows else (), tuple(shares), token_s, tuple(ramp), float(min(knee.values())),
                      hot_group)
    return rates

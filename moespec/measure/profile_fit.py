"""The rates of the structural model (moespec.kernels.structure) fitted from the timed calls of `moespec profile`
(moespec.measure.device_profile, which owns what is timed and the keys; this module owns how they become rates).

Keys of the timed calls (Item.key) and what info[key] holds beside them:
    ("cold" | "hot", kind, d, f, G)           a rate pass of `kind`'s kernel: E experts of shape (d, f), each applied to
                                              G tokens; info (expert bytes b, weight rows R, E)
    ("overhead", kind, tokens, m, "cold" | "hot")  tiny experts, distinct in every slot; info (b, R, (groups, nodes))
    ("check", kind, n, U)                     the self-check's passes of chosen ids; info (b, R, ids [n, m])
Rates are fitted per kernel kind: the deduplicating kind's rate passes give every G; where the per-slot kernel is a
program of its own (the Triton kernels on a GPU: a CUDA-core GEMV beside a tensor-core tile), its own rate passes give
its G = 1 rates and each kind's fixed costs come from its own overhead passes (`apart`); otherwise (the native CPU
kernels share one group loop; ggml's pair its vec_dot) one fit serves both kinds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from moespec import ArgumentError
from moespec.defaults import KERNELS
from moespec.kernels.structure import Rates, pass_time

# The stream's share s_G is fitted only where the profile's calls met more than one state of the host: 1 / C spread
# over at least this share of its median (10th to 90th percentile). A quiet run's calls spread 0.1-0.2; runs on this
# host while its streaming read moved between ~30 and ~55 GB/s spread ~0.5 (benchmarks/stream_share.py).
STATE_SPREAD = 0.25
# Alternating passes of the fixed costs and the rates: each corrects the other by a small share of it, so the
# per-row time (which a group's fixed time shifts) reaches its fixed point to ~1e-4 within ten
FIT_PASSES = 10

Key = tuple[Any, ...]


@dataclass
class Item:
    """One timed call of a round: what it is (key), its work (fn), whether it runs cold (flushed) or hot (run just
    before), and the samples: seconds with the ceiling sampled after each cold call."""

    key: Key
    fn: Callable[[], object]
    cold: bool = True
    seconds: list[float] | None = None
    ceilings: list[float] | None = None


def fixed_costs(by_key: dict[Key, Item], info: dict[Key, Any], state: str, rates: Rates,
                kind: str | None = None) -> tuple[float, float, float, float]:
    """(pass_s, group_s, node_s, token_s) of the overhead passes run `state` ("cold" after a flush, "hot" right after
    the same call), of `kind`'s kernel (None: every kind's): least squares of the time left after the groups' bytes
    and rows (rates at G = 1, cold at each call's ceiling or hot) on the group count, the nodes past the first (node_s
    0 where every pass is one node: our kernels) and, where every pass is one node and their token counts differ, the
    tokens (else token_s 0: ggml's per-token work is its nodes')."""
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
    coef = dict(zip(keep, np.linalg.lstsq(design[:, keep], np.array(left), rcond=None)[0]))
    pass_s, group_s, node_s, token_s = (max(float(coef.get(i, 0.0)), 0.0) for i in range(4))
    return pass_s, group_s, node_s, token_s


def excess_and_row(points: list[tuple[float, float]]) -> tuple[float, float]:
    """(x, r) of y = x + r u, least squares over points (u, y): u a shape's rows per byte, y its cold seconds per
    byte less s / C; neither below 0 (r 0 and x the median of y where the line falls, x 0 and r through the origin
    where it would start below 0)."""
    u, y = (np.array(v, dtype=float) for v in zip(*points))
    if len(points) < 2 or np.ptp(u) == 0:
        raise ArgumentError(f"a per-row time needs shapes of two or more row lengths, got {len(set(u))}")
    r, x = np.polyfit(u, y, 1)
    if r < 0:
        return max(float(np.median(y)), 0.0), 0.0
    if x < 0:
        return 0.0, max(float(u @ y / (u @ u)), 0.0)
    return float(x), float(r)


def stream_fit(shapes: list[tuple[float, list[tuple[float, float]]]], per_row: bool,
               state_spread: float = STATE_SPREAD) -> tuple[float, float, float]:
    """(x, s, r) of a cold group's seconds per byte y = x + s / C + r u (moespec.kernels.structure) from its calls:
    per shape (u: its rows per byte, [(y, 1 / C) per call]). s is the least-squares coefficient of 1 / C, clipped to
    [0, 1], where the calls' 1 / C spread over state_spread of its median, else 1; then, with s fixed, x and r as
    before (excess_and_row over the shapes' medians where per_row, else x the median), neither below 0."""
    calls = [(u, y, w) for u, rows in shapes for y, w in rows]
    u, y, w = (np.array(v, dtype=float) for v in zip(*calls))
    share = 1.0
    if (np.percentile(w, 90) - np.percentile(w, 10)) >= state_spread * np.median(w):
        design = np.column_stack([np.ones_like(w), w, *([u] if per_row else [])])
        share = float(np.clip(np.linalg.lstsq(design, y, rcond=None)[0][1], 0.0, 1.0))
    if per_row:
        x, r = excess_and_row([(ui, float(np.median([yi - share * wi for yi, wi in rows]))) for ui, rows in shapes])
    else:
        x, r = max(float(np.median(y - share * w)), 0.0), 0.0
    return x, share, r


def fit_rates(by_key: dict[Key, Item], info: dict[Key, Any], g_values: Sequence[int], per_row: bool,
              state_spread: float = STATE_SPREAD, kind: str = "dedup", apart: bool = False) -> Rates:
    """kappa_G, x_G, s_G (stream_fit, at state_spread), r_G where per_row (a GGUF format: ggml's pair) and the cold
    pass_s and group_s, for G in g_values, from the rate passes of `kind`'s kernel (module docstring) and the overhead
    passes of every kind (of `kind` alone where `apart`). A hot call has fixed costs of its own (its threads are awake
    and its code cached), taken from the hot overhead passes and subtracted before kappa; the fixed costs and the
    rates depend on each other only through small corrections, so alternating passes settle them (FIT_PASSES)."""
    g_values = tuple(g_values)
    zeros = (0.0,) * len(g_values)
    rates = Rates(g_values, (1e-12,) * len(g_values), zeros, 0.0, 0.0, row_s=zeros if per_row else ())
    own = kind if apart else None
    for _ in range(FIT_PASSES):
        hot_pass, hot_group, _, hot_token = fixed_costs(by_key, info, "hot", rates, own)
        pass_s, group_s, node_s, token_s = fixed_costs(by_key, info, "cold", rates, own)
        kappa, excess, shares, row = [], [], [], []
        for g in g_values:  # a rate pass of kind dedup runs G tokens, of kind slot one (key[4] = 1 = its tokens)
            x, share, r = stream_fit([(rows / b, [((t - pass_s - g * token_s - e * group_s) / (b * e), 1 / (c * 1e9))
                                                  for t, c in zip(by_key[k].seconds, by_key[k].ceilings)])
                                      for k, (b, rows, e) in info.items() if k[:2] == ("cold", kind) and k[4] == g],
                                     per_row, state_spread)
            hot = [(np.median(by_key[k].seconds) - hot_pass - g * hot_token - e * hot_group - e * rows * r) / (b * e)
                   for k, (b, rows, e) in info.items() if k[:2] == ("hot", kind) and k[4] == g]
            kappa.append(max(float(np.median(hot)), 1e-15))
            excess.append(x)
            shares.append(share)
            row.append(r)
        rates = Rates(g_values, tuple(kappa), tuple(excess), group_s, pass_s, node_s,
                      tuple(row) if per_row else (), tuple(shares), token_s)
    return rates


def self_check(rates: dict[str, Rates], by_key: dict[Key, Item], info: dict[Key, Any],
               cache_bytes: int) -> dict[str, Any]:
    """Per kernel kind: median and largest relative error of the model (rates[kind]) on the check passes, each
    predicted at the median ceiling of its own calls; and every pass's numbers."""
    rows = []
    for k, (b, expert_rows, ids) in info.items():
        if k[0] == "check":
            item = by_key[k]
            ceiling = float(np.median(item.ceilings))
            rows.append({"kernel": k[1], "n": k[2], "U": k[3], "ceiling_gbps": ceiling,
                         "measured_s": float(np.median(item.seconds)),
                         "predicted_s": pass_time(rates[k[1]], k[1], ids, b, expert_rows, ceiling, cache_bytes)})
    out: dict[str, Any] = {"passes": rows}
    for kernel in KERNELS:
        errors = [abs(r["predicted_s"] / r["measured_s"] - 1) for r in rows if r["kernel"] == kernel]
        out[kernel] = {"median": float(np.median(errors)), "max": float(max(errors)), "passes": len(errors)}
    return out

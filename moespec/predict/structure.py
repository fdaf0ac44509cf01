"""A model of each expert kernel's time from its structure and a device profile (the paper's first extension:
"the bandwidth needs a model from kernel structure"; Appendix E measures a bandwidth fitted on other models
missing a held-out model by 9-206%).

The native kernels (moespec/kernels/csrc/expert_kernels.cpp) run a pass as groups: one group is one expert applied to
G tokens. The per-slot kernel makes one group per slot (G = 1), in token-major order; the deduplicating kernel one
group per distinct expert (G = the slots that name it), so its groups read each expert once. A group streams the
expert's 2f gate and up rows of length d, then its d down rows of length f, b bytes in all (biases included).

Time of a pass at a streaming ceiling C (bytes/s), a roofline per group:

    t = pass_s + sum over groups g of [ group_s + b max(1 / (e(G_g) C), kappa(G_g)) ]   (a cold group)
    t = pass_s + sum over groups g of [ group_s + b kappa(G_g) ]                         (a group the cache serves)

e(G) is the share of the streaming ceiling a cold group of G tokens reaches while memory is its limit, and kappa(G)
the seconds per byte of a group whose weights sit in the cache: the issue rate of the kernel's inner loop at G
tokens, its limit once the loop, not memory, is the slower (at G = 1 memory is, at large G the loop is, and the
ceiling no longer matters). Every rate comes from a device profile (moespec.measure.device_profile), timed through
the kernels' own entry point on synthetic shapes, none a model's; G between the profile's values is interpolated
linearly and past its largest extrapolated (kappa on the line through its last two values, e at its last value). A
per-slot group is served by the cache when the distinct expert bytes read since its expert's previous slot, its own
included, fit the last-level cache; the deduplicating kernel reads every expert once, cold. The ceiling C is a
device measurement, never a parameter: a prediction is made at the profile's own ceiling or at one measured beside
the times it is compared with.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from moespec import ArgumentError
from moespec.arguments import show


@dataclass(frozen=True)
class Rates:
    """One weight format's rates from a device profile (moespec.formats.devicefile `dtypes.<dtype>`): per G (ascending
    from 1) kappa = hot_s_per_byte and the cold share e = efficiency; group_s and pass_s the fixed seconds of a group
    and of a call."""

    G: tuple[int, ...]  # noqa: N815
    hot_s_per_byte: tuple[float, ...]
    efficiency: tuple[float, ...]
    group_s: float
    pass_s: float

    def __post_init__(self) -> None:
        if not self.G or self.G[0] != 1 or any(a >= b for a, b in zip(self.G, self.G[1:])):
            raise ArgumentError(f"G must ascend from 1, got {show(self.G)}")
        if len(self.hot_s_per_byte) != len(self.G) or len(self.efficiency) != len(self.G):
            raise ArgumentError("hot_s_per_byte and efficiency need one value per G")
        if min(self.hot_s_per_byte) <= 0 or min(self.efficiency) <= 0 or self.group_s < 0 or self.pass_s < 0:
            raise ArgumentError("hot_s_per_byte and efficiency must be positive; group_s and pass_s >= 0")

    @classmethod
    def from_profile(cls, entry: Mapping[str, Any]) -> Rates:
        """The rates of one `dtypes` entry of a validated device.json."""
        return cls(tuple(entry["G"]), tuple(entry["hot_s_per_byte"]), tuple(entry["efficiency"]),
                   float(entry["group_s"]), float(entry["pass_s"]))

    def per_byte(self, g: int, ceiling_gbps: float, cold: bool = True) -> float:
        """Seconds per weight byte of a group of g tokens: max(1 / (e(g) C), kappa(g)) when it reads from memory at a
        ceiling of C = ceiling_gbps GB/s, kappa(g) when the cache serves it."""
        if isinstance(g, bool) or not isinstance(g, (int, np.integer)) or g < 1:
            raise ArgumentError(f"g must be a whole number of tokens >= 1, got {show(g)}")
        if not ceiling_gbps > 0:
            raise ArgumentError(f"ceiling_gbps must be positive, got {show(ceiling_gbps)}")
        grid = np.asarray(self.G, dtype=float)
        if g <= self.G[-1]:
            kappa = float(np.interp(g, grid, self.hot_s_per_byte))
            share = float(np.interp(g, grid, self.efficiency))
        else:  # past the profile: the inner loop's time grows on the line of its last two G, the share stays
            k = self.hot_s_per_byte
            slope = (k[-1] - k[-2]) / (self.G[-1] - self.G[-2]) if len(k) > 1 else 0.0
            kappa, share = k[-1] + max(slope, 0.0) * (g - self.G[-1]), self.efficiency[-1]
        return max(1.0 / (share * ceiling_gbps * 1e9), kappa) if cold else kappa


def groups(kind: str, ids: np.ndarray) -> list[tuple[int, int]]:
    """(expert, G) of each group in the order the kernel runs them: per slot in token-major order ('slot'), or per
    distinct expert in ascending id with the number of slots naming it ('dedup')."""
    ids = np.asarray(ids)
    if ids.ndim != 2 or ids.size == 0:
        raise ArgumentError(f"ids must be a non-empty [n, m] array of expert ids, got shape {show(ids.shape)}")
    if kind == "slot":
        return [(int(e), 1) for e in ids.reshape(-1)]
    if kind == "dedup":
        experts, counts = np.unique(ids, return_counts=True)
        return [(int(e), int(c)) for e, c in zip(experts, counts)]
    raise ArgumentError(f"kind must be 'slot' or 'dedup', got {show(kind)}")


def cached(order: Sequence[tuple[int, int]], expert_bytes: float, cache_bytes: float) -> list[bool]:
    """Per group: whether its expert is still in a cache of cache_bytes, i.e. read before and the distinct experts
    read since (its own included) take at most cache_bytes."""
    last: dict[int, int] = {}
    out = []
    for i, (expert, _) in enumerate(order):
        prev = last.get(expert)
        between = set() if prev is None else {e for e, _ in order[prev + 1:i]} | {expert}
        out.append(prev is not None and len(between) * expert_bytes <= cache_bytes)
        last[expert] = i
    return out


def pass_time(rates: Rates, kind: str, ids: np.ndarray, expert_bytes: float, ceiling_gbps: float,
              cache_bytes: float) -> float:
    """Predicted seconds of one pass of the expert operation (the module docstring): kernel kind 'slot' or 'dedup',
    ids [n, m], b = expert_bytes per expert, at a streaming ceiling of ceiling_gbps GB/s."""
    if not expert_bytes > 0 or not cache_bytes >= 0:
        raise ArgumentError(f"expert_bytes must be positive and cache_bytes >= 0, got {show(expert_bytes)}, "
                            f"{show(cache_bytes)}")
    order = groups(kind, ids)
    hot = cached(order, expert_bytes, cache_bytes)
    return rates.pass_s + sum(rates.group_s + expert_bytes * rates.per_byte(g, ceiling_gbps, not h)
                              for (_, g), h in zip(order, hot))

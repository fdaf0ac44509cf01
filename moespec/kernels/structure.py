"""A model of each expert kernel's time from its structure and a device profile (the paper's first extension:
"the bandwidth needs a model from kernel structure"; Appendix E measures a bandwidth fitted on other models
missing a held-out model by 9-206%).

The native kernels (moespec/kernels/csrc/expert_kernels.cpp) run a pass as groups: one group is one expert applied to
G tokens. The per-slot kernel makes one group per slot (G = 1), in token-major order; the deduplicating kernel one
group per distinct expert (G = the slots that name it), so its groups read each expert once. A group streams the
expert's 2f gate and up rows of length d, then its d down rows of length f, b bytes in all (biases included).

ggml's MUL_MAT_ID (moespec.kernels.peers, llama.cpp's CPU backend, on GGUF blocks) has the same structure: one node
over the pass groups its rows by expert (ggml-mul_mat_id: the deduplicating kind), and ggml-per-slot runs one node
per token, each applying its m experts to that one token (the per-slot kind, groups of G = 1 in token-major order);
each extra node adds fixed time (the graph's node, its threads' barrier, the Python that builds it). Its rates are
its own, from the same profile (a GGUF format's entry, timed through ggml's entry points). ggml also spends fixed time
per weight row: llama.cpp's ggml/src/ggml-cpu/ggml-cpu.c (ggml_compute_forward_mul_mat_id) hands each expert's rows
to the threads in chunks of 64 rows (16 once a group has more than one token) claimed from a per-expert atomic
counter, with no barrier between experts, and ggml_compute_forward_mul_mat_id_one_chunk calls vec_dot once per row
and token: the call, its block loop's start and horizontal sum, the store of one result and the chunk's claim are
r(G) seconds per row of a group, not overlapped with the row's stream. So ggml's cold seconds per byte of an expert
is 1 / C + x(G) + r(G) / (its bytes per row): faster for longer rows, which larger experts have (measured through
ggml's entry point at G = 1 on q8_0 experts of 0.2-160 MB with rows of 256-12288 weights: ~9 ns per row explains
each expert's time to within ~6%, where one rate per G misses by up to ~47% and a fixed time per group by ~20%).
Our native kernels make no call per row (a row task is a tile of rows), and one rate per G fits their experts of
0.4-126 MB to ~2% in median at G = 1; but a group of G tokens ends each row with G horizontal sums and G stores,
fixed time per row and token that a row of thousands of weights hides in its bytes and one of tens does not: on a
2-core Zen 3 EPYC, eight hot experts of the same 24.6 KB (d x f = 16 x 256 against 64 x 64) ran 1.4x longer a call at
G = 9 with 528 rows than with 192 (~2 ns per row and token) and 2.1x at G = 1. So the profile fits r(G) for our
kernels too, from hot experts of short and long rows (moespec.measure.device_profile ROW_SHAPES).

Time of a pass of n tokens at a streaming ceiling C (bytes/s), a roofline per group:

    t = pass_s + token_s n + node_s (n - 1 for the per-slot kind, else 0)
        + min(1, D_cold / W) mean over groups of (1 - h_g) F(G_g)
        + sum over groups g of [ (1 - h_g) group_s + h_g group_hot + R r(G_g)
                                 + b ((1 - h_g) cold(G_g) + h_g kappa(G_g)) ]
    cold(G) = max(s(G) / C + x(G), 1 / C),   kappa(G) = min(kappa_hot(G), max(s(G) / C_p + x(G), 1 / C_p))

(C in cold(G) is C p_e for group g's expert e where the placement p of the memory behind each expert is known:
moespec.measure.placement.)

(b bytes and R weight rows per expert, D_cold = sum over groups of (1 - h_g) b the bytes a pass reads from memory;
kappa_hot(G) the profile's hot passes' rate, C_p the profile's ceiling; node_s is 0 for our native kernels, which
run any pass as one call, and r is 0 where a profile has none; token_s is a call's fixed time per token, its rows
gathered and its output scattered, 0 for ggml's pair, whose per-token work node_s holds. group_s is a cold group's
fixed time, from the overhead passes run after a flush; group_hot that of a group whose expert the cache holds, from
the same passes run hot, as kappa_hot is from the hot rate passes: a hit starts without waiting on memory, so a group
of tiny experts re-read by the per-slot kernel costs its hot group's time, not its cold one's.)

F(G) >= 0 is what a cold pass pays past the fixed time of a pass of tiny experts when it reads ramp_bytes (W) or
more from memory, and a shorter one F times its cold bytes over W: a cold pass streams its first W bytes slower than
the rest. The profile times its cold rate passes at two sizes, W (~48 MiB) and 8x that, so x(G) is the rate past the
first W bytes and F(G) what those bytes cost beyond it (moespec.measure.profile_fit). On a 2-core Xeon VM a cold
pass at G = 1 streamed ~28 GB/s past pass_s from 12 to ~200 MB and ~30 beyond, against a ~33 GB/s ceiling: one rate
from 48 MB passes predicted every longer pass 10-30% slow, and a fixed start in every pass the tiny experts of the
trained pair 1.3-2x slow. A pass of mixed G pays the mean of its groups' F, each by the share of its expert read
from memory.

kappa(G) is the hot passes' rate held to the cold one at the profile's own ceiling C_p (Rates.capped): a byte the
cache serves costs no more than one read from memory. A hot pass slower than a cold pass of the same G did not run
from the cache, or paid for its shapes (the hot experts' rows are shorter than the rate shapes', which r(G) accounts
for where the profile fits it); either way the cold rate bounds the loop better. On a 2-core guest of a
first-generation Zen EPYC (AVX2 only) the hot passes read 1.0-1.4x slower per byte than the cold ones at G = 1..16 in
five profiles, and the uncapped kappa, then a floor under the cold rate, set every cold group's rate there: the dedup
kernel's check passes of three of those profiles missed by up to 34-41%, by 8-11% with the cap. kappa is the rate of
the bytes the cache serves only, not a floor under the cold rate: the cold loop's own cost is x(G), timed on cold
passes, and a floor of the capped kappa held every pass of a state faster than the profile's at the profile's rate
(the same EPYC's benches at 21.6-22.2 GB/s against a profile at 19.8 ran 10-17% faster than that floor predicted; over
eight runs there, 108 of 128 model-kernel-runs within 10% / 20% without it, 93 with it, and none of three other CPUs'
stored runs or the H200's worse).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from moespec import ArgumentError
from moespec.arguments import show


@dataclass(frozen=True)
class Rates:
    """One weight format's rates from a device profile (moespec.formats.devicefile `dtypes.<dtype>`): per G (ascending
    from 1) kappa = hot_s_per_byte, the cold loop's excess x = cold_excess_s_per_byte and the fixed seconds per weight
    row r = row_s (empty: none) and the stream's share s = stream_share (empty: 1 at every G);
    group_s and pass_s the fixed seconds of a group and of a call, ramp_s = cold_ramp_s what a cold pass's first
    ramp_bytes = cold_ramp_bytes cost past its rate, F per G (empty: 0); node_s those of each node past the first of a
    kernel that runs one node per token (ggml-per-slot; 0 where a call is one node); token_s those of each token of
    a call (0 where the profile did not tell them apart); hot_group_s those of a group whose expert the cache holds,
    from the hot overhead passes, as kappa is from the hot rate passes (None: group_s)."""

    G: tuple[int, ...]  # noqa: N815
    hot_s_per_byte: tuple[float, ...]
    cold_excess_s_per_byte: tuple[float, ...]
    group_s: float
    pass_s: float
    node_s: float = 0.0
    row_s: tuple[float, ...] = ()
    stream_share: tuple[float, ...] = ()
    token_s: float = 0.0
    ramp_s: tuple[float, ...] = ()
    ramp_bytes: float = 0.0
    hot_group_s: float | None = None

    def __post_init__(self) -> None:
        if not self.G or self.G[0] != 1 or any(a >= b for a, b in zip(self.G, self.G[1:])):
            raise ArgumentError(f"G must ascend from 1, got {show(self.G)}")
        if len(self.hot_s_per_byte) != len(self.G) or len(self.cold_excess_s_per_byte) != len(self.G):
            raise ArgumentError("hot_s_per_byte and cold_excess_s_per_byte need one value per G")
        if self.row_s and (len(self.row_s) != len(self.G) or min(self.row_s) < 0):
            raise ArgumentError(f"row_s must be empty or hold one value >= 0 per G, got {show(self.row_s)}")
        if self.ramp_s and (len(self.ramp_s) != len(self.G) or min(self.ramp_s) < 0):
            raise ArgumentError(f"ramp_s must be empty or hold one value >= 0 per G, got {show(self.ramp_s)}")
        if self.ramp_s and not self.ramp_bytes > 0:
            raise ArgumentError(f"ramp_bytes must be positive where ramp_s is given, got {show(self.ramp_bytes)}")
        if self.stream_share and (len(self.stream_share) != len(self.G)
                                  or not all(0 <= v <= 1 for v in self.stream_share)):
            raise ArgumentError(f"stream_share must be empty or hold one value in [0, 1] per G, got "
                                f"{show(self.stream_share)}")
        if min(self.hot_s_per_byte) <= 0 or min(self.cold_excess_s_per_byte) < 0 or self.group_s < 0 \
                or self.pass_s < 0 or self.node_s < 0 or self.token_s < 0 or self.group_hot < 0:
            raise ArgumentError("hot_s_per_byte must be positive; cold_excess_s_per_byte, group_s, pass_s, node_s, "
                                "token_s and hot_group_s >= 0")

    @property
    def group_hot(self) -> float:
        """The fixed seconds of a group whose expert the cache holds: hot_group_s, group_s where the profile has
        none."""
        return self.group_s if self.hot_group_s is None else self.hot_group_s

    @classmethod
    def from_profile(cls, entry: Mapping[str, Any], kind: str = "dedup") -> Rates:
        """The rates kernel kind `kind` (slot or dedup) runs at, from one `dtypes` entry of a validated device.json:
        the entry's own, or for the per-slot kind its `slot` entry where it has one (the kernel is a program of its
        own there); node_s and token_s 0, no row_s, stream_share or cold_ramp_s where the entry has none, a hit's
        group_s where it has no hot_group_s."""
        if kind not in ("slot", "dedup"):
            raise ArgumentError(f"kind must be 'slot' or 'dedup', got {show(kind)}")
        if kind == "slot" and "slot" in entry:
            entry = entry["slot"]
        return cls(tuple(entry["G"]), tuple(entry["hot_s_per_byte"]), tuple(entry["cold_excess_s_per_byte"]),
                   float(entry["group_s"]), float(entry["pass_s"]), float(entry.get("node_s", 0.0)),
                   tuple(entry.get("row_s", ())), tuple(entry.get("stream_share", ())),
                   float(entry.get("token_s", 0.0)), tuple(entry.get("cold_ramp_s", ())),
                   float(entry.get("cold_ramp_bytes", 0.0)),
                   None if entry.get("hot_group_s") is None else float(entry["hot_group_s"]))

    def with_share(self, shares: Rates, ceiling_gbps: float) -> Rates:
        """These rates, taken at one ceiling C = ceiling_gbps GB/s (a pinned profile's: its calls cannot tell the
        stream's share), with the share s'(G) of `shares` (a profile whose calls met several states of the host):
        x'(G) = x(G) + (s(G) - s'(G)) / C, so a cold group costs what it cost at C and follows s' elsewhere (x'
        not below 0)."""
        if not ceiling_gbps > 0:
            raise ArgumentError(f"ceiling_gbps must be positive, got {show(ceiling_gbps)}")
        new = tuple(shares.share(g) for g in self.G)
        excess = tuple(max(0.0, x + (self.share(g) - s) / (ceiling_gbps * 1e9))
                       for g, x, s in zip(self.G, self.cold_excess_s_per_byte, new))
        return replace(self, cold_excess_s_per_byte=excess, stream_share=new)

    def capped(self, ceiling_gbps: float) -> Rates:
        """These rates with each hot rate no slower than the same G's cold rate at the profile's ceiling C_p =
        ceiling_gbps GB/s: kappa(G) = min(kappa(G), max(s(G) / C_p + x(G), 1 / C_p)) (module docstring)."""
        if not ceiling_gbps > 0:
            raise ArgumentError(f"ceiling_gbps must be positive, got {show(ceiling_gbps)}")
        stream = 1.0 / (ceiling_gbps * 1e9)
        kappa = tuple(min(k, max(self.share(g) * stream + x, stream))
                      for g, k, x in zip(self.G, self.hot_s_per_byte, self.cold_excess_s_per_byte))
        return replace(self, hot_s_per_byte=kappa)

    def loop_scaled(self, k: float) -> Rates:
        """These rates on a host whose loop runs k times as long as the profile's: every term in seconds but the
        stream's s(G) / C (x, kappa, r, F and the fixed seconds of a pass, group, node, token and hit) times k; G, s
        and ramp_bytes kept. k = 1 is these rates (moespec.measure.state_probe measures k)."""
        if isinstance(k, bool) or not isinstance(k, (int, float)) or not (math.isfinite(k) and k > 0):
            raise ArgumentError(f"k must be a positive number, got {show(k)}")
        times = lambda v: tuple(k * x for x in v)  # noqa: E731
        return replace(self, hot_s_per_byte=times(self.hot_s_per_byte),
                       cold_excess_s_per_byte=times(self.cold_excess_s_per_byte), group_s=k * self.group_s,
                       pass_s=k * self.pass_s, node_s=k * self.node_s, row_s=times(self.row_s),
                       token_s=k * self.token_s, ramp_s=times(self.ramp_s),
                       hot_group_s=None if self.hot_group_s is None else k * self.hot_group_s)

    def share(self, g: int) -> float:
        """The stream's share s(g) of a cold group of g tokens: interpolated, its last value past the profile's G; 1
        without stream_share."""
        _check_tokens(g)
        return float(np.interp(g, self.G, self.stream_share)) if self.stream_share else 1.0

    def ramp(self, g: int) -> float:
        """A cold pass's start F(g) at groups of g tokens: interpolated, its last value past the profile's G; 0
        without ramp_s."""
        _check_tokens(g)
        return float(np.interp(g, self.G, self.ramp_s)) if self.ramp_s else 0.0

    def per_row(self, g: int) -> float:
        """Fixed seconds per weight row of a group of g tokens (0 without row_s): r(g) interpolated, past the
        profile's G on the line through its last two values."""
        _check_tokens(g)
        return _on_grid(self.G, self.row_s, g) if self.row_s else 0.0

    def per_byte(self, g: int, ceiling_gbps: float, cold: bool = True) -> float:
        """Seconds per weight byte of a group of g tokens: max(s(g) / C + x(g), 1 / C) when it reads from memory at a
        ceiling of C = ceiling_gbps GB/s, kappa(g) when the cache serves it; x and kappa past the profile's G on the
        line through their last two values (the loop's work grows with its tokens)."""
        _check_tokens(g)
        if not ceiling_gbps > 0:
            raise ArgumentError(f"ceiling_gbps must be positive, got {show(ceiling_gbps)}")
        if not cold:
            return _on_grid(self.G, self.hot_s_per_byte, g)
        excess = _on_grid(self.G, self.cold_excess_s_per_byte, g)
        stream = 1.0 / (ceiling_gbps * 1e9)
        return max(self.share(g) * stream + excess, stream)


def kind_rates(entry: Mapping[str, Any], ceiling_gbps: float) -> dict[str, Rates]:
    """kind (slot, dedup) -> the rates that kernel runs at, from one `dtypes` entry of a validated device.json whose
    ceiling is ceiling_gbps GB/s (its hot rates capped there: Rates.capped)."""
    return {kind: Rates.from_profile(entry, kind).capped(ceiling_gbps) for kind in ("slot", "dedup")}


def _check_tokens(g: int) -> None:
    if isinstance(g, bool) or not isinstance(g, (int, np.integer)) or g < 1:
        raise ArgumentError(f"g must be a whole number of tokens >= 1, got {show(g)}")


def _on_grid(grid: Sequence[int], values: Sequence[float], g: int) -> float:
    """The inner loop's work at g tokens: interpolated on the profile's G, past its largest on the line through its
    last two values (never falling)."""
    if g <= grid[-1]:
        return float(np.interp(g, grid, values))
    slope = (values[-1] - values[-2]) / (grid[-1] - grid[-2]) if len(values) > 1 else 0.0
    return values[-1] + max(slope, 0.0) * (g - grid[-1])


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


def hit_share(order: Sequence[tuple[int, int]], expert_bytes: float, cache_bytes: float) -> list[float]:
    """Per group: the share of its expert a cache of cache_bytes still holds: 0 on its first read, else
    min(1, cache_bytes / D), D the distinct expert bytes read since its previous read, its own included."""
    if not expert_bytes > 0 or not cache_bytes >= 0:
        raise ArgumentError(f"expert_bytes must be positive and cache_bytes >= 0, got {show(expert_bytes)}, "
                            f"{show(cache_bytes)}")
    last: dict[int, int] = {}
    out = []
    for i, (expert, _) in enumerate(order):
        prev = last.get(expert)
        between = 0 if prev is None else len({e for e, _ in order[prev + 1:i]} | {expert})
        out.append(0.0 if prev is None else min(1.0, cache_bytes / (between * expert_bytes)))
        last[expert] = i
    return out


def pass_time(rates: Rates, kind: str, ids: np.ndarray, expert_bytes: float, expert_rows: int, ceiling_gbps: float,
              cache_bytes: float, placement: Sequence[float] | None = None) -> float:
    """Predicted seconds of one pass of the expert operation (the module docstring): kernel kind 'slot' or 'dedup',
    ids [n, m], b = expert_bytes and R = expert_rows weight rows per expert, at a streaming ceiling of ceiling_gbps
    GB/s; with `placement` (one value per expert id, moespec.measure.placement) expert e's cold bytes read at
    C placement[e], the rate of the memory its pages lie in."""
    if isinstance(expert_rows, bool) or not isinstance(expert_rows, (int, np.integer)) or expert_rows < 1:
        raise ArgumentError(f"expert_rows must be a whole number >= 1, got {show(expert_rows)}")
    order = groups(kind, ids)
    if placement is not None and (len(placement) <= max(e for e, _ in order) or not all(v > 0 for v in placement)):
        raise ArgumentError(f"placement must hold a positive value for every expert id, got {len(placement)} values "
                            f"for ids up to {max(e for e, _ in order)}")
    hot = hit_share(order, expert_bytes, cache_bytes)
    nodes = len(ids) - 1 if kind == "slot" else 0
    start = sum((1.0 - h) * rates.ramp(g) for (_, g), h in zip(order, hot)) / len(order)
    if start:
        start *= min(1.0, sum(1.0 - h for h in hot) * expert_bytes / rates.ramp_bytes)
    return rates.pass_s + start + rates.token_s * len(ids) + rates.node_s * nodes + sum(
        (1.0 - h) * rates.group_s + h * rates.group_hot + expert_rows * rates.per_row(g)
        + expert_bytes * ((1.0 - h) * rates.per_byte(g, ceiling_gbps * (1.0 if placement is None else placement[e]))
                          + h * rates.per_byte(g, ceiling_gbps, cold=False))
        for (e, g), h in zip(order, hot))

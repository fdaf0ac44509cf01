"""`moespec profile`: the one-time device profile the structural model of the expert kernels reads
(moespec.kernels.structure; written as device.json, moespec.formats.devicefile). Not the acceptance profile of
moespec.theory.profile.

Microbenchmarks of the kernels' building blocks, each through the kernels' own entry point (moespec.kernels.expert_op:
native on the CPU for bf16 and fp32, Triton on a CUDA device; for a GGUF format, q8_0 or q4_0, on the CPU, ggml's pair
through moespec.kernels.peers.ggml_quantized, ggml-mul_mat_id playing dedup and ggml-per-slot playing slot; at the
threads asked) and never on a model's expert shapes (RATE_SHAPES and the others are synthetic; a test checks them
against every preset and the trained pair); the rates are fitted by moespec.measure.profile_fit:
- rates: the deduplicating kernel on passes of n = G tokens that all name the same E experts, so every group is one
  expert applied to G tokens, for G = 1..16 and a few larger (G_VALUES). Cold (after the cache flush) on every rate
  shape, at two sizes (COLD_BYTES: E experts of ~48 MiB in all, past the last-level cache, and of ~8x that), and hot
  (the same pass run just before) on HOT_SHAPES, experts of ~4 MB, HOT_EXPERTS of them and, where the cache the
  process keeps is large, more (HOT_CACHE_SHARE of it); our kernels on the CPU also on ROW_SHAPES, experts of short
  rows at the same bytes, so their fit tells a group's fixed seconds per weight row r_G (row_s) from kappa_G (hot
  seconds per byte = kappa_G + r_G x its rows per byte, least squares per G, none below 0), and r_G is taken off
  the cold passes before x_G. The line of time against a pass's bytes separates what a pass pays once from its rate:
  kappa_G is the hot passes' slope in seconds per byte (their intercept dropped: a pass
  starts once); the cold loop's excess x_G the slope over cold calls of their seconds per byte less s_G / C, C the
  ceiling sampled right after each, so the drift of a shared host's bandwidth between calls is taken out call by call,
  and F_G (cold_ramp_s) what the first W bytes of a cold pass (cold_ramp_bytes: the smaller size's) cost past that
  rate and the fixed costs of a pass of tiny experts (moespec.kernels.structure). s_G (stream_share) is the
  least-squares coefficient of 1 / C in the cold calls' seconds per byte where those calls met more than one state of
  the host (STATE_SPREAD), in [0, 1], else 1 (stream_fit). ggml's pair spends fixed time per weight row
  (moespec.kernels.structure), so a GGUF format is timed on GGUF_RATE_SHAPES, experts of ~0.5-170 MB in q8_0 with rows
  of 384-12800 weights, and per G its cold seconds per byte less s_G / C (each pass's median over its calls) is fitted
  as x_G + r_G / (bytes per row) + F_G / max(bytes of the pass, W), least squares over the passes, none below 0: r_G
  (row_s) the fixed seconds per row, subtracted before kappa too.
- overhead: the per-slot kernel on a tiny expert (64 x 64) at 8 tokens of 1, 2, 4 and 8 slots and at 1, 2 and 4
  tokens of 8 slots, cold and hot: the fixed time of a call (pass_s), of a group (group_s) and of a token (token_s:
  gathering its row, scattering its output), by least squares on the time left after the groups' bytes. ggml's pair
  adds its dedup kernel at the 8-token passes; its per-slot kernel runs one node per token, so there the fewer-token
  passes tell the fixed time of each node past the first (node_s) instead.
  A cold call pays more (its threads wake, its code and data come from memory); the model takes the cold ones, as
  every call the bench times follows a flush, and the hot ones are subtracted from the hot rate passes only.
- self-check (moespec.measure.profile_check): both kernels on chosen ids of the check shape, n = 2..9: the model
  predicts them from the rates above at each call's ceiling; the median and largest relative error are the profile's
  own stated error.
- streaming read at the chunk sizes the kernels read (a row task is ~1 MiB), cold; thread scaling: the rate passes
  and the streaming read on one thread (the CPU's).
- cache: the capacity a per-slot re-read finds (moespec.measure.cache_probe): cold per-slot passes re-reading a
  cycle of synthetic experts at known distances, the first dtype's; `cache_bytes` is the fitted capacity, at most
  the last-level cache's size (`cache_nominal_bytes`).
On a CUDA device (sizes_for) the passes are sized to the GPU: G up to the Triton kernels' 16 tokens, cold passes of
CUDA_COLD_L2 L2s (a short pass is mostly launch and ramp), hot passes filling CUDA_HOT_L2 of the L2; the per-slot
kernel, a program of its own there, gets its own cold and hot rate passes (one token naming E experts: G = 1) and
both kinds their own overhead passes, so each kind has its own rates (device.json `dtypes.<dtype>.slot`). No cache
probe runs there: `cache_bytes` is the L2's size. The probe measures what other tenants and the replacement policy
leave of a shared last-level cache; a GPU's L2 serves the one process, and the probe's passes of small experts are
launch-bound there (~14 us of fixed costs against 2-40 us of bytes on an H200), so they cannot measure it: in the
profile of results/structure-model/gpu-h200 they fitted 1 MiB of a 60 MiB L2, driven by passes of 53 slots a token
that ran below the cold rate for reasons of their own, and per-slot re-reads of the check passes ran 20-30% under a
cold read, as a hit at the slot kernel's hot rate predicts. The ceiling is the timer's: a streaming read on the
CPU, a device copy on the GPU.
Every cold call is timed as the bench times one (moespec.measure.contention.Cores.cold_call: the weights it reads
read once, a cache flush, the machine read, the call, the machine read again; the threads watched, never lowered:
device.json protocol.contention),
so the fixed costs fitted are those a bench's call pays; in rounds whose order is rotated so drift hits every item
alike; medians and IQRs over rounds. Pinned (`level_gbps`, `level_wait_s`; the CPU only, off unless asked for:
moespec.measure.level), every call is taken at one bandwidth level of the host: a call whose
reference read after it is off the level runs again (Level.measured), so the rates are of one state, the one a bench
pinned to the same level (`bench --pin-gbps`) meets; device.json `level` records it. The stream's share s_G is then
1, not fitted: the calls are of one state by construction, and the spread of their samples within the level's band is
the read's own noise, on which a regression of time on 1 / C is pulled toward 0 (a pinned profile's fit read s(1) =
0.68 and s = 0-0.3 past G = 8, and its self-check came out 10-29% slow).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable

import numpy as np
import torch

from moespec import MoespecError
from moespec.defaults import BENCH_DTYPES, DEVICE_KINDS, KERNELS, QUANTIZED, REPS_LIMIT
from moespec.formats.devicefile import FORMAT_NAME, FORMAT_VERSION, DeviceProfile
from moespec.formats.files import check_output, holds_outputs, provenance, write_json
from moespec.kernels import KERNELS as REGISTRY
from moespec.kernels import PAIRS, expert_op, implementation, pages
from moespec.kernels.peers import GGML_PEERS, ggml_quantized
from moespec.measure.contention import Cores
from moespec.measure.layer import gguf_blocks, torch_dtype
from moespec.measure.level import Level, check_level, host_level
from moespec.measure.timing import StreamRead, Timer, matmul_peak, measure_stream_read, median_iqr, timer_for
from moespec.model.weights import expert_matrix_bytes, expert_rows
from moespec.measure.cache_probe import PROBE_SHAPE, probe_cycles, probe_ids
from moespec.measure import profile_check
from moespec.measure.placement import expert_placement
from moespec.measure.profile_fit import Item
from moespec.measure.profile_refit import Timed, fit_profile, record_calls, rows_fit

# Synthetic (d, f) shapes, none a model's: row lengths d and f from 640 to 3584 columns, experts of 10-55 MB in bf16.
RATE_SHAPES = ((2560, 640), (1024, 1920), (1792, 1152), (3584, 2560))
# A GGUF format's (ggml's pair) rate shapes: its per-row time needs rows of many lengths, so experts of ~0.5 to
# ~170 MB in q8_0 (rows of 384 to 12800 weights; two of the same bytes with the long rows in gate/up or in down)
GGUF_RATE_SHAPES = ((384, 384), (832, 832), (1600, 1600), (3840, 640), (640, 3840), (2688, 2688), (4352, 4352),
                    (4224, 12800))
# Hot passes: one expert of ~4 MB, which a shared last-level cache keeps whole between two calls (an expert of ~12
# MB measured partly from memory here)
HOT_SHAPES = ((1280, 512), (768, 896), (1664, 384))
# Our kernels' hot passes on the CPU add experts of short rows (32-256 weights; 31, 74 and 197 KB in bf16): per row
# and token a group spends fixed time (a horizontal sum, a store, the tile's loop) that a row of thousands of weights
# hides in its bytes and one of tens does not, so the hot fit tells it (r_G) from the rate per byte by row length;
# down to 32 weights, the trained pair's down rows: a fit over rows of 64 weights and longer gave those too little
ROW_SHAPES = ((32, 160), (64, 192), (256, 128))
HOT_EXPERTS = 2  # at least: the threads' row tasks overlap across groups, as in a real pass
HOT_BYTES = 8 << 20  # the smaller hot passes: two of HOT_SHAPES' experts, which a 32 MiB last-level cache keeps whole
# The larger hot passes fill this share of the cache the process keeps (kept_cache): where that is ~4x HOT_BYTES or
# more, the two sizes tell a hot pass's fixed start from the cached rate (a pass of 8 MB spent a third of its time
# outside the loop on a VM keeping 128-256 MiB); on a 32 MiB cache they are the same passes, and kappa their median
HOT_CACHE_SHARE = 1 / 8
OVERHEAD_SHAPE = (64, 64)  # 24 KiB in bf16: its time is the fixed costs
OVERHEAD_SLOTS = (1, 2, 4, 8)  # slots per token of the overhead passes (8 tokens: 8..64 groups)
OVERHEAD_TOKENS = 8
NODE_TOKENS = (1, 2, 4)  # overhead passes at fewer tokens (of 8 slots): a token's fixed time (ggml-per-slot: a node's)
G_VALUES = (*range(1, 17), 24, 32, 48, 64)  # tokens per group: 1..16 where the loop turns compute-bound, then beyond
# A cold rate pass reads about this much: past a 32 MiB last-level cache, and 8x that, so that time against bytes
# gives what a pass's first bytes cost (moespec.kernels.structure: F) apart from the rate it settles at, over the
# range a model's verification pass reads (an OLMoE layer: 100 MB at one token, 0.5-0.9 GB at nine)
COLD_BYTES = (48 << 20, 384 << 20)
STREAM_CHUNKS = (64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20)  # around the kernels' ~1 MiB row task
THREAD_SCALING_G = (1, 4, 16)
# On a CUDA device: G up to the Triton kernels' TOKENS_MAX (16; a verification pass's groups hold at most n = 9),
# interpolated between
CUDA_G_VALUES = (1, 2, 3, 4, 6, 9, 12, 16)
# A cold pass reads this many L2s (~240 MB on an H200, ~60 us at its ~4 TB/s: well past the launch and the ramp) ...
CUDA_COLD_L2 = 4
# ... and a hot pass's experts fill this share of it (~24 MB: the L2 keeps them between two calls)
CUDA_HOT_L2 = 0.4
DEFAULT_REPS = 7
SEED = 0


@dataclass(frozen=True)
class ProfileConfig:
    """A profile: written to `out`; the device kind (cpu: the native kernels and ggml's pair; cuda: the Triton
    kernels on the current CUDA device), the weight formats to time (of BENCH_DTYPES: our kernels for bf16 and fp32,
    ggml's pair for the GGUF formats, on the CPU only), the timed rounds, the threads (None:
    torch.get_num_threads()) and the host's bandwidth level to take every call at (`level_gbps`, `level_wait_s`: off
    unless asked for, on the CPU only; moespec.measure.level.pin_wait)."""

    out: str
    device: str = "cpu"
    dtypes: tuple[str, ...] = ("bf16",)
    reps: int = DEFAULT_REPS
    threads: int | None = None
    level_gbps: float | None = None
    level_wait_s: float | None = None

    def check(self) -> None:
        check_output(self.out)
        check_level(self.level_gbps, self.level_wait_s)
        if self.device not in DEVICE_KINDS:
            raise MoespecError(f"--device {self.device}: give one of {', '.join(DEVICE_KINDS)}")
        if self.device == "cuda" and not torch.cuda.is_available():
            raise MoespecError("--device cuda: this torch sees no CUDA device")
        if not self.dtypes or not set(self.dtypes) <= set(BENCH_DTYPES):
            raise MoespecError(f"--dtypes {','.join(self.dtypes)}: give some of {', '.join(BENCH_DTYPES)}")
        if self.device == "cuda" and set(self.dtypes) & set(QUANTIZED):
            raise MoespecError(f"--dtypes {','.join(self.dtypes)}: on cuda the profile times the Triton kernels, at "
                               f"bf16 or fp32 (the GGUF formats run in ggml's CPU kernels)")
        if isinstance(self.reps, bool) or not isinstance(self.reps, int) or not 2 <= self.reps <= REPS_LIMIT:
            raise MoespecError(f"--reps must be a whole number in 2..{REPS_LIMIT}, got {self.reps!r}")


def pair_of(dtype: str) -> dict[str, str]:
    """kind (slot, dedup) -> the kernel that plays it at `dtype`: ggml's pair for a GGUF format (the only kernels
    that run its blocks), ours otherwise."""
    return dict(zip(KERNELS, GGML_PEERS if dtype in QUANTIZED else PAIRS[0]))


@dataclass(frozen=True)
class Weights:
    """Seeded synthetic experts of one shape in one format: gate_up [E, 2f, d] and down [E, d, f] (GGUF blocks,
    uint8, for a quantized format), and the bytes of one expert."""

    gate_up: torch.Tensor
    down: torch.Tensor
    dtype: str
    d: int
    f: int

    @classmethod
    def draw(cls, d: int, f: int, experts: int, dtype: str, device: str = "cpu") -> Weights:
        gen = torch.Generator().manual_seed(SEED)
        tensors = [torch.randn(experts, *shape, generator=gen) * 0.02 for shape in ((2 * f, d), (d, f))]
        if dtype in QUANTIZED:
            return cls(*(pages.huge(gguf_blocks(t, dtype)) for t in tensors), dtype, d, f)
        return cls(*(pages.huge(t.to(torch_dtype(dtype)).to(device)) for t in tensors), dtype, d, f)

    @staticmethod
    def bytes_of(d: int, f: int, dtype: str) -> int:
        """Bytes of one expert of shape (d, f) in `dtype`: 2f rows of d weights and d rows of f."""
        return expert_matrix_bytes(d, f, dtype)

    @property
    def expert_bytes(self) -> int:
        return self.bytes_of(self.d, self.f, self.dtype)

    @property
    def rows(self) -> int:
        return expert_rows(self.d, self.f)

    def reads(self, ids: np.ndarray) -> tuple[torch.Tensor, ...]:
        """The slices of these weights a pass on ids [n, m] reads (pages.expert_slices)."""
        return tuple(pages.expert_slices([self.gate_up, self.down], ids))

    def call(self, kernel: str, ids: np.ndarray, threads: int | None) -> Callable[[], object]:
        """The expert op of `kernel` on ids [n, m] over these weights (inputs drawn once: in the weights' dtype, fp32
        for GGUF blocks, as the bench draws them)."""
        n, m = ids.shape
        gen, device = torch.Generator().manual_seed(SEED), self.gate_up.device
        x_dtype = torch.float32 if self.dtype in QUANTIZED else self.gate_up.dtype
        x = torch.randn(n, self.d, generator=gen).to(x_dtype).to(device)
        weights = torch.softmax(torch.randn(n, m, generator=gen), dim=-1).to(x_dtype).to(device)
        ids_t = torch.from_numpy(np.ascontiguousarray(ids, dtype=np.int64)).to(device)
        if self.dtype in QUANTIZED:
            shape = (self.gate_up.shape[0], self.d, self.f)
            return lambda: ggml_quantized(kernel, x, ids_t, weights, self.gate_up, self.down, self.dtype, shape,
                                          threads)
        return lambda: expert_op(kernel, x, ids_t, weights, self.gate_up, self.down, threads=threads)


def _same_experts(tokens: int, experts: int) -> np.ndarray:
    """ids [tokens, experts]: every token names experts 0..experts-1, so each group applies one expert to all tokens."""
    return np.tile(np.arange(experts, dtype=np.int64), (tokens, 1))


@dataclass(frozen=True)
class Sizes:
    """What the profile times on one kind of device (sizes_for): the G of the rate passes, the bytes of the cold rate
    passes and those the hot passes' experts fill (each shape's expert counts: expert_counts; two sizes let the fit
    tell what a pass pays once from its rate), whether the per-slot kernel gets rate passes and fixed costs of its own
    (`apart`), whether the cache probe runs (else the cache is the last-level cache's size), and the device the
    weights live on."""

    g_values: tuple[int, ...]
    cold_bytes: tuple[int, ...]
    hot_bytes: tuple[int, ...]
    apart: bool
    probe: bool
    device: str


def sizes_for(device_kind: str, cache_bytes: int = 0) -> Sizes:
    """The CPU's sizes (G_VALUES, COLD_BYTES, hot passes of HOT_BYTES and HOT_CACHE_SHARE of the cache the process
    keeps, cache_bytes; one fit for both kinds) or a CUDA device's, from its L2 (cache_bytes; module docstring)."""
    if device_kind == "cuda":
        return Sizes(CUDA_G_VALUES, (CUDA_COLD_L2 * cache_bytes,), (int(CUDA_HOT_L2 * cache_bytes),), True, False,
                     "cuda")
    return Sizes(G_VALUES, COLD_BYTES, (HOT_BYTES, int(HOT_CACHE_SHARE * cache_bytes)), False, True, "cpu")


def expert_counts(fills: tuple[int, ...], expert_bytes: int, least: int) -> list[int]:
    """The distinct expert counts (at least `least`) whose experts of expert_bytes come nearest each fill, ascending."""
    return sorted({max(least, round(fill / expert_bytes)) for fill in fills})


def _overhead_passes(dtype: str, apart: bool = False) -> list[tuple[str, int, int]]:
    """(kind, tokens, slots) of the overhead passes (module docstring): 8 tokens of 1..8 slots, and fewer tokens of 8
    slots (which tell a fixed time per token, or ggml-per-slot's per node, from a group's); ggml's pair, and the kinds
    `apart`, add the dedup kernel's 8-token passes, the kinds apart its fewer-token ones too."""
    passes = [("slot", OVERHEAD_TOKENS, m) for m in OVERHEAD_SLOTS] + [("slot", t, max(OVERHEAD_SLOTS))
                                                                         for t in NODE_TOKENS]
    if dtype in QUANTIZED or apart:
        passes += [("dedup", OVERHEAD_TOKENS, m) for m in OVERHEAD_SLOTS]
    if apart:
        passes += [("dedup", t, max(OVERHEAD_SLOTS)) for t in NODE_TOKENS]
    return passes


def hot_shapes(dtype: str, device: str) -> tuple[tuple[int, int], ...]:
    """The hot passes' shapes of a dtype on a device kind: HOT_SHAPES, and ROW_SHAPES where the per-row time is fitted
    over the hot passes (rows_fit)."""
    return HOT_SHAPES + (ROW_SHAPES if rows_fit(dtype, device) == "hot" else ())


def rate_shapes(dtype: str) -> tuple[tuple[int, int], ...]:
    """The cold rate passes' shapes of a dtype: GGUF_RATE_SHAPES for a GGUF format (ggml's per-row time needs
    rows of many lengths), RATE_SHAPES for our kernels."""
    return GGUF_RATE_SHAPES if dtype in QUANTIZED else RATE_SHAPES


def _rate_items(dtype: str, threads: int | None, sizes: Sizes, state: str,
                scaling: bool = False) -> tuple[list[Item], dict[Any, Any], dict[Any, tuple[Weights, np.ndarray]]]:
    """The cold (every rate shape) or hot (hot_shapes) rate passes of one dtype, each shape at the expert counts of
    its sizes: the dedup kernel at each G, and where `apart` the per-slot kernel at G = 1 (one token naming the E
    experts); keys (state, kind, d, f, G, E). With `scaling`, the first shape's dedup passes at THREAD_SCALING_G on
    one thread too, at its fewest experts (keys ("threads_1", d, f, G)); and the weights and experts each cold pass
    reads (its placement: _place), `behind`."""
    pair, items, info, behind = pair_of(dtype), [], {}, {}
    for i, (d, f) in enumerate(rate_shapes(dtype) if state == "cold" else hot_shapes(dtype, sizes.device)):
        b = Weights.bytes_of(d, f, dtype)
        counts = expert_counts(sizes.cold_bytes, b, 1) if state == "cold" else \
            expert_counts(sizes.hot_bytes, b, HOT_EXPERTS)
        w = Weights.draw(d, f, max(counts), dtype, sizes.device)
        for experts in counts:
            runs = [("dedup", g, _same_experts(g, experts)) for g in sizes.g_values]
            if sizes.apart:
                runs.append(("slot", 1, _same_experts(1, experts)))
            for kind, g, ids in runs:
                key = (state, kind, d, f, g, experts)
                items.append(Item(key, w.call(pair[kind], ids, threads), cold=state == "cold", reads=w.reads(ids)))
                info[key] = (w.expert_bytes, w.rows, experts)
                if state == "cold":
                    behind[key] = (w, np.arange(experts))
        if scaling and i == 0:
            items += [Item(("threads_1", d, f, g), w.call(pair["dedup"], _same_experts(g, counts[0]), 1),
                           reads=w.reads(_same_experts(g, counts[0]))) for g in THREAD_SCALING_G]
    return items, info, behind


def _items(dtype: str, threads: int | None, nominal: int | None,
           sizes: Sizes | None = None) -> tuple[list[Item], dict[Any, Any], dict[Any, tuple[Weights, np.ndarray]]]:
    """Every timed call of one dtype (through the kernels of its pair, pair_of) at `sizes` (None: the CPU's), the
    bytes and rows of the experts behind each key, and the weights and experts read by the passes whose placement
    counts (the cold rate passes, the cache probe's, the self-check's: _place); with `nominal` (the last-level
    cache's bytes: the first dtype) the cache probe too, and on the CPU the thread scaling."""
    sizes = sizes or sizes_for("cpu")
    pair = pair_of(dtype)
    items, info, behind = _rate_items(dtype, threads, sizes, "cold", scaling=bool(nominal) and sizes.device == "cpu")
    if nominal and sizes.probe:  # the cache a per-slot re-read finds (moespec.measure.cache_probe), first dtype's pair
        cycles = probe_cycles(Weights.bytes_of(*PROBE_SHAPE, dtype), nominal)
        w = Weights.draw(*PROBE_SHAPE, max(cycles), dtype, sizes.device)
        for k in cycles:
            ids = probe_ids(k)
            items.append(Item(("cache", k), w.call(pair["slot"], ids, threads), reads=w.reads(ids)))
            info[("cache", k)] = (w.expert_bytes, w.rows, ids)
            behind[("cache", k)] = (w, np.unique(ids))
    hot_items, hot_info, _ = _rate_items(dtype, threads, sizes, "hot")
    items += hot_items
    info |= hot_info
    w = Weights.draw(*OVERHEAD_SHAPE, OVERHEAD_TOKENS * max(OVERHEAD_SLOTS), dtype, sizes.device)
    for kind, tokens, m in _overhead_passes(dtype, sizes.apart):  # distinct experts in every slot: groups = tokens m
        ids = np.arange(tokens * m, dtype=np.int64).reshape(tokens, m)
        for cold in (True, False):
            key = ("overhead", kind, tokens, m, "cold" if cold else "hot")
            items.append(Item(key, w.call(pair[kind], ids, threads), cold=cold, reads=w.reads(ids)))
            nodes = tokens if kind == "slot" and dtype in QUANTIZED else 1  # ggml-per-slot: a node per token
            info[key] = (w.expert_bytes, w.rows, (tokens * m, nodes))
    w = Weights.draw(*profile_check.CHECK_SHAPE, profile_check.CHECK_EXPERTS, dtype, sizes.device)
    for n, u, ids in profile_check.check_passes():
        for kind in KERNELS:
            items.append(Item(("check", kind, n, u), w.call(pair[kind], ids, threads), reads=w.reads(ids)))
            info[("check", kind, n, u)] = (w.expert_bytes, w.rows, ids)
            behind[("check", kind, n, u)] = (w, np.unique(ids))
    return items, info, behind


def _place(by_key: dict[Any, Item], behind: dict[Any, tuple[Weights, np.ndarray]], timer: Timer,
           sample: Callable[[], float]) -> list[float] | None:
    """The placement of every weights drawn (moespec.measure.placement) against the calls' ceiling buffer `sample`:
    each cold rate and cache-probe call's ceiling samples times the harmonic mean of its experts' p_e (the read rate
    of the memory its bytes lie in at that moment), in place; returns the self-check weights' p_e (its passes are
    predicted with them), None where there is no placement (a GPU)."""
    placed: dict[int, list[float] | None] = {}
    check = None
    for key, (w, experts) in behind.items():
        if id(w) not in placed:
            placed[id(w)] = expert_placement([w.gate_up, w.down], timer, sample)
        p = placed[id(w)]
        if key[0] == "check":
            check = p
        elif p is not None:
            ratio = len(experts) / sum(1.0 / p[e] for e in experts)
            by_key[key].ceilings = [c * ratio for c in by_key[key].ceilings]
    return check


def _time_rounds(items: list[Item], reps: int, timer: Timer, level: Level, say: Callable[[str], None],
                 ceiling: Callable[[], float], cores: Cores) -> None:
    """`reps` rounds over the items, round r started r/reps of the way through (drift balanced, as the bench's
    rounds); a cold item as the bench times a call (Cores.cold_call: after a flush, the machine read around it) with
    one `ceiling` sample after it (the timer's ceiling, its buffer drawn once), a hot one right after an untimed call;
    each call at the level where one is pinned (Level.measured)."""
    for item in items:
        item.fn()  # warm-up: code and buffers ready
        item.seconds, item.ceilings = [], []

    def call(item: Item) -> tuple[float, float | None]:
        if item.cold:
            return cores.cold_call(timer, item.fn, item.reads), ceiling()
        timer.warm(item.fn)
        return timer.time(item.fn), None

    for rep in range(reps):
        start = rep * len(items) // reps
        for item in [items[(start + j) % len(items)] for j in range(len(items))]:
            seconds, sample = level.measured(partial(call, item))
            item.seconds.append(seconds)
            if sample is not None:
                item.ceilings.append(sample)
        say(f"round {rep + 1} of {reps} done")


def _stream_chunks(timer: Timer, reps: int) -> dict[str, Any]:
    """GB/s of a cold streaming read of each chunk size (all threads): median and IQR over reps."""
    gbps, iqr = [], []
    for chunk in STREAM_CHUNKS:
        read = StreamRead(chunk)
        read()
        samples = []
        for _ in range(reps):
            timer.flush()
            samples.append(read())
        med, spread = median_iqr(samples)
        gbps.append(med)
        iqr.append(spread)
    return {"chunk_bytes": list(STREAM_CHUNKS), "gbps": gbps, "iqr_gbps": iqr}


def _check_kernels(config: ProfileConfig) -> None:
    """The kernels each dtype needs run here: ggml's for a GGUF format, ours natively on the CPU."""
    for dtype in config.dtypes:
        if dtype in QUANTIZED and not set(GGML_PEERS) <= set(REGISTRY):
            raise MoespecError(f"--dtypes {dtype}: ggml's kernels (ggml-python) are not installed here")
        if config.device == "cpu" and dtype not in QUANTIZED \
                and implementation("dedup", torch_dtype(dtype), "cpu") != "native":
            raise MoespecError(f"the native kernels are unavailable here ({dtype}): the profile times them only")


@holds_outputs(lambda config: [config.out])
def run_profile(config: ProfileConfig, say: Callable[[str], None] = lambda text: None) -> DeviceProfile:
    """Time the microbenchmarks (module docstring) and write device.json to config.out; `say` gets one line per
    stage."""
    started = time.perf_counter()
    config.check()
    _check_kernels(config)
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    threads = torch.get_num_threads()
    timer = timer_for(config.device)
    nominal = timer.cache_bytes
    sizes = sizes_for(timer.kind, nominal)
    level = host_level(config.level_gbps, config.level_wait_s, timer.kind, say)  # opt-in; the CPU's only
    sample = timer.sampler()  # every cold call's ceiling sample reads this buffer, and placement is against it
    cores = Cores(config.threads, fit=False)  # the profile's rates are of its threads: watched, never lowered
    before = timer.ceiling()
    say(f"moespec profile: {timer.name}; {', '.join(config.dtypes)}; {config.reps} rounds; ceiling "
        f"{median_iqr(before)[0]:.1f} GB/s")
    timed, peaks, scaling, all_ceilings, calls = {}, {}, None, list(before), 0
    for i, dtype in enumerate(config.dtypes):
        items, info, behind = _items(dtype, config.threads, nominal if i == 0 else None, sizes)
        say(f"{dtype}: {len(items)} timed calls per round")
        _time_rounds(items, config.reps, timer, level, say, sample, cores)
        by_key = {item.key: item for item in items}
        all_ceilings += [c for item in items for c in item.ceilings]
        timed[dtype] = Timed(by_key, info, _place(by_key, behind, timer, sample))
        say(f"{dtype}: placement of the weights' memory taken")
        calls += sum(len(item.seconds) for item in items)
        peaks[dtype] = median_iqr(matmul_peak(timer, torch_dtype(dtype)))[0]
        if i == 0 and timer.kind == "cpu":  # the thread scaling's calls ran with the first dtype
            first = rate_shapes(dtype)[0]
            experts = min(k[5] for k in by_key if k[:4] == ("cold", "dedup", *first))
            scaling = {"G": list(THREAD_SCALING_G), "speedup": [
                float(np.median(by_key["threads_1", *first, g].seconds)
                      / np.median(by_key["cold", "dedup", *first, g, experts].seconds)) for g in THREAD_SCALING_G],
                "ceiling_gbps": median_iqr(measure_stream_read(repeats=3, threads=1))[0]}
    stream = _stream_chunks(timer, config.reps) if timer.kind == "cpu" else None
    after = timer.ceiling()
    ceiling, ceiling_iqr = median_iqr(all_ceilings + after)
    entries, cache, probe, checks = fit_profile(timed, sizes.g_values, timer.kind, sizes.apart, level.active, ceiling,
                                                nominal, (pair_of(config.dtypes[0])["slot"], PROBE_SHAPE))
    doc_dtypes = {dtype: entry | {"matmul_peak_gflops": peaks[dtype]} for dtype, entry in entries.items()}
    doc = {"format": FORMAT_NAME, "format_version": FORMAT_VERSION, "device": timer.name, "device_kind": timer.kind,
           "threads": threads, "ceiling_kind": timer.ceiling_kind, "ceiling_gbps": ceiling,
           "ceiling_iqr_gbps": ceiling_iqr, "ceiling_before_after_gbps": [median_iqr(before)[0], median_iqr(after)[0]],
           "cache_bytes": cache, "cache_nominal_bytes": nominal, "cache_probe": probe,
           "stream_read": stream, "threads_1": scaling, "dtypes": doc_dtypes,
           "shapes": {"rates": {dtype: [list(s) for s in rate_shapes(dtype)] for dtype in config.dtypes},
                      "hot": [list(s) for s in HOT_SHAPES],
                      "rows": [list(s) for s in ROW_SHAPES] if any(rows_fit(d, timer.kind) == "hot"
                                                                   for d in config.dtypes) else [],
                      "overhead": list(OVERHEAD_SHAPE), "check": list(profile_check.CHECK_SHAPE)},
           "sizes": {"G": list(sizes.g_values), "cold_bytes": list(sizes.cold_bytes),
                     "hot_bytes": list(sizes.hot_bytes),
                     "slot_apart": sizes.apart, "cache_probe": sizes.probe},
           "self_check": profile_check.worst(checks),  # the worst dtype's; each dtype's passes below
           "self_check_by_dtype": checks,
           "level": level.record() | {"calls": calls},
           "protocol": {"reps": config.reps, "flush_bytes": timer.flush_bytes, "timer": timer.timer_name,
                        "late_starts": timer.late_starts, "contention": cores.take()},
           "calls": {dtype: record_calls(t) for dtype, t in timed.items()},
           "elapsed_s": time.perf_counter() - started,
           "provenance": provenance(timer.name, ",".join(config.dtypes))}
    write_json(config.out, doc)
    return DeviceProfile(doc, config.out)

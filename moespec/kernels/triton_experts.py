"""GPU expert kernels in Triton: the per-slot and the deduplicating expert operation (moespec.kernels' interface).

Physics. On a GPU the expert operation of a verification pass is a handful of matrix-vector products
over weights that are read from HBM once per request: an OLMoE expert is 12.6 MB in bf16, a pass of n = 9
tokens with m = 8 slots requests up to 72 of them (0.9 GB, ~190 us at the H200's ~4.8 TB/s), while the
multiply-adds they feed (n FLOPs per weight byte at most) keep the tensor cores under 1% busy. So the time is
the bytes requested over the bandwidth reached on them, and the two kernels differ in the bytes:
- `slot` (per-slot, the llama.cpp MMVQ pattern): a grid over (block of output rows, slot); each program
  streams its slot's expert rows once and multiplies the one token of that slot on the CUDA cores, so an
  expert chosen by k tokens of the pass is read k times (n m b bytes in all);
- `dedup` (deduplicating, the vLLM fused_moe pattern): a grid over (block of output rows, expert); each
  program finds the tokens that selected its expert by scanning the pass's n m ids (at most 81 numbers, in
  registers: the grouping needs no sort, no offsets array and no host sync), exits at once when there are
  none, and otherwise streams its weight tile once and applies it to all of them with one tensor-core
  product of the tile and the (zero-padded) block of <= 16 tokens, accumulating in fp32 (U b bytes).
Both run in two launches, each fused as the issue's pattern asks: gate/up with the bias and the activation
(h stored per slot in the weights' dtype, n m f values: ~1 MB, nothing beside the weights), then down with
its bias and the router weight, added into an fp32 output with atomics (a token's m slots land on the same
rows). Both read x, ids and router weights as they are and do no host synchronization, so a pass is four
asynchronous launches (zeroing the output, two kernels, the cast to x's dtype).

Shape legend (as moespec.kernels)
    n  tokens in the pass (<= TOKENS_MAX)   m  slots per token   N  experts   d  hidden   f  expert width
    x [n, d]   ids [n, m]   weights [n, m]   gate_up [N, 2f, d]   down [N, d, f]
    gate_up_bias [N, 2f]   down_bias [N, d]   (optional)          out [n, d]
    h [n m, f]   the activation of every slot (slot s = t m + j), between the two launches

Tuning. On a GPU each launch is autotuned once per (d, f, n) over a short list of tile shapes (the same
number for both kernels, so neither is handicapped); under TRITON_INTERPRET=1 (the tests, on the CPU) and for
shapes below TUNE_MIN_WEIGHTS, the first config of each list runs. Ids outside [0, N) are masked in the kernels
(they read nothing and add nothing); moespec.kernels range-checks ids that live on the CPU.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from moespec import MoespecError

__all__ = ["TOKENS_MAX", "expert_op", "interpreted", "tuned_configs"]

# The dedup kernel puts the pass's tokens in one tensor-core operand of 16 rows, the smallest M of an mma
# tile; the paper's passes have n <= 9, so one tile holds every token a verification pass can bring.
TOKENS_MAX = 16
# Below this many weights per expert matrix (d * f) tuning costs more than it can save: the tiny test and
# probe layers run the first config.
TUNE_MIN_WEIGHTS = 1 << 16
# Autotune's own timing of each candidate (ms): a few dozen calls of a ~20-200 us kernel are enough to rank
# tiles whose times differ by 10% or more, and keep tuning of all n and three models under a minute.
TUNE_WARMUP_MS, TUNE_REP_MS = 5, 25

_ACT_CODE = {"silu": 0, "gpt-oss": 1}


def interpreted() -> bool:
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1), as the tests do."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


# ---------------------------------------------------------------- device functions

@triton.jit
def _act(g, u, alpha, limit, ACT: tl.constexpr):
    """h = act(g, u): silu(g) * u, or gpt-oss's clamped SwiGLU (moespec.kernels.Activation)."""
    if ACT == 0:
        return g * tl.sigmoid(g) * u
    else:
        g = tl.minimum(g, limit)
        u = tl.minimum(tl.maximum(u, -limit), limit)
        return (u + 1.0) * (g * tl.sigmoid(alpha * g))


@triton.jit
def _select(ids_ptr, w_ptr, e, n, m, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr):
    """For expert e: which of the pass's tokens selected it, at which slot (t m + j), with which router weight."""
    t = tl.arange(0, BLOCK_N)
    j = tl.arange(0, BLOCK_M)
    ok = (t[:, None] < n) & (j[None, :] < m)
    offs = t[:, None] * m + j[None, :]
    hit = (tl.load(ids_ptr + offs, mask=ok, other=-1) == e) & ok
    chosen = tl.max(hit.to(tl.int32), axis=1) > 0
    slot = tl.sum(tl.where(hit, offs, 0), axis=1)
    weight = tl.sum(tl.where(hit, tl.load(w_ptr + offs, mask=ok, other=0.0).to(tl.float32), 0.0), axis=1)
    return chosen, slot, weight


@triton.jit
def _mma(a, b_rows, IEEE: tl.constexpr):
    """a [M, K] @ b_rows[N, K]^T with fp32 accumulation; IEEE: in exact fp32 (the operands as they are, bf16
    values included), which fp32 weights need and the interpreter needs for any dtype (its bf16 dot is wrong)."""
    if IEEE:
        return tl.dot(a.to(tl.float32), tl.trans(b_rows.to(tl.float32)), input_precision="ieee")
    else:
        return tl.dot(a, tl.trans(b_rows))


# ---------------------------------------------------------------- per-slot kernels

@triton.jit(do_not_specialize=["n"])
def _slot_gate_up(x_ptr, ids_ptr, gu_ptr, gub_ptr, h_ptr, n, m, N, d, f, alpha, limit,
                  HAS_BIAS: tl.constexpr, ACT: tl.constexpr, BLOCK_F: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_f, s = tl.program_id(0), tl.program_id(1)
    e = tl.load(ids_ptr + s).to(tl.int64)
    rows = pid_f * BLOCK_F + tl.arange(0, BLOCK_F)
    row_ok = rows < tl.where((e >= 0) & (e < N), f, 0)  # an id out of range reads nothing
    k = tl.arange(0, BLOCK_K)
    base = gu_ptr + e * 2 * f * d
    x_row = x_ptr + (s // m) * d
    acc_g = tl.zeros([BLOCK_F, BLOCK_K], tl.float32)
    acc_u = tl.zeros([BLOCK_F, BLOCK_K], tl.float32)
    for k0 in range(0, d, BLOCK_K):
        kk = k0 + k
        k_ok = kk < d
        xv = tl.load(x_row + kk, mask=k_ok, other=0.0).to(tl.float32)[None, :]
        mask = row_ok[:, None] & k_ok[None, :]
        acc_g += tl.load(base + rows[:, None] * d + kk[None, :], mask=mask, other=0.0).to(tl.float32) * xv
        acc_u += tl.load(base + (rows[:, None] + f) * d + kk[None, :], mask=mask, other=0.0).to(tl.float32) * xv
    g, u = tl.sum(acc_g, axis=1), tl.sum(acc_u, axis=1)
    if HAS_BIAS:
        g += tl.load(gub_ptr + e * 2 * f + rows, mask=row_ok, other=0.0).to(tl.float32)
        u += tl.load(gub_ptr + e * 2 * f + f + rows, mask=row_ok, other=0.0).to(tl.float32)
    h = _act(g, u, alpha, limit, ACT)
    tl.store(h_ptr + s * f + rows, h.to(h_ptr.dtype.element_ty), mask=rows < f)


@triton.jit(do_not_specialize=["n"])
def _slot_down(h_ptr, ids_ptr, w_ptr, dn_ptr, db_ptr, out_ptr, n, m, N, d, f,
               HAS_BIAS: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_d, s = tl.program_id(0), tl.program_id(1)
    e = tl.load(ids_ptr + s).to(tl.int64)
    rows = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    row_ok = rows < tl.where((e >= 0) & (e < N), d, 0)  # an id out of range reads and adds nothing
    k = tl.arange(0, BLOCK_K)
    base = dn_ptr + e * d * f
    acc = tl.zeros([BLOCK_D, BLOCK_K], tl.float32)
    for k0 in range(0, f, BLOCK_K):
        kk = k0 + k
        k_ok = kk < f
        hv = tl.load(h_ptr + s * f + kk, mask=k_ok, other=0.0).to(tl.float32)[None, :]
        acc += tl.load(base + rows[:, None] * f + kk[None, :], mask=row_ok[:, None] & k_ok[None, :],
                       other=0.0).to(tl.float32) * hv
    y = tl.sum(acc, axis=1)
    if HAS_BIAS:
        y += tl.load(db_ptr + e * d + rows, mask=row_ok, other=0.0).to(tl.float32)
    y *= tl.load(w_ptr + s).to(tl.float32)
    tl.atomic_add(out_ptr + (s // m) * d + rows, y, mask=row_ok)


# ---------------------------------------------------------------- deduplicating kernels

@triton.jit(do_not_specialize=["n"])
def _dedup_gate_up(x_ptr, ids_ptr, w_ptr, gu_ptr, gub_ptr, h_ptr, n, m, N, d, f, alpha, limit,
                   HAS_BIAS: tl.constexpr, ACT: tl.constexpr, IEEE: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_F: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_f, e = tl.program_id(0), tl.program_id(1)
    chosen, slot, _ = _select(ids_ptr, w_ptr, e, n, m, BLOCK_N, BLOCK_M)
    if tl.max(chosen.to(tl.int32), axis=0) > 0:  # experts no token chose exit here, having read nothing
        t = tl.arange(0, BLOCK_N)
        rows = pid_f * BLOCK_F + tl.arange(0, BLOCK_F)
        row_ok = rows < f
        k = tl.arange(0, BLOCK_K)
        base = gu_ptr + e.to(tl.int64) * 2 * f * d
        acc_g = tl.zeros([BLOCK_N, BLOCK_F], tl.float32)
        acc_u = tl.zeros([BLOCK_N, BLOCK_F], tl.float32)
        for k0 in range(0, d, BLOCK_K):
            kk = k0 + k
            k_ok = kk < d
            mask = row_ok[:, None] & k_ok[None, :]
            wg = tl.load(base + rows[:, None] * d + kk[None, :], mask=mask, other=0.0)
            wu = tl.load(base + (rows[:, None] + f) * d + kk[None, :], mask=mask, other=0.0)
            xs = tl.load(x_ptr + t[:, None] * d + kk[None, :], mask=chosen[:, None] & k_ok[None, :], other=0.0)
            xs = xs.to(wg.dtype)
            acc_g += _mma(xs, wg, IEEE)
            acc_u += _mma(xs, wu, IEEE)
        if HAS_BIAS:
            bias = gub_ptr + e.to(tl.int64) * 2 * f + rows
            acc_g += tl.load(bias, mask=row_ok, other=0.0).to(tl.float32)[None, :]
            acc_u += tl.load(bias + f, mask=row_ok, other=0.0).to(tl.float32)[None, :]
        h = _act(acc_g, acc_u, alpha, limit, ACT)
        tl.store(h_ptr + slot[:, None] * f + rows[None, :], h.to(h_ptr.dtype.element_ty),
                 mask=chosen[:, None] & row_ok[None, :])


@triton.jit(do_not_specialize=["n"])
def _dedup_down(h_ptr, ids_ptr, w_ptr, dn_ptr, db_ptr, out_ptr, n, m, N, d, f,
                HAS_BIAS: tl.constexpr, IEEE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_D: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_d, e = tl.program_id(0), tl.program_id(1)
    chosen, slot, weight = _select(ids_ptr, w_ptr, e, n, m, BLOCK_N, BLOCK_M)
    if tl.max(chosen.to(tl.int32), axis=0) > 0:
        t = tl.arange(0, BLOCK_N)
        rows = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
        row_ok = rows < d
        k = tl.arange(0, BLOCK_K)
        base = dn_ptr + e.to(tl.int64) * d * f
        acc = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
        for k0 in range(0, f, BLOCK_K):
            kk = k0 + k
            k_ok = kk < f
            wd = tl.load(base + rows[:, None] * f + kk[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            hs = tl.load(h_ptr + slot[:, None] * f + kk[None, :], mask=chosen[:, None] & k_ok[None, :], other=0.0)
            acc += _mma(hs.to(wd.dtype), wd, IEEE)
        if HAS_BIAS:
            acc += tl.load(db_ptr + e.to(tl.int64) * d + rows, mask=row_ok, other=0.0).to(tl.float32)[None, :]
        acc *= weight[:, None]
        tl.atomic_add(out_ptr + t[:, None] * d + rows[None, :], acc, mask=chosen[:, None] & row_ok[None, :])


# ---------------------------------------------------------------- tile lists and tuning

def _config(block: str, rows: int, k: int, warps: int, stages: int) -> triton.Config:
    return triton.Config({block: rows, "BLOCK_K": k}, num_warps=warps, num_stages=stages)


# The first entry of each list is the untuned default. Per-slot tiles are CUDA-core GEMVs: a few rows by a long
# k stretch keep 16-byte loads and enough programs (n m x rows/BLOCK) in flight for the HBM. Dedup tiles are
# mma tiles: rows x k per stage, pipelined 3-4 deep so the next tile streams while the current one multiplies.
_SLOT_TILES = [(16, 256, 4, 2), (8, 512, 4, 2), (32, 128, 4, 3), (4, 512, 2, 2), (16, 512, 8, 2), (32, 256, 8, 2)]
_DEDUP_TILES = [(32, 128, 4, 3), (16, 256, 4, 3), (64, 64, 4, 4), (16, 128, 2, 4), (16, 512, 4, 3), (32, 256, 8, 3)]
_TILES = {f"{kind}_{launch}": [_config(block, *tile) for tile in tiles]  # (rows, k, warps, stages)
          for kind, tiles in (("slot", _SLOT_TILES), ("dedup", _DEDUP_TILES))
          for launch, block in (("gate_up", "BLOCK_F"), ("down", "BLOCK_D"))}
_KERNELS = {"slot_gate_up": _slot_gate_up, "slot_down": _slot_down, "dedup_gate_up": _dedup_gate_up,
            "dedup_down": _dedup_down}
_TUNED: dict[str, object] = {}


def _launcher(name: str, tune: bool):
    """The kernel to launch: autotuned over its tile list, or plain (its first tile passed explicitly)."""
    if not tune:
        return _KERNELS[name], dict(_TILES[name][0].kwargs, num_warps=_TILES[name][0].num_warps,
                                    num_stages=_TILES[name][0].num_stages)
    if name not in _TUNED:
        zero = ["out_ptr"] if name.endswith("down") else None  # candidates add into out: reset between them
        _TUNED[name] = triton.autotune(_TILES[name], key=["d", "f", "n"], reset_to_zero=zero,
                                       warmup=TUNE_WARMUP_MS, rep=TUNE_REP_MS)(_KERNELS[name])
    return _TUNED[name], {}


def tuned_configs() -> dict[str, dict[str, str]]:
    """The tile each autotuned kernel chose, per tuning key (d, f, n), for the results file."""
    return {name: {str(key): str(cfg) for key, cfg in getattr(kernel, "cache", {}).items()}
            for name, kernel in _TUNED.items()}


# ---------------------------------------------------------------- the operation

def expert_op(mode: str, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, gate_up: torch.Tensor,
              down: torch.Tensor, gate_up_bias: torch.Tensor | None, down_bias: torch.Tensor | None,
              act_kind: str, alpha: float, limit: float) -> torch.Tensor:
    """The expert operation with the `slot` or `dedup` Triton kernels; out [n, d] in x's dtype.

    Shapes are checked by moespec.kernels.expert_op, the public entry; tensors must share one device (a CUDA
    device, or the CPU under TRITON_INTERPRET=1)."""
    (n, m), (N, two_f, d) = ids.shape, gate_up.shape
    f = two_f // 2
    if n > TOKENS_MAX:
        raise MoespecError(f"the Triton kernels take passes of at most {TOKENS_MAX} tokens, got n = {n}")
    if gate_up.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise MoespecError(f"the Triton kernels take fp32, bf16 or fp16 weights, not {gate_up.dtype}")
    x, ids, weights = x.contiguous(), ids.contiguous(), weights.contiguous()
    gate_up, down = gate_up.contiguous(), down.contiguous()
    gub = gate_up if gate_up_bias is None else gate_up_bias.contiguous()  # a valid pointer when unused
    db = down if down_bias is None else down_bias.contiguous()
    h = torch.empty(n * m, f, dtype=gate_up.dtype, device=x.device)
    out = torch.zeros(n, d, dtype=torch.float32, device=x.device)
    tune = not interpreted() and d * f >= TUNE_MIN_WEIGHTS
    act, has_bias = _ACT_CODE[act_kind], gate_up_bias is not None
    if mode == "slot":
        kernel, tiles = _launcher("slot_gate_up", tune)
        kernel[lambda c: (triton.cdiv(f, c["BLOCK_F"]), n * m)](
            x, ids, gate_up, gub, h, n, m, N, d, f, alpha, limit, HAS_BIAS=has_bias, ACT=act, **tiles)
        kernel, tiles = _launcher("slot_down", tune)
        kernel[lambda c: (triton.cdiv(d, c["BLOCK_D"]), n * m)](
            h, ids, weights, down, db, out, n, m, N, d, f, HAS_BIAS=has_bias, **tiles)
    elif mode == "dedup":
        common = dict(IEEE=gate_up.dtype == torch.float32 or interpreted(), BLOCK_N=TOKENS_MAX,
                      BLOCK_M=triton.next_power_of_2(m))
        kernel, tiles = _launcher("dedup_gate_up", tune)
        kernel[lambda c: (triton.cdiv(f, c["BLOCK_F"]), N)](
            x, ids, weights, gate_up, gub, h, n, m, N, d, f, alpha, limit, HAS_BIAS=has_bias, ACT=act,
            **common, **tiles)
        kernel, tiles = _launcher("dedup_down", tune)
        kernel[lambda c: (triton.cdiv(d, c["BLOCK_D"]), N)](
            h, ids, weights, down, db, out, n, m, N, d, f, HAS_BIAS=has_bias, **common, **tiles)
    else:
        raise MoespecError(f"unknown Triton kernel {mode!r}: slot or dedup")
    return out.to(x.dtype)

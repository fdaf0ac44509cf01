"""Attention of a verification pass on the CPU: n <= 16 new queries against the whole KV cache.

Physics. A pass of n tokens at depth d reads each layer's cached keys and values once (at the demo's depth of 512,
OLMoE's 16 heads of 128 in bf16: 4 MB a layer, ~0.13 ms at ~30 GB/s) and does n G multiply-adds per key element
(G query heads per kv head), so for n <= 16 attention is a stream of K and V like the dense weights. torch's CPU
flash attention is tuned for long query blocks: ~0.9 ms for those 4 MB at n = 1 on this project's machine, two
thirds of the time outside the expert operation of the demo's 2-layer model. The native kernel
(csrc/attention_kernels.cpp) reads every key and value row once per (sequence, kv head) and applies it to all
G n query rows, in fp32; past a few rows its multiply-adds set the time, and on a CPU with AMX tiles a bf16 call of
4 or more rows per kv head, D and Dv multiples of 32, runs on the tiles (the probabilities rounded to bf16 before
the values, as torch rounds them for a bf16 model).

Shape legend
    B batch   Hq query heads   Hkv kv heads (Hq a multiple)   n new queries (1..16)   L keys   D, Dv head sizes

    query   [B, Hq, n, D]    fp32 or bf16, last dim contiguous (transformers' layout)
    key     [B, Hkv, L, D]   query's dtype, last dim contiguous (a view of a longer cache is fine)
    value   [B, Hkv, L, Dv]  query's dtype, last dim contiguous
    mask    None (query i sees keys 0 .. L - n + i: the new tokens are the last n positions) or a bool tensor
            broadcastable to [B, 1, n, L], True where a query attends (transformers' sdpa mask)
    out     [B, n, Hq, Dv]   query's dtype: softmax(scale q k^T, masked) v per head, rounded once

`attention_reference` is the definition in plain torch (fp32). `takes` says whether a call is one the kernel runs;
the engine (moespec.model.dense) sends every other call to transformers' own attention.
"""

from __future__ import annotations

import math

import torch

from moespec.arguments import real
from moespec.kernels import native

MAX_QUERIES = 16  # the rows of a verification pass (k <= 15 drafts); a prefill goes to torch


def _layout(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None) -> str | None:
    """None when the tensors fit the shape legend, else what does not."""
    tensors = {"query": query, "key": key, "value": value}
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            return f"{name} is not a tensor"
        if t.device.type != "cpu" or t.dtype not in native.DTYPE_CODE:
            return f"{name} is {t.dtype} on {t.device}; the kernel takes float32 or bfloat16 on the CPU"
        if t.dim() != 4 or t.stride(-1) != 1:
            return f"{name} {tuple(t.shape)} must be 4-D with a contiguous last dimension"
    if key.dtype != query.dtype or value.dtype != query.dtype:
        return f"query, key and value must share a dtype, got {query.dtype}, {key.dtype}, {value.dtype}"
    (B, Hq, n, D), (Bk, Hkv, L, Dk), (Bv, Hv, Lv, _) = query.shape, key.shape, value.shape
    if not (B == Bk == Bv and Hkv == Hv and L == Lv and D == Dk) or Hkv < 1 or Hq % Hkv:
        return (f"shapes query {tuple(query.shape)}, key {tuple(key.shape)}, value {tuple(value.shape)} do not "
                "match the legend (same batch and keys, query heads a multiple of kv heads)")
    if not 1 <= n <= MAX_QUERIES or L < 1 or B < 1 or min(D, value.shape[-1]) < 1:
        return f"n = {n} queries (1..{MAX_QUERIES}), L = {L} keys and the sizes must be positive"
    if mask is not None:
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.device.type != "cpu":
            return "mask must be None or a bool tensor on the CPU"
        if mask.dim() != 4 or mask.shape[1] != 1 or mask.shape[0] not in (1, B) or tuple(mask.shape[2:]) != (n, L):
            return f"mask {tuple(mask.shape)} must broadcast to [B={B}, 1, n={n}, L={L}]"
    return None


def takes(query: object, key: object, value: object, mask: object = None) -> bool:
    """Whether `attention` runs this call natively (the library loaded and the tensors fit the legend)."""
    return native.load() is not None and _layout(query, key, value, mask) is None


def attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None = None,
              scale: float | None = None, *, threads: int | None = None) -> torch.Tensor:
    """out [B, n, Hq, Dv] (see the module docstring) with the native kernel; `scale` defaults to 1/sqrt(D) and
    `threads` to torch.get_num_threads(). Every tensor is checked before a pointer reaches native code."""
    wrong = _layout(query, key, value, mask)
    if wrong is not None:
        raise ValueError(wrong)
    if scale is not None:
        real("scale", scale)
    native.check_threads(threads)
    if native.load() is None:
        raise RuntimeError(f"native attention kernel unavailable: {native.status()}")
    return _run(query, key, value, mask, scale, threads)


def attention_if_taken(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None = None,
                       scale: float | None = None) -> torch.Tensor | None:
    """`attention` where the kernel takes the call (`takes`; a finite scale), else None: the engine's path,
    checked once."""
    if (scale is not None and not math.isfinite(scale)) or not takes(query, key, value, mask):
        return None
    return _run(query, key, value, mask, scale, None)


def _run(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
         scale: float | None, threads: int | None) -> torch.Tensor:
    """The native call, once the tensors are known to fit the legend (`attention`'s check or `takes`)."""
    lib = native.load()
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else float(scale)
    B, Hq, n, D = query.shape
    _, Hkv, L, Dv = value.shape
    out = torch.empty((B, n, Hq, Dv), dtype=query.dtype)
    if mask is None:
        mask_args = (None, 0, 0, 0)
    else:
        mask = mask.view(torch.uint8)  # bool is one byte: 0 or 1
        mask_args = (mask.data_ptr(), mask.stride(0) if mask.shape[0] > 1 else 0, mask.stride(2), mask.stride(3))
    q, k, v = query.stride(), key.stride(), value.stride()
    rc = lib.moespec_attention(
        native.DTYPE_CODE[query.dtype], B, Hq, Hkv, n, L, D, Dv,
        query.data_ptr(), q[0], q[1], q[2], key.data_ptr(), k[0], k[1], k[2], value.data_ptr(), v[0], v[1], v[2],
        *mask_args, scale, out.data_ptr(), threads or torch.get_num_threads())
    if rc != 0:
        raise RuntimeError(f"moespec_attention rejected its arguments (code {rc})")
    return out


def attention_reference(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                        mask: torch.Tensor | None = None, scale: float | None = None) -> torch.Tensor:
    """The definition in plain torch: fp32 scores, softmax and sums, one rounding to query's dtype at the end."""
    B, Hq, n, D = query.shape
    Hkv, L = key.shape[1], key.shape[2]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    k = key.float().repeat_interleave(Hq // Hkv, dim=1)
    v = value.float().repeat_interleave(Hq // Hkv, dim=1)
    scores = (query.float() @ k.transpose(-1, -2)) * scale
    if mask is None:
        mask = torch.ones(n, L, dtype=torch.bool).tril(L - n)[None, None]
    scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # a row with no key attended gives zeros
    return (weights @ v).transpose(1, 2).to(query.dtype)

"""The per-token steps of a verification pass on the CPU, one native call each: RMSNorm, rotary embedding and the
router's softmax and top-k.

Physics. Between the streams of weights and cached keys a pass normalizes, rotates and routes a few kilobytes per
token. Their bytes cost nothing; their calls do: transformers' RMSNorm is eight torch operations, its rotary
embedding ten and its router's top-k five, each costing tens of microseconds right after the pass has pushed
hundreds of megabytes through the caches (an empty() ~20 us, an add ~40 us here, against ~1-3 us warm). On the
demo's 2-layer OLMoE model that is about a millisecond of a 15 ms pass at n = 1. The kernels
(csrc/token_kernels.cpp) do each in one call on the calling thread and reproduce torch's roundings.

Shape legend
    rows  the product of x's leading dimensions      d  features normalized together (x's last dimension)
    n  tokens   H  heads   D  head size (even)

    rms_norm   x [..., d] fp32 or bf16 (last dim contiguous), weight [d] x's dtype
               -> y [..., d] = weight * round(x / sqrt(mean(x^2) + eps)), the Llama-family RMSNorm of transformers
                  (OLMoE, Qwen3-MoE, Mixtral, DeepSeek-V2: `weight * hidden.to(input_dtype)`)
    rope_      t [n, H, D] fp32 or bf16 (last dim contiguous, any row and head strides), rotated in place;
               cos, sin [n, D] contiguous, t's dtype (transformers' rotary module output):
               t = t * cos + rotate_half(t) * sin, rotate_half(t) = cat(-t[..., D/2:], t[..., :D/2])
    softmax_topk  logits [n, N] fp32 or bf16 -> scores [n, k] (fp32 or bf16), ids [n, k] int64: the k largest of
               softmax(logits) in descending order (ties in torch.topk's CPU order), divided by their sum when renorm
               (the router of OLMoE, Qwen3-MoE and Mixtral)

`rms_norm_reference`, `rope_reference` and `softmax_topk_reference` are the definitions in plain torch, written as
transformers writes them.
"""

from __future__ import annotations

import torch

from moespec.arguments import real, whole
from moespec.kernels import native


def _cpu(name: str, t: object, dtype: torch.dtype | None = None) -> torch.Tensor:
    """t, once known to be a CPU tensor of fp32 or bf16 (of `dtype` when given); ValueError naming it otherwise."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cpu" or t.dtype not in native.DTYPE_CODE:
        raise ValueError(f"{name} is {t.dtype} on {t.device}; the kernel takes float32 or bfloat16 on the CPU")
    if dtype is not None and t.dtype != dtype:
        raise ValueError(f"{name} is {t.dtype}, expected {dtype} (the dtype of the tensor it goes with)")
    return t


def _library():
    lib = native.load()
    if lib is None:
        raise RuntimeError(f"native norm and rotary kernels unavailable: {native.status()}")
    return lib


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """y = weight * round(x / sqrt(mean(x^2, -1) + eps)) in a new tensor of x's shape and dtype (module docstring)."""
    _cpu("x", x)
    _cpu("weight", weight, x.dtype)
    if x.dim() == 0 or x.shape[-1] < 1 or x.numel() == 0:
        raise ValueError(f"x {tuple(x.shape)} must have at least one row of at least one feature")
    if tuple(weight.shape) != (x.shape[-1],) or not weight.is_contiguous():
        raise ValueError(f"weight {tuple(weight.shape)} must be contiguous [d={x.shape[-1]}] for x {tuple(x.shape)}")
    eps = real("eps", eps, least=0)
    return rms_norm_unchecked(x, weight, float(eps))


def rms_norm_unchecked(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """`rms_norm` for arguments the caller has already checked (the engine's path: CPU tensors of one dtype)."""
    d = x.shape[-1]
    x2 = x.reshape(-1, d)
    if x2.stride(-1) != 1 or (x2.shape[0] > 1 and x2.stride(0) < d):
        x2 = x2.contiguous()
    y = torch.empty(x.shape, dtype=x.dtype)
    rc = _library().moespec_rms_norm(native.DTYPE_CODE[x.dtype], x2.shape[0], d, x2.data_ptr(),
                                     x2.stride(0) if x2.shape[0] > 1 else d, weight.data_ptr(), eps, y.data_ptr(), d)
    if rc != 0:
        raise RuntimeError(f"moespec_rms_norm rejected its arguments (code {rc})")
    return y


def rope_(t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate t [n, H, D] in place by cos, sin [n, D] (module docstring) and return it."""
    _cpu("t", t)
    _cpu("cos", cos, t.dtype)
    _cpu("sin", sin, t.dtype)
    if t.dim() != 3 or t.stride(-1) != 1 or t.shape[-1] % 2 or min(t.shape) < 1:
        raise ValueError(f"t {tuple(t.shape)} must be [n, H, D] with D even and a contiguous last dimension")
    n, _, D = t.shape
    for name, c in (("cos", cos), ("sin", sin)):
        if tuple(c.shape) != (n, D) or not c.is_contiguous():
            raise ValueError(f"{name} {tuple(c.shape)} must be contiguous [n={n}, D={D}] for t {tuple(t.shape)}")
    return rope_unchecked(t, cos, sin)


def rope_unchecked(t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """`rope_` for arguments the caller has already checked (the engine's path)."""
    n, H, D = t.shape
    rc = _library().moespec_rope(native.DTYPE_CODE[t.dtype], n, H, D, t.data_ptr(), t.stride(0), t.stride(1),
                                 cos.data_ptr(), sin.data_ptr())
    if rc != 0:
        raise RuntimeError(f"moespec_rope rejected its arguments (code {rc})")
    return t


def softmax_topk(logits: torch.Tensor, k: int, renorm: bool,
                 dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """(scores [n, k] of `dtype`, ids [n, k] int64) of logits [n, N] (module docstring)."""
    _cpu("logits", logits)
    if logits.dim() != 2 or min(logits.shape) < 1:
        raise ValueError(f"logits {tuple(logits.shape)} must be [n, N] with n, N >= 1")
    k = whole("k", k, 1, logits.shape[1])
    if dtype not in native.DTYPE_CODE:
        raise ValueError(f"dtype must be torch.float32 or torch.bfloat16, got {dtype}")
    return softmax_topk_unchecked(logits, k, bool(renorm), dtype)


def softmax_topk_unchecked(logits: torch.Tensor, k: int, renorm: bool,
                           dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """`softmax_topk` for arguments the caller has already checked (the engine's path)."""
    logits = logits if logits.is_contiguous() else logits.contiguous()
    n, N = logits.shape
    scores, ids = torch.empty((n, k), dtype=dtype), torch.empty((n, k), dtype=torch.int64)
    rc = _library().moespec_softmax_topk(native.DTYPE_CODE[logits.dtype], n, N, logits.data_ptr(), k, int(renorm),
                                         native.DTYPE_CODE[dtype], scores.data_ptr(), ids.data_ptr())
    if rc != 0:
        raise RuntimeError(f"moespec_softmax_topk rejected its arguments (code {rc})")
    return scores, ids


def softmax_topk_reference(logits: torch.Tensor, k: int, renorm: bool,
                           dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """The definition in plain torch, as transformers' OLMoE, Qwen3-MoE and Mixtral routers compute it."""
    values, ids = torch.topk(torch.softmax(logits, dim=-1, dtype=torch.float32), k, dim=-1)
    if renorm:
        values = values / values.sum(dim=-1, keepdim=True)
    return values.to(dtype), ids


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The definition in plain torch, as transformers' Llama-family RMSNorm computes it."""
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def rope_reference(t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The definition in plain torch (transformers' apply_rotary_pos_emb on t [n, H, D]), a new tensor."""
    half = t.shape[-1] // 2
    rotated = torch.cat((-t[..., half:], t[..., :half]), dim=-1)
    return t * cos[:, None, :] + rotated * sin[:, None, :]

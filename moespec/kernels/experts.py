"""Our expert kernels (`slot`, `dedup`), the float64 reference beside them, and the layout they take.

The physics, the shape legend and the implementations are described in moespec.kernels (the package docstring);
this module holds the operation's checks, the float64 ground truth, the native (moespec/kernels/csrc) and
pure-torch paths of our two kernels, the dispatch to the Triton kernels on a CUDA device, and `from_hf_experts`,
which gives any transformers v5 experts module in our layout.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from moespec import ArgumentError, MoespecError
from moespec.arguments import show
from moespec.kernels import native


@dataclass(frozen=True)
class Activation:
    """The gated activation h = act(gate, up).

    `silu`: h = silu(g) * u (OLMoE, Qwen3-MoE, Mixtral, DeepSeek-V2).
    `gpt-oss`: g' = min(g, limit), u' = clamp(u, -limit, limit), h = (u' + 1) * g' * sigmoid(alpha g')."""

    kind: str = "silu"
    alpha: float = 1.702
    limit: float = 7.0

    def __post_init__(self) -> None:
        if self.kind not in ("silu", "gpt-oss"):
            raise MoespecError(f"unknown activation {self.kind!r}: use 'silu' or 'gpt-oss'")

    def __call__(self, g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        if self.kind == "silu":
            return F.silu(g) * u
        g = g.clamp(max=self.limit)
        u = u.clamp(min=-self.limit, max=self.limit)
        return (u + 1) * (g * torch.sigmoid(self.alpha * g))


SILU = Activation("silu")
GPT_OSS = Activation("gpt-oss", alpha=1.702, limit=7.0)  # transformers' GptOssConfig defaults


@dataclass(frozen=True)
class Kernel:
    """One way to run the expert operation. `kind` is the byte model: 'slot' requests n*m*b, 'dedup' U*b."""

    name: str
    kind: str
    run: Callable[..., torch.Tensor]
    about: str


# ---------------------------------------------------------------- checks and byte model

_INT_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


def _check(x, ids, weights, gate_up, down, gate_up_bias, down_bias) -> tuple[int, int, int, int, int]:
    """(n, m, N, d, f) once every tensor is known to fit the shape legend: ArgumentError naming the first that does
    not (not a tensor, a dtype the kernels cannot read exactly, a size of 0, a shape or device that does not fit)."""
    tensors = (("x", x), ("ids", ids), ("weights", weights), ("gate_up", gate_up), ("down", down),
               ("gate_up_bias", gate_up_bias), ("down_bias", down_bias))
    for name, t in tensors:
        if not isinstance(t, torch.Tensor) and (t is not None or name in ("x", "ids", "weights", "gate_up", "down")):
            raise ArgumentError(f"{name} must be a torch.Tensor, got {show(t)}")
    # Each tensor attribute read is a call into torch, and after a cache flush a slow one: read each once.
    xs, si, sw, sg, sd = x.shape, ids.shape, weights.shape, gate_up.shape, down.shape
    if len(xs) != 2 or len(si) != 2 or len(sg) != 3 or len(sd) != 3:
        raise ArgumentError("expert_op wants x [n, d], ids [n, m], gate_up [N, 2f, d], down [N, d, f]")
    (n, d), m, (N, two_f, d_gu) = xs, si[1], sg
    f = two_f // 2
    # A size of 0 leaves the native kernels nothing to divide their rows by (f = 0 stopped the process with SIGFPE).
    for name, size in (("x's tokens n", n), ("x's hidden size d", d), ("ids' slots m", m),
                       ("gate_up's experts N", N), ("gate_up's expert width f", f)):
        if size < 1:
            raise ArgumentError(f"{name} is {size}: the expert operation needs every size >= 1")
    if si[0] != n or sw != (n, m):
        raise ArgumentError(f"ids {tuple(si)} and weights {tuple(sw)} must both be [n={n}, m]")
    if two_f % 2 or d_gu != d or sd != (N, d, f):
        raise ArgumentError(f"gate_up {tuple(sg)} / down {tuple(sd)} do not fit [N, 2f, d={d}] / [N, d, f]")
    if gate_up.dtype != down.dtype:
        raise ArgumentError(f"gate_up is {gate_up.dtype} but down is {down.dtype}")
    if gate_up_bias is not None and gate_up_bias.shape != (N, 2 * f):
        raise ArgumentError(f"gate_up_bias {tuple(gate_up_bias.shape)} is not [N={N}, 2f={2 * f}]")
    if down_bias is not None and down_bias.shape != (N, d):
        raise ArgumentError(f"down_bias {tuple(down_bias.shape)} is not [N={N}, d={d}]")
    if ids.dtype not in _INT_DTYPES:
        raise ArgumentError(f"ids must be integers, got {ids.dtype}")
    # Floating point only: the kernels compute in fp32 and round once to x's dtype, so an integer x would be truncated.
    for name, t in tensors:
        if name != "ids" and t is not None and not t.is_floating_point():
            raise ArgumentError(f"{name} is {t.dtype}; the expert operation takes floating-point tensors")
    # No pointer the kernels cannot read: every tensor where the weights are (ids may stay on the host for a GPU),
    # and the weights on a device the kernels run on (a meta tensor has no memory at all).
    home = gate_up.device.type
    if home not in ("cpu", "cuda"):
        raise ArgumentError(f"gate_up is on {gate_up.device}: the expert kernels run on cpu or cuda tensors")
    for name, t in (("x", x), ("ids", ids), ("weights", weights), ("down", down), ("gate_up_bias", gate_up_bias),
                    ("down_bias", down_bias)):
        if t is not None and t.device.type != home and not (name == "ids" and home == "cuda" and
                                                            t.device.type == "cpu"):
            raise ArgumentError(f"{name} is on {t.device} but gate_up on {gate_up.device}: put every tensor of the "
                               f"expert operation on one device")
    return n, m, N, d, f


def _check_run(act: object, threads: object) -> None:
    """The activation an Activation, threads None or a whole number in 1..THREADS_LIMIT."""
    if not isinstance(act, Activation):
        raise ArgumentError(f"act must be an Activation (SILU or GPT_OSS), got {show(act)}")
    native.check_threads(threads)


def _expert_tensor(name: str, t: object, dims: int) -> torch.Tensor:
    """t when it is a tensor of `dims` dimensions holding at least one expert; ArgumentError naming it otherwise."""
    if not isinstance(t, torch.Tensor) or t.dim() != dims or t.shape[0] < 1:
        raise ArgumentError(f"{name} must be a torch.Tensor of {dims} dimensions with at least one expert, got "
                            f"{show(t) if not isinstance(t, torch.Tensor) else tuple(t.shape)}")
    return t


def _check_ids(ids: torch.Tensor, N: int) -> None:
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= N):
        raise ArgumentError(f"expert ids must lie in [0, {N})")


def expert_bytes(gate_up: torch.Tensor, down: torch.Tensor, gate_up_bias: torch.Tensor | None = None,
                 down_bias: torch.Tensor | None = None) -> int:
    """b: the bytes of one expert as stored (gate, up and down rows plus its biases)."""
    _expert_tensor("gate_up", gate_up, 3)
    _expert_tensor("down", down, 3)
    for name, bias in (("gate_up_bias", gate_up_bias), ("down_bias", down_bias)):
        if bias is not None:
            _expert_tensor(name, bias, 2)
    b = (gate_up[0].numel() * gate_up.element_size()) + (down[0].numel() * down.element_size())
    for bias in (gate_up_bias, down_bias):
        if bias is not None:
            b += bias[0].numel() * bias.element_size()
    return b


def distinct_experts(ids: torch.Tensor) -> int:
    """U: the number of distinct experts the pass's n*m slots name."""
    if not isinstance(ids, torch.Tensor) or ids.dtype not in _INT_DTYPES:
        raise ArgumentError(f"ids must be a tensor of integer expert ids, got {show(ids)}")
    return int(torch.unique(ids).numel())


# ---------------------------------------------------------------- reference

def reference_float64(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, gate_up: torch.Tensor,
                      down: torch.Tensor, gate_up_bias: torch.Tensor | None = None,
                      down_bias: torch.Tensor | None = None, act: Activation = SILU) -> torch.Tensor:
    """The definition, slot by slot, in float64 throughout on the CPU; returns float64 [n, d] on the CPU."""
    n, m, N, d, f = _check(x, ids, weights, gate_up, down, gate_up_bias, down_bias)
    _check_run(act, None)
    x, ids, weights, gate_up, down, gate_up_bias, down_bias = (
        None if t is None else t.cpu() for t in (x, ids, weights, gate_up, down, gate_up_bias, down_bias))
    _check_ids(ids, N)
    out = torch.zeros(n, d, dtype=torch.float64)
    for t in range(n):
        xt = x[t].double()
        for j in range(m):
            e = int(ids[t, j])
            gu = gate_up[e].double() @ xt
            if gate_up_bias is not None:
                gu = gu + gate_up_bias[e].double()
            y = down[e].double() @ act(gu[:f], gu[f:])
            if down_bias is not None:
                y = y + down_bias[e].double()
            out[t] += float(weights[t, j]) * y
    return out


def _reference(x, ids, weights, gate_up, down, gate_up_bias, down_bias, act, threads):
    return reference_float64(x, ids, weights, gate_up, down, gate_up_bias, down_bias, act).to(x.dtype)


# ---------------------------------------------------------------- our kernels

_MODE = {"slot": 0, "dedup": 1}
_ACT_CODE = {"silu": 0, "gpt-oss": 1}


def implementation(kernel: str, dtype: torch.dtype = torch.bfloat16, device: str = "cpu") -> str:
    """What runs our `kernel` for weights of `dtype` on `device`: 'triton' on CUDA; on the CPU 'native' (the
    compiled AVX2 code) or 'torch' (its fallback); 'torch' for the torch-* loops."""
    if not isinstance(kernel, str):
        raise ArgumentError(f"kernel must be a kernel's name, got {show(kernel)}")
    if not isinstance(dtype, torch.dtype):
        raise ArgumentError(f"dtype must be a torch.dtype, got {show(dtype)}")
    if not isinstance(device, (str, torch.device)):
        raise ArgumentError(f"device must be a device name or torch.device, got {show(device)}")
    try:
        device = torch.device(device)
    except RuntimeError:
        raise ArgumentError(f"device {device!r} is not a torch device") from None
    if kernel not in _MODE:
        return "torch"
    if device.type == "cuda":
        return "triton"
    return "native" if dtype in native.DTYPE_CODE and native.load() is not None else "torch"


def _native_op(mode, x, ids, weights, gate_up, down, gate_up_bias, down_bias, act, threads):
    # Lean on purpose: after a cache flush every torch call here costs tens of microseconds of misses, so
    # dtype conversions happen in C++ and only the output is allocated here.
    (n, m), (N, two_f, d) = ids.shape, gate_up.shape
    lib = native.load()
    dtype = x.dtype
    x, weights = _native_input(x), _native_input(weights)
    ids = ids if ids.dtype == torch.int64 and ids.is_contiguous() else ids.to(torch.int64).contiguous()
    gate_up = gate_up if gate_up.is_contiguous() else gate_up.contiguous()
    down = down if down.is_contiguous() else down.contiguous()
    biases = [None if b is None else b.to(gate_up.dtype).contiguous() for b in (gate_up_bias, down_bias)]
    bias_ptrs = [None if b is None else b.data_ptr() for b in biases]  # `biases` keeps converted copies alive
    out = torch.empty(n, d, dtype=x.dtype)
    rc = lib.moespec_expert_op(
        native.DTYPE_CODE[gate_up.dtype], native.DTYPE_CODE[x.dtype], native.DTYPE_CODE[weights.dtype], _MODE[mode],
        _ACT_CODE[act.kind], act.alpha, act.limit, n, m, N, d, two_f // 2, x.data_ptr(), ids.data_ptr(),
        weights.data_ptr(), gate_up.data_ptr(), down.data_ptr(), bias_ptrs[0], bias_ptrs[1], out.data_ptr(),
        threads or torch.get_num_threads())
    if rc != 0:
        raise ArgumentError(f"expert ids must lie in [0, {N})")
    return out if out.dtype == dtype else out.to(dtype)


def _native_input(t: torch.Tensor) -> torch.Tensor:
    """t as a contiguous fp32 or bf16 tensor (other dtypes go through fp32)."""
    if t.dtype not in native.DTYPE_CODE:
        t = t.to(torch.float32)
    return t if t.is_contiguous() else t.contiguous()


def _expert_apply(xs, e, gate_up, down, gate_up_bias, down_bias, act, f):
    """One expert on a block of tokens in the weights' dtype (the fallback's building block)."""
    gub = None if gate_up_bias is None else gate_up_bias[e].to(gate_up.dtype)
    db = None if down_bias is None else down_bias[e].to(gate_up.dtype)
    gu = F.linear(xs.to(gate_up.dtype), gate_up[e], gub)
    return F.linear(act(gu[:, :f], gu[:, f:]), down[e], db)


def _slot_torch(x, ids, weights, gate_up, down, gate_up_bias, down_bias, act):
    (n, d), f = x.shape, down.shape[2]
    out = torch.zeros(n, d, dtype=torch.float32, device=x.device)
    for t, row in enumerate(ids.tolist()):
        for j, e in enumerate(row):
            y = _expert_apply(x[t:t + 1], e, gate_up, down, gate_up_bias, down_bias, act, f)
            out[t] += float(weights[t, j]) * y[0].float()
    return out.to(x.dtype)


def _dedup_torch(x, ids, weights, gate_up, down, gate_up_bias, down_bias, act):
    (n, d), m, f = x.shape, ids.shape[1], down.shape[2]
    out = torch.zeros(n, d, dtype=torch.float32, device=x.device)
    flat = ids.reshape(-1)
    w = weights.reshape(-1).float()
    for e in torch.unique(flat).tolist():
        slots = (flat == e).nonzero().squeeze(1)
        tokens = slots // m
        y = _expert_apply(x[tokens], e, gate_up, down, gate_up_bias, down_bias, act, f)
        out.index_add_(0, tokens, w[slots, None] * y.float())
    return out.to(x.dtype)


def _torch_loop(mode: str) -> Callable[..., torch.Tensor]:
    loop = _slot_torch if mode == "slot" else _dedup_torch

    def run(x, ids, weights, gate_up, down, gate_up_bias, down_bias, act, threads):
        _check_ids(ids, gate_up.shape[0])
        return loop(x, ids, weights, gate_up, down, gate_up_bias, down_bias, act)

    return run


def _ours(mode: str) -> Callable[..., torch.Tensor]:
    fallback = _torch_loop(mode)

    def run(x, ids, weights, gate_up, down, gate_up_bias, down_bias, act, threads):
        if gate_up.is_cuda:  # ids already on the device are not checked: that would synchronize with the host
            if not ids.is_cuda:
                _check_ids(ids, gate_up.shape[0])
            from moespec.kernels import triton_experts  # optional heavy dependency: triton, on CUDA only

            return triton_experts.expert_op(mode, x, ids.to(gate_up.device), weights, gate_up, down, gate_up_bias,
                                            down_bias, act.kind, act.alpha, act.limit)
        if implementation(mode, gate_up.dtype) == "native":  # ids are range-checked in C++
            return _native_op(mode, x, ids, weights, gate_up, down, gate_up_bias, down_bias, act, threads)
        return fallback(x, ids, weights, gate_up, down, gate_up_bias, down_bias, act, threads)

    return run


# ---------------------------------------------------------------- layout

def from_hf_experts(module: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None,
                                                      torch.Tensor | None, Activation]:
    """(gate_up [N, 2f, d], down [N, d, f], gate_up_bias, down_bias, act) of a transformers v5 experts module.

    Canonical modules (OLMoE, Qwen3-MoE, Mixtral, DeepSeek-V2) are returned as they are, without a copy;
    gpt-oss's transposed, interleaved layout is converted once (a copy)."""
    if not isinstance(module, torch.nn.Module) or not all(
            isinstance(getattr(module, name, None), torch.Tensor) for name in ("gate_up_proj", "down_proj")):
        raise ArgumentError(f"module must be a transformers experts module (gate_up_proj, down_proj), got "
                            f"{show(module)}")
    gate_up, down = module.gate_up_proj.detach(), module.down_proj.detach()
    gate_up_bias = getattr(module, "gate_up_proj_bias", None)
    down_bias = getattr(module, "down_proj_bias", None)
    gate_up_bias = None if gate_up_bias is None else gate_up_bias.detach()
    down_bias = None if down_bias is None else down_bias.detach()
    if getattr(module, "is_transposed", False):
        gate_up, down = gate_up.transpose(1, 2), down.transpose(1, 2)
    if not getattr(module, "is_concatenated", True):  # rows g0 u0 g1 u1 ... -> g0 g1 ... u0 u1 ...
        gate_up = torch.cat([gate_up[:, 0::2], gate_up[:, 1::2]], dim=1)
        if gate_up_bias is not None:
            gate_up_bias = torch.cat([gate_up_bias[:, 0::2], gate_up_bias[:, 1::2]], dim=1)
    if hasattr(module, "limit") and hasattr(module, "alpha"):
        act = Activation("gpt-oss", alpha=float(module.alpha), limit=float(module.limit))
    else:
        name = getattr(module.config, "hidden_act", "silu")
        if name != "silu":
            raise MoespecError(f"experts activation {name!r} is not supported (silu or gpt-oss)")
        act = SILU
    return gate_up.contiguous(), down.contiguous(), gate_up_bias, down_bias, act

"""Expert kernels: the expert operation of one MoE layer for a verification pass, per-slot or deduplicating.

Physics. A pass verifies n <= 9 tokens; each token's router picks m experts and every expert is three
matrices (gate, up, down) of b bytes in all (OLMoE: 3 x 2048 x 1024 weights = 12.6 MB in bf16). A weight
applied to G tokens costs G multiply-adds, so a bf16 expert does G FLOPs per byte it streams. An AVX2 core
issues ~32 FLOPs per cycle while DRAM feeds it ~4-6 bytes per cycle (this machine: ~48 GMAC/s of FMA peak,
~10 GB/s per core, ~20 GB/s for both), so the operation is memory-bound, its time the bytes it streams over
the bandwidth it streams them at, as long as an expert serves fewer than ~6 tokens at once; an expert that a
deduplicating kernel applies to more tokens becomes compute-bound. The two kernels differ in the bytes
they request:
- per-slot (`slot`): each of the n*m slots multiplies its token by its expert, so an expert chosen by
  several tokens is requested once per slot: n*m*b bytes (llama.cpp MMVQ, Metal mul_mv_id, MLX gather_qmv);
- deduplicating (`dedup`): tokens are grouped by expert and each distinct expert is streamed once and
  applied to all its tokens: U*b bytes for U distinct experts (llama.cpp CPU / MMQ, vLLM fused_moe).
Whether dedup's fewer bytes make a faster pass depends on the bandwidth each kernel reaches on its bytes;
both kernels here run the same streaming code and differ only in how slots are grouped, so neither is
handicapped.

Shape legend
    n  tokens in the pass            m  slots (distinct experts) per token
    N  experts in the layer          d  hidden size              f  expert width (intermediate size)

    x        [n, d]      hidden states of the pass
    ids      [n, m]      int expert ids, each in [0, N)
    weights  [n, m]      router weights
    gate_up  [N, 2f, d]  f gate rows then f up rows: `gate_up_proj` of transformers v5's OlmoeExperts,
                         Qwen3MoeExperts, MixtralExperts and DeepseekV2Experts as stored
    down     [N, d, f]   `down_proj` of the same classes
    gate_up_bias [N, 2f], down_bias [N, d]   optional (gpt-oss has both)
    out      [n, d]      out[t] = sum_j weights[t, j] * (down[e] h + down_bias[e]),  e = ids[t, j],
                         h = act(gate[e] x[t] + gate_bias[e], up[e] x[t] + up_bias[e])

gpt-oss stores its experts transposed with gate and up interleaved (`gate_up_proj` [N, d, 2f] with columns
g0 u0 g1 u1 ..., `down_proj` [N, f, d]) and uses a clamped SwiGLU; `from_hf_experts` converts any of these
modules to the layout above once, and `Activation` carries the activation (`SILU` or `GPT_OSS`).

Implementations. On the CPU `slot` and `dedup` run the native AVX2/FMA kernels of moespec/csrc (fp32 or bf16
weights, fp32 accumulation, the threads sharing the rows of every weight matrix; see moespec.native) and fall
back to a pure-torch loop with the same results when the native library is unavailable or the weights are
neither fp32 nor bf16; on a CUDA device they run the Triton kernels of moespec.triton_kernels.
`implementation(kernel, dtype, device)` says which runs. `reference` (float64) is every test's ground truth. Peers:
- `torch-slot`, `torch-dedup`: plain torch loops (F.linear per slot, or per distinct expert on its tokens);
- `hf-batched_mm` (per-slot), `hf-grouped_mm`, `hf-eager` (dedup): transformers' experts implementations,
  called on a real experts module of the model's class (OlmoeExperts; GptOssExperts for the gpt-oss
  activation) that shares our weight tensors (gpt-oss's layout: converted once);
- when installed, `ggml-mul_mat_id` (dedup; ggml-python: llama.cpp's MUL_MAT_ID on the ggml CPU backend,
  which groups rows by expert) and `mlx-gather` / `mlx-sorted` (mlx[cpu] + mlx-lm: SwitchGLU's layers with
  its sort decision forced: per-slot gather_mm, or slots sorted by expert; float32 only on the CPU).
"""

from __future__ import annotations

import importlib.util
import weakref
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from moespec import MoespecError, fits, native

__all__ = [
    "Activation", "SILU", "GPT_OSS", "Kernel", "KERNELS", "expert_op", "reference_float64", "implementation",
    "expert_bytes", "distinct_experts", "requested_bytes", "from_hf_experts",
]


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
    # Each tensor attribute read is a call into torch, and after a cache flush a slow one: read each once.
    xs, si, sw, sg, sd = x.shape, ids.shape, weights.shape, gate_up.shape, down.shape
    if len(xs) != 2 or len(si) != 2 or len(sg) != 3 or len(sd) != 3:
        raise MoespecError("expert_op wants x [n, d], ids [n, m], gate_up [N, 2f, d], down [N, d, f]")
    (n, d), m, (N, two_f, d_gu) = xs, si[1], sg
    f = two_f // 2
    if si[0] != n or sw != (n, m):
        raise MoespecError(f"ids {tuple(si)} and weights {tuple(sw)} must both be [n={n}, m]")
    if two_f % 2 or d_gu != d or sd != (N, d, f):
        raise MoespecError(f"gate_up {tuple(sg)} / down {tuple(sd)} do not fit [N, 2f, d={d}] / [N, d, f]")
    if gate_up.dtype != down.dtype:
        raise MoespecError(f"gate_up is {gate_up.dtype} but down is {down.dtype}")
    if gate_up_bias is not None and gate_up_bias.shape != (N, 2 * f):
        raise MoespecError(f"gate_up_bias {tuple(gate_up_bias.shape)} is not [N={N}, 2f={2 * f}]")
    if down_bias is not None and down_bias.shape != (N, d):
        raise MoespecError(f"down_bias {tuple(down_bias.shape)} is not [N={N}, d={d}]")
    if ids.dtype not in _INT_DTYPES:
        raise MoespecError(f"ids must be integers, got {ids.dtype}")
    return n, m, N, d, f


def _check_ids(ids: torch.Tensor, N: int) -> None:
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= N):
        raise MoespecError(f"expert ids must lie in [0, {N})")


def expert_bytes(gate_up: torch.Tensor, down: torch.Tensor, gate_up_bias: torch.Tensor | None = None,
                 down_bias: torch.Tensor | None = None) -> int:
    """b: the bytes of one expert as stored (gate, up and down rows plus its biases)."""
    b = (gate_up[0].numel() * gate_up.element_size()) + (down[0].numel() * down.element_size())
    for bias in (gate_up_bias, down_bias):
        if bias is not None:
            b += bias[0].numel() * bias.element_size()
    return b


def distinct_experts(ids: torch.Tensor) -> int:
    """U: the number of distinct experts the pass's n*m slots name."""
    return int(torch.unique(ids).numel())


def requested_bytes(kernel: str, ids: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor,
                    gate_up_bias: torch.Tensor | None = None, down_bias: torch.Tensor | None = None) -> int:
    """Expert bytes the kernel requests for this pass: n*m*b for a per-slot kernel, U*b for a deduplicating one."""
    n, m = ids.shape
    b = expert_bytes(gate_up, down, gate_up_bias, down_bias)
    return int(fits.requested_bytes(_kernel(kernel).kind, n, distinct_experts(ids), m, b))


# ---------------------------------------------------------------- reference

def reference_float64(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, gate_up: torch.Tensor,
                      down: torch.Tensor, gate_up_bias: torch.Tensor | None = None,
                      down_bias: torch.Tensor | None = None, act: Activation = SILU) -> torch.Tensor:
    """The definition, slot by slot, in float64 throughout on the CPU; returns float64 [n, d] on the CPU."""
    n, m, N, d, f = _check(x, ids, weights, gate_up, down, gate_up_bias, down_bias)
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

_NATIVE_DTYPES = {torch.float32: 0, torch.bfloat16: 1}
_MODE = {"slot": 0, "dedup": 1}
_ACT_CODE = {"silu": 0, "gpt-oss": 1}


def implementation(kernel: str, dtype: torch.dtype = torch.bfloat16, device: str = "cpu") -> str:
    """What runs our `kernel` for weights of `dtype` on `device`: 'triton' on CUDA; on the CPU 'native' (the
    compiled AVX2 code) or 'torch' (its fallback); 'torch' for the torch-* loops."""
    if kernel not in _MODE:
        return "torch"
    if torch.device(device).type == "cuda":
        return "triton"
    return "native" if dtype in _NATIVE_DTYPES and native.load() is not None else "torch"


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
        _NATIVE_DTYPES[gate_up.dtype], _NATIVE_DTYPES[x.dtype], _NATIVE_DTYPES[weights.dtype], _MODE[mode],
        _ACT_CODE[act.kind], act.alpha, act.limit, n, m, N, d, two_f // 2, x.data_ptr(), ids.data_ptr(),
        weights.data_ptr(), gate_up.data_ptr(), down.data_ptr(), bias_ptrs[0], bias_ptrs[1], out.data_ptr(),
        threads or torch.get_num_threads())
    if rc != 0:
        raise MoespecError(f"expert ids must lie in [0, {N})")
    return out if out.dtype == dtype else out.to(dtype)


def _native_input(t: torch.Tensor) -> torch.Tensor:
    """t as a contiguous fp32 or bf16 tensor (other dtypes go through fp32)."""
    if t.dtype not in _NATIVE_DTYPES:
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
            from moespec import triton_kernels

            return triton_kernels.expert_op(mode, x, ids.to(gate_up.device), weights, gate_up, down, gate_up_bias,
                                            down_bias, act.kind, act.alpha, act.limit)
        if implementation(mode, gate_up.dtype) == "native":  # ids are range-checked in C++
            return _native_op(mode, x, ids, weights, gate_up, down, gate_up_bias, down_bias, act, threads)
        return fallback(x, ids, weights, gate_up, down, gate_up_bias, down_bias, act, threads)

    return run


# ---------------------------------------------------------------- layouts and HF peers

def from_hf_experts(module: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None,
                                                      torch.Tensor | None, Activation]:
    """(gate_up [N, 2f, d], down [N, d, f], gate_up_bias, down_bias, act) of a transformers v5 experts module.

    Canonical modules (OLMoE, Qwen3-MoE, Mixtral, DeepSeek-V2) are returned as they are, without a copy;
    gpt-oss's transposed, interleaved layout is converted once (a copy)."""
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


# Peer state (modules sharing or converting our weights) is built once per weight tensor and dropped when
# that tensor is garbage-collected. Weights are treated as immutable while their peer state is cached.
_PEER_STATE: dict[tuple, object] = {}


def _peer_state(kind: str, gate_up, down, gate_up_bias, down_bias, act, build: Callable[[], object]):
    key = (kind, id(gate_up), id(down), id(gate_up_bias), id(down_bias), act)
    if key not in _PEER_STATE:
        _PEER_STATE[key] = build()
        weakref.finalize(gate_up, _PEER_STATE.pop, key, None)
    return _PEER_STATE[key]


def _hf_module(impl, gate_up, down, gate_up_bias, down_bias, act):
    """A real transformers experts module (OlmoeExperts, or GptOssExperts for the gpt-oss activation)."""
    N, two_f, d = gate_up.shape
    f = two_f // 2
    param = lambda t: torch.nn.Parameter(t.detach(), requires_grad=False)  # noqa: E731
    if act.kind == "silu":
        if gate_up_bias is not None or down_bias is not None:
            raise MoespecError("HF peers: silu experts have no biases in transformers (biases need gpt-oss)")
        from transformers import OlmoeConfig
        from transformers.models.olmoe.modeling_olmoe import OlmoeExperts

        config = OlmoeConfig(hidden_size=d, intermediate_size=f, num_experts=N, hidden_act="silu")
        config._experts_implementation = impl
        with torch.device("meta"):
            module = OlmoeExperts(config)
        module.gate_up_proj, module.down_proj = param(gate_up), param(down)
    else:
        from transformers import GptOssConfig
        from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts

        config = GptOssConfig(hidden_size=d, intermediate_size=f, num_local_experts=N,
                              swiglu_alpha=act.alpha, swiglu_limit=act.limit)
        config._experts_implementation = impl
        with torch.device("meta"):
            module = GptOssExperts(config)
        zeros = lambda *shape: torch.zeros(*shape, dtype=gate_up.dtype, device=gate_up.device)  # noqa: E731
        gb = zeros(N, 2 * f) if gate_up_bias is None else gate_up_bias.to(gate_up.dtype)
        db = zeros(N, d) if down_bias is None else down_bias.to(gate_up.dtype)
        inter = torch.stack([gate_up[:, :f], gate_up[:, f:]], dim=2).reshape(N, 2 * f, d)  # g0 u0 g1 u1 ...
        module.gate_up_proj = param(inter.transpose(1, 2).contiguous())
        module.gate_up_proj_bias = param(torch.stack([gb[:, :f], gb[:, f:]], dim=2).reshape(N, 2 * f))
        module.down_proj = param(down.transpose(1, 2).contiguous())
        module.down_proj_bias = param(db)
    return module.eval()


def _hf(impl: str) -> Callable[..., torch.Tensor]:
    def run(x, ids, weights, gate_up, down, gate_up_bias, down_bias, act, threads):
        _check_ids(ids, gate_up.shape[0])
        module = _peer_state(f"hf-{impl}", gate_up, down, gate_up_bias, down_bias, act,
                             lambda: _hf_module(impl, gate_up, down, gate_up_bias, down_bias, act))
        with torch.no_grad():
            out = module(x.to(gate_up.dtype), ids.to(torch.int64), weights.to(gate_up.dtype))
        return out.to(x.dtype)

    return run


def _mlx_available() -> bool:
    return importlib.util.find_spec("mlx") is not None and importlib.util.find_spec("mlx_lm") is not None


def _to_mlx(t: torch.Tensor):
    import mlx.core as mx

    dtype = {torch.float32: mx.float32, torch.bfloat16: mx.bfloat16}.get(t.dtype, mx.float32)
    return mx.array(t.detach().float().numpy()).astype(dtype)


def _mlx_module(gate_up, down, gate_up_bias, down_bias, act):
    """mlx-lm's SwitchGLU holding a copy of our weights (MLX arrays live in MLX's own memory)."""
    import mlx.core as mx
    from mlx_lm.models.activations import SwigluOAI
    from mlx_lm.models.switch_layers import SwiGLU, SwitchGLU

    N, two_f, d = gate_up.shape
    f = two_f // 2
    bias = gate_up_bias is not None or down_bias is not None
    activation = SwiGLU() if act.kind == "silu" else SwigluOAI(alpha=act.alpha, limit=act.limit)
    module = SwitchGLU(d, f, N, activation=activation, bias=bias)
    module.gate_proj.weight, module.up_proj.weight = _to_mlx(gate_up[:, :f]), _to_mlx(gate_up[:, f:])
    module.down_proj.weight = _to_mlx(down)
    if bias:
        gb = torch.zeros(N, 2 * f, dtype=gate_up.dtype) if gate_up_bias is None else gate_up_bias
        db = torch.zeros(N, d, dtype=gate_up.dtype) if down_bias is None else down_bias
        module.gate_proj.bias, module.up_proj.bias = _to_mlx(gb[:, :f]), _to_mlx(gb[:, f:])
        module.down_proj.bias = _to_mlx(db)
    mx.eval(module.parameters())
    return module


def _mlx(sort: bool) -> Callable[..., torch.Tensor]:
    """SwitchGLU's own layers with its sort decision forced: gather_mm per slot (its path below the sort
    threshold, n*m < 64), or slots sorted by expert first (its path above; the paper's modified MLX-LM)."""

    def run(x, ids, weights, gate_up, down, gate_up_bias, down_bias, act, threads):
        import mlx.core as mx
        import numpy as np
        from mlx_lm.models.switch_layers import _gather_sort, _scatter_unsort

        _check_ids(ids, gate_up.shape[0])
        if gate_up.dtype != torch.float32:  # mlx 0.32: "[GatherMM::eval] Currently only supports float32."
            raise MoespecError(f"mlx peers: MLX's CPU gather_mm runs float32 only, not {gate_up.dtype}")
        module = _peer_state("mlx", gate_up, down, gate_up_bias, down_bias, act,
                             lambda: _mlx_module(gate_up, down, gate_up_bias, down_bias, act))
        idx = mx.array(ids.numpy().astype(np.uint32))
        xs = mx.expand_dims(_to_mlx(x.to(gate_up.dtype)), (-2, -3))
        if sort:
            xs, idx, inverse = _gather_sort(xs, idx)
        h = module.activation(module.up_proj(xs, idx, sorted_indices=sort),
                              module.gate_proj(xs, idx, sorted_indices=sort))
        y = module.down_proj(h, idx, sorted_indices=sort)
        if sort:
            y = _scatter_unsort(y, inverse, tuple(ids.shape))
        out = (y.squeeze(-2) * mx.expand_dims(_to_mlx(weights.to(gate_up.dtype)), -1)).sum(axis=-2)
        mx.eval(out)
        return torch.from_numpy(np.array(out.astype(mx.float32))).to(x.dtype)

    return run


def _ggml_available() -> bool:
    return importlib.util.find_spec("ggml") is not None


def _ggml_run(x, ids, weights, gate_up, down, gate_up_bias, down_bias, act, threads):
    """llama.cpp's ggml MUL_MAT_ID on the CPU backend (ggml-python bindings), wrapping our weights without a
    copy; ggml-cpu groups the slots' rows by expert, so each distinct expert is read once per pass."""
    import ctypes

    import ggml
    import ggml.utils

    _check_ids(ids, gate_up.shape[0])
    gtype = {torch.float32: ggml.GGML_TYPE_F32, torch.bfloat16: ggml.GGML_TYPE_BF16}.get(gate_up.dtype)
    if gtype is None:  # ggml aborts the process on unsupported operands, so refuse them here
        raise MoespecError(f"ggml peer: weights must be float32 or bfloat16, not {gate_up.dtype}")
    (n, d), m, (N, two_f, _) = x.shape, ids.shape[1], gate_up.shape
    f = two_f // 2
    # ggml's add_id wants fp32 biases: converted once per weight set
    biases = _peer_state("ggml", gate_up, down, gate_up_bias, down_bias, act, lambda: [
        None if b is None else b.detach().float().contiguous() for b in (gate_up_bias, down_bias)])
    inputs = [x.detach().float().contiguous(), ids.to(torch.int32).contiguous(),
              weights.detach().float().contiguous()]
    # Activations (gate/up, h, per-slot outputs, float32) and the work buffer, with room to spare.
    mem = 16 * (2 * f + 2 * d) * m * n + (4 << 20)
    wrap_ctx = ggml.ggml_init(ggml.ggml_init_params(mem_size=16 * ggml.ggml_tensor_overhead(), mem_buffer=None,
                                                    no_alloc=True))
    ctx = ggml.ggml_init(ggml.ggml_init_params(mem_size=mem, mem_buffer=None, no_alloc=False))

    def wrap(t, ne, kind):  # ggml dims are innermost first
        g = ggml.ggml_new_tensor(wrap_ctx, kind, len(ne), (ctypes.c_int64 * len(ne))(*ne))
        g.contents.data = ctypes.c_void_p(t.data_ptr())
        return g

    try:
        xs, idx, ws = inputs
        experts_in = wrap(gate_up, [d, two_f, N], gtype)
        experts_out = wrap(down, [f, d, N], gtype)
        sel = wrap(idx, [m, n], ggml.GGML_TYPE_I32)
        gu = ggml.ggml_mul_mat_id(ctx, experts_in, wrap(xs, [d, 1, n], ggml.GGML_TYPE_F32), sel)  # [2f, m, n]
        if biases[0] is not None:
            gu = ggml.ggml_add_id(ctx, gu, wrap(biases[0], [two_f, N], ggml.GGML_TYPE_F32), sel)
        nb1, nb2 = gu.contents.nb[1], gu.contents.nb[2]
        gate = ggml.ggml_view_3d(ctx, gu, f, m, n, nb1, nb2, 0)
        up = ggml.ggml_view_3d(ctx, gu, f, m, n, nb1, nb2, f * 4)
        h = (ggml.ggml_swiglu_split(ctx, gate, up) if act.kind == "silu"
             else ggml.ggml_swiglu_oai(ctx, gate, up, act.alpha, act.limit))
        y = ggml.ggml_mul_mat_id(ctx, experts_out, h, sel)  # [d, m, n]
        if biases[1] is not None:
            y = ggml.ggml_add_id(ctx, y, wrap(biases[1], [d, N], ggml.GGML_TYPE_F32), sel)
        y = ggml.ggml_mul(ctx, y, wrap(ws, [1, m, n], ggml.GGML_TYPE_F32))
        out = ggml.ggml_sum_rows(ctx, ggml.ggml_cont(ctx, ggml.ggml_permute(ctx, y, 1, 0, 2, 3)))  # [1, d, n]
        graph = ggml.ggml_new_graph(ctx)
        ggml.ggml_build_forward_expand(graph, out)
        ggml.ggml_graph_compute_with_ctx(ctx, graph, threads or torch.get_num_threads())
        result = torch.from_numpy(ggml.utils.to_numpy(out).copy()).reshape(n, d)
    finally:
        ggml.ggml_free(ctx)
        ggml.ggml_free(wrap_ctx)
    return result.to(x.dtype)


# ---------------------------------------------------------------- registry and entry point

KERNELS: dict[str, Kernel] = {
    "reference": Kernel("reference", "slot", _reference, "float64 loop over slots: the ground truth"),
    "slot": Kernel("slot", "slot", _ours("slot"), "ours, per-slot: each slot streams its expert"),
    "dedup": Kernel("dedup", "dedup", _ours("dedup"), "ours, deduplicating: each distinct expert streamed once"),
    "torch-slot": Kernel("torch-slot", "slot", _torch_loop("slot"), "torch loop: one F.linear pair per slot"),
    "torch-dedup": Kernel("torch-dedup", "dedup", _torch_loop("dedup"),
                          "torch loop: one F.linear pair per distinct expert on its tokens"),
    "hf-batched_mm": Kernel("hf-batched_mm", "slot", _hf("batched_mm"),
                            "transformers batched_mm: gathers each slot's weights, then bmm"),
    "hf-grouped_mm": Kernel("hf-grouped_mm", "dedup", _hf("grouped_mm"),
                            "transformers grouped_mm: sorts slots by expert, torch grouped_mm"),
    "hf-eager": Kernel("hf-eager", "dedup", _hf("eager"),
                       "transformers eager: loop over hit experts, linear on their tokens"),
}
if _ggml_available():  # optional peer: pip install ggml-python (builds llama.cpp's ggml from source)
    KERNELS["ggml-mul_mat_id"] = Kernel("ggml-mul_mat_id", "dedup", _ggml_run,
                                        "llama.cpp ggml MUL_MAT_ID, CPU backend: rows grouped by expert")
if _mlx_available():  # optional peer: pip install 'mlx[cpu]' mlx-lm
    KERNELS["mlx-gather"] = Kernel("mlx-gather", "slot", _mlx(sort=False),
                                   "mlx-lm SwitchGLU, gather_mm per slot (its path when n*m < 64)")
    KERNELS["mlx-sorted"] = Kernel("mlx-sorted", "dedup", _mlx(sort=True),
                                   "mlx-lm SwitchGLU, slots sorted by expert (its path when n*m >= 64)")


def _kernel(name: str) -> Kernel:
    if name not in KERNELS:
        raise MoespecError(f"unknown kernel {name!r}; choose from {', '.join(KERNELS)}")
    return KERNELS[name]


def expert_op(kernel: str, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, gate_up: torch.Tensor,
              down: torch.Tensor, gate_up_bias: torch.Tensor | None = None, down_bias: torch.Tensor | None = None,
              act: Activation = SILU, threads: int | None = None) -> torch.Tensor:
    """Run the expert operation with `kernel` (a key of KERNELS); returns out [n, d] in x's dtype.

    `threads` applies to our native kernels (default: torch.get_num_threads())."""
    _check(x, ids, weights, gate_up, down, gate_up_bias, down_bias)
    return _kernel(kernel).run(x, ids, weights, gate_up, down, gate_up_bias, down_bias, act, threads)

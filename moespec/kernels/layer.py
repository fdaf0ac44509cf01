"""One MoE decoder layer of a verification pass in one native call (csrc/layer_kernels.cpp).

Physics. A layer's bytes are its weights, its cached keys and values and its selected experts; the kernels that
stream them are this package's (dense, attention, token_ops, experts). Called one by one from Python, a layer
costs ~25 Python and torch calls between the streams, each tens of microseconds right after megabytes have gone
through the caches: ~0.5 ms a layer on this project's machine, a few percent of a pass. `decoder_layer` runs the
same kernels in the same order from C++, so its result equals the Python composition bit for bit
(moespec.model.lean runs one or the other and is its reference; transformers' decoder layer is the definition).

Shape legend
    n tokens (1..16)   d hidden   Hq, Hkv heads   D head size (even)   N experts   m experts per token   f width

    h        [n, d]            the residual stream, updated in place; the dtype of every float tensor (fp32, bf16)
    weights  LayerWeights      nn.Linear-layout projections q [Hq D, d], k, v [Hkv D, d], o [d, Hq D] (biases
                               or None), norms, router [N, d], experts gate_up [N, 2f, d], down [N, d, f]
    cos, sin [n, D]            rotary rows of the pass's positions, contiguous
    keys, values [1, Hkv, C, D] cache buffers with room: rows past .. past + n - 1 are written, 0 .. past + n - 1
                               attended
    replay   [n, m] int64 or None: expert ids used instead of the router's (its top-k weights kept by rank)

The layer (a Llama-family pre-norm MoE layer, as transformers computes it for OLMoE, Qwen3-MoE and Mixtral):
    x = rms(h); q, k, v = proj(x); qk_norm; clamp; rope(q, k); cache <- k, v; h = h + o_proj(attention(q, cache))
    x = rms(h); ids, w = top-k(softmax(router x)); h = h + experts_kernel(x, ids, w)
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from moespec.kernels import native

QK_NORMS = {None: 0, "full": 1, "head": 2}  # where q and k are normalized: not, over the projection, per head
MODES = {"slot": 0, "dedup": 1, "outside": 2}  # the expert kernel, or the expert operation taken out


class LayerArgs(ctypes.Structure):
    """The C struct LayerArgs of csrc/layer_kernels.cpp, field by field (ABI native.LAYER_ABI_VERSION)."""

    _fields_ = ([(name, ctypes.c_int64) for name in (
        "dtype", "n", "d", "Hq", "Hkv", "D", "qk_norm", "has_clip", "N", "m", "f", "renorm", "scores_fp32", "mode",
        "past", "threads", "k_sh", "k_sl", "v_sh", "v_sl")]
        + [(name, ctypes.c_float) for name in ("eps", "scale", "clip", "pad")]
        + [(name, ctypes.c_void_p) for name in (
            "h", "in_norm", "q_w", "k_w", "v_w", "o_w", "q_b", "k_b", "v_b", "o_b", "q_norm", "k_norm", "post_norm",
            "router_w", "gate_up", "down", "cos", "sin", "keys", "values", "replay")])


@dataclass(frozen=True)
class LayerWeights:
    """One layer's tensors and constants (the tensors are the model's own parameters, read at every call, so a
    model moved in place stays valid; `check` runs once when the layer is set up)."""

    in_norm: torch.Tensor
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    o: torch.Tensor
    q_bias: torch.Tensor | None
    k_bias: torch.Tensor | None
    v_bias: torch.Tensor | None
    o_bias: torch.Tensor | None
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    post_norm: torch.Tensor
    router: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor
    heads: int
    kv_heads: int
    head_dim: int
    top_k: int
    eps: float
    scale: float
    clip: float | None
    qk_norm: str | None
    renorm: bool
    scores_fp32: bool

    def tensors(self) -> dict[str, torch.Tensor]:
        return {name: t for name, t in vars(self).items() if isinstance(t, torch.Tensor)}

    def check(self) -> None:
        """ValueError naming the first tensor that is not a contiguous CPU tensor of the layer's dtype and shape."""
        dtype, (d,) = self.in_norm.dtype, self.in_norm.shape
        if dtype not in native.DTYPE_CODE:
            raise ValueError(f"in_norm is {dtype}; the layer kernel takes float32 or bfloat16")
        qd, kd = self.heads * self.head_dim, self.kv_heads * self.head_dim
        N, two_f = self.gate_up.shape[0], self.gate_up.shape[1]
        norm_q = {"full": (qd,), "head": (self.head_dim,)}.get(self.qk_norm)
        norm_k = {"full": (kd,), "head": (self.head_dim,)}.get(self.qk_norm)
        shapes = {"in_norm": (d,), "q": (qd, d), "k": (kd, d), "v": (kd, d), "o": (d, qd), "q_bias": (qd,),
                  "k_bias": (kd,), "v_bias": (kd,), "o_bias": (d,), "q_norm": norm_q, "k_norm": norm_k,
                  "post_norm": (d,), "router": (N, d), "gate_up": (N, two_f, d), "down": (N, d, two_f // 2)}
        for name, t in self.tensors().items():
            if t.device.type != "cpu" or t.dtype != dtype or not t.is_contiguous() or tuple(t.shape) != shapes[name]:
                raise ValueError(f"{name} is {t.dtype} {tuple(t.shape)} on {t.device}; the layer kernel needs a "
                                 f"contiguous {dtype} {shapes[name]} on the CPU")
        if self.qk_norm not in QK_NORMS or (self.qk_norm is not None) != (self.q_norm is not None) or \
                (self.q_norm is None) != (self.k_norm is None):
            raise ValueError(f"qk_norm {self.qk_norm!r} does not match the q and k norms given")
        if self.heads % self.kv_heads or self.head_dim % 2 or two_f % 2 or not 1 <= self.top_k <= N:
            raise ValueError(f"heads {self.heads}/{self.kv_heads}, head_dim {self.head_dim}, top_k {self.top_k} "
                             f"of {N} experts do not fit the layer kernel")


def decoder_layer(h: torch.Tensor, w: LayerWeights, cos: torch.Tensor, sin: torch.Tensor, keys: torch.Tensor,
                  values: torch.Tensor, past: int, mode: str, replay: torch.Tensor | None = None,
                  threads: int | None = None) -> torch.Tensor:
    """Run one layer on h [n, d] in place (module docstring) and return h. Every tensor is checked for device,
    dtype, shape and layout before a pointer reaches native code; ValueError names the one that does not fit."""
    for name, t in (("h", h), ("cos", cos), ("sin", sin), ("keys", keys), ("values", values)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if not isinstance(w, LayerWeights):
        raise ValueError(f"w must be a LayerWeights, got {type(w).__name__}")
    if isinstance(past, bool) or not isinstance(past, int):
        raise ValueError(f"past must be an integer >= 0, got {type(past).__name__}")
    native.check_threads(threads)
    n = h.shape[0] if h.dim() == 2 else 0
    if not 1 <= n <= 16:
        raise ValueError(f"h must be [n, d] with 1..16 tokens, got {tuple(h.shape)}")
    dtype = w.in_norm.dtype
    D, kv = w.head_dim, w.kv_heads
    expect = {"h": (h, (n, w.in_norm.shape[0])), "cos": (cos, (n, D)), "sin": (sin, (n, D))}
    for name, (t, shape) in expect.items():
        if not (t.device.type == "cpu" and t.dtype == dtype and t.is_contiguous() and tuple(t.shape) == shape):
            raise ValueError(f"{name} is {t.dtype} {tuple(t.shape)} on {t.device}; expected a contiguous {dtype} "
                             f"{shape} on the CPU")
    for name, t in (("keys", keys), ("values", values)):
        if not (t.device.type == "cpu" and t.dtype == dtype and t.dim() == 4 and t.shape[0] == 1
                and t.shape[1] == kv and t.shape[3] == D and t.stride(3) == 1 and past >= 0
                and t.shape[2] >= past + n):
            raise ValueError(f"{name} {tuple(t.shape)} {t.dtype} must be a CPU [1, {kv}, >= {past + n}, {D}] "
                             f"{dtype} buffer with a contiguous last dimension")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if replay is not None and (replay.dtype != torch.int64 or replay.device.type != "cpu"
                               or tuple(replay.shape) != (n, w.top_k) or not replay.is_contiguous()):
        raise ValueError(f"replay must be contiguous int64 [{n}, {w.top_k}] on the CPU")
    run_layers([layer_args(h, w, cos, sin, keys, values, past, mode, replay, threads)], w.gate_up.shape[0])
    return h


def layer_args(h: torch.Tensor, w: LayerWeights, cos: torch.Tensor, sin: torch.Tensor, keys: torch.Tensor,
               values: torch.Tensor, past: int, mode: str, replay: torch.Tensor | None,
               threads: int | None) -> LayerArgs:
    """The native arguments of one layer, for arguments the caller has checked (the engine's path: w.check()
    once, the pass's own tensors made to fit); `run_layers` runs them."""
    ptr = lambda t: None if t is None else t.data_ptr()  # noqa: E731
    return LayerArgs(
        dtype=native.DTYPE_CODE[h.dtype], n=h.shape[0], d=h.shape[1], Hq=w.heads, Hkv=w.kv_heads, D=w.head_dim,
        qk_norm=QK_NORMS[w.qk_norm], has_clip=w.clip is not None, N=w.gate_up.shape[0], m=w.top_k,
        f=w.down.shape[2], renorm=w.renorm, scores_fp32=w.scores_fp32, mode=MODES[mode], past=past,
        threads=threads or torch.get_num_threads(), k_sh=keys.stride(1), k_sl=keys.stride(2),
        v_sh=values.stride(1), v_sl=values.stride(2), eps=w.eps, scale=w.scale, clip=w.clip or 0.0,
        h=h.data_ptr(), in_norm=w.in_norm.data_ptr(), q_w=w.q.data_ptr(), k_w=w.k.data_ptr(), v_w=w.v.data_ptr(),
        o_w=w.o.data_ptr(), q_b=ptr(w.q_bias), k_b=ptr(w.k_bias), v_b=ptr(w.v_bias), o_b=ptr(w.o_bias),
        q_norm=ptr(w.q_norm), k_norm=ptr(w.k_norm), post_norm=w.post_norm.data_ptr(), router_w=w.router.data_ptr(),
        gate_up=w.gate_up.data_ptr(), down=w.down.data_ptr(), cos=cos.data_ptr(), sin=sin.data_ptr(),
        keys=keys.data_ptr(), values=values.data_ptr(), replay=ptr(replay))


def run_layers(args: list[LayerArgs], experts: int) -> None:
    """Run consecutive layers (their `layer_args`, all on one h) in one native call; `experts`: N, named when a
    replayed id falls outside [0, N)."""
    lib = native.load()
    if lib is None:
        raise RuntimeError(f"native layer kernel unavailable: {native.status()}")
    rc = lib.moespec_decoder_layers((LayerArgs * len(args))(*args), len(args))
    if rc == 3:
        raise ValueError(f"replayed expert ids must lie in [0, {experts})")
    if rc != 0:
        raise RuntimeError(f"moespec_decoder_layers rejected its arguments (code {rc})")

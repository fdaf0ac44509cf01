"""The peers our kernels are benchmarked against, run on our weight tensors: transformers' experts
implementations, and, when installed, ggml's MUL_MAT_ID (llama.cpp's CPU backend) and mlx-lm's SwitchGLU. They are
for the bench only; the engine runs our kernels (moespec.kernels.experts). `PEERS` maps each name to its Kernel."""

from __future__ import annotations

import ctypes
import importlib.util
import weakref
from typing import Callable

import numpy as np
import torch
from transformers import GptOssConfig, OlmoeConfig
from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts
from transformers.models.olmoe.modeling_olmoe import OlmoeExperts

from moespec import MoespecError
from moespec.kernels.experts import Kernel, _check_ids

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

        config = OlmoeConfig(hidden_size=d, intermediate_size=f, num_experts=N, hidden_act="silu")
        config._experts_implementation = impl
        with torch.device("meta"):
            module = OlmoeExperts(config)
        module.gate_up_proj, module.down_proj = param(gate_up), param(down)
    else:

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
    import mlx.core as mx  # optional heavy dependency: mlx

    dtype = {torch.float32: mx.float32, torch.bfloat16: mx.bfloat16}.get(t.dtype, mx.float32)
    return mx.array(t.detach().float().numpy()).astype(dtype)


def _mlx_module(gate_up, down, gate_up_bias, down_bias, act):
    """mlx-lm's SwitchGLU holding a copy of our weights (MLX arrays live in MLX's own memory)."""
    import mlx.core as mx  # optional heavy dependency: mlx
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
        import mlx.core as mx  # optional heavy dependency: mlx
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

    import ggml  # optional heavy dependency: ggml-python
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


PEERS: dict[str, Kernel] = {
    "hf-batched_mm": Kernel("hf-batched_mm", "slot", _hf("batched_mm"),
                            "transformers batched_mm: gathers each slot's weights, then bmm"),
    "hf-grouped_mm": Kernel("hf-grouped_mm", "dedup", _hf("grouped_mm"),
                            "transformers grouped_mm: sorts slots by expert, torch grouped_mm"),
    "hf-eager": Kernel("hf-eager", "dedup", _hf("eager"),
                       "transformers eager: loop over hit experts, linear on their tokens"),
}
if _ggml_available():  # optional peer: pip install ggml-python (builds llama.cpp's ggml from source)
    PEERS["ggml-mul_mat_id"] = Kernel("ggml-mul_mat_id", "dedup", _ggml_run,
                                        "llama.cpp ggml MUL_MAT_ID, CPU backend: rows grouped by expert")
if _mlx_available():  # optional peer: pip install 'mlx[cpu]' mlx-lm
    PEERS["mlx-gather"] = Kernel("mlx-gather", "slot", _mlx(sort=False),
                                   "mlx-lm SwitchGLU, gather_mm per slot (its path when n*m < 64)")
    PEERS["mlx-sorted"] = Kernel("mlx-sorted", "dedup", _mlx(sort=True),
                                   "mlx-lm SwitchGLU, slots sorted by expert (its path when n*m >= 64)")

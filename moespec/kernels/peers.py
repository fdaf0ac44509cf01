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
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from moespec import MoespecError
from moespec.defaults import QUANTIZED
from moespec.kernels.experts import SILU, Kernel, _check_ids

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
    # imported here: transformers' model modules take seconds to import and only the HF peers need them
    from transformers import GptOssConfig, OlmoeConfig
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts
    from transformers.models.olmoe.modeling_olmoe import OlmoeExperts

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


def _ggml_type(fmt: str) -> int:
    import ggml  # optional heavy dependency: ggml-python

    return {"fp32": ggml.GGML_TYPE_F32, "bf16": ggml.GGML_TYPE_BF16, "q8_0": ggml.GGML_TYPE_Q8_0,
            "q4_0": ggml.GGML_TYPE_Q4_0}[fmt]


GRAPH_NODES_PER_TOKEN = 16  # the per-slot graph's nodes for one token (views, products, activation, biases, write)


def _ggml_experts(x, ids, weights, gate_up, down, fmt: str, shape: tuple[int, int, int], biases, act, threads,
                  per_slot: bool) -> torch.Tensor:
    """llama.cpp's ggml MUL_MAT_ID on the CPU backend (ggml-python bindings) over expert weights held as raw bytes
    of ggml type `fmt` (shape (N, d, f): gate_up's rows are 2f rows of d weights, down's d rows of f), wrapped
    without a copy. ggml-cpu groups a node's rows by expert, so one node for the pass reads each distinct expert
    once (dedup); `per_slot` builds one node per token instead, each reading its own m experts (per-slot bytes)."""
    import ggml  # optional heavy dependency: ggml-python
    import ggml.utils

    (n, d), m, (N, _, f) = x.shape, ids.shape[1], shape
    two_f = 2 * f
    inputs = [x.detach().float().contiguous(), ids.to(torch.int32).contiguous(),
              weights.detach().float().contiguous()]
    # Activations (gate/up, h, per-slot outputs, float32) and the work buffer, with room to spare, and the graph:
    # per slot ~10 nodes a token (GRAPH_NODES_PER_TOKEN leaves room), past ggml's default of 2048 from ~200 tokens.
    nodes = max(ggml.GGML_DEFAULT_GRAPH_SIZE, GRAPH_NODES_PER_TOKEN * n + 64) if per_slot else \
        ggml.GGML_DEFAULT_GRAPH_SIZE
    mem = 16 * (2 * f + 2 * d) * m * n + (4 << 20) + (n << 16) + ggml.ggml_graph_overhead_custom(nodes, False)
    wrap_ctx = ggml.ggml_init(ggml.ggml_init_params(mem_size=8 * ggml.ggml_tensor_overhead(), mem_buffer=None,
                                                    no_alloc=True))  # the 7 wrapped tensors below
    ctx = ggml.ggml_init(ggml.ggml_init_params(mem_size=mem, mem_buffer=None, no_alloc=False))

    def wrap(t, ne, kind):  # ggml dims are innermost first
        g = ggml.ggml_new_tensor(wrap_ctx, kind, len(ne), (ctypes.c_int64 * len(ne))(*ne))
        g.contents.data = ctypes.c_void_p(t.data_ptr())
        return g

    def experts_of(xs, sel, rows):  # [d, 1, rows] inputs, [m, rows] ids -> [1, d, rows] weighted sums
        gu = ggml.ggml_mul_mat_id(ctx, experts_in, xs, sel)  # [2f, m, rows]
        if bias_in is not None:
            gu = ggml.ggml_add_id(ctx, gu, bias_in, sel)
        nb1, nb2 = gu.contents.nb[1], gu.contents.nb[2]
        gate = ggml.ggml_view_3d(ctx, gu, f, m, rows, nb1, nb2, 0)
        up = ggml.ggml_view_3d(ctx, gu, f, m, rows, nb1, nb2, f * 4)
        h = (ggml.ggml_swiglu_split(ctx, gate, up) if act.kind == "silu"
             else ggml.ggml_swiglu_oai(ctx, gate, up, act.alpha, act.limit))
        y = ggml.ggml_mul_mat_id(ctx, experts_out, h, sel)  # [d, m, rows]
        if bias_out is not None:
            y = ggml.ggml_add_id(ctx, y, bias_out, sel)
        return y

    try:
        xs, idx, ws = inputs
        gtype = _ggml_type(fmt)
        experts_in = wrap(gate_up, [d, two_f, N], gtype)
        experts_out = wrap(down, [f, d, N], gtype)
        bias_in = None if biases[0] is None else wrap(biases[0], [two_f, N], ggml.GGML_TYPE_F32)
        bias_out = None if biases[1] is None else wrap(biases[1], [d, N], ggml.GGML_TYPE_F32)
        x_all, sel_all = wrap(xs, [d, 1, n], ggml.GGML_TYPE_F32), wrap(idx, [m, n], ggml.GGML_TYPE_I32)
        graph = ggml.ggml_new_graph_custom(ctx, nodes, False)
        if per_slot:  # each token's node writes its [d, m] outputs into its slice of y, as llama.cpp's cache writes
            y = ggml.ggml_new_tensor_3d(ctx, ggml.GGML_TYPE_F32, d, m, n)
            for t in range(n):
                part = experts_of(ggml.ggml_view_3d(ctx, x_all, d, 1, 1, x_all.contents.nb[1], x_all.contents.nb[2],
                                                    t * x_all.contents.nb[2]),
                                  ggml.ggml_view_2d(ctx, sel_all, m, 1, sel_all.contents.nb[1],
                                                    t * sel_all.contents.nb[1]), 1)
                ggml.ggml_build_forward_expand(graph, ggml.ggml_cpy(ctx, part, ggml.ggml_view_3d(
                    ctx, y, d, m, 1, y.contents.nb[1], y.contents.nb[2], t * y.contents.nb[2])))
        else:
            y = experts_of(x_all, sel_all, n)
        y = ggml.ggml_mul(ctx, y, wrap(ws, [1, m, n], ggml.GGML_TYPE_F32))
        out = ggml.ggml_sum_rows(ctx, ggml.ggml_cont(ctx, ggml.ggml_permute(ctx, y, 1, 0, 2, 3)))  # [1, d, n]
        ggml.ggml_build_forward_expand(graph, out)  # after every slice's write: ggml computes nodes in graph order
        ggml.ggml_graph_compute_with_ctx(ctx, graph, threads or torch.get_num_threads())
        result = torch.from_numpy(ggml.utils.to_numpy(out).copy()).reshape(n, d)
    finally:
        ggml.ggml_free(ctx)
        ggml.ggml_free(wrap_ctx)
    return result.to(x.dtype)


def _ggml(per_slot: bool) -> Callable[..., torch.Tensor]:
    def run(x, ids, weights, gate_up, down, gate_up_bias, down_bias, act, threads):
        _check_ids(ids, gate_up.shape[0])
        fmt = {torch.float32: "fp32", torch.bfloat16: "bf16"}.get(gate_up.dtype)
        if fmt is None:  # ggml aborts the process on unsupported operands, so refuse them here
            raise MoespecError(f"ggml peer: weights must be float32 or bfloat16, not {gate_up.dtype}")
        # ggml's add_id wants fp32 biases: converted once per weight set
        biases = _peer_state("ggml", gate_up, down, gate_up_bias, down_bias, act, lambda: [
            None if b is None else b.detach().float().contiguous() for b in (gate_up_bias, down_bias)])
        N, two_f, d = gate_up.shape
        return _ggml_experts(x, ids, weights, gate_up.contiguous(), down.contiguous(), fmt, (N, d, two_f // 2),
                             biases, act, threads, per_slot)

    return run


def ggml_quantized(kernel: str, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, gate_up: torch.Tensor,
                   down: torch.Tensor, fmt: str, shape: tuple[int, int, int], threads: int | None = None
                   ) -> torch.Tensor:
    """A ggml peer (`kernel`: ggml-mul_mat_id or ggml-per-slot) on quantized experts: gate_up and down the raw
    GGUF blocks (uint8, contiguous: [N, 2f, d / 32 x block bytes], [N, d, f / 32 x block bytes]) of `fmt` (one
    of QUANTIZED), shape (N, d, f), silu and no biases: what llama.cpp's CPU backend runs for a q8_0 or
    q4_0 GGUF (bench --dtype q8_0)."""
    if kernel not in GGML_PEERS or fmt not in QUANTIZED:
        raise MoespecError(f"quantized experts run on {', '.join(GGML_PEERS)} in {', '.join(QUANTIZED)}; got "
                           f"{kernel} in {fmt}")
    (N, d, f), (block, block_bytes) = shape, GGML_QUANT_SIZES[GGMLQuantizationType[fmt.upper()]]
    want = {"gate_up": (N, 2 * f, d // block * block_bytes), "down": (N, d, f // block * block_bytes)}
    for name, t in (("gate_up", gate_up), ("down", down)):
        if t.dtype != torch.uint8 or t.device.type != "cpu" or not t.is_contiguous() or tuple(t.shape) != want[name]:
            raise MoespecError(f"{name} must be contiguous uint8 {want[name]} on the CPU ({fmt} blocks), got "
                               f"{t.dtype} {tuple(t.shape)} on {t.device}")
    if d % block or f % block or tuple(x.shape) != (ids.shape[0], d) or x.device.type != "cpu":
        raise MoespecError(f"x {tuple(x.shape)} must be [n, d={d}] on the CPU, d and f multiples of {block}")
    _check_ids(ids, N)
    return _ggml_experts(x, ids, weights, gate_up, down, fmt, shape, [None, None], SILU, threads,
                         kernel == "ggml-per-slot")


GGML_PEERS = ("ggml-per-slot", "ggml-mul_mat_id")  # llama.cpp's kernel pair: per token, and the whole pass


PEERS: dict[str, Kernel] = {
    "hf-batched_mm": Kernel("hf-batched_mm", "slot", _hf("batched_mm"),
                            "transformers batched_mm: gathers each slot's weights, then bmm"),
    "hf-grouped_mm": Kernel("hf-grouped_mm", "dedup", _hf("grouped_mm"),
                            "transformers grouped_mm: sorts slots by expert, torch grouped_mm"),
    "hf-eager": Kernel("hf-eager", "dedup", _hf("eager"),
                       "transformers eager: loop over hit experts, linear on their tokens"),
}
if _ggml_available():  # optional peer: pip install ggml-python (builds llama.cpp's ggml from source)
    PEERS["ggml-mul_mat_id"] = Kernel("ggml-mul_mat_id", "dedup", _ggml(per_slot=False),
                                        "llama.cpp ggml MUL_MAT_ID, CPU backend: rows grouped by expert")
    PEERS["ggml-per-slot"] = Kernel("ggml-per-slot", "slot", _ggml(per_slot=True),
                                      "llama.cpp ggml MUL_MAT_ID, one node per token: each token's m experts")
if _mlx_available():  # optional peer: pip install 'mlx[cpu]' mlx-lm
    PEERS["mlx-gather"] = Kernel("mlx-gather", "slot", _mlx(sort=False),
                                   "mlx-lm SwitchGLU, gather_mm per slot (its path when n*m < 64)")
    PEERS["mlx-sorted"] = Kernel("mlx-sorted", "dedup", _mlx(sort=True),
                                   "mlx-lm SwitchGLU, slots sorted by expert (its path when n*m >= 64)")

"""A verification pass of a Llama-family MoE decoder (OLMoE, Qwen3-MoE, Mixtral) in one readable function.

Physics first. A pass of n <= 16 tokens is a stream of bytes: the dense weights, the cached keys and values and the
selected experts, each read once (moespec.model.spec). Between the streams it does a few kilobytes of arithmetic
per token, which costs nothing, and a few hundred Python and torch calls, which do: on the demo's 2-layer OLMoE
model transformers' forward spends ~3 ms of a ~16 ms pass at n = 1 outside the native kernels (module calls,
keyword plumbing, the causal-mask builder, eight torch operations per RMSNorm and ten per rotary embedding, each a
few microseconds right after the pass has pushed hundreds of megabytes through the caches). llama.cpp runs one
prebuilt graph and spends ~14 ms on the same pass. `Lean.verify` computes the same function from the model's
own modules with a few calls: every MoE layer under one of our expert policies runs as one native call
(moespec.kernels.layer: RMSNorm, projections, rotary, cache write, attention, router top-k and expert kernel,
composed in C++), a run of such layers as one call, so the Python work of a pass happens before its streams. A
layer the layer kernel does not take (a dense MLP, a tracer's hooks on its router, transformers' expert
implementations) runs the same steps from Python: RMSNorm and rotary one native call each
(moespec.kernels.token_ops), every matrix the native dense kernel, attention the native kernel with its implicit
causal mask, the KV cache written in place (moespec.model.cache), and the MoE block as transformers' own module,
so expert policies, routing replay and router hooks (moespec.model.policies, the tracer) work unchanged. Both
give the same bits (tests/test_lean.py). moespec.model.batched runs these steps over the rows of B sequences at once;
the native dense kernel takes them up to dense.native_rows (MAX_TOKENS; 256 bf16 rows on a CPU with AMX tiles),
and past those rows a bf16 matrix multiplies oneDNN's packed copy of its weight (moespec.kernels.dense.pack), made
at the first such pass and kept: the dense weights' bytes a second time in memory.

Where it applies (`unsupported` says why not): a model of these families on the CPU in fp32 or bf16 on transformers'
sdpa attention, full attention only (every cache layer an InPlaceLayer: no sliding window), rotary over the whole
head, the non-interleaved rotary of transformers, no router-logit outputs; a call of 1..MAX_TOKENS new tokens as
`input_ids` of batch 1 with the engine's cache and nothing else (no attention mask, positions or embeddings given).
Every other model or call runs transformers' forward. moespec.model.dense installs it with the native dense path
(`set_dense(model, "native")`); `set_dense(model, "torch")` removes it. The tests hold its logits to transformers'
on tiny models of all three families.

Per decoder layer, with x [n, d] and the family's q/k normalization ("full": over the whole projection, OLMoE;
"head": per head, Qwen3-MoE; none: Mixtral):
    h = x + o_proj(attention(rope(norm_q(q_proj(rms(x)))), cache <- rope(norm_k(k_proj(rms(x)))), v_proj(rms(x))))
    x = h + mlp(rms(h))
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.modules import module as nn_module
from transformers.modeling_outputs import MoeCausalLMOutputWithPast

from moespec.kernels import attention, dense, token_ops
from moespec.kernels import layer as layer_kernel
from moespec.model import policies
from moespec.model.cache import InPlaceLayer

MAX_TOKENS = min(dense.MAX_TOKENS, attention.MAX_QUERIES)  # a verification pass; longer calls go to transformers
QK_NORM = {"olmoe": "full", "qwen3_moe": "head", "mixtral": None}  # where each family normalizes q and k
# Rotary kinds whose inverse frequencies do not change with the sequence: cos and sin of a position are then a
# fixed table (dynamic and longrope rescale with the length and keep transformers' module).
STATIC_ROPE = ("default", "linear", "llama3", "yarn")
# The softmax-then-top-k routers: whether the scores are cast back to the logits' dtype (Mixtral keeps fp32) and
# the attribute that says whether the top k are renormalized (None: always).
ROUTERS = {"OlmoeTopKRouter": (True, "norm_topk_prob"), "Qwen3MoeTopKRouter": (True, "norm_topk_prob"),
           "MixtralTopKRouter": (False, None)}
Part = tuple[slice, torch.Tensor, torch.Tensor, Any]  # one sequence of a pass: its rows, cos, sin, cache
MIN_TABLE = 1024  # positions of the first rotary table (doubled when a pass goes past it)
_CALL_KEYS = {"input_ids", "use_cache", "logits_to_keep", "cache", "past_key_values"}  # what a verify call passes


def _norm_ok(module: Any, dtype: torch.dtype) -> bool:
    weight = getattr(module, "weight", None)
    return (type(module).__name__.endswith("RMSNorm") and isinstance(weight, torch.Tensor) and weight.dim() == 1
            and weight.dtype == dtype and weight.is_contiguous() and hasattr(module, "variance_epsilon"))


def unsupported(model: Any) -> str | None:
    """None when `Lean.verify` computes this model's passes, else the reason it does not."""
    config = getattr(model, "config", None)
    family = getattr(config, "model_type", None)
    if family not in QK_NORM:
        return f"model type {family!r} is not one of {', '.join(QK_NORM)}"
    if getattr(config, "output_router_logits", False):
        return "the config asks for router logits (an auxiliary loss)"
    if getattr(config, "_attn_implementation", None) != "sdpa":
        return f"attention runs {config._attn_implementation!r}; the native attention stands in for sdpa only"
    body = getattr(model, "model", None)
    dtype = getattr(model, "dtype", None)
    if dtype not in (torch.float32, torch.bfloat16) or getattr(model.device, "type", None) != "cpu":
        return f"the model is {dtype} on {getattr(model, 'device', '?')}; the kernels take fp32 or bf16 on the CPU"
    if body is None or not all(hasattr(body, a) for a in ("embed_tokens", "rotary_emb", "layers", "norm")):
        return "the model has no embed_tokens, rotary_emb, layers and norm"
    if not _norm_ok(body.norm, dtype) or not isinstance(getattr(model, "lm_head", None), torch.nn.Linear):
        return "the final norm or the output head is not of the expected kind"
    inv_freq = getattr(body.rotary_emb, "inv_freq", None)
    head_dim = getattr(body.layers[0].self_attn, "head_dim", None) if len(body.layers) else None
    if not isinstance(inv_freq, torch.Tensor) or head_dim is None or 2 * inv_freq.numel() != head_dim:
        return "the rotary embedding does not span the whole head (partial rotary)"
    for layer in body.layers:
        a = getattr(layer, "self_attn", None)
        if a is None or not all(hasattr(layer, n) for n in ("input_layernorm", "post_attention_layernorm", "mlp")):
            return f"decoder layer {type(layer).__name__} is not the pre-norm attention + mlp layout"
        if not all(_norm_ok(getattr(layer, n), dtype) for n in ("input_layernorm", "post_attention_layernorm")):
            return "a decoder layer's norms are not RMSNorms of the model's dtype"
        if QK_NORM[family] and not all(_norm_ok(getattr(a, n, None), dtype) for n in ("q_norm", "k_norm")):
            return "an attention module lacks its q_norm and k_norm"
        if not all(isinstance(getattr(a, n, None), torch.nn.Linear) for n in ("q_proj", "k_proj", "v_proj", "o_proj")):
            return "an attention module's projections are not nn.Linear"
    return None


class RotaryTable:
    """cos and sin [positions, D] of a model's rotary module for positions 0.. (computed by that module, so every
    rotary kind and scaling is its own; valid for STATIC_ROPE only), grown by doubling."""

    def __init__(self, rotary: Any, dtype: torch.dtype) -> None:
        self.rotary, self.dtype = rotary, dtype
        self.cos = self.sin = torch.empty(0)

    def rows(self, start: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [n, D] of positions start .. start + n - 1 (contiguous views)."""
        if start + n > self.cos.shape[0]:
            size = max(MIN_TABLE, 2 * (start + n))
            cos, sin = self.rotary(torch.empty(1, 1, dtype=self.dtype), torch.arange(size).unsqueeze(0))
            self.cos, self.sin = cos[0].contiguous(), sin[0].contiguous()
        return self.cos[start:start + n], self.sin[start:start + n]


class Lean:
    """What `install` puts on a model: its instance forward, the routers' instance forwards, the rotary table, the
    counts of native calls made by the passes it ran (`linear_calls`, `attention_calls`), and oneDNN's packed
    copies of the bf16 dense weights that passes past dense.native_rows multiply (`packs`)."""

    def __init__(self, model: Any) -> None:
        self.model, self.qk_norm = model, QK_NORM[model.config.model_type]
        self.linear_calls = self.attention_calls = 0
        rotary = model.model.rotary_emb
        self.table = RotaryTable(rotary, model.dtype) if getattr(rotary, "rope_type", None) in STATIC_ROPE else None
        self.original = type(model).forward.__get__(model)
        model.forward = self.forward
        self.routers = [m for m in model.modules() if type(m).__name__ in ROUTERS]
        for router in self.routers:
            router.forward = _RouterForward(router, self)
        self.fused = [_layer_weights(layer, self.qk_norm) for layer in model.model.layers]
        self.fused_calls = 0  # layers run by the one-call layer kernel
        self.packs: dict[torch.nn.Module, tuple[tuple, torch.Tensor | None]] = {}  # layer -> (weight key, packed)

    def remove(self) -> None:
        for module in (self.model, *self.routers):
            module.__dict__.pop("forward", None)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        cache = None if args else takes_call(self.model, kwargs)
        if cache is None:
            return self.original(*args, **kwargs)
        logits = self.verify(kwargs["input_ids"], cache, kwargs.get("logits_to_keep", 0))
        return MoeCausalLMOutputWithPast(logits=logits.unsqueeze(0), cache=cache)

    def logits(self, input_ids: torch.Tensor, cache: Any, logits_to_keep: int = 0) -> torch.Tensor | None:
        """The engine's direct call: `verify`'s logits [n, vocab] for a call `forward` would take, without the
        module call and the output object around it (~0.5 ms of a 13 ms pass after a stream, measured); None
        where `forward` would hand the call to transformers or where hooks on the model itself must see it."""
        model = self.model
        if model._forward_hooks or model._forward_pre_hooks or _global_hooks():
            return None
        cache = takes_call(model, {"input_ids": input_ids, "cache": cache, "logits_to_keep": logits_to_keep})
        return None if cache is None else self.verify(input_ids, cache, logits_to_keep)

    def linear(self, x: torch.Tensor, layer: torch.nn.Linear) -> torch.Tensor:
        packed = self.packed(layer) if dense.packed_takes(x, layer.bias) else None
        if packed is not None:
            return dense.packed_linear(x.contiguous(), packed, layer.bias)
        y = dense.linear_if_taken(x, layer.weight, layer.bias)
        if y is not None:
            self.linear_calls += 1
            return y
        return F.linear(x, layer.weight, layer.bias)

    def packed(self, layer: torch.nn.Linear) -> torch.Tensor | None:
        """The oneDNN copy of a layer's weight for passes past dense.native_rows (kernels.dense.pack),
        made at its first such pass and made again if the weight is replaced or written to; None where it has none."""
        w = layer.weight
        key = (w.data_ptr(), w._version, tuple(w.shape))
        have = self.packs.get(layer)
        if have is None or have[0] != key:
            have = self.packs[layer] = (key, dense.pack(w.detach()))
        return have[1]

    def attention_block(self, a: Any, x: torch.Tensor, parts: list[Part]) -> torch.Tensor:
        """o_proj(attention) of one layer for x [T, d], the rows of one or more sequences: each part (its rows,
        cos and sin [n_b, D] of its positions, its cache) attends over its own cache, which receives its new keys
        and values; every projection runs once over all T rows (moespec.model.batched)."""
        T, D = x.shape[0], a.head_dim
        q, k, v = self.linear(x, a.q_proj), self.linear(x, a.k_proj), self.linear(x, a.v_proj)
        if self.qk_norm == "full":
            q, k = _rms(a.q_norm, q), _rms(a.k_norm, k)
        clip = getattr(a.config, "clip_qkv", None)
        if clip is not None:
            for t in (q, k, v):
                t.clamp_(min=-clip, max=clip)
        q, k, v = q.view(T, -1, D), k.view(T, -1, D), v.view(T, -1, D)
        if self.qk_norm == "head":
            q, k = _rms(a.q_norm, q), _rms(a.k_norm, k)
        outs = []
        for rows, cos, sin, cache in parts:
            q_b, k_b, v_b = q[rows], k[rows], v[rows]  # [n_b, heads, D] views
            token_ops.rope_unchecked(q_b, cos, sin)
            token_ops.rope_unchecked(k_b, cos, sin)
            keys, values = cache.update(k_b.transpose(0, 1)[None], v_b.transpose(0, 1)[None], a.layer_idx)
            out = attention.attention_if_taken(q_b.transpose(0, 1)[None], keys, values, None, a.scaling)
            if out is None:
                raise RuntimeError("the native attention kernel did not take a verification pass it was installed for")
            self.attention_calls += 1
            outs.append(out.view(q_b.shape[0], -1))
        return self.linear(outs[0] if len(outs) == 1 else torch.cat(outs), a.o_proj)

    def fused_args(self, i: int, layer: Any, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   cache: Any) -> layer_kernel.LayerArgs | None:
        """Layer i's arguments for the one-call layer kernel (moespec.kernels.layer), its cache room reserved,
        where that computes what the modules would: a MoE layer under one of our expert policies, with no hooks on
        its block, router or experts other than replay's, and a cache layer with buffers; else None."""
        w, mlp = self.fused[i], layer.mlp
        if w is None or _global_hooks() or any(t.dtype != h.dtype or t.device.type != "cpu" for t in (w.q, w.gate_up)):
            return None  # (a model moved to another dtype or device after the install: the modules' path)
        kernel = policies.pass_kernel(mlp.experts, h.shape[0])
        replay = policies.replayed(mlp.experts)
        hooks = (mlp._forward_hooks or mlp._forward_pre_hooks or mlp.gate._forward_hooks
                 or mlp.gate._forward_pre_hooks or mlp.experts._forward_hooks
                 or len(mlp.experts._forward_pre_hooks) != (replay is not None))
        if kernel is None or hooks or (replay is not None and replay.shape[0] != h.shape[0]):
            return None
        room = cache.layers[i].reserve(h.shape[0])
        if room is None:
            return None
        keys, values, past = room
        return layer_kernel.layer_args(h, w, cos, sin, keys, values, past, kernel, replay, None)

    def layers(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: Any) -> torch.Tensor:
        """The decoder layers on h [n, d]: runs of layers the layer kernel takes in one native call each (h in
        place), the others through `attention_block` and the model's MLP module."""
        layers, n, i = self.model.model.layers, h.shape[0], 0
        while i < len(layers):
            run = []
            while i + len(run) < len(layers):
                args = self.fused_args(i + len(run), layers[i + len(run)], h, cos, sin, cache)
                if args is None:
                    break
                run.append(args)
            if run:
                layer_kernel.run_layers(run, self.fused[i].gate_up.shape[0])
                for k in range(i, i + len(run)):
                    cache.layers[k].advance(n)
                self.fused_calls += len(run)
                self.attention_calls += len(run)
                self.linear_calls += 5 * len(run)  # q, k, v, o and the router of each
                i += len(run)
                continue
            h = self.decoder_layer(layers[i], h, [(slice(0, n), cos, sin, cache)])
            i += 1
        return h

    def decoder_layer(self, layer: Any, h: torch.Tensor, parts: list[Part]) -> torch.Tensor:
        """One decoder layer through `attention_block` and the model's MLP module, on the rows h [T, d] of the
        sequences `parts` (the MLP, experts included, runs once over all T rows)."""
        h = h + self.attention_block(layer.self_attn, _rms(layer.input_layernorm, h), parts)
        return h + layer.mlp(_rms(layer.post_attention_layernorm, h).unsqueeze(0))[0]

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """Logits [T, vocab] of the final hidden states h [T, d]: the final norm and the output head."""
        return self.linear(_rms(self.model.model.norm, h), self.model.lm_head)

    def rotary(self, h: torch.Tensor, past: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [n, D] (contiguous) of positions past .. past + n - 1; h: any rows of the pass (dtype)."""
        if self.table is not None:
            return self.table.rows(past, n)
        cos, sin = self.model.model.rotary_emb(h, torch.arange(past, past + n).unsqueeze(0))
        return cos[0].contiguous(), sin[0].contiguous()

    def verify(self, input_ids: torch.Tensor, cache: Any, logits_to_keep: int = 0) -> torch.Tensor:
        """Logits [n, vocab] (the last `logits_to_keep` rows when > 0) of the n = input_ids.shape[1] tokens after
        the cache, which receives their keys and values: the function transformers' forward computes (module
        docstring)."""
        body = self.model.model
        n = input_ids.shape[1]
        past = cache.get_seq_length()
        h = body.embed_tokens(input_ids)[0]
        cos, sin = self.rotary(h, past, n)
        h = self.layers(h, cos, sin, cache)
        return self.head(h if logits_to_keep <= 0 else h[-logits_to_keep:])


class _RouterForward:
    """The instance forward of a softmax-then-top-k router (ROUTERS): the native linear and top-k for passes of
    up to MAX_TOKENS tokens on the CPU, the class's forward for anything else. Same outputs: (logits, scores,
    ids)."""

    def __init__(self, router: Any, lean: Lean) -> None:
        self.original = type(router).forward.__get__(router)
        self.router, self.lean = router, lean

    def __call__(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        router = self.router
        x = hidden_states.reshape(-1, router.weight.shape[1])
        logits = dense.linear_if_taken(x, router.weight) if x.shape[0] <= MAX_TOKENS else None
        if logits is None:
            return self.original(hidden_states)
        self.lean.linear_calls += 1
        renorm, scores_dtype = _router_rule(router)
        scores, ids = token_ops.softmax_topk_unchecked(logits, router.top_k, renorm, scores_dtype or logits.dtype)
        return logits, scores, ids


def _global_hooks() -> bool:
    """Whether module hooks registered for every module are active (they would miss the fused layer's modules)."""
    return bool(nn_module._global_forward_hooks or nn_module._global_forward_pre_hooks)


def _router_rule(router: Any) -> tuple[bool, torch.dtype | None]:
    """A ROUTERS router's (renormalize the top k, scores dtype: None for the logits' own, else fp32)."""
    cast, flag = ROUTERS[type(router).__name__]
    return True if flag is None else bool(getattr(router, flag)), None if cast else torch.float32


def _layer_weights(layer: Any, qk_norm: str | None) -> layer_kernel.LayerWeights | None:
    """The layer's tensors for the one-call layer kernel, or None where the kernel does not compute this layer
    (a dense MLP, a router that is not softmax-then-top-k, experts with biases, another activation or layout)."""
    mlp, a = layer.mlp, layer.self_attn
    gate, experts = getattr(mlp, "gate", None), getattr(mlp, "experts", None)
    if type(gate).__name__ not in ROUTERS or not hasattr(experts, "gate_up_proj") or set(dict(mlp.named_children())) \
            != {"gate", "experts"}:
        return None
    if getattr(experts, "is_transposed", False) or not getattr(experts, "is_concatenated", True) \
            or getattr(experts, "gate_up_proj_bias", None) is not None or hasattr(experts, "limit") \
            or getattr(experts.config, "hidden_act", "silu") != "silu":
        return None
    renorm, scores_dtype = _router_rule(gate)
    clip = getattr(a.config, "clip_qkv", None)
    weights = layer_kernel.LayerWeights(
        in_norm=layer.input_layernorm.weight, q=a.q_proj.weight, k=a.k_proj.weight, v=a.v_proj.weight,
        o=a.o_proj.weight, q_bias=a.q_proj.bias, k_bias=a.k_proj.bias, v_bias=a.v_proj.bias, o_bias=a.o_proj.bias,
        q_norm=a.q_norm.weight if qk_norm else None, k_norm=a.k_norm.weight if qk_norm else None,
        post_norm=layer.post_attention_layernorm.weight, router=gate.weight, gate_up=experts.gate_up_proj,
        down=experts.down_proj, heads=a.config.num_attention_heads, kv_heads=a.config.num_key_value_heads,
        head_dim=a.head_dim, top_k=gate.top_k, eps=layer.input_layernorm.variance_epsilon, scale=a.scaling,
        clip=None if clip is None else float(clip), qk_norm=qk_norm,
        renorm=renorm, scores_fp32=scores_dtype is not None)
    norms = [layer.post_attention_layernorm] + ([a.q_norm, a.k_norm] if qk_norm else [])
    if any(m.variance_epsilon != weights.eps for m in norms):
        return None  # one eps for the layer's norms
    try:
        weights.check()
    except ValueError:
        return None
    return weights


def _rms(module: Any, x: torch.Tensor) -> torch.Tensor:
    return token_ops.rms_norm_unchecked(x, module.weight, module.variance_epsilon)


def takes_call(model: Any, kwargs: dict[str, Any]) -> Any:
    """The cache when this forward call is a verification pass `Lean.verify` computes, else None."""
    if not set(kwargs) <= _CALL_KEYS or kwargs.get("use_cache") is False:
        return None
    ids, cache = kwargs.get("input_ids"), kwargs.get("cache", kwargs.get("past_key_values"))
    if not (isinstance(ids, torch.Tensor) and ids.dim() == 2 and ids.shape[0] == 1 and 1 <= ids.shape[1] <= MAX_TOKENS
            and ids.device.type == "cpu"):
        return None
    keep = kwargs.get("logits_to_keep", 0)
    if not isinstance(keep, int) or keep < 0:
        return None
    layers = getattr(cache, "layers", None)
    if not layers or len(layers) != len(model.model.layers) or not all(type(x) is InPlaceLayer for x in layers):
        return None
    head = model.lm_head.weight  # a model moved to another device or dtype since the install: transformers' forward
    if head.device.type != "cpu" or head.dtype not in (torch.float32, torch.bfloat16):
        return None
    return cache


def install(model: Any) -> Lean | None:
    """Give `model` (when `unsupported(model)` is None) an instance forward that runs `Lean.verify` for the calls
    it takes and transformers' forward for every other, and its ROUTERS an instance forward that routes
    natively; returns what was installed (its `remove()` undoes it), or None for a model it does not support."""
    return Lean(model) if unsupported(model) is None else None

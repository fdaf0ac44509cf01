"""Model shapes and the bytes a forward pass reads: w_l, W, D and kv(k) of the formula sheet.

Physics first. A decode or verification pass is memory-bound: its time is the bytes it moves over the
bandwidth. Those bytes split three ways.

- Experts (w_l, W). An MoE layer holds N experts; each token selects m of them. One expert is a gated FFN
  (gate and up: hidden -> f, down: f -> hidden), so w_l = 3 * hidden * f weights in the stored format, plus
  its biases where the model has them (gpt-oss). W = sum over the L MoE layers of w_l is what one token's
  choice of "one expert per layer" costs; a pass requests m n W bytes per slot, fewer when deduplicated.
- Fixed bytes (D): read once per pass whatever the routing. We count, per decoder layer: the attention
  projections (q, k, v, o, or the MLA down/up projections), their biases, q/k norms and attention sinks;
  the two RMSNorm vectors; then either the dense FFN (dense layers) or the router plus the shared experts
  (MoE layers). Once per model: the final norm and the output head (vocab x hidden, read in full even when
  tied to the embedding). The embedding table is NOT read in full: a pass of `tokens` tokens gathers one
  row per token, so D counts `tokens` rows (default 1; the extra rows of an n-token pass are < 0.01% of D).
- KV cache (kv(k)): a step verifying k+1 tokens at context depth d reads the cached keys and values of the
  d earlier tokens plus those of its own k+1 tokens, in every layer. Standard attention caches K and V
  (2 x kv_heads x head_dim per token and layer); MLA (DeepSeek-V2) caches the compressed latent
  (kv_lora_rank) plus the shared rope key (qk_rope_head_dim), as llama.cpp, vLLM, SGLang and transformers
  v5 do; the per-head keys and values are expanded from it after the read. A sliding-window layer
  (gpt-oss, alternate layers) reads at most window + k positions: the union of the k+1 queries' windows.

Formats: the bytes of a matrix or a vector in each weight format are moespec.model.weights'.

The gpt-oss release stores its experts in mxfp4 and everything else in bf16: use expert_bytes(l, "mxfp4")
with dense_bytes("bf16"). Layer arguments index the L MoE layers (0..L-1, the trace's layer axis).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from moespec import MoespecError
from moespec.model.weights import FORMATS, matrix_bytes, matrix_format, router_weight_bytes, vector_bytes

SUPPORTED_MODEL_TYPES = ("olmoe", "qwen3_moe", "gpt_oss", "deepseek_v2", "mixtral")


@dataclass(frozen=True)
class ModelSpec:
    """Shapes of an MoE decoder that fix its byte accounting. Symbols: N = num_experts, m = top_k,
    f = expert_width, L = number of MoE layers (all layers but `dense_layers`)."""

    name: str
    model_type: str  # Hugging Face config model_type
    hidden: int
    layers: int  # decoder layers, dense and MoE
    num_experts: int  # N routed experts per MoE layer
    top_k: int  # m experts selected per token
    expert_width: int  # f
    vocab: int
    heads: int
    kv_heads: int
    head_dim: int  # per-head q/k/v width; for MLA the q/k width qk_nope_head_dim + qk_rope_head_dim
    dense_layers: tuple[int, ...] = ()  # layers with a dense FFN instead of experts (DeepSeek's first layer)
    dense_width: int = 0  # FFN width of the dense layers
    shared_experts: int = 0  # always-on experts per MoE layer (DeepSeek), counted in D
    shared_width: int = 0  # width of one shared expert
    gated: bool = True  # gate+up+down (SwiGLU); False: up+down only
    expert_bias: bool = False  # biases on the expert projections (gpt-oss)
    router_bias: bool = False
    attention_bias: bool = False  # biases on q, k, v, o
    qk_norm: str = "none"  # "none", "head" (norm over head_dim, Qwen3) or "proj" (over the projection, OLMoE)
    attention_sinks: bool = False  # one learned logit per head (gpt-oss)
    q_lora_rank: int | None = None  # MLA query compression; None: a plain q projection (DeepSeek-V2-Lite)
    kv_lora_rank: int | None = None  # MLA latent width; None: standard attention
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    sliding_window: int | None = None
    sliding_layers: tuple[int, ...] = ()  # layers that attend within sliding_window
    tied_embeddings: bool = False
    notes: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        positive = ("hidden", "layers", "num_experts", "top_k", "expert_width", "vocab", "heads", "kv_heads",
                    "head_dim")
        for key in positive:
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise MoespecError(f"model spec {self.name!r}: {key} = {value!r} must be a positive integer")
        if not 1 <= self.top_k < self.num_experts:
            raise MoespecError(f"model spec {self.name!r}: need 1 <= top_k < num_experts, "
                               f"got top_k={self.top_k}, num_experts={self.num_experts}")
        for key in ("dense_layers", "sliding_layers"):
            bad = [i for i in getattr(self, key) if not 0 <= i < self.layers]
            if bad:
                raise MoespecError(f"model spec {self.name!r}: {key} {bad} outside 0..{self.layers - 1}")
        if len(self.dense_layers) >= self.layers:
            raise MoespecError(f"model spec {self.name!r}: no MoE layer left")
        if self.dense_layers and self.dense_width < 1:
            raise MoespecError(f"model spec {self.name!r}: dense layers need dense_width >= 1")
        if self.qk_norm not in ("none", "head", "proj"):
            raise MoespecError(f"model spec {self.name!r}: qk_norm {self.qk_norm!r} not in none/head/proj")
        if self.kv_lora_rank is not None and min(self.qk_rope_head_dim, self.qk_nope_head_dim, self.v_head_dim) < 1:
            raise MoespecError(f"model spec {self.name!r}: MLA needs positive qk_rope/qk_nope/v head dims")
        if self.sliding_layers and not self.sliding_window:
            raise MoespecError(f"model spec {self.name!r}: sliding_layers given without sliding_window")

    # -- symbols of the formula sheet --------------------------------------------------------------
    @property
    def N(self) -> int:  # noqa: N802 - the paper's symbol
        return self.num_experts

    @property
    def m(self) -> int:
        return self.top_k

    @property
    def moe_layers(self) -> tuple[int, ...]:
        """Decoder-layer index of each MoE layer, in order (trace layer l is decoder layer moe_layers[l])."""
        return tuple(i for i in range(self.layers) if i not in self.dense_layers)

    @property
    def L(self) -> int:  # noqa: N802
        return len(self.moe_layers)

    @property
    def mla(self) -> bool:
        return self.kv_lora_rank is not None

    # -- construction ------------------------------------------------------------------------------
    @classmethod
    def from_name(cls, name: str) -> ModelSpec:
        """A built-in preset by name (see PRESETS)."""
        key = name.lower()
        if key not in PRESETS:
            raise MoespecError(f"unknown model {name!r}; presets: {', '.join(PRESETS)}")
        return PRESETS[key]

    @classmethod
    def from_config(cls, path: str | Path) -> ModelSpec:
        """Build a spec from a local Hugging Face config.json (or the checkpoint folder holding it).

        The spec is named after the preset it equals, else after the checkpoint folder."""
        path = Path(path)
        file = path / "config.json" if path.is_dir() else path
        if not file.is_file():
            raise MoespecError(f"{file}: no such file (expected a Hugging Face config.json)")
        try:
            cfg = json.loads(file.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise MoespecError(f"{file}: not readable JSON ({e})") from None
        if not isinstance(cfg, dict):
            raise MoespecError(f"{file}: expected a JSON object")
        spec = cls.from_config_dict(cfg, file.parent.name or None, source=str(file))
        for preset in PRESETS.values():
            if replace(spec, name=preset.name) == preset:
                return replace(spec, name=preset.name, notes=preset.notes)
        return spec

    @classmethod
    def from_config_dict(cls, cfg: dict[str, Any], name: str | None = None, source: str = "config") -> ModelSpec:
        """Build a spec from the keys of a config.json (or a transformers config's `to_dict()`), named `name`
        (default: the model_type); `source` names the config in error messages."""
        model_type = cfg.get("model_type")
        if model_type not in _CONFIG_READERS:
            raise MoespecError(f"{source}: model_type {model_type!r} is not a supported MoE model "
                               f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})")
        return _CONFIG_READERS[model_type](_Config(cfg, source), name or model_type)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields (tuples become lists)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelSpec:
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise MoespecError(f"model spec: unknown fields {unknown}")
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})

    # -- bytes -------------------------------------------------------------------------------------
    def expert_bytes(self, layer: int, fmt: str) -> int:
        """w_l: bytes of one routed expert of MoE layer `layer` (0..L-1) in format `fmt`, biases included."""
        if not 0 <= layer < self.L:
            raise MoespecError(f"model {self.name}: MoE layer {layer} outside 0..{self.L - 1}")
        return self._ffn_bytes(self.expert_width, self.moe_layers[layer], fmt, bias=self.expert_bias)

    def W(self, fmt: str) -> int:  # noqa: N802 - the paper's symbol
        """W = sum over MoE layers of w_l."""
        return sum(self.expert_bytes(layer, fmt) for layer in range(self.L))

    def dense_bytes(self, fmt: str, tokens: int = 1) -> int:
        """D: bytes a pass of `tokens` tokens reads whatever the routing (see the module docstring)."""
        if tokens < 1:
            raise MoespecError(f"model {self.name}: tokens must be >= 1, got {tokens}")
        vec = vector_bytes(fmt)
        total = 0
        for i in range(self.layers):
            total += self._attention_bytes(i, fmt) + 2 * self.hidden * vec  # + input/post-attention norms
            if i in self.dense_layers:
                total += self._ffn_bytes(self.dense_width, i, fmt, bias=False)
            else:
                total += self.num_experts * self.hidden * router_weight_bytes(fmt)
                total += self.num_experts * vec if self.router_bias else 0
                if self.shared_experts:  # stored fused, as one FFN of the summed width (HF and GGUF)
                    total += self._ffn_bytes(self.shared_experts * self.shared_width, i, fmt, bias=False)
        head_fmt = matrix_format(fmt, "output", 0, self.layers)
        embed_fmt = head_fmt if self.tied_embeddings else matrix_format(fmt, "embed", 0, self.layers)
        total += self.hidden * vec  # final norm
        total += matrix_bytes(self.vocab, self.hidden, head_fmt)
        total += matrix_bytes(tokens, self.hidden, embed_fmt)  # one embedding row per token
        return total

    def kv_bytes(self, k: int, depth: int, dtype: str = "bf16") -> int:
        """kv(k): cache bytes read by a step verifying k+1 tokens after `depth` cached tokens."""
        if k < 0 or depth < 0:
            raise MoespecError(f"model {self.name}: need k >= 0 and depth >= 0, got k={k}, depth={depth}")
        if dtype not in FORMATS:
            raise MoespecError(f"unknown KV-cache dtype {dtype!r}; one of {', '.join(FORMATS)}")
        if self.mla:  # latent row + shared rope-key row per token
            per_token = matrix_bytes(1, self.kv_lora_rank, dtype) + matrix_bytes(1, self.qk_rope_head_dim, dtype)
        else:  # K and V, one head_dim row per kv head
            per_token = 2 * matrix_bytes(self.kv_heads, self.head_dim, dtype)
        context = depth + k + 1
        total = 0
        for i in range(self.layers):
            positions = min(context, self.sliding_window + k) if i in self.sliding_layers else context
            total += positions * per_token
        return total

    def byte_model(self, fmt: str, depth: int, kmax: int, kv_dtype: str = "bf16") -> tuple[int, int, list[int]]:
        """(mW, D, kv) of the one-bandwidth byte model (16) at context depth d: mW bytes of one token's experts,
        D the fixed bytes of a one-token pass, kv[k] what a step verifying k+1 tokens reads beyond D: its cache
        bytes plus the growth of D with k (one embedding row per extra token), so D + kv[k] = D(k+1) + kv(k)."""
        D = [self.dense_bytes(fmt, tokens=k + 1) for k in range(kmax + 1)]
        kv = [self.kv_bytes(k, depth, kv_dtype) + D[k] - D[0] for k in range(kmax + 1)]
        return self.m * self.W(fmt), D[0], kv

    # -- pieces ------------------------------------------------------------------------------------
    def _ffn_bytes(self, width: int, layer: int, fmt: str, bias: bool) -> int:
        up_fmt = matrix_format(fmt, "ffn_up", layer, self.layers)
        down_fmt = matrix_format(fmt, "ffn_down", layer, self.layers)
        inputs = 2 if self.gated else 1  # gate and up, or up alone
        total = inputs * matrix_bytes(width, self.hidden, up_fmt) + matrix_bytes(self.hidden, width, down_fmt)
        if bias:
            total += (inputs * width + self.hidden) * vector_bytes(fmt)
        return total

    def _attention_bytes(self, layer: int, fmt: str) -> int:
        other = matrix_format(fmt, "attn", layer, self.layers)
        vec = vector_bytes(fmt)
        h = self.hidden
        if self.mla:
            q_out = self.heads * (self.qk_nope_head_dim + self.qk_rope_head_dim)
            if self.q_lora_rank is None:
                q = matrix_bytes(q_out, h, other)
            else:
                q = (matrix_bytes(self.q_lora_rank, h, other) + self.q_lora_rank * vec
                     + matrix_bytes(q_out, self.q_lora_rank, other))
            kv_a = matrix_bytes(self.kv_lora_rank + self.qk_rope_head_dim, h, other) + self.kv_lora_rank * vec
            kv_b = matrix_bytes(self.heads * (self.qk_nope_head_dim + self.v_head_dim), self.kv_lora_rank, other)
            o = matrix_bytes(h, self.heads * self.v_head_dim, other)
            return q + kv_a + kv_b + o
        q_width, kv_width = self.heads * self.head_dim, self.kv_heads * self.head_dim
        v_fmt = matrix_format(fmt, "attn_v", layer, self.layers)
        total = (matrix_bytes(q_width, h, other) + matrix_bytes(kv_width, h, other)
                 + matrix_bytes(kv_width, h, v_fmt) + matrix_bytes(h, q_width, other))
        if self.attention_bias:
            total += (q_width + 2 * kv_width + h) * vec
        if self.qk_norm == "head":
            total += 2 * self.head_dim * vec
        elif self.qk_norm == "proj":
            total += (q_width + kv_width) * vec
        if self.attention_sinks:
            total += self.heads * vec
        return total


# -- presets (public Hugging Face configs) ------------------------------------------------------------
PRESETS: dict[str, ModelSpec] = {
    s.name: s
    for s in (
        ModelSpec("olmoe-1b-7b", "olmoe", hidden=2048, layers=16, num_experts=64, top_k=8, expert_width=1024,
                  vocab=50304, heads=16, kv_heads=16, head_dim=128, qk_norm="proj",
                  notes="allenai/OLMoE-1B-7B-0924"),
        ModelSpec("qwen3-30b-a3b", "qwen3_moe", hidden=2048, layers=48, num_experts=128, top_k=8,
                  expert_width=768, vocab=151936, heads=32, kv_heads=4, head_dim=128, qk_norm="head",
                  notes="Qwen/Qwen3-30B-A3B"),
        ModelSpec("gpt-oss-20b", "gpt_oss", hidden=2880, layers=24, num_experts=32, top_k=4, expert_width=2880,
                  vocab=201088, heads=64, kv_heads=8, head_dim=64, expert_bias=True, router_bias=True,
                  attention_bias=True, attention_sinks=True, sliding_window=128,
                  sliding_layers=tuple(range(0, 24, 2)),
                  notes="openai/gpt-oss-20b; released with mxfp4 experts and bf16 elsewhere"),
        ModelSpec("deepseek-v2-lite", "deepseek_v2", hidden=2048, layers=27, num_experts=64, top_k=6,
                  expert_width=1408, vocab=102400, heads=16, kv_heads=16, head_dim=192, dense_layers=(0,),
                  dense_width=10944, shared_experts=2, shared_width=1408, q_lora_rank=None, kv_lora_rank=512,
                  qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128,
                  notes="deepseek-ai/DeepSeek-V2-Lite; MLA, greedy top-k"),
        ModelSpec("mixtral-8x7b", "mixtral", hidden=4096, layers=32, num_experts=8, top_k=2, expert_width=14336,
                  vocab=32000, heads=32, kv_heads=8, head_dim=128, notes="mistralai/Mixtral-8x7B-v0.1"),
    )
}


_EXPERT_COUNT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")


class _Config:
    """Read keys of one config.json, naming the file and key in every error."""

    _REQUIRED = object()

    def __init__(self, cfg: dict[str, Any], file: Path | str) -> None:
        self.cfg, self.file = cfg, file

    def __call__(self, key: str, default: Any = _REQUIRED, least: int | None = None) -> Any:
        """cfg[key] (`default` where absent or null); with `least`, an integer >= least (a size or count)."""
        value = self.cfg.get(key)
        if value is None:
            if default is self._REQUIRED:
                raise MoespecError(f"{self.file}: missing key {key!r} for model_type {self.cfg['model_type']!r}")
            value = default
        if least is not None and value is not None and \
                (isinstance(value, bool) or not isinstance(value, int) or value < least):
            raise MoespecError(f"{self.file}: {key} = {value!r} must be an integer >= {least}")
        return value

    def items(self, key: str, default: list, kind: type) -> list:
        """cfg[key] as a list whose every item is a `kind` (layer indices, layer types), naming the key if not."""
        value = self(key, default)
        if not isinstance(value, list) or not all(isinstance(v, kind) and not isinstance(v, bool) for v in value):
            raise MoespecError(f"{self.file}: {key} = {value!r} must be a list of {kind.__name__}")
        return value

    def num_experts(self) -> int:
        """Routed experts per layer, under whichever name the writer used: transformers v5 maps the names
        onto each other (attribute_map) and saves its own, e.g. Qwen3 as num_local_experts."""
        for key in _EXPERT_COUNT_KEYS:
            if self.cfg.get(key) is not None:
                return self(key, least=1)
        return self(_EXPERT_COUNT_KEYS[0], least=1)

    def attention(self) -> dict[str, Any]:
        """heads, kv heads, head dim, vocab, tying: keys every supported config shares."""
        heads = self("num_attention_heads", least=1)
        hidden = self("hidden_size", least=1)
        return dict(hidden=hidden, layers=self("num_hidden_layers", least=1), vocab=self("vocab_size", least=1),
                    heads=heads, kv_heads=self("num_key_value_heads", heads, least=1),
                    head_dim=self("head_dim", hidden // heads, least=1),
                    tied_embeddings=bool(self("tie_word_embeddings", False)),
                    attention_bias=bool(self("attention_bias", False)))


def _build(c: _Config, name: str, **kw: Any) -> ModelSpec:
    try:
        return ModelSpec(name, c.cfg["model_type"], **kw)
    except (MoespecError, TypeError) as e:
        raise MoespecError(f"{c.file}: {e}") from None


def _read_olmoe(c: _Config, name: str) -> ModelSpec:
    return _build(c, name, **c.attention(), num_experts=c.num_experts(), top_k=c("num_experts_per_tok", least=1),
                  expert_width=c("intermediate_size", least=1), qk_norm="proj")


def _read_qwen3_moe(c: _Config, name: str) -> ModelSpec:
    layers, step = c("num_hidden_layers", least=1), c("decoder_sparse_step", 1, least=1)
    only_mlp = set(c.items("mlp_only_layers", [], int))  # as Qwen3MoeDecoderLayer decides
    dense = tuple(i for i in range(layers) if i in only_mlp or (i + 1) % step)
    return _build(c, name, **c.attention(), num_experts=c.num_experts(), top_k=c("num_experts_per_tok", least=1),
                  expert_width=c("moe_intermediate_size", least=1), dense_layers=dense,
                  dense_width=c("intermediate_size", least=1) if dense else 0, qk_norm="head")


def _read_gpt_oss(c: _Config, name: str) -> ModelSpec:
    layers = c("num_hidden_layers", least=1)
    # GptOssConfig default: sliding on even layers (0, 2, ...), full attention on odd ones
    types = c.items("layer_types", ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(layers)],
                    str)
    window = c("sliding_window", None, least=1)
    sliding = tuple(i for i, t in enumerate(types) if t == "sliding_attention") if window else ()
    attention = c.attention() | {"attention_bias": bool(c("attention_bias", True))}
    return _build(c, name, **attention, num_experts=c.num_experts(), top_k=c("num_experts_per_tok", least=1),
                  expert_width=c("intermediate_size", least=1), expert_bias=True, router_bias=True,
                  attention_sinks=True,
                  sliding_window=window if sliding else None, sliding_layers=sliding)


def _read_deepseek_v2(c: _Config, name: str) -> ModelSpec:
    # DeepseekV2DecoderLayer in transformers: MoE from layer first_k_dense_replace on (moe_layer_freq unused)
    first_dense = c("first_k_dense_replace", 0, least=0)
    nope, rope = c("qk_nope_head_dim", least=1), c("qk_rope_head_dim", least=1)
    attention = c.attention() | {"head_dim": nope + rope}
    return _build(c, name, **attention, num_experts=c.num_experts(), top_k=c("num_experts_per_tok", least=1),
                  expert_width=c("moe_intermediate_size", least=1), dense_layers=tuple(range(first_dense)),
                  dense_width=c("intermediate_size", least=1) if first_dense else 0,
                  shared_experts=c("n_shared_experts", 0, least=0), shared_width=c("moe_intermediate_size", least=1),
                  q_lora_rank=c("q_lora_rank", None, least=1), kv_lora_rank=c("kv_lora_rank", least=1),
                  qk_rope_head_dim=rope,
                  qk_nope_head_dim=nope, v_head_dim=c("v_head_dim", least=1))


def _read_mixtral(c: _Config, name: str) -> ModelSpec:
    layers, window = c("num_hidden_layers", least=1), c("sliding_window", None, least=1)
    return _build(c, name, **c.attention(), num_experts=c.num_experts(), top_k=c("num_experts_per_tok", least=1),
                  expert_width=c("intermediate_size", least=1), sliding_window=window,
                  sliding_layers=tuple(range(layers)) if window else ())


_CONFIG_READERS = {"olmoe": _read_olmoe, "qwen3_moe": _read_qwen3_moe, "gpt_oss": _read_gpt_oss,
                   "deepseek_v2": _read_deepseek_v2, "mixtral": _read_mixtral}


def resolve(model: str) -> ModelSpec:
    """A preset name, or else a path to a checkpoint folder or config.json."""
    if model.lower() in PRESETS:
        return ModelSpec.from_name(model)
    if Path(model).exists():
        return ModelSpec.from_config(model)
    raise MoespecError(f"{model!r} is neither a preset ({', '.join(PRESETS)}) nor an existing path")


def summary(spec: ModelSpec, fmt: str, kv_dtype: str, depth: int, kmax: int) -> dict[str, Any]:
    """w_l per MoE layer, W, D and kv(0..kmax) in bytes, with the spec itself."""
    return {
        "spec": spec.to_dict(), "format": fmt, "kv_dtype": kv_dtype, "depth": depth,
        "expert_bytes": [spec.expert_bytes(layer, fmt) for layer in range(spec.L)],
        "W": spec.W(fmt), "D": spec.dense_bytes(fmt),
        "kv": [spec.kv_bytes(k, depth, kv_dtype) for k in range(kmax + 1)],
    }

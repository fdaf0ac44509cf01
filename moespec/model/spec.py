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

from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from moespec import ArgumentError, MoespecError
from moespec.defaults import LAYERS_LIMIT
from moespec.formats.files import read_json
from moespec.formats.trace import MAX_EXPERTS
from moespec.model.weights import (
    FORMATS,
    expert_rows,
    matrix_bytes,
    matrix_format,
    router_weight_bytes,
    vector_bytes,
)

SUPPORTED_MODEL_TYPES = ("olmoe", "qwen3_moe", "gpt_oss", "deepseek_v2", "mixtral")

# Bounds on a model's sizes wherever they come from (a preset, config.json, a GGUF file, the spec in a bench or trace):
# far past every public MoE, they keep a corrupt or hostile file from running for hours or exhausting memory.
WIDTH_LIMIT = 1 << 17  # hidden size, FFN widths, heads, head and latent dims: 2.5x the widest (Llama 3.1 405B's FFN)
VOCAB_LIMIT = 1 << 22  # 16x the largest public vocabulary (Gemma 3's 262,144)
SLIDING_WINDOW_LIMIT = 2**32 - 1  # llama.cpp stores the window as a uint32
# ModelSpec field -> (least, most). Layers: LAYERS_LIMIT, as the flags; experts: MAX_EXPERTS, what a trace can hold.
SIZES: dict[str, tuple[int, int]] = {
    "hidden": (1, WIDTH_LIMIT), "layers": (1, LAYERS_LIMIT), "num_experts": (2, MAX_EXPERTS),
    "top_k": (1, MAX_EXPERTS), "expert_width": (1, WIDTH_LIMIT), "vocab": (1, VOCAB_LIMIT), "heads": (1, WIDTH_LIMIT),
    "kv_heads": (1, WIDTH_LIMIT), "head_dim": (1, WIDTH_LIMIT), "dense_width": (0, WIDTH_LIMIT),
    "shared_experts": (0, MAX_EXPERTS), "shared_width": (0, WIDTH_LIMIT), "q_lora_rank": (1, WIDTH_LIMIT),
    "kv_lora_rank": (1, WIDTH_LIMIT), "qk_rope_head_dim": (0, WIDTH_LIMIT), "qk_nope_head_dim": (0, WIDTH_LIMIT),
    "v_head_dim": (0, WIDTH_LIMIT), "sliding_window": (1, SLIDING_WINDOW_LIMIT),
}
_OPTIONAL_SIZES = ("q_lora_rank", "kv_lora_rank", "sliding_window")  # None: the feature is absent
_FLAGS = ("gated", "expert_bias", "router_bias", "attention_bias", "attention_sinks", "tied_embeddings")
_QK_NORMS = ("none", "head", "proj")


def shown(value: Any, limit: int = 60) -> str:
    """repr of a value read from a file, cut to `limit` characters (repr escapes control characters)."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def check_size(value: Any, where: str, size: str, least: int | None = None) -> int:
    """`value` as a size of the kind of ModelSpec field `size` (SIZES; `least` overrides its lower bound): an int,
    not a bool, in range; else one line `where = value must be ...` (`where` names the file and key)."""
    low, most = SIZES[size]
    low = low if least is None else least
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= most:
        raise MoespecError(f"{where} = {shown(value)} must be an integer in {low}..{most:,}")
    return value


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
        where = f"model spec {shown(self.name)}"
        if not isinstance(self.name, str) or not isinstance(self.notes, str):
            raise MoespecError(f"{where}: name and notes must be strings")
        if self.model_type not in SUPPORTED_MODEL_TYPES:
            raise MoespecError(f"{where}: model_type {shown(self.model_type)} not in "
                               f"{', '.join(SUPPORTED_MODEL_TYPES)}")
        for key in SIZES:
            if getattr(self, key) is not None or key not in _OPTIONAL_SIZES:
                check_size(getattr(self, key), f"{where}: {key}", key)
        for key in _FLAGS:
            if not isinstance(getattr(self, key), bool):
                raise MoespecError(f"{where}: {key} = {shown(getattr(self, key))} must be true or false")
        if self.qk_norm not in _QK_NORMS:
            raise MoespecError(f"{where}: qk_norm {shown(self.qk_norm)} not in {'/'.join(_QK_NORMS)}")
        for key in ("dense_layers", "sliding_layers"):
            layers = getattr(self, key)
            if not isinstance(layers, tuple) or not all(type(i) is int for i in layers) \
                    or any(a >= b for a, b in zip(layers, layers[1:])):
                raise MoespecError(f"{where}: {key} = {shown(layers)} must be a tuple of increasing layer indices")
            if layers and (layers[0] < 0 or layers[-1] >= self.layers):
                raise MoespecError(f"{where}: {key} {shown(layers)} outside 0..{self.layers - 1}")
        if not 1 <= self.top_k < self.num_experts:
            raise MoespecError(f"{where}: need 1 <= top_k < num_experts, "
                               f"got top_k={self.top_k}, num_experts={self.num_experts}")
        if self.heads % self.kv_heads:  # each kv head serves a whole group of query heads
            raise MoespecError(f"{where}: heads = {self.heads} must be a multiple of kv_heads = {self.kv_heads}")
        if len(self.dense_layers) >= self.layers:
            raise MoespecError(f"{where}: no MoE layer left")
        if self.dense_layers and self.dense_width < 1:
            raise MoespecError(f"{where}: dense layers need dense_width >= 1")
        if self.shared_experts and self.shared_width < 1:
            raise MoespecError(f"{where}: shared experts need shared_width >= 1")
        if self.kv_lora_rank is not None:
            if min(self.qk_rope_head_dim, self.qk_nope_head_dim, self.v_head_dim) < 1:
                raise MoespecError(f"{where}: MLA needs positive qk_rope/qk_nope/v head dims")
            if self.head_dim != self.qk_nope_head_dim + self.qk_rope_head_dim:
                raise MoespecError(f"{where}: MLA needs head_dim = qk_nope_head_dim + qk_rope_head_dim, got "
                                   f"{self.head_dim} != {self.qk_nope_head_dim} + {self.qk_rope_head_dim}")
        if self.sliding_layers and not self.sliding_window:
            raise MoespecError(f"{where}: sliding_layers given without sliding_window")

    # -- symbols of the formula sheet --------------------------------------------------------------
    @property
    def N(self) -> int:  # noqa: N802 - the paper's symbol
        return self.num_experts

    @property
    def m(self) -> int:
        return self.top_k

    @cached_property
    def moe_layers(self) -> tuple[int, ...]:
        """Decoder-layer index of each MoE layer, in order (trace layer l is decoder layer moe_layers[l])."""
        dense = set(self.dense_layers)
        return tuple(i for i in range(self.layers) if i not in dense)

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
        if not file.exists():
            raise MoespecError(f"{file}: no such file (expected a Hugging Face config.json)")
        cfg = read_json(file, "Hugging Face config.json")
        spec = cls.from_config_dict(cfg, file.parent.name or None, source=str(file))
        for preset in PRESETS.values():
            if replace(spec, name=preset.name) == preset:
                return replace(spec, name=preset.name, notes=preset.notes)
        return spec

    @classmethod
    def from_config_dict(cls, cfg: dict[str, Any], name: str | None = None, source: str = "config") -> ModelSpec:
        """Build a spec from the keys of a config.json (or a transformers config's `to_dict()`), named `name`
        (default: the model_type); `source` names the config in error messages."""
        from moespec.model.hf_config import read_config  # its readers build ModelSpecs: imported when called

        return read_config(cfg, name, source)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields (tuples become lists)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelSpec:
        """The spec of to_dict's fields (as a bench or trace stores it); one line for anything else."""
        if not isinstance(data, dict):
            raise MoespecError(f"model spec: expected an object of fields, got {shown(data)}")
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - names)
        missing = [f.name for f in fields(cls) if f.name not in data and f.default is MISSING]
        if unknown or missing:
            raise MoespecError(f"model spec: {'unknown' if unknown else 'missing'} fields {shown(unknown or missing)}")
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})

    # -- bytes -------------------------------------------------------------------------------------
    def expert_bytes(self, layer: int, fmt: str) -> int:
        """w_l: bytes of one routed expert of MoE layer `layer` (0..L-1) in format `fmt`, biases included."""
        if not 0 <= layer < self.L:
            raise MoespecError(f"model {self.name}: MoE layer {layer} outside 0..{self.L - 1}")
        return self._ffn_bytes(self.expert_width, self.moe_layers[layer], fmt, bias=self.expert_bias)

    @property
    def expert_rows(self) -> int:
        """Weight rows of one routed expert (moespec.model.weights.expert_rows)."""
        return expert_rows(self.hidden, self.expert_width, self.gated)

    def W(self, fmt: str) -> int:  # noqa: N802 - the paper's symbol
        """W = sum over MoE layers of w_l."""
        return sum(self.expert_bytes(layer, fmt) for layer in range(self.L))

    def dense_bytes(self, fmt: str, tokens: int = 1) -> int:
        """D: bytes a pass of `tokens` tokens reads whatever the routing (see the module docstring)."""
        if tokens < 1:
            raise MoespecError(f"model {self.name}: tokens must be >= 1, got {tokens}")
        vec = vector_bytes(fmt)
        dense = set(self.dense_layers)
        total = 0
        for i in range(self.layers):
            total += self._attention_bytes(i, fmt) + 2 * self.hidden * vec  # + input/post-attention norms
            if i in dense:
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
        sliding = len(self.sliding_layers)  # each reads at most its window + k positions, the others all of them
        windowed = sliding * min(context, self.sliding_window + k) if sliding else 0
        return ((self.layers - sliding) * context + windowed) * per_token

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


def resolve(model: str) -> ModelSpec:
    """A preset name, or else a path to a checkpoint folder or config.json."""
    if model.lower() in PRESETS:
        return ModelSpec.from_name(model)
    if Path(model).exists():
        return ModelSpec.from_config(model)
    raise ArgumentError(f"{model!r} is neither a preset ({', '.join(PRESETS)}) nor an existing path")


def summary(spec: ModelSpec, fmt: str, kv_dtype: str, depth: int, kmax: int) -> dict[str, Any]:
    """w_l per MoE layer, W, D and kv(0..kmax) in bytes, with the spec itself."""
    return {
        "spec": spec.to_dict(), "format": fmt, "kv_dtype": kv_dtype, "depth": depth,
        "expert_bytes": [spec.expert_bytes(layer, fmt) for layer in range(spec.L)],
        "W": spec.W(fmt), "D": spec.dense_bytes(fmt),
        "kv": [spec.kv_bytes(k, depth, kv_dtype) for k in range(kmax + 1)],
    }

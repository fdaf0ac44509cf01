"""A Hugging Face config.json read into a ModelSpec (moespec.model.spec): one reader per supported model_type, as
transformers builds that class's layers from the keys.

Every key read is checked where it is read, naming the file and the key in one line: sizes are integers (not
booleans, not floats) in the range of the ModelSpec field they become (spec.SIZES), flags JSON booleans, layer lists
integers inside the model's layers; names that transformers maps onto each other (the expert count) must agree.
The relations between fields (top_k < N, heads a multiple of kv heads, ...) are ModelSpec's own checks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from moespec import MoespecError
from moespec.model.spec import SUPPORTED_MODEL_TYPES, ModelSpec, check_size, shown

_EXPERT_COUNT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")
_LAYER_TYPES = ("sliding_attention", "full_attention")  # gpt-oss's attention per layer


class _Config:
    """Read keys of one config.json, naming the file and key in every error: sizes are integers in their SIZES range,
    flags JSON booleans, lists of the right items."""

    _REQUIRED = object()

    def __init__(self, cfg: dict[str, Any], file: Path | str) -> None:
        self.cfg, self.file = cfg, file

    def __call__(self, key: str, default: Any = _REQUIRED) -> Any:
        """cfg[key], `default` where absent or null."""
        value = self.cfg.get(key)
        if value is None:
            if default is self._REQUIRED:
                raise MoespecError(f"{self.file}: missing key {key!r} for model_type {self.cfg['model_type']!r}")
            return default
        return value

    def size(self, key: str, size: str, default: Any = _REQUIRED, least: int | None = None) -> Any:
        """cfg[key] as a size of the kind of ModelSpec field `size` (check_size); `default` where absent or null."""
        value = self(key, default)
        return None if value is None else check_size(value, f"{self.file}: {key}", size, least)

    def flag(self, key: str, default: bool) -> bool:
        value = self(key, default)
        if not isinstance(value, bool):
            raise MoespecError(f"{self.file}: {key} = {shown(value)} must be true or false")
        return value

    def items(self, key: str, default: list, kind: type) -> list:
        """cfg[key] as a list whose every item is a `kind` (layer indices, layer types), naming the key if not."""
        value = self(key, default)
        if not isinstance(value, list) or not all(isinstance(v, kind) and not isinstance(v, bool) for v in value):
            raise MoespecError(f"{self.file}: {key} = {shown(value)} must be a list of {kind.__name__}")
        return value

    def layers(self, key: str, layers: int) -> set[int]:
        """cfg[key] as a set of decoder-layer indices (a list of ints in 0..layers-1; absent: none)."""
        given = self.items(key, [], int)
        bad = [i for i in given if not 0 <= i < layers]
        if bad:
            raise MoespecError(f"{self.file}: {key} holds {shown(bad)} outside the layers 0..{layers - 1}")
        return set(given)

    def num_experts(self) -> int:
        """Routed experts per layer, under whichever name the writer used: transformers v5 maps the names
        onto each other (attribute_map) and saves its own, e.g. Qwen3 as num_local_experts; names that disagree
        are refused."""
        given = {key: self.size(key, "num_experts") for key in _EXPERT_COUNT_KEYS if self.cfg.get(key) is not None}
        if len(set(given.values())) > 1:
            raise MoespecError(f"{self.file}: the expert counts disagree: "
                               f"{', '.join(f'{key} = {n}' for key, n in given.items())}")
        return next(iter(given.values())) if given else self.size(_EXPERT_COUNT_KEYS[0], "num_experts")

    def attention(self) -> dict[str, Any]:
        """heads, kv heads, head dim, vocab, tying: keys every supported config shares."""
        heads, hidden = self.size("num_attention_heads", "heads"), self.size("hidden_size", "hidden")
        if self.cfg.get("head_dim") is None and hidden < heads:
            raise MoespecError(f"{self.file}: hidden_size {hidden} < num_attention_heads {heads} and no head_dim")
        return dict(hidden=hidden, layers=self.size("num_hidden_layers", "layers"),
                    vocab=self.size("vocab_size", "vocab"), heads=heads,
                    kv_heads=self.size("num_key_value_heads", "kv_heads", heads),
                    head_dim=self.size("head_dim", "head_dim", hidden // heads),
                    tied_embeddings=self.flag("tie_word_embeddings", False),
                    attention_bias=self.flag("attention_bias", False))


def _build(c: _Config, name: str, **kw: Any) -> ModelSpec:
    try:
        return ModelSpec(name, c.cfg["model_type"], **kw)
    except MoespecError as e:
        raise MoespecError(f"{c.file}: {e}") from None


def _routing(c: _Config, width_key: str) -> dict[str, Any]:
    """N, m and the expert width: keys every supported config has (the width under `width_key`)."""
    return dict(num_experts=c.num_experts(), top_k=c.size("num_experts_per_tok", "top_k"),
                expert_width=c.size(width_key, "expert_width"))


def _read_olmoe(c: _Config, name: str) -> ModelSpec:
    return _build(c, name, **c.attention(), **_routing(c, "intermediate_size"), qk_norm="proj")


def _read_qwen3_moe(c: _Config, name: str) -> ModelSpec:
    layers, step = c.size("num_hidden_layers", "layers"), c.size("decoder_sparse_step", "layers", 1)
    only_mlp = c.layers("mlp_only_layers", layers)  # as Qwen3MoeDecoderLayer decides
    dense = tuple(i for i in range(layers) if i in only_mlp or (i + 1) % step)
    return _build(c, name, **c.attention(), **_routing(c, "moe_intermediate_size"), dense_layers=dense,
                  dense_width=c.size("intermediate_size", "dense_width", least=1) if dense else 0, qk_norm="head")


def _read_gpt_oss(c: _Config, name: str) -> ModelSpec:
    layers = c.size("num_hidden_layers", "layers")
    # GptOssConfig default: sliding on even layers (0, 2, ...), full attention on odd ones
    types = c.items("layer_types", ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(layers)],
                    str)
    if len(types) != layers or not set(types) <= set(_LAYER_TYPES):
        raise MoespecError(f"{c.file}: layer_types = {shown(types)} must give each of the {layers} layers one of "
                           f"{', '.join(_LAYER_TYPES)}")
    window = c.size("sliding_window", "sliding_window", None)
    sliding = tuple(i for i, t in enumerate(types) if t == "sliding_attention") if window else ()
    attention = c.attention() | {"attention_bias": c.flag("attention_bias", True)}
    return _build(c, name, **attention, **_routing(c, "intermediate_size"), expert_bias=True, router_bias=True,
                  attention_sinks=True, sliding_window=window if sliding else None, sliding_layers=sliding)


def _read_deepseek_v2(c: _Config, name: str) -> ModelSpec:
    # DeepseekV2DecoderLayer in transformers: MoE from layer first_k_dense_replace on (moe_layer_freq unused)
    first_dense = c.size("first_k_dense_replace", "layers", 0, least=0)
    nope, rope = c.size("qk_nope_head_dim", "qk_nope_head_dim", least=1), \
        c.size("qk_rope_head_dim", "qk_rope_head_dim", least=1)
    attention = c.attention() | {"head_dim": nope + rope}
    routing = _routing(c, "moe_intermediate_size")
    return _build(c, name, **attention, **routing, dense_layers=tuple(range(first_dense)),
                  dense_width=c.size("intermediate_size", "dense_width", least=1) if first_dense else 0,
                  shared_experts=c.size("n_shared_experts", "shared_experts", 0), shared_width=routing["expert_width"],
                  q_lora_rank=c.size("q_lora_rank", "q_lora_rank", None),
                  kv_lora_rank=c.size("kv_lora_rank", "kv_lora_rank"), qk_rope_head_dim=rope, qk_nope_head_dim=nope,
                  v_head_dim=c.size("v_head_dim", "v_head_dim", least=1))


def _read_mixtral(c: _Config, name: str) -> ModelSpec:
    layers, window = c.size("num_hidden_layers", "layers"), c.size("sliding_window", "sliding_window", None)
    return _build(c, name, **c.attention(), **_routing(c, "intermediate_size"), sliding_window=window,
                  sliding_layers=tuple(range(layers)) if window else ())


_CONFIG_READERS = {"olmoe": _read_olmoe, "qwen3_moe": _read_qwen3_moe, "gpt_oss": _read_gpt_oss,
                   "deepseek_v2": _read_deepseek_v2, "mixtral": _read_mixtral}


def read_config(cfg: dict[str, Any], name: str | None = None, source: str = "config") -> ModelSpec:
    """The spec of the keys of a config.json, named `name` (default: the model_type); `source` names the config in
    error messages."""
    if not isinstance(cfg, dict):
        raise MoespecError(f"{source}: expected a JSON object of config keys, got {shown(cfg)}")
    model_type = cfg.get("model_type")
    if not isinstance(model_type, str) or model_type not in _CONFIG_READERS:
        raise MoespecError(f"{source}: model_type {shown(model_type)} is not a supported MoE model "
                           f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})")
    return _CONFIG_READERS[model_type](_Config(cfg, source), name or model_type)

"""Loading the models the engine runs: a local Hugging Face checkpoint of the five MoE classes, or a preset's
architecture (moespec.model.spec) built at its real shapes with random weights, and where their routers are.

Models. `load_model` loads a local checkpoint of the five classes, or builds a preset's architecture from its real
shapes with random weights: the experts, whose bytes and kernels are measured, are exact; only the layer count and
the vocabulary may be cut (PRESET_VOCAB). `find_routers` finds each MoE layer's router module, where routing is
computed (the tracer taps it; moespec.model.policies finds the experts module beside it).
"""

from __future__ import annotations

import functools
import inspect
import re
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from moespec import MoespecError
from moespec.kernels import pages
from moespec.defaults import DTYPES, TORCH_DTYPES
from moespec.model.spec import SUPPORTED_MODEL_TYPES, ModelSpec

__all__ = ["LoadedModel", "load_model", "load_draft", "preset_config", "cache_argument", "find_routers", "PRESET_VOCAB"]

# A preset's model is built with this vocabulary unless asked for the real one (vocab=None): the embedding and
# LM head of a 150k vocabulary (Qwen3, gpt-oss: 0.3-0.6 G weights) would dominate the memory and build time of
# a few-layer model, and are not what the experts measure; 32768 is still a realistic head (Mixtral: 32000).
PRESET_VOCAB = 32768
# Files whose presence means a checkpoint folder ships a tokenizer (fast, sentencepiece or BPE vocabularies).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
# Values of the presets' published config.json that a ModelSpec does not carry and transformers' defaults get
# wrong: routing-weight normalization and the rope base (rope scaling is left out: it moves no bytes).
PUBLISHED_EXTRAS: dict[str, dict[str, Any]] = {
    "qwen3_moe": {"norm_topk_prob": True, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}},
    "deepseek_v2": {"topk_method": "greedy", "n_group": 1, "topk_group": 1, "routed_scaling_factor": 1.0},
}
# What transformers and safetensors raise on a checkpoint they cannot load (a missing, damaged or foreign file).
_LOAD_ERRORS = (OSError, ValueError, KeyError, RuntimeError, SafetensorError)


@dataclass
class LoadedModel:
    """A model ready to run: eval mode, no grad, on `device` in `dtype` ('fp32' or 'bf16'); `spec` describes
    the model as built (its decoder layers, its L MoE layers, its vocabulary); `source` says where it came from."""

    model: Any
    tokenizer: Any | None
    spec: ModelSpec
    device: str
    dtype: str
    source: str


# ---------------------------------------------------------------- loading

def resolve_device(name: str) -> str:
    """`name` ("cpu", "cuda" or "cuda:N") checked against this machine; raises MoespecError when it names no
    device here."""
    kind, colon, index = name.partition(":")
    if not (name == "cpu" or kind == "cuda" and (not colon or index.isdigit())):
        raise MoespecError(f"--device {name}: unknown device; use cpu, cuda or cuda:N")
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise MoespecError(f"--device {name}: no CUDA device here (torch.cuda.is_available() is False)")
        if colon and int(index) >= torch.cuda.device_count():
            raise MoespecError(f"--device {name}: this machine has {torch.cuda.device_count()} CUDA device(s), "
                               f"cuda:0..cuda:{torch.cuda.device_count() - 1}")
    return name


def load_model(path: str | None = None, preset: str | ModelSpec | None = None, layers: int | None = None,
               dtype: str = "bf16", device: str = "cpu", seed: int = 0,
               vocab: int | None = PRESET_VOCAB) -> LoadedModel:
    """A local checkpoint folder (`path`: any of the five classes, tokenizer if present, never the hub), or a
    preset's architecture with random weights drawn with `seed` (`preset`: a preset name, or a ModelSpec such as
    a preset shrunk with dataclasses.replace): its first `layers` decoder layers (default all) and a vocabulary
    of `vocab` tokens (None: the real one). `layers` and `vocab` apply to presets only."""
    if (path is None) == (preset is None):
        raise MoespecError("load_model: give exactly one of path (a checkpoint folder) and preset")
    if dtype not in DTYPES:
        raise MoespecError(f"load_model: dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    resolve_device(device)
    torch_dtype = getattr(torch, TORCH_DTYPES[dtype])
    if path is not None:
        if layers is not None:
            raise MoespecError("load_model: layers applies to presets; a checkpoint is loaded whole")
        model, tokenizer, spec, source = _load_checkpoint(Path(path), torch_dtype)
    else:
        spec = preset if isinstance(preset, ModelSpec) else ModelSpec.from_name(preset)
        config, spec = preset_config(spec, layers, vocab)
        torch.manual_seed(seed)
        with torch.device(device):  # drawn on the device: a large model initializes fast on a GPU
            model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
        tokenizer, source = None, f"preset {spec.name}, random weights (seed {seed})"
    model = model.to(device).eval().requires_grad_(False)
    pages.to_huge_pages(model)  # its weight streams enter 2 MiB pages (moespec.kernels.pages); a no-op off the CPU
    return LoadedModel(model, tokenizer, spec, device, dtype, source)


def load_draft(path: str, dtype: str = "bf16", device: str = "cpu") -> Any:
    """A draft model: any local causal LM checkpoint (dense or MoE; it must share the target's tokenizer), in
    eval mode on `device` in `dtype`; one-line errors name the folder."""
    folder = Path(path)
    if not (folder / "config.json").is_file():
        raise MoespecError(f"{path}: no config.json (a local Hugging Face checkpoint folder is needed)")
    if dtype not in DTYPES:
        raise MoespecError(f"load_draft: dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    resolve_device(device)
    _check_weights(folder)
    try:
        model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True,
                                                     dtype=getattr(torch, TORCH_DTYPES[dtype]))
    except _LOAD_ERRORS as e:
        raise MoespecError(f"{path}: cannot load the draft model ({_first_line(e)})") from None
    model = model.to(device).eval().requires_grad_(False)
    pages.to_huge_pages(model)
    return model


def _check_weights(folder: Path) -> None:
    """Every safetensors file of a checkpoint folder opens (its header parses and its tensors lie inside the file),
    so a truncated or damaged one is named in one line before transformers reads it."""
    for file in sorted(folder.glob("*.safetensors")):
        try:
            with safe_open(file, "pt"):
                pass
        except (SafetensorError, OSError) as e:
            raise MoespecError(f"{file}: not a readable safetensors file ({_first_line(e)})") from None


def _first_line(e: BaseException) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


def _load_checkpoint(path: Path, dtype: torch.dtype) -> tuple[Any, Any, ModelSpec, str]:
    if not path.is_dir():
        raise MoespecError(f"{path}: {'not a folder' if path.exists() else 'no such directory'} (a local Hugging Face "
                           f"checkpoint is needed)")
    spec = ModelSpec.from_config(path)  # rejects configs that are not a supported MoE
    _check_weights(path)
    try:
        tokenizer = (AutoTokenizer.from_pretrained(path, local_files_only=True)
                     if any((path / name).is_file() for name in TOKENIZER_FILES) else None)
        model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=dtype)
    except _LOAD_ERRORS as e:
        raise MoespecError(f"{path}: cannot load the checkpoint ({_first_line(e)})") from None
    return model, tokenizer, spec, str(path)


def preset_config(spec: ModelSpec, layers: int | None = None,
                  vocab: int | None = PRESET_VOCAB) -> tuple[Any, ModelSpec]:
    """The transformers config of `spec`'s architecture cut to its first `layers` decoder layers (default all)
    with a vocabulary of `vocab` (None: the spec's), and the spec of that model. The config is read back into
    a spec and must give exactly the cut spec, so every shape of the preset is in the built model."""
    layers = spec.layers if layers is None else layers
    if not 1 <= layers <= spec.layers:
        raise MoespecError(f"{spec.name}: layers must lie in 1..{spec.layers}, got {layers}")
    want = replace(spec, layers=layers, vocab=spec.vocab if vocab is None else vocab,  # validates the cut
                   dense_layers=tuple(i for i in spec.dense_layers if i < layers),
                   sliding_layers=tuple(i for i in spec.sliding_layers if i < layers))
    if (want.layers, want.vocab) != (spec.layers, spec.vocab):
        want = replace(want, name=f"{spec.name} ({layers} of {spec.layers} layers, vocab {want.vocab})")
    kwargs = _config_kwargs(want) | PUBLISHED_EXTRAS.get(want.model_type, {})
    config = AutoConfig.for_model(want.model_type, **kwargs)
    got = ModelSpec.from_config_dict(config.to_dict(), want.name)
    wrong = [f"{f.name}={getattr(got, f.name)!r} (want {getattr(want, f.name)!r})" for f in fields(ModelSpec)
             if f.compare and getattr(got, f.name) != getattr(want, f.name)]
    if wrong:
        raise MoespecError(f"{want.name}: its {want.model_type} config cannot hold this spec: {', '.join(wrong)}")
    return config, replace(got, notes=spec.notes)


def _config_kwargs(s: ModelSpec) -> dict[str, Any]:
    """The config.json keys of `s` for its model_type (the inverse of spec's config readers)."""
    common = dict(hidden_size=s.hidden, num_hidden_layers=s.layers, vocab_size=s.vocab,
                  num_attention_heads=s.heads, num_key_value_heads=s.kv_heads, num_experts_per_tok=s.top_k,
                  tie_word_embeddings=s.tied_embeddings,
                  bos_token_id=None, eos_token_id=None, pad_token_id=None)  # random weights: no tokenizer
    dense = {"intermediate_size": s.dense_width} if s.dense_layers else {}
    if s.model_type == "olmoe":
        return common | dict(num_experts=s.N, intermediate_size=s.expert_width)
    if s.model_type == "qwen3_moe":
        return common | dense | dict(num_experts=s.N, moe_intermediate_size=s.expert_width, head_dim=s.head_dim,
                                     mlp_only_layers=list(s.dense_layers))
    if s.model_type == "gpt_oss":
        types = ["sliding_attention" if i in s.sliding_layers else "full_attention" for i in range(s.layers)]
        return common | dict(num_local_experts=s.N, intermediate_size=s.expert_width, head_dim=s.head_dim,
                             sliding_window=s.sliding_window, layer_types=types, attention_bias=s.attention_bias)
    if s.model_type == "deepseek_v2":
        return common | dense | dict(n_routed_experts=s.N, moe_intermediate_size=s.expert_width,
                                     first_k_dense_replace=len(s.dense_layers), n_shared_experts=s.shared_experts,
                                     q_lora_rank=s.q_lora_rank, kv_lora_rank=s.kv_lora_rank,
                                     qk_rope_head_dim=s.qk_rope_head_dim, qk_nope_head_dim=s.qk_nope_head_dim,
                                     v_head_dim=s.v_head_dim)
    if s.model_type == "mixtral":
        return common | dict(num_local_experts=s.N, intermediate_size=s.expert_width, sliding_window=s.sliding_window)
    raise MoespecError(f"{s.name}: model_type {s.model_type!r} is not one of {', '.join(SUPPORTED_MODEL_TYPES)}")


@functools.lru_cache(maxsize=None)
def _cache_argument(model_class: type) -> str:
    return "cache" if "cache" in inspect.signature(model_class.forward).parameters else "past_key_values"


def cache_argument(model: Any) -> str:
    """The forward's KV-cache keyword: `cache`, renamed from `past_key_values` during transformers v5."""
    return _cache_argument(type(model))


def find_routers(model: Any, spec: ModelSpec) -> list[Any]:
    """The router module of each MoE layer, in layer order: the class transformers itself records
    router_logits from (`_can_record_outputs`), else any module class named *TopKRouter."""
    recorder = getattr(model, "_can_record_outputs", {}).get("router_logits")
    target = getattr(recorder, "target_class", None)
    routers = [m for m in model.modules()
               if (isinstance(m, target) if target else re.search(r"TopKRouter$", type(m).__name__, re.I))]
    if len(routers) != spec.L:
        raise MoespecError(f"{type(model).__name__}: found {len(routers)} router modules, expected one per MoE "
                           f"layer ({spec.L}); this model class or transformers version is not supported")
    return routers

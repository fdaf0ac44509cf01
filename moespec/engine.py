"""The model substrate: a real transformers MoE model with our expert kernels installed in it, and routing replay.

Physics first. A verification pass of n tokens runs the whole target model once. Attention, norms, the KV
cache and the head cost the same whatever the routing; the expert operation does not: in every MoE layer a
per-slot kernel streams the n*m experts the slots name, a deduplicating one the U distinct ones
(moespec.kernels). To see what that choice is worth end to end, it has to be made inside the model, for the
pass actually run, with everything else untouched. transformers v5 routes the forward of every experts module
(OlmoeExperts, Qwen3MoeExperts, GptOssExperts, DeepseekV2Experts, MixtralExperts) through a registry of
implementations `fn(module, hidden_states [T, d], top_k_index [T, m], top_k_weights [T, m]) -> [T, d]`
(`use_experts_implementation`, `ALL_EXPERTS_FUNCTIONS`), chosen per model by `config._experts_implementation`,
so that is where the kernels go. `set_policy` picks one of POLICIES:
- `slot`, `dedup`: kernels.expert_op with that kernel (registered as `moespec-slot`, `moespec-dedup`);
- `auto` (`moespec-auto`): per pass, the kernel a plan chose for its size n (`kernel_by_n`);
- `eager`, `batched_mm`, `grouped_mm`: transformers' own implementations, for comparison.
Our kernels want the layout gate_up [N, 2f, d], down [N, d, f]; `kernels.from_hf_experts` gives it once per
module (the canonical classes share their storage, gpt-oss's transposed interleaved weights are copied).

Routing replay. Which experts a pass needs depends on the text, so a pass measured on a model with random
weights must be given real routing: `set_replay(model, ids)` makes every MoE layer l use ids[:, l] (a trace
window's experts, [T, L, m], rank-ordered as traces store them) instead of the router's choice. The router
still runs and its top-k weights are kept: they are sorted by decreasing weight and paired rank by rank with
the replayed ids (token t's j-th heaviest weight goes to ids[t, l, j]), so each layer keeps the router's mass,
its normalization and scaling, and replaying a model's own trace reproduces its forward exactly. Replay is a
forward pre-hook on the experts modules, so it works under every policy, the stock ones included.

Per-model state lives on the experts modules themselves, as an `_ExpertsState` at attribute `_moespec`: the
converted weights (rebuilt if the parameters move), the auto policy's kernel_by_n, and this layer's replay
ids with their hook. Nothing is global except the three registered implementations.

Models. `load_model` loads a local checkpoint of the five classes, or builds a preset's architecture
(moespec.spec) from its real shapes with random weights: the experts, whose bytes and kernels are measured,
are exact; only the layer count and the vocabulary may be cut (PRESET_VOCAB).
"""

from __future__ import annotations

import bisect
import functools
import inspect
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

from moespec import MoespecError
from moespec.kernels import expert_op, from_hf_experts
from moespec.spec import SUPPORTED_MODEL_TYPES, ModelSpec
from moespec.tracer import DTYPES, find_routers

__all__ = ["LoadedModel", "load_model", "preset_config", "moe_experts", "set_policy", "set_replay",
           "cache_argument", "POLICIES", "PRESET_VOCAB"]

POLICIES = ("slot", "dedup", "auto", "eager", "batched_mm", "grouped_mm")
OUR_KERNELS = ("slot", "dedup")  # the kernels a plan's kernel_by_n may name
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
    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        raise MoespecError(f"device {device!r}: CUDA is not available on this machine")
    torch_dtype = getattr(torch, DTYPES[dtype])
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
    return LoadedModel(model, tokenizer, spec, device, dtype, source)


def _load_checkpoint(path: Path, dtype: torch.dtype) -> tuple[Any, Any, ModelSpec, str]:
    if not path.is_dir():
        raise MoespecError(f"{path}: no such directory (a local Hugging Face checkpoint is needed)")
    spec = ModelSpec.from_config(path)  # rejects configs that are not a supported MoE
    try:
        tokenizer = (AutoTokenizer.from_pretrained(path, local_files_only=True)
                     if any((path / name).is_file() for name in TOKENIZER_FILES) else None)
        model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=dtype)
    except (OSError, ValueError, KeyError, RuntimeError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise MoespecError(f"{path}: cannot load the checkpoint ({first})") from None
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


# ---------------------------------------------------------------- experts modules and their state

@dataclass
class _ExpertsState:
    """What moespec keeps on one experts module (attribute `_moespec`)."""

    weights: tuple | None = None  # from_hf_experts(module): gate_up, down, gate_up_bias, down_bias, act
    weights_key: tuple | None = None  # the parameters those were made from (storage and device)
    kernel_by_n: tuple[list[int], list[str]] | None = None  # auto: sorted pass sizes and their kernels
    replay: torch.Tensor | None = None  # [T, m] expert ids of this layer while replay is on
    hook: Any = None  # the replay pre-hook's handle


def _state(module: torch.nn.Module) -> _ExpertsState:
    state = getattr(module, "_moespec", None)
    if state is None:
        state = _ExpertsState()
        module._moespec = state
    return state


def _spec_of(model: Any) -> ModelSpec:
    return ModelSpec.from_config_dict(model.config.to_dict(), source=f"{type(model).__name__} config")


def moe_experts(model: Any) -> list[torch.nn.Module]:
    """The experts module of each MoE layer, in MoE-layer order (the routers tracer.find_routers finds, and
    the `experts` module beside each in its MoE block)."""
    parents = {child: parent for parent in model.modules() for child in parent.children()}
    experts = [getattr(parents[router], "experts", None) for router in find_routers(model, _spec_of(model))]
    if any(e is None or not hasattr(e, "gate_up_proj") for e in experts):
        raise MoespecError(f"{type(model).__name__}: a router has no `experts` module with gate_up_proj beside it; "
                           "this model class or transformers version is not supported")
    return experts


def _weights(module: torch.nn.Module) -> tuple:
    """The module's weights in our layout, converted once and again only if its parameters move."""
    state = _state(module)
    key = (module.gate_up_proj.data_ptr(), module.down_proj.data_ptr(), module.gate_up_proj.device)
    if state.weights_key != key:
        state.weights, state.weights_key = from_hf_experts(module), key
    return state.weights


def _kernel_for(module: torch.nn.Module, n: int) -> str:
    table = _state(module).kernel_by_n
    if table is None:
        raise MoespecError("moespec-auto needs a kernel per pass size: "
                           "use engine.set_policy(model, 'auto', kernel_by_n)")
    sizes, kernels = table
    return kernels[max(bisect.bisect_right(sizes, n) - 1, 0)]


def _implementation(kernel: str | None):
    """The registered experts forward running our `kernel` (None: the auto policy's choice for the pass size)."""

    def forward(self: torch.nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        gate_up, down, gate_up_bias, down_bias, act = _weights(self)
        name = kernel or _kernel_for(self, hidden_states.shape[0])
        return expert_op(name, hidden_states, top_k_index, top_k_weights, gate_up, down, gate_up_bias, down_bias, act)

    return forward


ALL_EXPERTS_FUNCTIONS.register("moespec-slot", _implementation("slot"))
ALL_EXPERTS_FUNCTIONS.register("moespec-dedup", _implementation("dedup"))
ALL_EXPERTS_FUNCTIONS.register("moespec-auto", _implementation(None))


def _kernel_table(kernel_by_n: dict[int, str] | None) -> tuple[list[int], list[str]]:
    if not kernel_by_n:
        raise MoespecError("policy 'auto' needs kernel_by_n, a plan's {pass size n: 'slot' | 'dedup'}")
    table = {}
    for n, kernel in kernel_by_n.items():
        size = int(n) if str(n).isdigit() else 0  # JSON turns the keys into strings
        if size < 1 or kernel not in OUR_KERNELS:
            raise MoespecError(f"kernel_by_n: {n!r}: {kernel!r} is not a pass size >= 1 and 'slot' or 'dedup'")
        table[size] = kernel
    sizes = sorted(table)
    return sizes, [table[n] for n in sizes]


def set_policy(model: Any, policy: str, kernel_by_n: dict[int, str] | None = None) -> None:
    """Run the model's experts with `policy` (one of POLICIES). `auto` takes kernel_by_n {n: 'slot' | 'dedup'}:
    a pass of T tokens runs the kernel of the largest n <= T (the smallest n's below all of them), so passes
    longer than the plan's largest n, such as a prompt's prefill, use that n's kernel."""
    if policy not in POLICIES:
        raise MoespecError(f"unknown policy {policy!r}; one of {', '.join(POLICIES)}")
    table = _kernel_table(kernel_by_n) if policy == "auto" else None
    for module in moe_experts(model):
        _state(module).kernel_by_n = table
    name = f"moespec-{policy}" if policy in (*OUR_KERNELS, "auto") else policy
    try:
        model.set_experts_implementation(name)
    except (ValueError, KeyError, RuntimeError) as e:
        raise MoespecError(f"policy {policy!r}: transformers refused experts implementation {name!r} ({e})") from None


# ---------------------------------------------------------------- routing replay

def _replay_hook(module: torch.nn.Module, args: tuple) -> tuple:
    """Pre-hook of an experts module: the replayed ids instead of the router's, its weights in rank order."""
    if len(args) != 3:
        raise MoespecError(f"{type(module).__name__} was called without (hidden_states, top_k_index, top_k_weights) "
                           "as positional arguments; replay does not support this transformers version")
    hidden_states, _, top_k_weights = args
    ids = _state(module).replay
    if hidden_states.shape[0] != ids.shape[0]:
        raise MoespecError(f"replay holds {ids.shape[0]} tokens but the pass has {hidden_states.shape[0]}")
    return hidden_states, ids, top_k_weights.sort(dim=-1, descending=True).values


def set_replay(model: Any, ids: np.ndarray | None) -> None:
    """While set, MoE layer l's experts get ids[:, l] ([T, L, m] expert ids, rank-ordered) instead of the router's
    top-k, with the router's top-k weights sorted and paired rank by rank (see the module docstring); every
    forward must then be a pass of exactly T tokens. None turns replay off."""
    experts = moe_experts(model)
    if ids is None:
        for module in experts:
            state = _state(module)
            if state.hook is not None:
                state.hook.remove()
            state.replay = state.hook = None
        return
    spec = _spec_of(model)
    ids = np.asarray(ids)
    if ids.ndim != 3 or ids.shape[1:] != (spec.L, spec.m) or not np.issubdtype(ids.dtype, np.integer):
        raise MoespecError(f"replay ids must be integers [T, L={spec.L}, m={spec.m}], got {ids.dtype} {ids.shape}")
    if ids.size and (ids.min() < 0 or ids.max() >= spec.N):
        raise MoespecError(f"replay ids must lie in [0, {spec.N})")
    for layer, module in enumerate(experts):
        state = _state(module)
        state.replay = torch.as_tensor(ids[:, layer], dtype=torch.long, device=module.gate_up_proj.device)
        if state.hook is None:
            state.hook = module.register_forward_pre_hook(_replay_hook)

"""Kernel policies and routing replay inside a real transformers MoE model: our expert kernels installed through
transformers' experts registry, touching no model source.

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
- `outside` (`moespec-outside`): the expert operation taken out (every MoE layer adds zero): a pass under it takes
  the time outside the expert operation (attention, dense weights, routers, KV cache, head), which the whole-pass
  prediction adds to the predicted expert time (moespec.predict.verify);
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

"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

from moespec import MoespecError
from moespec.defaults import KERNELS
from moespec.kernels import expert_op, from_hf_experts
from moespec.model.load import find_routers
from moespec.model.spec import ModelSpec

__all__ = ["POLICIES", "moe_experts", "set_policy", "set_replay", "pass_kernel", "replayed"]

# our kernels, AUTO (a plan's kernel per pass size), OUTSIDE (the expert operation taken out, to time the rest of a
# pass) and transformers' own implementations for comparison
OURS = (*KERNELS, "auto", "outside")
POLICIES = (*OURS, "eager", "batched_mm", "grouped_mm")


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
    """The experts module of each MoE layer, in MoE-layer order (the routers load.find_routers finds, and
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
    return _table_kernel(table, n)


def _table_kernel(table: tuple[list[int], list[str]], n: int) -> str:
    sizes, kernels = table
    return kernels[max(bisect.bisect_right(sizes, n) - 1, 0)]


def auto_kernel(kernel_by_n: dict[int, str], n: int) -> str:
    """The kernel the auto policy runs for a pass of n tokens under kernel_by_n (set_policy's rule: the largest
    planned size <= n, the smallest below all of them)."""
    return _table_kernel(_kernel_table(kernel_by_n), n)


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


def _outside(self: torch.nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
             top_k_weights: torch.Tensor) -> torch.Tensor:
    """The expert operation taken out: every MoE layer adds nothing, so a pass times what lies outside it."""
    return torch.zeros_like(hidden_states)


ALL_EXPERTS_FUNCTIONS.register("moespec-outside", _outside)


def _kernel_table(kernel_by_n: dict[int, str] | None) -> tuple[list[int], list[str]]:
    if not kernel_by_n:
        raise MoespecError("policy 'auto' needs kernel_by_n, a plan's {pass size n: 'slot' | 'dedup'}")
    table = {}
    for n, kernel in kernel_by_n.items():
        size = int(n) if str(n).isdigit() else 0  # JSON turns the keys into strings
        if size < 1 or kernel not in KERNELS:
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
    name = f"moespec-{policy}" if policy in OURS else policy
    try:
        model.set_experts_implementation(name)
    except (ValueError, KeyError, RuntimeError) as e:
        raise MoespecError(f"policy {policy!r}: transformers refused experts implementation {name!r} ({e})") from None


def pass_kernel(module: torch.nn.Module, n: int) -> str | None:
    """What the experts module's current policy runs for a pass of n tokens: "slot" or "dedup" (our kernels, auto
    resolved for n), "outside" (the operation taken out), or None for transformers' own implementations."""
    name = getattr(module.config, "_experts_implementation", None)
    if name == "moespec-auto":
        return _kernel_for(module, n)
    return {"moespec-slot": "slot", "moespec-dedup": "dedup", "moespec-outside": "outside"}.get(name)


def replayed(module: torch.nn.Module) -> torch.Tensor | None:
    """The replayed ids [T, m] (int64, contiguous, held by the module) of this experts module while replay is on,
    else None."""
    return _state(module).replay



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
        state.replay = torch.as_tensor(ids[:, layer], dtype=torch.long,
                                       device=module.gate_up_proj.device).contiguous()
        if state.hook is None:
            state.hook = module.register_forward_pre_hook(_replay_hook)

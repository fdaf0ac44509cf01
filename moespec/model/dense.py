"""The non-expert path of a verification pass through moespec's native memory-bound kernels: the dense weights
(moespec.kernels.dense) and the attention over the KV cache (moespec.kernels.attention), installed in a real
transformers model without touching its source.

Physics first. Besides the experts, a pass of n tokens reads every dense weight matrix once: the attention
projections (MLA's down and up projections in DeepSeek-V2), the routers, the shared experts, dense MLP layers
(DeepSeek-V2's first) and the LM head. At n <= 16 each weight does at most 16 multiply-adds, so these matrices are
streams of bytes and should cost their bytes over the streaming bandwidth whatever n is. torch's CPU F.linear is
a GEMM tuned for large n: on this project's machine the LM head (32768 x 2048 bf16, 134 MB) takes 16 ms at n = 1
and 67 ms at n = 9, so the time outside the expert operation grew ~10 ms per token, which no byte model predicts.
moespec.kernels.dense streams each row once for all n tokens instead.

How it is installed. transformers computes all of these as torch.nn.functional.linear calls: nn.Linear modules, and a
few modules that hold a weight matrix and call F.linear on it themselves (the routers). `set_dense(model, "native")`
gives every nn.Linear of the model an instance `forward` that runs the native kernel, and puts on each of the other
matrix-holding modules a forward pre-hook and an always-called forward hook that enter and leave a TorchFunctionMode
for the duration of that module's forward, inside which F.linear runs the native kernel. A call runs natively when its
input has at most kernels.dense.native_rows rows (16, or 256 bf16 rows on a CPU with AMX tiles: a verification pass; a
longer prefill keeps torch's GEMM, except in bf16 on a CPU where torch has none: there it runs the native kernel in
row blocks, kernels.dense.linear_if_taken) and its tensors are ones the kernel takes (CPU, fp32 or bf16, contiguous
2-D weight); any other call runs torch's. The mode is scoped to those few modules on purpose: a mode intercepts every
torch call made while it is active (about 350 per pass of the demo's model, ~1.3 us each here), so a model-wide mode
would add its own half millisecond to every pass. No module class, weight or model source changes; `set_dense(model,
"torch")` removes the instance forwards and the hooks. The expert operation is not an F.linear under our policies
(moespec.model.policies), so it is untouched.

The lean pass. For OLMoE, Qwen3-MoE and Mixtral `set_dense(model, "native")` also installs moespec.model.lean:
the model's verification passes (1..16 new tokens on the engine's cache) then run one readable forward with the
same kernels and a quarter of transformers' calls, and the routers route with one native top-k; other calls and
the other classes keep transformers' forward with the kernels above.

Attention. The cached keys and values are read once per pass as well (4 MB a layer at the demo's depth), and
torch's CPU flash attention takes ~0.9 ms for them at n = 1 here, 7x their bytes' time. `set_dense(model,
"native")` also switches every config on transformers' "sdpa" to ATTENTION_NAME, an attention function registered
through transformers' AttentionInterface (with sdpa's boolean masks): a verification pass runs the native
kernel, anything else (a prefill, dropout, sinks, a float mask) transformers' sdpa function. Models on another
implementation (gpt-oss's eager attention, for its sinks) keep it; `set_dense(model, "torch")` switches back.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

from moespec import MoespecError
from moespec.kernels import attention, dense
from moespec.model import lean

DENSE = ("native", "torch")  # the engine's dense path: our kernel for verify passes, or torch's F.linear throughout
DEFAULT_DENSE = "native"


def _owns_matrix(module: torch.nn.Module) -> bool:
    """A module other than nn.Linear and nn.Embedding with a 2-D weight of its own: one that calls F.linear itself."""
    weight = getattr(module, "weight", None)
    return (isinstance(weight, torch.Tensor) and weight.dim() == 2
            and not isinstance(module, (torch.nn.Linear, torch.nn.Embedding)))


class NativeLinear(TorchFunctionMode):
    """While active, F.linear of a verification pass runs moespec.kernels.dense.linear; `calls` counts them."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """The native kernel where it takes the call, else torch's F.linear."""
        y = dense.linear_if_taken(x, weight, bias)
        if y is None:
            return F.linear(x, weight, bias)
        self.calls += 1
        return y

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is F.linear:  # inside __torch_function__ the mode is off: torch's F.linear below is torch's own
            x, weight = args[0], args[1] if len(args) > 1 else kwargs["weight"]
            return self.linear(x, weight, args[2] if len(args) > 2 else kwargs.get("bias"))
        return func(*args, **kwargs)


class _Installed:
    """What set_dense keeps on a model (attribute `_moespec_dense`): the mode, the nn.Linear modules given an
    instance forward, and the hook handles of the modules that call F.linear themselves."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.mode = NativeLinear()
        self.linears = [module for module in model.modules() if isinstance(module, torch.nn.Linear)]
        for module in self.linears:
            module.forward = functools.partial(self._forward, module)
        self.lean = lean.install(model)  # None: a model lean.unsupported names runs transformers' forward
        routed = self.lean.routers if self.lean is not None else []
        self.handles = []
        for module in model.modules():
            if _owns_matrix(module) and module not in routed:
                self.handles += [module.register_forward_pre_hook(self._enter),
                                 module.register_forward_hook(self._leave, always_call=True)]
        # attention: configs on sdpa switch to the native function (others, e.g. eager with sinks, keep theirs)
        self.attention_calls = 0
        self.configs = {id(m.config): m.config for m in _attention_modules(model)
                        if m.config._attn_implementation == "sdpa"}
        for config in self.configs.values():
            config._attn_implementation = ATTENTION_NAME
        self.counted = [m for m in model.modules() if hasattr(m, "num_key_value_groups") or hasattr(m, "scaling")]
        for module in self.counted:
            module._moespec_counter = self

    def _forward(self, module: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
        return self.mode.linear(x, module.weight, module.bias)

    def _enter(self, module: Any, args: Any) -> None:
        self.mode.__enter__()

    def _leave(self, module: Any, args: Any, output: Any) -> None:
        self.mode.__exit__(None, None, None)

    def remove(self) -> None:
        for module in self.linears:
            del module.forward
        for handle in self.handles:
            handle.remove()
        for config in self.configs.values():
            config._attn_implementation = "sdpa"
        for module in self.counted:
            del module._moespec_counter
        if self.lean is not None:
            self.lean.remove()


# transformers' documented way to add an attention implementation (AttentionInterface, AttentionMaskInterface):
# registered once under this name, with sdpa's boolean mask; a model runs it when its config names it.
ATTENTION_NAME = "moespec_native"


def _attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
               is_causal: bool | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention function, "moespec_native": the native kernel for a verification pass (at most
    kernels.attention.MAX_QUERIES queries; no dropout, sinks, soft-capping or position bias; a boolean mask, or
    none where a single query sees every key), sdpa's for anything else (a prefill, a float mask)."""
    n, length = query.shape[2], key.shape[2]
    plain = dropout == 0 and not any(kwargs.get(name) is not None for name in ("s_aux", "sinks", "softcap",
                                                                                   "position_bias"))
    causal_ok = attention_mask is not None or n == 1 or (n == length and is_causal is not False)
    out = attention.attention_if_taken(query, key, value, attention_mask, scaling) if plain and causal_ok else None
    if out is not None:
        installed = getattr(module, "_moespec_counter", None)
        if installed is not None:
            installed.attention_calls += 1
        return out, None
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                  is_causal=is_causal, **kwargs)


AttentionInterface.register(ATTENTION_NAME, _attention)
ALL_MASK_ATTENTION_FUNCTIONS.register(ATTENTION_NAME, sdpa_mask)


def _attention_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules whose config selects the attention implementation (every config object reached from one)."""
    return [m for m in model.modules() if getattr(getattr(m, "config", None), "_attn_implementation", None)]


def set_dense(model: torch.nn.Module, kind: str) -> str:
    """Run the model's dense weights with `kind` (one of DENSE) and return what runs them: "native", or "torch"
    with the reason the native kernel is unavailable when "native" was asked for and cannot load."""
    if kind not in DENSE:
        raise MoespecError(f"unknown dense path {kind!r}; one of {', '.join(DENSE)}")
    installed = getattr(model, "_moespec_dense", None)
    if installed is not None:
        installed.remove()
        model._moespec_dense = None
    if kind == "torch":
        return "torch"
    if not dense.available():
        return f"torch ({dense.status()})"
    model._moespec_dense = _Installed(model)
    return "native"


def lean_pass(model: torch.nn.Module) -> lean.Lean | None:
    """The lean verify pass installed on this model (set_dense "native" on a class it supports), else None."""
    installed = getattr(model, "_moespec_dense", None)
    return None if installed is None else installed.lean


def verify_pass(model: torch.nn.Module) -> str:
    """What computes a verification pass of this model: "lean" (moespec.model.lean) with how many of its layers
    run as one native call each, or "transformers" with the reason the lean pass does not apply."""
    installed = getattr(model, "_moespec_dense", None)
    if installed is None:
        return "transformers (dense path torch)"
    if installed.lean is None:
        return f"transformers ({lean.unsupported(model)})"
    fused = sum(w is not None for w in installed.lean.fused)
    return f"lean ({fused} of {len(installed.lean.fused)} layers one native call each)"


def native_calls(model: torch.nn.Module) -> int:
    """How many F.linear calls the native kernel ran in this model since set_dense (0 when not installed)."""
    installed = getattr(model, "_moespec_dense", None)
    if installed is None:
        return 0
    return installed.mode.calls + (installed.lean.linear_calls if installed.lean is not None else 0)


def native_attention_calls(model: torch.nn.Module) -> int:
    """How many attention calls the native kernel ran in this model since set_dense (0 when not installed)."""
    installed = getattr(model, "_moespec_dense", None)
    if installed is None:
        return 0
    return installed.attention_calls + (installed.lean.attention_calls if installed.lean is not None else 0)

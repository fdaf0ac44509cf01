"""The dense weights of a verification pass through moespec's native memory-bound kernel, installed in a real
transformers model without touching its source.

Physics first. Besides the experts, a pass of n tokens reads every dense weight matrix once: the attention
projections (MLA's down and up projections in DeepSeek-V2), the routers, the shared experts, dense MLP layers
(DeepSeek-V2's first) and the LM head. At n <= 16 each weight does at most 16 multiply-adds, so these matrices are
streams of bytes and should cost their bytes over the streaming bandwidth whatever n is. torch's CPU F.linear is
a GEMM tuned for large n: on this project's machine the LM head (32768 x 2048 bf16, 134 MB) takes 16 ms at n = 1
and 67 ms at n = 9, so the time outside the expert operation grew ~10 ms per token, which no byte model predicts.
moespec.kernels.dense streams each row once for all n tokens instead.

How it is installed. transformers computes all of these as torch.nn.functional.linear calls: nn.Linear modules,
and a few modules that hold a weight matrix and call F.linear on it themselves (the routers). `set_dense(model,
"native")` gives every nn.Linear of the model an instance `forward` that runs the native kernel, and puts on each
of the other matrix-holding modules a forward pre-hook and an always-called forward hook that enter and leave a
TorchFunctionMode for the duration of that module's forward, inside which F.linear runs the native kernel. A call
runs natively when its input has at most kernels.dense.MAX_TOKENS rows (a verification pass; prefill keeps
torch's GEMM) and its tensors are ones the kernel takes (CPU, fp32 or bf16, contiguous 2-D weight); any other
call runs torch's. The mode is scoped to those few modules on purpose: a mode intercepts every torch call made
while it is active (about 350 per pass of the demo's model, ~1.3 us each here), so a model-wide mode would add
its own half millisecond to every pass. No module class, weight or model source changes; `set_dense(model,
"torch")` removes the instance forwards and the hooks. The expert operation is not an F.linear under our
policies (moespec.model.policies), so it is untouched.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from moespec import MoespecError
from moespec.kernels import dense

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
        if dense.takes(x, weight, bias):
            self.calls += 1
            return dense.linear(x, weight, bias)
        return F.linear(x, weight, bias)

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
        self.handles = []
        for module in model.modules():
            if _owns_matrix(module):
                self.handles += [module.register_forward_pre_hook(self._enter),
                                 module.register_forward_hook(self._leave, always_call=True)]

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


def native_calls(model: torch.nn.Module) -> int:
    """How many F.linear calls the native kernel ran in this model since set_dense (0 when not installed)."""
    installed = getattr(model, "_moespec_dense", None)
    return 0 if installed is None else installed.mode.calls

"""The dense weights of a verification pass through moespec's native memory-bound kernel, installed in a real
transformers model without touching its source.

Physics first. Besides the experts, a pass of n tokens reads every dense weight matrix once: the attention
projections (MLA's down and up projections in DeepSeek-V2), the routers, the shared experts, dense MLP layers
(DeepSeek-V2's first) and the LM head. At n <= 16 each weight does at most 16 multiply-adds, so these matrices are
streams of bytes and should cost their bytes over the streaming bandwidth whatever n is. torch's CPU F.linear is
a GEMM tuned for large n: on this project's machine the LM head (32768 x 2048 bf16, 134 MB) takes 16 ms at n = 1
and 67 ms at n = 9, so the time outside the expert operation grew ~10 ms per token, which no byte model predicts.
moespec.kernels.dense streams each row once for all n tokens instead.

How it is installed. transformers computes all of these as torch.nn.functional.linear calls (nn.Linear modules,
and the routers' own F.linear). `set_dense(model, "native")` puts a forward pre-hook and an always-called forward
hook on the model that enter and leave a TorchFunctionMode for the duration of each forward; inside it every
F.linear whose input has at most kernels.dense.MAX_TOKENS rows (a verification pass; prefill keeps torch's GEMM)
and whose tensors the kernel takes (CPU, fp32 or bf16, contiguous 2-D weight) runs the native kernel, and any
other call runs torch's. No module, weight or model source changes; `set_dense(model, "torch")` removes the
hooks. The expert operation is not an F.linear under our policies (moespec.model.policies), so it is untouched.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from moespec import MoespecError
from moespec.kernels import dense

DENSE = ("native", "torch")  # the engine's dense path: our kernel for verify passes, or torch's F.linear throughout
DEFAULT_DENSE = "native"


class NativeLinear(TorchFunctionMode):
    """While active, F.linear of a verification pass runs moespec.kernels.dense.linear; `calls` counts them."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is F.linear:
            x, weight = args[0], args[1] if len(args) > 1 else kwargs["weight"]
            bias = args[2] if len(args) > 2 else kwargs.get("bias")
            if dense.takes(x, weight, bias):
                self.calls += 1
                return dense.linear(x, weight, bias)
        return func(*args, **kwargs)


class _Installed:
    """What set_dense keeps on a model (attribute `_moespec_dense`): the mode and the two hook handles."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.mode = NativeLinear()
        self.handles = [model.register_forward_pre_hook(self._enter),
                        model.register_forward_hook(self._leave, always_call=True)]

    def _enter(self, module: Any, args: Any) -> None:
        self.mode.__enter__()

    def _leave(self, module: Any, args: Any, output: Any) -> None:
        self.mode.__exit__(None, None, None)

    def remove(self) -> None:
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

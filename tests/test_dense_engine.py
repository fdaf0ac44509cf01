"""The native dense path installed in real models (moespec.model.dense): every F.linear of a verification pass of
each of the five architectures runs the native kernel, with logits equal to torch's path.

Tolerances. fp32: the kernel and torch accumulate the same products in fp32 in different orders, so logits of
O(1) agree to ATOL = 2e-5 (as the expert kernels do against eager). bf16: each layer rounds its output to bf16
once, at a different point of a different summation order than torch's, and a one-ulp difference (2^-8
relative) can travel through the layers, and now and then tip a router's choice between two near-tied experts
or a bf16 rounding of an expert's activation, which moves a logit by more than rounding does, in either path.
So in bf16 each path is set against the same model in fp32: the native path's logits lie no further from them
than torch's path's do, plus BF16_ATOL = 0.06 (a few bf16 ulps at O(1))."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from moespec import MoespecError
from moespec.kernels import dense
from moespec.model.dense import native_calls, set_dense
from moespec.model.load import load_model
from moespec.model.policies import set_policy
from moespec.model.spec import SUPPORTED_MODEL_TYPES

pytestmark = pytest.mark.skipif(not dense.available(), reason=f"native kernels: {dense.status()}")

ATOL, BF16_ATOL = 2e-5, 0.06


class CountLinear(TorchFunctionMode):
    """Counts the F.linear calls of a forward."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.calls += func is F.linear
        return func(*args, **(kwargs or {}))


def logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=ids).logits[0].float()


@pytest.mark.parametrize("dtype, atol", [("fp32", ATOL), ("bf16", BF16_ATOL)])
@pytest.mark.parametrize("model_type", SUPPORTED_MODEL_TYPES)
def test_every_dense_matrix_runs_native_with_torch_logits(model_type, dtype, atol, tiny_checkpoints):
    model = load_model(path=str(tiny_checkpoints[model_type]), dtype=dtype).model
    exact = load_model(path=str(tiny_checkpoints[model_type]), dtype="fp32").model if dtype == "bf16" else None
    set_policy(model, "dedup")
    for n in (1, 9, 16):  # every forward of at most 16 tokens: each of its F.linear calls is a verify pass's
        ids = torch.arange(3, 3 + n)[None]
        assert set_dense(model, "torch") == "torch"
        counted = CountLinear()
        with counted:
            want = logits(model, ids)
        assert set_dense(model, "native") == "native"
        got = logits(model, ids)
        assert native_calls(model) == counted.calls > 0  # attention (MLA too), routers, shared/dense MLPs, head
        if exact is None:
            torch.testing.assert_close(got, want, atol=atol, rtol=0, msg=f"{model_type} {dtype} n={n}")
        else:
            truth = logits(exact, ids)
            native_err, torch_err = ((got - truth).abs().max().item(), (want - truth).abs().max().item())
            assert native_err <= torch_err + atol, (model_type, n, native_err, torch_err)
    set_dense(model, "torch")


def test_a_prefill_keeps_torch_and_torch_removes_the_hooks(tiny_checkpoints):
    model = load_model(path=str(tiny_checkpoints["olmoe"]), dtype="fp32").model
    set_policy(model, "slot")
    set_dense(model, "native")
    logits(model, torch.arange(3, 3 + dense.MAX_TOKENS + 1)[None])  # 17 tokens: torch's GEMM
    assert native_calls(model) == 0
    logits(model, torch.arange(3, 5)[None])
    calls = native_calls(model)
    assert calls > 0
    set_dense(model, "torch")
    assert native_calls(model) == 0 and not model._forward_pre_hooks and not model._forward_hooks
    with pytest.raises(MoespecError, match="unknown dense path 'fast'"):
        set_dense(model, "fast")


def test_the_mode_leaves_even_when_the_forward_fails(tiny_checkpoints):
    model = load_model(path=str(tiny_checkpoints["olmoe"]), dtype="fp32").model
    set_dense(model, "native")
    with pytest.raises(Exception), torch.inference_mode():
        model(input_ids=torch.tensor([[10**9]]))  # an id past the vocabulary
    assert not torch.overrides._is_torch_function_mode_enabled()
    set_dense(model, "torch")

"""The per-token kernels of a verification pass (moespec.kernels.token_ops) against their plain-torch definitions,
on edge shapes: one row, odd sizes, per-head norms, D = 2, k = 1 and k = N, ties, strided inputs, fp32 and bf16.

bf16: every operation is the same fp32 arithmetic rounded at the same points, so results are bit-equal (a
difference in the fp32 sum of squares is far below a bf16 ulp). fp32: the kernel may contract a product and a
sum into one fused multiply-add, so results agree to a few fp32 ulps (ATOL)."""

from __future__ import annotations

import pytest
import torch

from moespec.kernels import native
from moespec.kernels import token_ops as T

pytestmark = pytest.mark.skipif(native.load() is None, reason=f"native kernels: {native.status()}")

ATOL = 4e-6
DTYPES = [torch.bfloat16, torch.float32]


def close(got: torch.Tensor, want: torch.Tensor) -> None:
    if got.dtype == torch.bfloat16:
        assert torch.equal(got, want)
    else:
        torch.testing.assert_close(got, want, atol=ATOL, rtol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 2048), (16, 2048), (3, 5, 128), (7, 33), (1, 1), (2, 1, 3)])
def test_rms_norm_equals_transformers_formula(shape, dtype):
    torch.manual_seed(0)
    x, w = (torch.randn(shape) * 3).to(dtype), torch.randn(shape[-1]).to(dtype)
    got = T.rms_norm(x, w, 1e-6)
    assert got.shape == x.shape and got.dtype == dtype
    close(got, T.rms_norm_reference(x, w, 1e-6))


def test_rms_norm_reads_a_strided_input_and_leaves_it():
    x = torch.randn(4, 64).to(torch.bfloat16)[:, :32]  # rows 64 apart
    before = x.clone()
    w = torch.ones(32, dtype=torch.bfloat16)
    close(T.rms_norm(x, w, 1e-5), T.rms_norm_reference(x, w, 1e-5))
    assert torch.equal(x, before)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n, H, D", [(1, 16, 128), (16, 4, 64), (3, 1, 2), (5, 3, 6)])
def test_rope_equals_apply_rotary_pos_emb(n, H, D, dtype):
    torch.manual_seed(1)
    t, cos, sin = torch.randn(n, H, D).to(dtype), torch.randn(n, D).to(dtype), torch.randn(n, D).to(dtype)
    want = T.rope_reference(t, cos, sin)
    got = T.rope_(t, cos, sin)
    assert got is t
    close(got, want)


def test_rope_rotates_a_view_with_head_and_token_strides_in_place():
    base = torch.randn(4, 6, 16)  # a [n=4, H=3, D=16] view taking every other head of 6
    view = base[:, ::2]
    untouched = base[:, 1::2].clone()
    cos, sin = torch.randn(4, 16), torch.randn(4, 16)
    want = T.rope_reference(view.clone(), cos, sin)
    T.rope_(view, cos, sin)
    close(view, want)
    assert torch.equal(base[:, 1::2], untouched)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n, N, k", [(1, 64, 8), (16, 64, 8), (3, 7, 6), (2, 5, 1), (4, 3, 3), (2, 61, 5)])
@pytest.mark.parametrize("renorm", [True, False])
def test_softmax_topk_equals_the_routers(n, N, k, renorm, dtype):
    torch.manual_seed(2)
    logits = torch.randn(n, N).to(dtype)
    for out in DTYPES:
        scores, ids = T.softmax_topk(logits, k, renorm, out)
        want_scores, want_ids = T.softmax_topk_reference(logits, k, renorm, out)
        assert ids.dtype == torch.int64 and torch.equal(ids, want_ids)
        close(scores, want_scores)


@pytest.mark.parametrize("N, k", [(64, 8), (64, 1), (8, 2), (6, 6), (7, 3)])
def test_softmax_topk_breaks_ties_as_torch_topk_does(N, k):
    torch.manual_seed(3)  # bf16 logits of few distinct values: ties inside and across the k-th place
    logits = torch.randint(-2, 3, (32, N)).to(torch.bfloat16)
    scores, ids = T.softmax_topk(logits, k, True, torch.bfloat16)
    want_scores, want_ids = T.softmax_topk_reference(logits, k, True, torch.bfloat16)
    assert torch.equal(ids, want_ids) and torch.equal(scores, want_scores)


@pytest.mark.parametrize("call, match", [
    (lambda: T.rms_norm(torch.randn(2, 4), torch.randn(4).bfloat16(), 1e-5), "^weight is torch.bfloat16"),
    (lambda: T.rms_norm(torch.randn(2, 4), torch.randn(5), 1e-5), "^weight"),
    (lambda: T.rms_norm(torch.randn(2, 4).to("meta"), torch.randn(4), 1e-5), "^x is .* on meta"),
    (lambda: T.rms_norm(torch.randn(2, 4), torch.randn(4), -1.0), "^eps"),
    (lambda: T.rms_norm(torch.randn(2, 4).half(), torch.randn(4).half(), 1e-5), "^x is torch.float16"),
    (lambda: T.rope_(torch.randn(2, 3, 5), torch.randn(2, 5), torch.randn(2, 5)), "^t .* D even"),
    (lambda: T.rope_(torch.randn(2, 3, 4), torch.randn(1, 4), torch.randn(2, 4)), "^cos"),
    (lambda: T.rope_(torch.randn(2, 3, 4), torch.randn(2, 4), torch.randn(2, 4).to("meta")), "^sin is .* on meta"),
    (lambda: T.softmax_topk(torch.randn(2, 4), 5, True), "^k must"),
    (lambda: T.softmax_topk(torch.randn(4), 1, True), "^logits"),
    (lambda: T.softmax_topk(torch.randn(2, 4), 2, True, torch.float16), "^dtype"),
])
def test_bad_arguments_are_refused_in_python_naming_them(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize("eps", [True, float("inf"), float("nan"), -1.0, "1e-6", None])
def test_rms_norm_refuses_an_eps_outside_its_domain(eps):
    with pytest.raises(ValueError, match="eps"):
        T.rms_norm(torch.randn(2, 4), torch.ones(4), eps)


@pytest.mark.parametrize("k", [True, 0, 5, 2.0, None])
def test_softmax_topk_refuses_a_k_outside_its_domain(k):
    with pytest.raises(ValueError, match="k must be an integer in 1..4"):
        T.softmax_topk(torch.randn(2, 4), k, True)

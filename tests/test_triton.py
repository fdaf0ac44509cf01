"""The Triton kernels (moespec.kernels.triton_experts) against the float64 reference, run by Triton's CPU interpreter
(conftest sets TRITON_INTERPRET=1 where no CUDA device exists) on the CPU kernels' edge shapes.

Tolerances, on the largest absolute error over the largest absolute reference output: fp32 1e-5 (fp32
products and accumulation); bf16 2e-2 (x and h rounded to bf16 before their products, as on the tensor
cores, and the output rounded once: observed ~7e-3)."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import SHAPES, make, rel_err

from moespec import MoespecError
from moespec import kernels as K

pytest.importorskip("triton")
T = pytest.importorskip("moespec.kernels.triton_experts")

TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}
DTYPES = [torch.float32, torch.bfloat16]
# The interpreter runs every program in Python: the first five edge shapes (n = 1, all tokens on the same
# experts, m = N - 1, prime N, n = 9 with OLMoE's m = 8 of N = 64) keep the module near ten seconds.
INTERPRETED_SHAPES = SHAPES[:5]


def run(kernel, x, ids, weights, gate_up, down, gub=None, db=None, act=K.SILU):
    return T.expert_op(kernel, x, ids, weights, gate_up, down, gub, db, act.kind, act.alpha, act.limit)


@pytest.fixture(autouse=True)
def interpreter_only():
    if not T.interpreted():
        pytest.skip("a CUDA device is present: benchmarks/gpu_expert_op.py checks the kernels there")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", INTERPRETED_SHAPES, ids=[s[0] for s in INTERPRETED_SHAPES])
@pytest.mark.parametrize("kernel", ["slot", "dedup"])
def test_triton_matches_reference(kernel, shape, dtype):
    _, n, m, N, d, f, same = shape
    args = make(n, m, N, d, f, dtype, same)
    y = run(kernel, *args)
    assert y.dtype == dtype and y.shape == (n, d)
    assert rel_err(y, K.reference_float64(*args)) < TOL[dtype]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("act", [K.SILU, K.GPT_OSS], ids=["silu", "gpt-oss"])
@pytest.mark.parametrize("kernel", ["slot", "dedup"])
def test_triton_biases_and_activations(kernel, act, dtype):
    args = make(6, 3, 7, 45, 21, dtype, bias=True, seed=3)
    assert rel_err(run(kernel, *args, act=act), K.reference_float64(*args, act=act)) < TOL[dtype]


@pytest.mark.parametrize("kernel", ["slot", "dedup"])
def test_triton_largest_pass_and_int32_ids(kernel):
    """n = TOKENS_MAX fills the dedup kernel's token tile; ids may come as int32."""
    x, ids, w, gu, dn, gub, db = make(T.TOKENS_MAX, 3, 11, 32, 16, torch.float32, seed=4)
    ref = K.reference_float64(x, ids, w, gu, dn)
    assert rel_err(run(kernel, x, ids.to(torch.int32), w, gu, dn), ref) < TOL[torch.float32]


def test_triton_kernels_agree_with_each_other_and_are_repeatable():
    args = make(5, 4, 13, 48, 24, torch.bfloat16, seed=7)
    slot, dedup = run("slot", *args), run("dedup", *args)
    assert rel_err(slot, dedup.double()) < TOL[torch.bfloat16]
    assert torch.equal(run("dedup", *args), dedup)


def test_triton_masks_out_of_range_ids():
    """An id outside [0, N) reads and adds nothing (moespec.kernels rejects such ids before they get here)."""
    x, ids, w, gu, dn, _, _ = make(3, 2, 5, 16, 8, torch.float32, seed=2)
    bad = ids.clone()
    bad[1, 0] = 5
    keep = w.clone()
    keep[1, 0] = 0.0
    for kernel in ("slot", "dedup"):
        assert rel_err(run(kernel, x, bad, w, gu, dn), K.reference_float64(x, ids, keep, gu, dn)) < 1e-5


def test_triton_rejects_what_it_cannot_run():
    x, ids, w, gu, dn, _, _ = make(T.TOKENS_MAX + 1, 2, 5, 16, 8, torch.float32)
    with pytest.raises(MoespecError, match="at most"):
        run("dedup", x, ids, w, gu, dn)
    small = make(2, 2, 5, 16, 8, torch.float64)
    with pytest.raises(MoespecError, match="weights"):
        run("slot", *small[:5])
    with pytest.raises(MoespecError, match="unknown"):
        run("both", *make(2, 2, 5, 16, 8, torch.float32)[:5])


def test_implementation_names_triton_on_cuda():
    assert K.implementation("slot", torch.bfloat16, "cuda") == "triton"
    assert K.implementation("dedup", torch.float32, "cuda:0") == "triton"
    assert K.implementation("torch-slot", torch.bfloat16, "cuda") == "torch"

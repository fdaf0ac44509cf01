"""Every expert kernel (ours, native and fallback, and the installed peers) against the float64 reference on
edge shapes, plus the byte model and the layout conversion of transformers' experts modules.

Tolerances, on the largest absolute error divided by the largest absolute reference output:
- fp32: 1e-5 for every kernel (all accumulate in fp32; observed ~4e-7);
- bf16: 3e-2 for every kernel. The pure-torch fallback and HF peers round the gate/up products, h and each slot's
  output to bf16 on the way; our native kernels accumulate in fp32 and round h (as the model's bf16 forward does)
  and the output: a few 2^-9 roundings, which a sum that cancels makes larger relative to its result (TOL).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_cases import SHAPES, make, rel_err

from moespec import MoespecError
from moespec import kernels as K
from moespec.kernels import native

# bf16: a sum that cancels (d = 1: one down row of f terms) keeps a few bf16 ulps of its terms: 1.3% at worst over
# 3,000 random shapes of test_native_random_shapes' space for our native kernels.
TOL = {
    ("native", torch.float32): 1e-5, ("native", torch.bfloat16): 3e-2,
    ("torch", torch.float32): 1e-5, ("torch", torch.bfloat16): 3e-2,
    ("peer", torch.float32): 1e-5, ("peer", torch.bfloat16): 3e-2,
}
DTYPES = [torch.float32, torch.bfloat16]
HF = ["hf-batched_mm", "hf-grouped_mm", "hf-eager"]

def ours_tol(dtype: torch.dtype) -> float:
    """Our kernels' tolerance: native when the library runs here, else the torch fallback's."""
    return TOL[K.implementation("slot", dtype), dtype]


def run_hf(kernel, *args, act=K.SILU):
    """A peer's output, or a skip when torch's CPU grouped_mm refuses the shape (its own limitation:
    operand strides must be multiples of 16 bytes, so d and f must be multiples of 8 in bf16, 4 in fp32)."""
    try:
        return K.expert_op(kernel, *args, act=act)
    except RuntimeError as err:
        if kernel == "hf-grouped_mm" and "multiple of 16" in str(err):
            pytest.skip(f"torch grouped_mm on CPU: {err}")
        raise


@pytest.fixture
def torch_fallback(monkeypatch):
    """Runs our kernels as if the native library were unavailable."""
    monkeypatch.setattr(native, "load", lambda: None)
    assert K.implementation("slot") == "torch"


def test_native_builds_here():
    if native._cpu_supported() or native._compiler() is None or os.environ.get("MOESPEC_NATIVE") == "0":
        pytest.skip(f"no native kernels on this machine: {native.status()}")
    assert native.load() is not None, native.status()
    assert K.implementation("slot", torch.bfloat16) == "native"
    assert K.implementation("dedup", torch.float32) == "native"
    assert K.implementation("dedup", torch.float16) == "torch"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=[s[0] for s in SHAPES])
@pytest.mark.parametrize("kernel", ["slot", "dedup"])
def test_ours_native_match_reference(kernel, shape, dtype):
    _, n, m, N, d, f, same = shape
    args = make(n, m, N, d, f, dtype, same)
    ref = K.reference_float64(*args)
    y = K.expert_op(kernel, *args)
    assert y.dtype == dtype and y.shape == (n, d)
    assert rel_err(y, ref) < ours_tol(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("act", [K.SILU, K.GPT_OSS], ids=["silu", "gpt-oss"])
@pytest.mark.parametrize("kernel", ["slot", "dedup"])
def test_ours_native_biases_and_activations(kernel, act, dtype):
    args = make(6, 3, 7, 45, 21, dtype, bias=True, seed=3)
    ref = K.reference_float64(*args, act=act)
    assert rel_err(K.expert_op(kernel, *args, act=act), ref) < ours_tol(dtype)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_native_thread_counts_agree(threads):
    args = make(9, 4, 11, 1030, 200, torch.float32, seed=5)
    ref = K.reference_float64(*args)
    for kernel in ("slot", "dedup"):
        assert rel_err(K.expert_op(kernel, *args, threads=threads), ref) < ours_tol(torch.float32)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES[:5], ids=[s[0] for s in SHAPES[:5]])
@pytest.mark.parametrize("kernel", ["slot", "dedup", "torch-slot", "torch-dedup"])
def test_ours_fallback_match_reference(torch_fallback, kernel, shape, dtype):
    """Our kernels without the native library, and the torch-loop peers, which are that same code."""
    _, n, m, N, d, f, same = shape
    args = make(n, m, N, d, f, dtype, same, bias=True)
    for act in (K.SILU, K.GPT_OSS):
        ref = K.reference_float64(*args, act=act)
        assert rel_err(K.expert_op(kernel, *args, act=act), ref) < TOL["torch", dtype]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES[:5], ids=[s[0] for s in SHAPES[:5]])
@pytest.mark.parametrize("kernel", HF)
def test_hf_peers_match_reference(kernel, shape, dtype):
    _, n, m, N, d, f, same = shape
    args = make(n, m, N, d, f, dtype, same)
    ref = K.reference_float64(*args)
    assert rel_err(run_hf(kernel, *args), ref) < TOL["peer", dtype]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kernel", HF)
def test_hf_peers_gpt_oss_with_biases(kernel, dtype):
    args = make(5, 2, 7, 40, 24, dtype, bias=True, seed=1)
    ref = K.reference_float64(*args, act=K.GPT_OSS)
    assert rel_err(run_hf(kernel, *args, act=K.GPT_OSS), ref) < TOL["peer", dtype]


def test_hf_silu_peers_refuse_biases():
    with pytest.raises(MoespecError, match="biases"):
        K.expert_op("hf-eager", *make(2, 2, 5, 16, 8, torch.float32, bias=True))


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 9), N=st.integers(2, 17), d=st.integers(1, 70), f=st.integers(1, 40),
       bf16=st.booleans(), dedup=st.booleans(), bias=st.booleans(), seed=st.integers(0, 2**16))
def test_native_random_shapes(n, N, d, f, bf16, dedup, bias, seed):
    m = 1 + seed % (N - 1)
    dtype = torch.bfloat16 if bf16 else torch.float32
    args = make(n, m, N, d, f, dtype, same=seed % 3 == 0, bias=bias, seed=seed)
    act = K.GPT_OSS if seed % 2 else K.SILU
    ref = K.reference_float64(*args, act=act)
    if ref.abs().max() == 0:
        return
    y = K.expert_op("dedup" if dedup else "slot", *args, act=act)
    assert rel_err(y, ref) < ours_tol(dtype)


def test_mixed_dtypes_and_int32_ids():
    x, ids, w, gu, dn, _, _ = make(4, 3, 9, 33, 17, torch.bfloat16)
    ref = K.reference_float64(x.float(), ids, w.float(), gu, dn)
    for kernel in ("slot", "dedup"):
        y = K.expert_op(kernel, x.float(), ids.to(torch.int32), w.float(), gu, dn)
        assert y.dtype == torch.float32
        assert rel_err(y, ref) < ours_tol(torch.bfloat16)


@pytest.mark.parametrize("kernel", list(K.KERNELS))
def test_bad_ids_and_shapes_are_rejected(kernel):
    x, ids, w, gu, dn, _, _ = make(2, 2, 5, 16, 8, torch.float32)
    with pytest.raises(MoespecError, match="ids"):
        K.expert_op(kernel, x, ids + 5, w, gu, dn)
    with pytest.raises(MoespecError):
        K.expert_op(kernel, x, ids, w, gu, dn[:, :, :7])
    with pytest.raises(MoespecError):
        K.expert_op(kernel, x, ids.float(), w, gu, dn)


def test_unknown_kernel_and_activation():
    with pytest.raises(MoespecError, match="unknown kernel"):
        K.expert_op("nope", *make(1, 1, 2, 4, 4, torch.float32))
    with pytest.raises(MoespecError, match="activation"):
        K.Activation("relu")


def test_requested_bytes():
    x, ids, w, gu, dn, gub, db = make(3, 2, 6, 16, 8, torch.bfloat16, bias=True)
    ids = torch.tensor([[0, 1], [1, 2], [0, 1]])
    b = (2 * 8 * 16 + 16 * 8 + 2 * 8 + 16) * 2
    assert K.expert_bytes(gu, dn, gub, db) == b
    assert K.distinct_experts(ids) == 3
    for kernel in ("slot", "hf-batched_mm", "reference"):
        assert K.requested_bytes(kernel, ids, gu, dn, gub, db) == 6 * b
    for kernel in ("dedup", "hf-grouped_mm", "hf-eager"):
        assert K.requested_bytes(kernel, ids, gu, dn, gub, db) == 3 * b


def test_registry():
    assert {"reference", "slot", "dedup", "torch-slot", "torch-dedup", "hf-batched_mm", "hf-grouped_mm",
            "hf-eager"} <= set(K.KERNELS)
    assert all(k.kind in ("slot", "dedup") for k in K.KERNELS.values())


def test_from_hf_experts_olmoe_shares_weights():
    from transformers import OlmoeConfig
    from transformers.models.olmoe.modeling_olmoe import OlmoeExperts

    torch.manual_seed(0)
    module = OlmoeExperts(OlmoeConfig(hidden_size=24, intermediate_size=8, num_experts=5))
    for p in module.parameters():
        torch.nn.init.normal_(p, std=0.3)
    gate_up, down, gub, db, act = K.from_hf_experts(module)
    assert gate_up.data_ptr() == module.gate_up_proj.data_ptr() and gub is None and db is None and act == K.SILU
    x, ids, w = torch.randn(4, 24), torch.tensor([[0, 1], [2, 4], [1, 3], [4, 0]]), torch.rand(4, 2)
    with torch.no_grad():
        hf = module(x, ids, w)
    assert rel_err(hf, K.reference_float64(x, ids, w, gate_up, down, act=act)) < 1e-5


def test_from_hf_experts_gpt_oss_layout():
    from transformers import GptOssConfig
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts

    torch.manual_seed(0)
    config = GptOssConfig(hidden_size=24, intermediate_size=8, num_local_experts=5)
    config._experts_implementation = "eager"
    module = GptOssExperts(config)
    for p in module.parameters():
        torch.nn.init.normal_(p, std=0.5)
    gate_up, down, gub, db, act = K.from_hf_experts(module)
    assert gate_up.shape == (5, 16, 24) and down.shape == (5, 24, 8) and act.kind == "gpt-oss"
    x, ids, w = torch.randn(4, 24), torch.tensor([[0, 1], [2, 4], [1, 3], [4, 0]]), torch.rand(4, 2)
    with torch.no_grad():
        hf = module(x, ids, w)
    ref = K.reference_float64(x, ids, w, gate_up, down, gub, db, act=act)
    assert rel_err(hf, ref) < 1e-5
    assert rel_err(K.expert_op("dedup", x, ids, w, gate_up, down, gub, db, act=act), ref) < 1e-5


MLX = [k for k in ("mlx-gather", "mlx-sorted") if k in K.KERNELS]


@pytest.mark.skipif(not MLX, reason="optional peer: pip install 'mlx[cpu]' mlx-lm")
@pytest.mark.parametrize("shape", SHAPES[:5], ids=[s[0] for s in SHAPES[:5]])
@pytest.mark.parametrize("kernel", MLX or ["mlx"])
def test_mlx_peers_match_reference(kernel, shape):
    _, n, m, N, d, f, same = shape
    for act, bias in ((K.SILU, False), (K.GPT_OSS, True)):
        args = make(n, m, N, d, f, torch.float32, same, bias=bias)
        ref = K.reference_float64(*args, act=act)
        assert rel_err(K.expert_op(kernel, *args, act=act), ref) < TOL["peer", torch.float32]


@pytest.mark.skipif(not MLX, reason="optional peer: pip install 'mlx[cpu]' mlx-lm")
def test_mlx_peers_refuse_bf16_on_cpu():
    with pytest.raises(MoespecError, match="float32"):
        K.expert_op(MLX[0], *make(2, 2, 5, 16, 8, torch.bfloat16))


@pytest.mark.skipif("ggml-mul_mat_id" not in K.KERNELS, reason="optional peer: pip install ggml-python")
@pytest.mark.parametrize("kernel", ["ggml-mul_mat_id", "ggml-per-slot"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES[:5], ids=[s[0] for s in SHAPES[:5]])
def test_ggml_peer_matches_reference(shape, dtype, kernel):
    _, n, m, N, d, f, same = shape
    for act, bias in ((K.SILU, False), (K.GPT_OSS, True)):
        args = make(n, m, N, d, f, dtype, same, bias=bias)
        ref = K.reference_float64(*args, act=act)
        assert rel_err(K.expert_op(kernel, *args, act=act), ref) < TOL["peer", dtype]


@pytest.mark.skipif("ggml-mul_mat_id" not in K.KERNELS, reason="optional peer: pip install ggml-python")
def test_ggml_per_slot_holds_a_pass_of_72_tokens():
    """A pass of B = 8 sequences x 9 tokens: the per-slot graph's chain of concatenations grows with n^2 and must fit
    the ggml context (ggml aborts the process when it does not)."""
    args = make(72, 8, 16, 512, 64, torch.bfloat16)
    assert rel_err(K.expert_op("ggml-per-slot", *args), K.reference_float64(*args)) < TOL["peer", torch.bfloat16]


@pytest.mark.skipif("ggml-mul_mat_id" not in K.KERNELS, reason="optional peer: pip install ggml-python")
def test_ggml_per_slot_holds_more_nodes_than_ggmls_default_graph():
    """300 tokens: one node group per token, past the 2048 nodes of ggml's default graph (ggml aborts past its size)."""
    args = make(300, 2, 5, 16, 8, torch.float32)
    assert rel_err(K.expert_op("ggml-per-slot", *args), K.reference_float64(*args)) < TOL["peer", torch.float32]


def test_biases_in_another_dtype_are_converted():
    x, ids, w, gu, dn, gub, db = make(3, 2, 5, 24, 16, torch.bfloat16, bias=True, seed=2)
    ref = K.reference_float64(x, ids, w, gu, dn, gub, db)
    for kernel in ("slot", "dedup"):
        y = K.expert_op(kernel, x, ids, w, gu, dn, gub.float(), db.double())
        assert rel_err(y, ref) < ours_tol(torch.bfloat16)


AVX2_CHECK = """
import torch
from moespec import kernels as K
from moespec.kernels import dense
gen = torch.Generator().manual_seed(0)
for mode in ("slot", "dedup"):
    for n in (1, 2, 9):
        x = torch.randn(n, 64, generator=gen).bfloat16()
        ids = torch.stack([torch.randperm(8, generator=gen)[:2] for _ in range(n)])
        w = torch.softmax(torch.randn(n, 2, generator=gen), -1).bfloat16()
        gu = (0.1 * torch.randn(8, 64, 64, generator=gen)).bfloat16()
        dn = (0.1 * torch.randn(8, 64, 32, generator=gen)).bfloat16()
        got = K.expert_op(mode, x, ids, w, gu, dn).float()
        ref = K.reference_float64(x, ids, w, gu, dn).float()
        assert torch.allclose(got, ref, atol=2e-2, rtol=2e-2), (mode, n, (got - ref).abs().max())
x, wt = torch.randn(9, 130, generator=gen).bfloat16(), torch.randn(33, 130, generator=gen).bfloat16()
ref = dense.linear_reference(x, wt).float()
assert torch.allclose(dense.linear(x, wt).float(), ref, atol=0.1, rtol=2 ** -7)
assert not dense.has_dot_path()
print("avx2 paths ok")
"""


ONE_TOKEN_CHECK = """
import numpy as np
import torch
from moespec import kernels as K
from moespec.kernels import dense, native
gen = torch.Generator().manual_seed(1)
for dtype in (torch.float32, torch.bfloat16):
    for mode in ("slot", "dedup"):
        x = torch.randn(1, 70, generator=gen).to(dtype)  # rows of 70 and 37: tiles of 4 rows and a remainder
        ids = torch.randperm(7, generator=gen)[:3].reshape(1, 3)
        w = torch.softmax(torch.randn(1, 3, generator=gen), -1).to(dtype)
        gu = (0.1 * torch.randn(7, 74, 70, generator=gen)).to(dtype)
        dn = (0.1 * torch.randn(7, 70, 37, generator=gen)).to(dtype)
        got = K.expert_op(mode, x, ids, w, gu, dn).double()
        ref = K.reference_float64(x, ids, w, gu, dn)
        assert torch.allclose(got, ref, atol=2e-2, rtol=2e-2), (dtype, mode, (got - ref).abs().max())
    x, wt = torch.randn(1, 130, generator=gen).to(dtype), torch.randn(35, 130, generator=gen).to(dtype)
    ref = dense.linear_reference(x, wt).float()
    assert torch.allclose(dense.linear(x, wt).float(), ref, atol=0.1, rtol=2 ** -7), dtype
words = torch.randint(-2 ** 62, 2 ** 62, (65540,), dtype=torch.int64, generator=gen)  # past the prefetch, a tail
for threads in (1, 2, 3):  # the streaming read (the ceiling) reads every word: the xor of all of them
    got = native.load().moespec_stream_read(words.data_ptr(), words.numel() * 8, threads)
    assert got == int(np.bitwise_xor.reduce(words.numpy().view(np.uint64))), threads
print("one-token path ok")
"""


@pytest.mark.parametrize("path", ["rows", "tiles"])
@pytest.mark.parametrize("dot", ["0", "1"])
def test_both_one_token_paths_match_the_reference(path: str, dot: str) -> None:
    """MOESPEC_NATIVE_ONE_TOKEN takes the one-token path of the CPU's other vendor (rows one after the other, or
    prefetched tiles; the streaming read without or with its prefetch): both, on both bf16 paths and fp32, against
    the reference (a fresh process: read once)."""
    env = {**os.environ, "MOESPEC_NATIVE_ONE_TOKEN": path, "MOESPEC_NATIVE_DOT": dot}
    proc = subprocess.run([sys.executable, "-c", ONE_TOKEN_CHECK], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "one-token path ok" in proc.stdout, proc.stderr[-2000:]


WIDE_CHECK = """
import torch
from kernel_cases import SHAPES, make, rel_err
from moespec import kernels as K
for name, n, m, N, d, f, same in SHAPES:
    for mode in ("slot", "dedup"):
        args = make(n, m, N, d, f, torch.bfloat16, same=same, bias=True)
        ref = K.reference_float64(*args, act=K.GPT_OSS)
        assert rel_err(K.expert_op(mode, *args, act=K.GPT_OSS), ref) < 3e-2, (name, mode)
print("wide tiles ok")
"""


def test_the_wide_tiles_run_where_the_cpu_has_amx():
    """MOESPEC_NATIVE_AMX=0 keeps experts of many tokens on the 512-bit wide tiles, the path of every CPU without AMX,
    checked against the reference on the edge shapes even where the CPU has AMX (a fresh process: read once); the
    in-process tests above run the AMX tiles where the CPU has them."""
    env = {**os.environ, "MOESPEC_NATIVE_AMX": "0", "PYTHONPATH": os.path.dirname(__file__)}
    proc = subprocess.run([sys.executable, "-c", WIDE_CHECK], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "wide tiles ok" in proc.stdout, proc.stderr[-2000:]


def test_the_library_builds_without_the_amx_tiles(tmp_path):
    """A compiler without the tile intrinsics (GCC < 11, Clang < 12) still builds every source: amx_tiles.h's guard,
    checked here by defining MOESPEC_NO_AMX (the kernels then keep the wide tiles; MOESPEC_NATIVE_AMX=0 runs them)."""
    cxx = native._compiler()
    if cxx is None or native._cpu_supported():
        pytest.skip(f"no native kernels on this machine: {native.status()}")
    # -O0 after the build's -O3: the guard is the preprocessor's, and intrinsics of a missing target still fail
    proc = subprocess.run([cxx, *native.CXXFLAGS, "-O0", "-DMOESPEC_NO_AMX", *map(str, native.SOURCES), "-o",
                           str(tmp_path / "no_amx.so")], capture_output=True, text=True, timeout=native.BUILD_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_the_avx2_paths_run_where_the_cpu_has_the_dot_instructions(tmp_path):
    """MOESPEC_NATIVE_DOT=0 keeps the bf16 kernels on their AVX2 path: the path of every AVX2-only machine, checked
    against the reference even on a CPU with AVX512-BF16 (a fresh process: the switch is read once)."""
    env = {**os.environ, "MOESPEC_NATIVE_DOT": "0"}
    proc = subprocess.run([sys.executable, "-c", AVX2_CHECK], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "avx2 paths ok" in proc.stdout, proc.stderr[-2000:]

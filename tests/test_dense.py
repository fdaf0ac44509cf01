"""Tests of the native dense linear layer (moespec.kernels.dense, csrc/dense_kernels.cpp) against `linear_reference`.

Tolerances. Both sides accumulate in fp32, in different orders, so on random inputs they agree to a few
fp32 roundings of the sum of |products|: |y - ref| <= 1e-5 * (|x| @ |W|^T + |b|) elementwise, a bound
relative to that absolute sum rather than to y, which can cancel to ~0. A bf16 output is one rounding of
the fp32 result, so it lies within 2^-8 * |ref| (one bf16 rounding, with room for the fp32 differences to
flip a tie) of the unrounded fp32 reference, plus the same fp32 term. On small-integer inputs every
product and partial sum is exact in fp32, so there the native result must equal the reference bit for
bit, in every dtype, shape, tail and path; that is what pins down indexing, tails and bias handling.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys

import pytest
import torch

from moespec.kernels import dense, native

pytestmark = pytest.mark.skipif(not dense.available(), reason=f"native dense kernels: {dense.status()}")

BF16, F32 = torch.bfloat16, torch.float32
# (K, M): K below, at and past a 16-column step, odd, not a multiple of 8 or 16; M below and past the
# 4-row tile, and 1001 rows of K = 130 (several row tasks with a remainder row).
SHAPES = [(7, 1), (13, 3), (16, 5), (33, 33), (130, 1001), (2049, 33)]
# one token; each path's 2-row tiles (fma n = 2, dot n = 4..6); a single block of 3; blocks of 2 and 3 (bf16 weights
# on the fma path: blocks of 2, one of 3 where n is odd; fp32: blocks of 3)
NS = [1, 2, 3, 5, 9, 16]
PATHS = ["auto", "fma"]  # auto: the dot path for bf16 x bf16 where the CPU has AVX512-BF16
# The AMX path's (K, M): K one and many tiles of 32 columns; M below one 16-row tile, one tile and a tail, a 32-row
# block and a tail, several row tasks (100 rows of K = 2048: 128-row tasks, so one task and a 4-row tail)
LANE_NS = [1, 7, 8, 9, 16, 17, 24, 33, 72, 256]  # one panel of 8 or 16, a padded last panel, to the most rows
AMX_SHAPES = [(32, 1), (64, 15), (96, 17), (160, 33), (2048, 100), (64, 300)]
AMX_NS = [1, 2, 5, 16, 17, 33, 72, 256]  # to the most rows it takes; token blocks of 16 and 32, and their tails
needs_amx = pytest.mark.skipif(not dense.amx_path(), reason="no AMX tiles granted to this process")


def _ints(shape, dtype, gen, lo=-4, hi=5):
    return torch.randint(lo, hi, shape, generator=gen).to(dtype)


def _check_close(y: torch.Tensor, x, w, b):
    """y within the module docstring's tolerance of the fp32 reference."""
    ref = x.float() @ w.float().T + (0 if b is None else b.float())
    mag = x.float().abs() @ w.float().abs().T + (0 if b is None else b.float().abs())
    tol = 1e-5 * mag + 1e-30
    if y.dtype == BF16:
        tol = tol + 2.0 ** -8 * ref.abs()
    err = (y.float() - ref).abs()
    assert bool((err <= tol).all()), f"max excess {float((err - tol).max()):.3g} (max err {float(err.max()):.3g})"


@pytest.mark.parametrize("isa", PATHS)
@pytest.mark.parametrize("wdtype,xdtype", list(itertools.product([BF16, F32], repeat=2)))
@pytest.mark.parametrize("K,M", SHAPES)
def test_exact_on_integers(K, M, wdtype, xdtype, isa):
    gen = torch.Generator().manual_seed(K * 1000 + M)
    w = _ints((M, K), wdtype, gen)
    for n, with_bias in itertools.product(NS, [False, True]):
        x = _ints((n, K), xdtype, gen)
        b = _ints((M,), wdtype, gen, -50, 51) if with_bias else None
        y = dense.linear(x, w, b, isa=isa)
        assert y.shape == (n, M) and y.dtype == xdtype
        assert torch.equal(y, dense.linear_reference(x, w, b)), (n, with_bias)


@pytest.mark.parametrize("isa", PATHS)
@pytest.mark.parametrize("wdtype,xdtype", list(itertools.product([BF16, F32], repeat=2)))
@pytest.mark.parametrize("K,M", SHAPES)
def test_random_within_tolerance(K, M, wdtype, xdtype, isa):
    gen = torch.Generator().manual_seed(7 * K + M)
    w = torch.randn(M, K, generator=gen).to(wdtype)
    for n, with_bias in itertools.product(NS, [False, True]):
        x = torch.randn(n, K, generator=gen).to(xdtype)
        b = torch.randn(M, generator=gen).to(wdtype) if with_bias else None
        _check_close(dense.linear(x, w, b, isa=isa), x, w, b)


def test_all_equal_rows_give_equal_outputs():
    """Every row of W is the same and the values are exact, so every output column must be the same."""
    gen = torch.Generator().manual_seed(3)
    for wdtype, (K, M) in itertools.product([BF16, F32], [(13, 7), (2049, 37)]):
        w = _ints((1, K), wdtype, gen).expand(M, K).contiguous()
        x = _ints((9, K), BF16, gen)
        y = dense.linear(x, w)
        assert torch.equal(y, y[:, :1].expand_as(y))
        assert torch.equal(y, dense.linear_reference(x, w))


def test_paths_agree_and_threads_do_not_change_the_result():
    gen = torch.Generator().manual_seed(5)
    w = torch.randn(515, 1037, generator=gen).to(BF16)
    x = torch.randn(9, 1037, generator=gen).to(BF16)
    for isa in PATHS:
        ys = [dense.linear(x, w, isa=isa, threads=t) for t in (1, 2, 3)]
        assert all(torch.equal(ys[0], y) for y in ys[1:])  # each row is summed by one thread, in one order
        _check_close(ys[0], x, w, None)


@pytest.mark.skipif(not dense.has_dot_path(), reason="CPU without AVX512-BF16")
def test_dot_path_on_request():
    gen = torch.Generator().manual_seed(9)
    w, x = _ints((33, 2049), BF16, gen), _ints((16, 2049), BF16, gen)
    assert torch.equal(dense.linear(x, w, isa="dot"), dense.linear_reference(x, w))
    with pytest.raises(ValueError, match="dot"):
        dense.linear(x.float(), w, isa="dot")


def test_mixed_bias_dtype_and_large_values():
    gen = torch.Generator().manual_seed(11)
    w = torch.randn(40, 24, generator=gen).to(BF16)
    x = (1e4 * torch.randn(3, 24, generator=gen)).to(BF16)
    b = torch.randn(40, generator=gen)  # fp32 bias with bf16 weights
    _check_close(dense.linear(x, w, b), x, w, b)


def test_leading_dims_flatten_and_strided_x():
    gen = torch.Generator().manual_seed(13)
    w = torch.randn(21, 19, generator=gen)
    x = torch.randn(2, 3, 19, generator=gen)
    y = dense.linear(x, w)
    assert y.shape == (2, 3, 21)
    _check_close(y.reshape(6, 21), x.reshape(6, 19), w, None)
    x1 = torch.randn(19, generator=gen)  # a single token without a batch dim
    assert dense.linear(x1, w).shape == (21,)
    wide = torch.randn(5, 40, generator=gen)
    cases = [wide[:, 3:22],  # row stride 40 > K: passed as ldx
             torch.randn(19, 5, generator=gen).T,  # column stride 5: copied
             torch.randn(19, generator=gen).expand(4, 19)]  # row stride 0: copied
    for xs in cases:
        _check_close(dense.linear(xs, w), xs, w, None)


def test_zero_size_shapes_follow_the_reference():
    w = torch.randn(6, 4)
    assert dense.linear(torch.randn(0, 4), w).shape == (0, 6)
    b = torch.randn(6)
    assert torch.equal(dense.linear(torch.randn(3, 0), torch.randn(6, 0), b), b.expand(3, 6))


def test_rejects_bad_inputs_before_native_code():
    w, x = torch.randn(8, 16), torch.randn(2, 16)
    with pytest.raises(ValueError, match="at most 16"):
        dense.linear(torch.randn(17, 16), w)
    with pytest.raises(ValueError, match="at most 16"):
        dense.linear(torch.randn(3, 6, 16), w)
    with pytest.raises(ValueError, match="^x is on meta"):
        dense.linear(torch.empty(2, 16, device="meta"), w)
    with pytest.raises(ValueError, match="^weight is on meta"):
        dense.linear(x, torch.empty(8, 16, device="meta"))
    with pytest.raises(ValueError, match="^bias is on meta"):
        dense.linear(x, w, torch.empty(8, device="meta"))
    with pytest.raises(ValueError, match="weight must be 2-D"):
        dense.linear(x, torch.randn(2, 8, 16))
    with pytest.raises(ValueError, match=r"must be \[\.\.\., K=16\]"):
        dense.linear(torch.randn(2, 15), w)
    with pytest.raises(ValueError, match=r"bias \(7,\) must be \[M=8\]"):
        dense.linear(x, w, torch.randn(7))
    with pytest.raises(ValueError, match="not contiguous"):
        dense.linear(x, torch.randn(16, 8).T)
    with pytest.raises(ValueError, match="float16"):
        dense.linear(x.half(), w)
    with pytest.raises(ValueError, match="int64"):
        dense.linear(x, w.long())
    with pytest.raises(ValueError, match="x must be a torch.Tensor"):
        dense.linear([[1.0] * 16], w)
    with pytest.raises(ValueError, match="isa"):
        dense.linear(x, w, isa="avx512")


def test_rejects_cuda_tensors():
    try:
        xc = torch.empty(2, 16, device="cuda")
    except (RuntimeError, AssertionError) as err:  # a CPU-only torch cannot build one
        pytest.skip(f"no CUDA tensor here: {err}")
    with pytest.raises(ValueError, match="^x is on cuda"):
        dense.linear(xc, torch.randn(8, 16))


def test_native_entry_point_rejects_bad_arguments():
    """The C ABI's own checks, for callers other than `linear`: return codes, nothing written."""
    lib = native.load()
    x, w, y = torch.randn(2, 16), torch.randn(8, 16), torch.zeros(2, 8)
    px, pw, py = x.data_ptr(), w.data_ptr(), y.data_ptr()

    def call(wd=0, xd=0, bd=0, yd=0, n=2, K=16, M=8, x=px, ldx=16, w=pw, b=None, y=py, ldy=8, isa=0):
        return lib.moespec_linear(wd, xd, bd, yd, n, K, M, x, ldx, w, b, y, ldy, 1, isa)

    assert call() == 0 and torch.allclose(y, x @ w.T, rtol=1e-5, atol=1e-5)
    y.zero_()
    assert [call(wd=2), call(yd=-1), call(isa=5), call(isa=-1)] == [1, 1, 1, 1]
    assert [call(n=0), call(n=17), call(K=0), call(M=0), call(ldx=15), call(ldy=7)] == [2] * 6
    assert [call(x=None), call(w=None), call(y=None)] == [3, 3, 3]
    assert call(isa=2) == 4 and call(isa=3) == 4  # fp32 weights take neither the dot path nor the tiles
    assert call(isa=3, n=257) == 2 and call(isa=4, n=257) == 2  # past the AMX and lanes paths' rows
    assert not y.any()
    assert call(isa=4, n=2) == 0 and torch.allclose(y, x @ w.T, rtol=1e-5, atol=1e-5)


def test_status_names_the_library():
    assert dense.status().startswith("native (")


@pytest.mark.skipif(not dense.packs_bf16(), reason="torch's oneDNN does not pack bf16 on this CPU")
@pytest.mark.parametrize("n", [5, 17, 72])
def test_packed_linear_equals_torch(n):
    gen = torch.Generator().manual_seed(n)
    w = torch.randn(96, 64, generator=gen).bfloat16()
    b = torch.randn(96, generator=gen).bfloat16()
    x = torch.randn(n, 64, generator=gen).bfloat16()
    packed = dense.pack(w)
    torch.testing.assert_close(dense.packed_linear(x, packed), torch.nn.functional.linear(x, w), atol=0, rtol=0)
    torch.testing.assert_close(dense.packed_linear(x, packed, b), torch.nn.functional.linear(x, w, b),
                               atol=1e-2, rtol=1e-2)


def test_pack_is_none_where_onednn_refuses_bf16(monkeypatch):
    """A CPU without AVX512-BW/VL/DQ or AVX-NE-CONVERT: torch's reorder raises, so nothing is packed and the engine's
    bf16 calls past the native rows run in native row blocks."""
    def refuse(*args):
        raise RuntimeError("mkldnn_reorder_linear_weight: bf16 path needs the cpu support avx_ne_convert")

    monkeypatch.setattr(torch.ops.mkldnn, "_reorder_linear_weight", refuse)
    dense.packs_bf16.cache_clear()
    try:
        assert not dense.packs_bf16() and dense.pack(torch.ones(8, 4, dtype=torch.bfloat16)) is None
    finally:
        monkeypatch.undo()
        dense.packs_bf16.cache_clear()
    assert dense.packs_bf16() == (dense.pack(torch.ones(8, 4, dtype=torch.bfloat16)) is not None)


def test_pack_takes_contiguous_cpu_bf16_matrices_only():
    w = torch.randn(8, 4)
    assert dense.pack(w) is None  # fp32: measured no faster, left to F.linear
    assert dense.pack(w.bfloat16().t()) is None and dense.pack(w.bfloat16()[0]) is None
    assert dense.pack(torch.empty(0, 4, dtype=torch.bfloat16)) is None
    rows = torch.zeros(dense.MAX_TOKENS + 1, 4, dtype=torch.bfloat16)  # K = 4: never the tiles' rows
    assert dense.packed_takes(rows) and dense.packed_takes(rows, torch.zeros(8, dtype=torch.bfloat16))
    assert not dense.packed_takes(rows[:-1]) and not dense.packed_takes(rows.float())
    assert not dense.packed_takes(rows, torch.zeros(8))  # an fp32 bias: F.linear


@pytest.mark.parametrize("K,M", SHAPES)
@pytest.mark.parametrize("wdtype,xdtype", list(itertools.product([BF16, F32], repeat=2)))
def test_lanes_path_exact_on_integers(K, M, wdtype, xdtype):
    """The lanes path on request, every dtype: small integers give the reference bit for bit at every row count
    (panels of 16, a last panel of 8 or a padded 16), K across chunks of 256 with tails, M across tiles of 6."""
    gen = torch.Generator().manual_seed(K * 1000 + M)
    w = _ints((M, K), wdtype, gen)
    for n, with_bias in itertools.product(LANE_NS, [False, True]):
        x = _ints((n, K), xdtype, gen)
        b = _ints((M,), wdtype, gen, -50, 51) if with_bias else None
        y = dense.linear(x, w, b, isa="lanes")
        assert y.shape == (n, M) and y.dtype == xdtype
        assert torch.equal(y, dense.linear_reference(x, w, b)), (n, with_bias)


def test_lanes_path_random_within_tolerance_on_any_thread_count():
    gen = torch.Generator().manual_seed(13)
    w, b = torch.randn(515, 2049, generator=gen).to(BF16), torch.randn(515, generator=gen).to(BF16)
    for n in (9, 40, 72):
        x = torch.randn(n, 2049, generator=gen).to(BF16)
        ys = [dense.linear(x, w, b, threads=t, isa="lanes") for t in (1, 2, 3)]
        assert all(torch.equal(ys[0], y) for y in ys[1:])  # each row is summed by one thread, in one order
        _check_close(ys[0], x, w, b)
    with pytest.raises(ValueError, match="at most 256"):
        dense.linear(torch.zeros(257, 64), torch.zeros(8, 64), isa="lanes")


@pytest.mark.parametrize("shape", [(dense.MAX_TOKENS + 1, 96), (40, 96), (300, 96), (2, 23, 100)])
def test_past_the_native_rows_bf16_runs_on_lanes_where_torch_has_no_bf16_gemm(monkeypatch, shape):
    """An AVX2 CPU: nothing packs, so a bf16 call past the native rows runs on the lanes path in blocks of
    LANE_MAX_TOKENS rows (fp32 sums, one rounding: the definition's value up to the order of the fp32 sums); where
    oneDNN packs, it is not taken."""
    monkeypatch.setattr(dense, "amx_path", lambda: False)
    gen = torch.Generator().manual_seed(len(shape))
    x = torch.randn(*shape, generator=gen).bfloat16()
    w = torch.randn(24, shape[-1], generator=gen).bfloat16()
    b = torch.randn(24, generator=gen).bfloat16()
    monkeypatch.setattr(dense, "packs_bf16", lambda: False)
    x2 = x.reshape(-1, shape[-1])
    for bias in (None, b):
        y = dense.linear_if_taken(x, w, bias)
        assert y is not None and y.shape == (*shape[:-1], 24) and y.dtype == torch.bfloat16
        torch.testing.assert_close(y, dense.linear_reference(x, w, bias), atol=2e-2, rtol=1e-2)
        lanes = [dense.linear(x2[i:i + 256], w, bias, isa="lanes") for i in range(0, x2.shape[0], 256)]
        assert torch.equal(y.reshape(x2.shape[0], 24), torch.cat(lanes))
    assert dense.linear_if_taken(x.float(), w.float()) is None  # fp32: torch's GEMM
    monkeypatch.setattr(dense, "packs_bf16", lambda: True)
    assert dense.linear_if_taken(x, w) is None  # oneDNN's packed copy serves it


@pytest.mark.skipif(dense.has_dot_path() or dense.amx_path(), reason="the CPU runs the dot path or the tiles")
def test_auto_takes_the_lanes_path_from_16_rows_of_a_bf16_weight():
    """Without the tiles or the dot path, `auto` runs a bf16 weight on the lanes path from 16 rows, the fma path
    below, and an fp32 weight on the fma path at any rows."""
    gen = torch.Generator().manual_seed(14)
    w, x = torch.randn(40, 300, generator=gen).bfloat16(), torch.randn(16, 300, generator=gen).bfloat16()
    assert torch.equal(dense.linear(x, w), dense.linear(x, w, isa="lanes"))
    assert torch.equal(dense.linear(x[:15], w), dense.linear(x[:15], w, isa="fma"))
    assert torch.equal(dense.linear(x, w.float()), dense.linear(x, w.float(), isa="fma"))


@pytest.mark.parametrize("amx", [False, True])
def test_native_rows_follow_the_tiles(monkeypatch, amx):
    """The native kernel takes bf16 calls of K a multiple of 32 to AMX_MAX_TOKENS rows where the tiles run, every
    other call to MAX_TOKENS; oneDNN's packed copy takes bf16 calls past those rows."""
    monkeypatch.setattr(dense, "amx_path", lambda: amx)
    tiles = torch.zeros(dense.AMX_MAX_TOKENS + 1, 64, dtype=torch.bfloat16)
    most = dense.AMX_MAX_TOKENS if amx else dense.MAX_TOKENS
    assert dense.native_rows(tiles) == most and dense.native_rows(tiles, torch.zeros(8, 64)) == dense.MAX_TOKENS
    assert dense.native_rows(tiles[:, :48]) == dense.native_rows(tiles.float()) == dense.MAX_TOKENS
    assert dense.packed_takes(tiles[:most + 1]) and not dense.packed_takes(tiles[:most])
    assert dense.takes(tiles[:most], torch.zeros(8, 64, dtype=torch.bfloat16))
    assert not dense.takes(tiles[:most + 1], torch.zeros(8, 64, dtype=torch.bfloat16))


@needs_amx
@pytest.mark.parametrize("K,M", AMX_SHAPES)
def test_amx_path_exact_on_integers(K, M):
    """Small integers: the tiles' products and fp32 sums are exact, so every row count, tail and bias gives the
    reference bit for bit."""
    gen = torch.Generator().manual_seed(K * 1000 + M)
    w = _ints((M, K), BF16, gen)
    for n, with_bias in itertools.product(AMX_NS, [False, True]):
        x = _ints((n, K), BF16, gen)
        b = _ints((M,), BF16, gen, -50, 51) if with_bias else None
        y = dense.linear(x, w, b)  # `auto`: the tiles take every such call
        assert y.shape == (n, M) and y.dtype == BF16
        assert torch.equal(y, dense.linear_reference(x, w, b)), (n, with_bias)


@needs_amx
def test_amx_path_random_within_tolerance_on_any_thread_count():
    gen = torch.Generator().manual_seed(11)
    w, b = torch.randn(515, 2048, generator=gen).to(BF16), torch.randn(515, generator=gen).to(BF16)
    for n in (3, 72):
        x = torch.randn(n, 2048, generator=gen).to(BF16)
        ys = [dense.linear(x, w, b, threads=t) for t in (1, 2, 3)]
        assert all(torch.equal(ys[0], y) for y in ys[1:])  # each row is summed by one thread, in one order
        _check_close(ys[0], x, w, b)


@needs_amx
def test_amx_path_gives_a_row_the_same_bits_in_a_call_of_any_size():
    """Batch invariance: a token's outputs do not depend on the other rows of its call (one-token decoding and a
    verify pass of many tokens agree exactly), on random inputs where the sums round."""
    gen = torch.Generator().manual_seed(12)
    w, b = torch.randn(200, 2048, generator=gen).to(BF16), torch.randn(200, generator=gen).to(BF16)
    x = torch.randn(72, 2048, generator=gen).to(BF16)
    whole = dense.linear(x, w, b)
    for lo, hi in ((0, 1), (5, 6), (71, 72), (3, 12), (16, 49)):
        assert torch.equal(dense.linear(x[lo:hi], w, b), whole[lo:hi]), (lo, hi)


@needs_amx
def test_amx_path_refusals():
    w = torch.randn(8, 64).to(BF16)
    with pytest.raises(ValueError, match="at most 256"):
        dense.linear(torch.randn(257, 64).to(BF16), w)
    with pytest.raises(ValueError, match="at most 16"):
        dense.linear(torch.randn(17, 64), w.float())  # fp32: the fma path's rows
    with pytest.raises(ValueError, match="at most 16"):
        dense.linear(torch.randn(17, 48).to(BF16), torch.randn(8, 48).to(BF16))  # K not a multiple of 32
    with pytest.raises(ValueError, match="AMX tiles"):
        dense.linear(torch.randn(3, 64), w.float(), isa="amx")
    with pytest.raises(ValueError, match="AMX tiles"):
        dense.linear(torch.randn(3, 48).to(BF16), torch.randn(8, 48).to(BF16), isa="amx")


TILES_OFF_CHECK = """
import torch
from moespec.kernels import dense
assert not dense.amx_path() and dense.native_rows(torch.zeros(2, 64, dtype=torch.bfloat16)) == dense.MAX_TOKENS
gen = torch.Generator().manual_seed(2)
w, x = torch.randint(-4, 5, (40, 64), generator=gen).bfloat16(), torch.randint(-4, 5, (9, 64), generator=gen).bfloat16()
assert torch.equal(dense.linear(x, w), dense.linear_reference(x, w))
print("tiles off ok")
"""


def test_moespec_native_amx_0_keeps_the_dense_layers_off_the_tiles():
    """MOESPEC_NATIVE_AMX=0 (read once a process): the dense kernel takes MAX_TOKENS rows on its vector paths."""
    env = {**os.environ, "MOESPEC_NATIVE_AMX": "0"}
    proc = subprocess.run([sys.executable, "-c", TILES_OFF_CHECK], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0 and "tiles off ok" in proc.stdout, proc.stderr[-2000:]

"""The native attention of a verification pass (moespec.kernels.attention) against its plain-torch definition, on
edge shapes (n = 1 and 16, one key, grouped-query heads, MLA's value size, head sizes off the 8-lane width, a
batch, masks with holes, a row that sees nothing, a view of a longer cache, the AMX tiles' row and key tails) on
the CPU's own paths and, in a fresh process, on the AVX2 path of a CPU without AMX, the refusals before any pointer
reaches native code, and its installation in the five architectures (moespec.model.dense): logits of a cached
decoding equal to transformers' sdpa."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from conftest import VOCAB_SIZE
from transformers import AutoModelForCausalLM

from moespec.kernels import attention as A
from moespec.model.cache import new_cache
from moespec.model.dense import native_attention_calls, set_dense
from moespec.model.load import cache_argument
from moespec.model.spec import SUPPORTED_MODEL_TYPES

pytestmark = pytest.mark.skipif(not A.takes(*[torch.zeros(1, 1, 1, 8)] * 3), reason="native kernels unavailable")
# fp32: summation order, exp to 2e-7; bf16: the result's rounding, one unit in its last place either way (2^-7 of
# it), to which the AMX tiles' rounding of p to bf16 before the values (2^-9 of each weight) can tip it
ATOL = {torch.float32: 1e-5, torch.bfloat16: 2 ** -7}
RTOL = {torch.float32: 0.0, torch.bfloat16: 2 ** -7}

# (B, Hq, Hkv, n, L, D, Dv); the query rows of a kv head, G n, cover the kernel's score blocks of 1-8 rows (8 + 4, 6,
# 8 + 2, 3, ...) and its value blocks of 1-3 rows by 4 vectors, 1 vector and single columns (Dv = 44, 40, 9, 5); in
# bf16 on a CPU with AMX, the tiles from 4 rows where D and Dv are multiples of 32: one and two row tiles (9, 56, 20
# and 4 rows), keys past the last whole 16 (521, 30, 37), an odd last pair of keys, value blocks of 4 and 2 tiles
# (Dv = 128, 96, 32).
SHAPES = [(1, 16, 16, 1, 513, 128, 128), (1, 4, 2, 16, 40, 8, 8), (2, 6, 2, 3, 7, 12, 5), (1, 3, 1, 5, 5, 9, 9),
          (1, 2, 2, 1, 1, 16, 16), (1, 8, 1, 7, 30, 192, 128), (1, 4, 1, 3, 11, 40, 44), (1, 6, 1, 1, 9, 24, 40),
          (1, 5, 1, 2, 7, 72, 16), (2, 3, 1, 1, 4, 33, 9), (1, 4, 4, 9, 521, 128, 128), (2, 8, 2, 5, 37, 64, 96),
          (1, 2, 1, 2, 32, 32, 32)]


def tensors(B, Hq, Hkv, n, L, D, Dv, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, n, D, generator=g).to(dtype)
    cache = torch.randn(B, Hkv, L + 6, D, generator=g).to(dtype)  # keys: a view of a longer buffer
    v = torch.randn(B, Hkv, L, Dv, generator=g).to(dtype)
    return q, cache[:, :, :L], v


def check_shape(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    """The kernel against the reference on one shape, causal and under a random mask."""
    B, Hq, Hkv, n, L, D, Dv = shape
    q, k, v = tensors(*shape, dtype)
    for mask in (None, torch.rand(B, 1, n, L, generator=torch.Generator().manual_seed(1)) > 0.4):
        got = A.attention(q, k, v, mask, scale=0.3)
        want = A.attention_reference(q, k, v, mask, scale=0.3)
        assert got.shape == (B, n, Hq, Dv) and got.dtype == dtype and got.is_contiguous()
        torch.testing.assert_close(got.float(), want.float(), atol=ATOL[dtype], rtol=RTOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_matches_the_reference_causal_and_masked(shape, dtype):
    check_shape(shape, dtype)


VECTOR_CHECK = """
import torch
from test_attention import SHAPES, check_shape
for shape in SHAPES:
    check_shape(shape, torch.bfloat16)
print("vector path ok")
"""


def test_bf16_takes_the_vector_path_where_the_cpu_has_amx():
    """MOESPEC_NATIVE_AMX=0 keeps bf16 attention on the AVX2 path of every CPU without AMX, checked against the
    reference on every shape even where the CPU has AMX (a fresh process: the switch is read once); the in-process
    tests above run the tiles where the CPU has them."""
    env = {**os.environ, "MOESPEC_NATIVE_AMX": "0", "PYTHONPATH": os.path.dirname(__file__)}
    proc = subprocess.run([sys.executable, "-c", VECTOR_CHECK], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "vector path ok" in proc.stdout, proc.stderr[-2000:]


def test_a_query_that_sees_no_key_gives_zeros_and_the_mask_broadcasts_over_the_batch():
    q, k, v = tensors(2, 4, 2, 3, 6, 8, 8, torch.float32)
    mask = torch.ones(1, 1, 3, 6, dtype=torch.bool)
    mask[0, 0, 1] = False
    got = A.attention(q, k, v, mask)
    assert torch.all(got[:, 1] == 0)
    torch.testing.assert_close(got, A.attention_reference(q, k, v, mask), atol=ATOL[torch.float32], rtol=0)


def test_default_scale_and_causal_offset():
    q, k, v = tensors(1, 2, 2, 4, 9, 16, 16, torch.float32)
    causal = torch.ones(4, 9, dtype=torch.bool).tril(5)[None, None]  # query i sees keys 0 .. 5 + i
    torch.testing.assert_close(A.attention(q, k, v), A.attention(q, k, v, causal), atol=0, rtol=0)
    torch.testing.assert_close(A.attention(q, k, v), A.attention_reference(q, k, v, scale=16 ** -0.5),
                               atol=ATOL[torch.float32], rtol=0)


@pytest.mark.parametrize("case, match", [
    ("meta", "on meta"), ("float16", "float16"), ("mixed", "share a dtype"), ("strided", "contiguous last"),
    ("17 queries", "n = 17"), ("heads", "multiple"), ("float mask", "bool"), ("mask shape", "broadcast"),
])
def test_refuses_before_native_code(case, match):
    q, k, v = tensors(1, 4, 2, 3, 6, 8, 8, torch.float32)
    mask = None
    if case == "meta":
        k = k.to("meta")
    elif case == "float16":
        q, k, v = q.half(), k.half(), v.half()
    elif case == "mixed":
        v = v.bfloat16()
    elif case == "strided":
        q = q.transpose(-1, -2).contiguous().transpose(-1, -2)
    elif case == "17 queries":
        q = torch.randn(1, 4, 17, 8)
    elif case == "heads":
        q = torch.randn(1, 3, 3, 8)
    elif case == "float mask":
        mask = torch.zeros(1, 1, 3, 6)
    else:
        mask = torch.ones(1, 1, 3, 5, dtype=torch.bool)
    assert not A.takes(q, k, v, mask)
    with pytest.raises(ValueError, match=match):
        A.attention(q, k, v, mask)


@pytest.mark.parametrize("model_type", SUPPORTED_MODEL_TYPES)
def test_installed_in_a_cached_decoding_with_sdpa_logits(model_type, tiny_configs):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_configs[model_type]).eval()
    stock = model.config._attn_implementation

    def decode() -> list[torch.Tensor]:
        cache, logits = new_cache(model), []
        with torch.inference_mode():
            for start, n in ((3, 20), (40, 1), (50, 4), (60, 16)):  # a prefill (torch's), then verify passes
                ids = torch.arange(start, start + n)[None] % VOCAB_SIZE
                logits.append(model(input_ids=ids, use_cache=True, **{cache_argument(model): cache}).logits)
        return logits

    set_dense(model, "torch")
    want = decode()
    set_dense(model, "native")
    got = decode()
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=2e-5, rtol=0)
    # sdpa models run the three verify passes of every layer natively; gpt-oss (sinks: eager) keeps its own
    passes = 3 * model.config.num_hidden_layers
    assert native_attention_calls(model) == (passes if stock == "sdpa" else 0)
    set_dense(model, "torch")
    assert model.config._attn_implementation == stock

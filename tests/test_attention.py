"""The native attention of a verification pass (moespec.kernels.attention) against its plain-torch definition, on
edge shapes (n = 1 and 16, one key, grouped-query heads, MLA's value size, head sizes off the 8-lane width, a
batch, masks with holes, a row that sees nothing, a view of a longer cache), the refusals before any pointer
reaches native code, and its installation in the five architectures (moespec.model.dense): logits of a cached
decoding equal to transformers' sdpa."""

from __future__ import annotations

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
ATOL = {torch.float32: 1e-5, torch.bfloat16: 2 ** -7}  # fp32: summation order, exp to 2e-7; bf16: one rounding

# (B, Hq, Hkv, n, L, D, Dv); the query rows of a kv head, G n, cover the kernel's score blocks of 1-8 rows (8 + 4, 6,
# 8 + 2, 3, ...) and its value blocks of 1-3 rows by 4 vectors, 1 vector and single columns (Dv = 44, 40, 9, 5).
SHAPES = [(1, 16, 16, 1, 513, 128, 128), (1, 4, 2, 16, 40, 8, 8), (2, 6, 2, 3, 7, 12, 5), (1, 3, 1, 5, 5, 9, 9),
          (1, 2, 2, 1, 1, 16, 16), (1, 8, 1, 7, 30, 192, 128), (1, 4, 1, 3, 11, 40, 44), (1, 6, 1, 1, 9, 24, 40),
          (1, 5, 1, 2, 7, 72, 16), (2, 3, 1, 1, 4, 33, 9)]


def tensors(B, Hq, Hkv, n, L, D, Dv, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, n, D, generator=g).to(dtype)
    cache = torch.randn(B, Hkv, L + 6, D, generator=g).to(dtype)  # keys: a view of a longer buffer
    v = torch.randn(B, Hkv, L, Dv, generator=g).to(dtype)
    return q, cache[:, :, :L], v


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_matches_the_reference_causal_and_masked(shape, dtype):
    B, Hq, Hkv, n, L, D, Dv = shape
    q, k, v = tensors(*shape, dtype)
    for mask in (None, torch.rand(B, 1, n, L, generator=torch.Generator().manual_seed(1)) > 0.4):
        got = A.attention(q, k, v, mask, scale=0.3)
        want = A.attention_reference(q, k, v, mask, scale=0.3)
        assert got.shape == (B, n, Hq, Dv) and got.dtype == dtype and got.is_contiguous()
        torch.testing.assert_close(got.float(), want.float(), atol=ATOL[dtype], rtol=0)


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

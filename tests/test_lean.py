"""The lean verification pass (moespec.model.lean) installed by the native dense path: on tiny models of the three
Llama-family classes it gives transformers' logits, keys and values and routing in a cached decoding, counts its
native calls, leaves every other call and model to transformers, and is removed by set_dense(model, "torch").

Against transformers' forward on torch's kernels in fp32: logits to 2e-5 (the same products summed in another
order). In bf16 the reference is transformers' forward on the same native kernels (the lean forward taken off the
model), so the comparison isolates the lean pass itself: a one-ulp difference of a bf16 router logit between two
matrix kernels can flip an expert and move logits by O(1), which says nothing about the pass. Its RMSNorm sums in
fp64, torch's in fp32, so bf16 results agree to 0.06 (a few bf16 ulps at O(1))."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from conftest import VOCAB_SIZE
from transformers import AutoModelForCausalLM

from moespec.kernels import dense, native
from moespec.model import lean
from moespec.model.cache import new_cache
from moespec.model.dense import native_attention_calls, native_calls, set_dense
from moespec.model.load import cache_argument, find_routers
from moespec.model.policies import set_policy, set_replay
from moespec.model.spec import ModelSpec
from moespec.routing.tracer import RouterTap

pytestmark = pytest.mark.skipif(native.load() is None, reason=f"native kernels: {native.status()}")

LEAN = ("olmoe", "qwen3_moe", "mixtral")
TOL = {torch.float32: 2e-5, torch.bfloat16: 0.06}
PASSES = ((3, 20), (40, 1), (50, 4), (60, 16), (70, 9))  # a prefill (transformers'), then verification passes


def model_of(tiny_configs, model_type: str, dtype: torch.dtype = torch.float32):
    """A model of its own config copy: set_dense switches a config's attention, and the fixture is shared."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(copy.deepcopy(tiny_configs[model_type])).eval().to(dtype)
    set_policy(model, "dedup")
    return model


def decode(model, passes=PASSES, **extra) -> tuple[list[torch.Tensor], object]:
    cache, logits = new_cache(model), []
    with torch.inference_mode():
        for start, n in passes:
            ids = torch.arange(start, start + n)[None] % VOCAB_SIZE
            logits.append(model(input_ids=ids, use_cache=True, **{cache_argument(model): cache}, **extra).logits)
    return logits, cache


@pytest.mark.parametrize("dtype, packed", [(torch.float32, False), (torch.bfloat16, False), (torch.bfloat16, True)])
@pytest.mark.parametrize("model_type", LEAN)
def test_lean_pass_gives_transformers_logits_and_cache(model_type, dtype, packed, tiny_configs, monkeypatch):
    """On any CPU, both rules for the bf16 dense layers: native up to the rows it takes (dense.native_rows: the AMX
    path's on a CPU with tiles), or (`packed`) oneDNN's packed copy past 4 rows, so the passes of 9 and 16 tokens
    multiply the packs."""
    if packed:
        monkeypatch.setattr(dense, "native_rows", lambda x, weight=None: 4)
    model = model_of(tiny_configs, model_type, dtype)
    assert lean.unsupported(model) is None
    set_dense(model, "native" if dtype == torch.bfloat16 else "torch")
    if dtype == torch.bfloat16:
        del model.forward  # transformers' forward, the native kernels inside
    want, want_cache = decode(model)
    if dtype == torch.bfloat16:
        set_dense(model, "torch")
    set_dense(model, "native")
    installed = model._moespec_dense.lean
    assert installed is not None and "forward" in model.__dict__
    got, got_cache = decode(model)
    for g, w in zip(got, want):
        torch.testing.assert_close(g.float(), w.float(), atol=TOL[dtype], rtol=0)
    for g, w in zip(got_cache.layers, want_cache.layers):
        torch.testing.assert_close(g.keys.float(), w.keys.float(), atol=TOL[dtype], rtol=0)
        torch.testing.assert_close(g.values.float(), w.values.float(), atol=TOL[dtype], rtol=0)
    layers = model.config.num_hidden_layers
    verify_passes = len(PASSES) - 1
    assert installed.attention_calls == verify_passes * layers == native_attention_calls(model)
    # per native pass and layer q, k, v, o and the router (or a dense layer's 3 matrices), and the head
    rows = 4 if packed else dense.MAX_TOKENS  # the native rows; every verify pass has at most MAX_TOKENS
    native_passes = sum(n <= rows for _, n in PASSES[1:]) if dtype == torch.bfloat16 else verify_passes
    assert native_calls(model) >= native_passes * (5 * layers + 1)
    assert bool(installed.packs) == (packed and dtype == torch.bfloat16)
    set_dense(model, "torch")
    assert "forward" not in model.__dict__ and all("forward" not in r.__dict__ for r in installed.routers)


@pytest.mark.parametrize("model_type", LEAN)
def test_routers_hooks_see_transformers_routing(model_type, tiny_configs):
    model = model_of(tiny_configs, model_type)
    spec = ModelSpec.from_config_dict(model.config.to_dict())
    taken = {}
    for kind in ("torch", "native"):
        set_dense(model, kind)
        tap = RouterTap(find_routers(model, spec), spec.m)
        decode(model)
        taken[kind] = tap.take()
        tap.close()
    np.testing.assert_array_equal(taken["native"][0], taken["torch"][0])
    np.testing.assert_allclose(taken["native"][1], taken["torch"][1], atol=1e-6)


def test_replayed_routing_reaches_the_experts_through_the_lean_pass(tiny_configs):
    model = model_of(tiny_configs, "olmoe")
    spec = ModelSpec.from_config_dict(model.config.to_dict())
    ids = np.tile(np.arange(spec.m), (4, spec.L, 1))  # every token on experts 0..m-1
    out = {}
    for kind in ("torch", "native"):
        set_dense(model, kind)
        cache = new_cache(model)
        with torch.inference_mode():
            model(input_ids=torch.arange(3, 23)[None], use_cache=True, cache=cache)
            set_replay(model, ids)
            out[kind] = model(input_ids=torch.arange(30, 34)[None], use_cache=True, cache=cache).logits
            set_replay(model, None)
    torch.testing.assert_close(out["native"], out["torch"], atol=2e-5, rtol=0)


@pytest.mark.parametrize("extra", [{"attention_mask": None}, {"position_ids": torch.arange(40, 41)[None]},
                                   {"output_hidden_states": True}])
def test_other_calls_run_transformers_forward(extra, tiny_configs):
    model = model_of(tiny_configs, "olmoe")
    set_dense(model, "native")
    decode(model, passes=((3, 20), (40, 1)), **extra)
    assert model._moespec_dense.lean.attention_calls == 0  # transformers' forward ran (with the native attention)
    assert native_attention_calls(model) == model.config.num_hidden_layers


def test_a_cache_without_in_place_layers_runs_transformers_forward(tiny_configs):
    from transformers import DynamicCache

    model = model_of(tiny_configs, "mixtral")
    set_dense(model, "native")
    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        model(input_ids=torch.arange(3, 8)[None], use_cache=True, cache=cache)
        model(input_ids=torch.arange(9, 10)[None], use_cache=True, cache=cache)
    assert model._moespec_dense.lean.attention_calls == 0 and native_calls(model) > 0


@pytest.mark.parametrize("model_type, reason", [("gpt_oss", "model type 'gpt_oss'"),
                                                ("deepseek_v2", "model type 'deepseek_v2'")])
def test_other_classes_keep_transformers_forward(model_type, reason, tiny_configs):
    model = model_of(tiny_configs, model_type)
    assert reason in lean.unsupported(model)
    set_dense(model, "native")
    assert model._moespec_dense.lean is None and "forward" not in model.__dict__


def test_unsupported_names_a_float16_model_and_eager_attention(tiny_configs):
    model = model_of(tiny_configs, "olmoe", torch.float16)
    assert "float16" in lean.unsupported(model)
    model = model_of(tiny_configs, "mixtral")
    model.config._attn_implementation = "eager"
    assert "'eager'" in lean.unsupported(model)


def test_the_rotary_table_equals_the_rotary_module(tiny_configs):
    model = model_of(tiny_configs, "qwen3_moe", torch.bfloat16)
    table = lean.RotaryTable(model.model.rotary_emb, torch.bfloat16)
    cos, sin = table.rows(lean.MIN_TABLE + 5, 3)  # past the first table: it grows
    want_cos, want_sin = model.model.rotary_emb(torch.empty(1, dtype=torch.bfloat16),
                                                torch.arange(lean.MIN_TABLE + 5, lean.MIN_TABLE + 8)[None])
    torch.testing.assert_close(cos, want_cos[0], atol=0, rtol=0)
    torch.testing.assert_close(sin, want_sin[0], atol=0, rtol=0)
    assert table.cos.shape[0] >= lean.MIN_TABLE + 8


def test_the_engines_direct_call_equals_the_forward_and_yields_to_model_hooks(tiny_configs):
    from moespec.model import speculative

    model = model_of(tiny_configs, "olmoe")
    set_dense(model, "native")
    logits = {}
    for hooked in (False, True):
        seen = []
        handle = model.register_forward_hook(lambda m, a, out: seen.append(out)) if hooked else None
        cache = new_cache(model)
        with torch.inference_mode():
            speculative.forward_logits(model, list(range(3, 23)), cache)  # a prefill: transformers' forward either way
            logits[hooked] = speculative.forward_logits(model, [30, 31, 32], cache)
        if handle is not None:
            handle.remove()
        assert len(seen) == (2 if hooked else 0)  # the hook saw both calls: the direct call stood aside
    torch.testing.assert_close(logits[True], logits[False], atol=2e-5, rtol=0)  # two threads: fp32 sums vary
    assert model._moespec_dense.lean.logits(torch.tensor([[5]]), new_cache(model)) is not None  # an empty cache


def test_a_model_moved_after_the_install_runs_transformers_forward(tiny_configs):
    model = model_of(tiny_configs, "olmoe")
    set_dense(model, "native")
    model.to(torch.float16)  # no native kernel takes fp16: no pointer of it may reach one
    cache = new_cache(model)
    with torch.inference_mode():
        model(input_ids=torch.arange(3, 23)[None], use_cache=True, cache=cache)
        out = model(input_ids=torch.arange(30, 33)[None], use_cache=True, cache=cache).logits
    assert out.dtype == torch.float16 and torch.isfinite(out).all()
    assert model._moespec_dense.lean.attention_calls == 0 and model._moespec_dense.lean.fused_calls == 0


def test_passes_past_the_native_rows_multiply_packed_weights(tiny_configs):
    model = model_of(tiny_configs, "olmoe", torch.bfloat16)
    set_dense(model, "native")
    installed = model._moespec_dense.lean
    head = model.lm_head
    x = torch.randn(dense.AMX_MAX_TOKENS + 4, head.weight.shape[1]).bfloat16()  # past the native rows anywhere
    with torch.inference_mode():
        got = installed.linear(x, head)
        torch.testing.assert_close(got, torch.nn.functional.linear(x, head.weight), atol=0, rtol=0)
        if dense.pack(head.weight) is None:  # torch without oneDNN: F.linear, nothing packed
            assert installed.packs[head][1] is None
            return
        assert head in installed.packs
        head.weight.mul_(2)  # a weight written to is packed again
        torch.testing.assert_close(installed.linear(x, head), torch.nn.functional.linear(x, head.weight),
                                   atol=0, rtol=0)
        assert installed.linear(x[:3], head) is not None and len(installed.packs) == 1  # few rows: the native kernel

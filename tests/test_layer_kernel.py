"""The one-call decoder layer (moespec.kernels.layer) against its reference, the same layer run step by step from Python
(moespec.model.lean with the layer kernel switched off), on tiny models of the three Llama-family classes: bit-equal
logits and caches, because both run the same kernels in the same order. On one thread: with two, the expert kernels'
fp32 sums depend on how the threads split the work (a few fp32 ulps from run to run). Also: replayed routing, the
expert operation taken out, OLMoE's clip_qkv, the hooks that send a layer back to Python, and bad arguments refused
in Python before any pointer reaches native code."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from conftest import VOCAB_SIZE
from transformers import AutoModelForCausalLM

from moespec.kernels import layer as L
from moespec.kernels import native
from moespec.model.cache import new_cache
from moespec.model.dense import set_dense
from moespec.model.load import find_routers
from moespec.model.policies import set_policy, set_replay
from moespec.model.spec import ModelSpec
from moespec.routing.tracer import RouterTap

pytestmark = pytest.mark.skipif(native.load() is None, reason=f"native kernels: {native.status()}")

PASSES = ((3, 20), (40, 1), (50, 4), (60, 16), (70, 9))  # a prefill (transformers'), then verification passes


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def native_model(tiny_configs, model_type, dtype=torch.bfloat16, **config):
    torch.manual_seed(0)
    cfg = copy.deepcopy(tiny_configs[model_type])
    for key, value in config.items():
        setattr(cfg, key, value)
    model = AutoModelForCausalLM.from_config(cfg).eval().to(dtype)
    set_dense(model, "native")
    return model


def decode(model, fused: bool, passes=PASSES):
    installed = model._moespec_dense.lean
    kept, installed.fused = installed.fused, installed.fused if fused else [None] * len(installed.fused)
    cache, logits = new_cache(model), []
    with torch.inference_mode():
        for start, n in passes:
            ids = torch.arange(start, start + n)[None] % VOCAB_SIZE
            logits.append(model(input_ids=ids, use_cache=True, cache=cache).logits)
    installed.fused = kept
    return logits, cache


def assert_same(model, policy="dedup", expect_fused=True):
    set_policy(model, policy)
    want, want_cache = decode(model, fused=False)
    before = model._moespec_dense.lean.fused_calls
    got, got_cache = decode(model, fused=True)
    fused = model._moespec_dense.lean.fused_calls - before
    assert (fused > 0) == expect_fused
    for g, w in zip(got, want):
        assert torch.equal(g, w)
    for g, w in zip(got_cache.layers, want_cache.layers):
        assert torch.equal(g.keys, w.keys) and torch.equal(g.values, w.values)
    return fused


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("model_type", ["olmoe", "qwen3_moe", "mixtral"])
@pytest.mark.parametrize("policy", ["slot", "dedup", "outside"])
def test_the_layer_kernel_equals_the_python_steps_bit_for_bit(model_type, dtype, policy, tiny_configs):
    model = native_model(tiny_configs, model_type, dtype)
    moe_layers = sum(w is not None for w in model._moespec_dense.lean.fused)
    assert moe_layers == ModelSpec.from_config_dict(model.config.to_dict()).L  # qwen3's dense layer 1 is not one
    assert assert_same(model, policy) == moe_layers * (len(PASSES) - 1)


def test_olmoe_clip_qkv_and_attention_bias(tiny_configs):
    assert_same(native_model(tiny_configs, "olmoe", clip_qkv=0.05, attention_bias=True))


def test_auto_resolves_the_kernel_per_pass_size(tiny_configs):
    model = native_model(tiny_configs, "olmoe")
    set_policy(model, "auto", {1: "slot", 4: "dedup"})
    want, _ = decode(model, fused=False)
    got, _ = decode(model, fused=True)
    assert all(torch.equal(g, w) for g, w in zip(got, want))
    assert model._moespec_dense.lean.fused_calls > 0


def test_replayed_routing(tiny_configs):
    model = native_model(tiny_configs, "mixtral")
    spec = ModelSpec.from_config_dict(model.config.to_dict())
    set_policy(model, "dedup")
    ids = np.stack([np.arange(spec.m) + t % 2 for t in range(4)])[:, None, :].repeat(spec.L, 1)  # [4, L, m]
    out = {}
    for fused in (False, True):
        installed = model._moespec_dense.lean
        kept, installed.fused = installed.fused, installed.fused if fused else [None] * len(installed.fused)
        cache = new_cache(model)
        with torch.inference_mode():
            model(input_ids=torch.arange(3, 23)[None], use_cache=True, cache=cache)
            set_replay(model, ids)
            before = installed.fused_calls
            out[fused] = model(input_ids=torch.arange(30, 34)[None], use_cache=True, cache=cache).logits
            assert (installed.fused_calls > before) == fused
            set_replay(model, None)
        installed.fused = kept
    assert torch.equal(out[True], out[False])


def test_a_tracer_on_the_routers_sends_the_layers_back_to_python(tiny_configs):
    model = native_model(tiny_configs, "qwen3_moe")
    set_policy(model, "dedup")
    spec = ModelSpec.from_config_dict(model.config.to_dict())
    tap = RouterTap(find_routers(model, spec), spec.m)
    before = model._moespec_dense.lean.fused_calls
    decode(model, fused=True)
    assert model._moespec_dense.lean.fused_calls == before  # the hooks saw every pass
    ids, _ = tap.take()
    assert ids.shape[0] == sum(n for _, n in PASSES)
    tap.close()


def test_transformers_expert_implementations_keep_the_python_steps(tiny_configs):
    model = native_model(tiny_configs, "olmoe")
    assert_same(model, "eager", expect_fused=False)


def layer_inputs(dtype=torch.float32, n=2, N=4, m=2):
    torch.manual_seed(1)
    d, H, D, f = 16, 2, 8, 8
    t = lambda *s: torch.randn(*s).to(dtype) * 0.3  # noqa: E731
    w = L.LayerWeights(in_norm=t(d), q=t(H * D, d), k=t(H * D, d), v=t(H * D, d), o=t(d, H * D), q_bias=None,
                       k_bias=None, v_bias=None, o_bias=None, q_norm=None, k_norm=None, post_norm=t(d),
                       router=t(N, d), gate_up=t(N, 2 * f, d), down=t(N, d, f), heads=H, kv_heads=H, head_dim=D,
                       top_k=m, eps=1e-5, scale=D ** -0.5, clip=None, qk_norm=None, renorm=True, scores_fp32=True)
    w.check()
    keys, values = torch.zeros(1, H, 8, D, dtype=dtype), torch.zeros(1, H, 8, D, dtype=dtype)
    return dict(h=t(n, d), w=w, cos=torch.ones(n, D, dtype=dtype), sin=torch.zeros(n, D, dtype=dtype),
                keys=keys, values=values, past=3, mode="dedup")


def test_the_checked_call_runs_and_writes_the_cache_rows():
    args = layer_inputs()
    h = args["h"].clone()
    out = L.decoder_layer(**args)
    assert out is args["h"] and not torch.equal(out, h) and torch.isfinite(out).all()
    assert args["keys"][0, :, 3:5].abs().sum() > 0 and args["keys"][0, :, 5:].abs().sum() == 0


@pytest.mark.parametrize("change, match", [
    (lambda a: a.update(h=a["h"].to("meta")), "^h is .* on meta"),
    (lambda a: a.update(h=torch.randn(17, 16)), "^h must be"),
    (lambda a: a.update(cos=a["cos"][:, :4].contiguous()), "^cos"),
    (lambda a: a.update(keys=a["keys"][:, :, :4]), "^keys"),
    (lambda a: a.update(values=a["values"].to(torch.bfloat16)), "^values"),
    (lambda a: a.update(mode="fast"), "^mode"),
    (lambda a: a.update(replay=torch.zeros(2, 3, dtype=torch.int64)), "^replay"),
])
def test_bad_arguments_are_refused_in_python(change, match):
    args = layer_inputs()
    change(args)
    with pytest.raises(ValueError, match=match):
        L.decoder_layer(**args)


def test_replayed_ids_out_of_range_are_refused_by_the_kernel():
    args = layer_inputs()
    with pytest.raises(ValueError, match=r"replayed expert ids must lie in \[0, 4\)"):
        L.decoder_layer(**args, replay=torch.tensor([[0, 9], [1, 2]]))


@pytest.mark.parametrize("field, value, match", [("router", torch.randn(4, 15), "^router"),
                                                 ("q_norm", torch.randn(16), "^q_norm"),
                                                 ("gate_up", torch.randn(4, 16, 16).to("meta"), "^gate_up")])
def test_weights_that_do_not_fit_are_named(field, value, match):
    w = layer_inputs()["w"]
    with pytest.raises(ValueError, match=match):
        L.LayerWeights(**{**vars(w), field: value}).check()

"""The engine's in-place KV cache (moespec.model.cache) against transformers' DynamicCache on the five classes:
the same logits through a prefill, passes, speculative rollbacks and buffer growth; passes write in place; a copy
is independent of its original."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import DynamicCache

from moespec.model import cache as kv
from moespec.model.load import cache_argument
from moespec.model.spec import SUPPORTED_MODEL_TYPES

ATOL = 1e-5  # fp32 logits of O(1); the attention reads the same numbers through a strided view
PROMPT = [5, 17, 3, 40, 22, 9, 31]
# (tokens fed, tokens rolled back after): passes of a speculative decoding, past the buffer's first size
PASSES = [([7, 8, 9], 2), ([11], 0), ([12, 13, 14, 15], 3), ([16, 17, 18, 19, 20, 21], 1), ([22, 23], 0)]


def stock_cache(model) -> DynamicCache:
    cache = DynamicCache(config=model.config)
    cache.activate_past_recording()
    return cache


def feed(model, tokens: list[int], cache) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=torch.tensor([tokens]), use_cache=True, **{cache_argument(model): cache}).logits[0]


@pytest.mark.parametrize("model_type", SUPPORTED_MODEL_TYPES)
def test_same_logits_as_dynamic_cache(model_type, models, monkeypatch):
    monkeypatch.setattr(kv, "MIN_ROWS", 8)  # the prompt fits; the passes grow the buffers twice
    model = models[model_type].model
    ours, stock = kv.new_cache(model), stock_cache(model)
    assert any(isinstance(layer, kv.InPlaceLayer) for layer in ours.layers) or ours.layers == []
    torch.testing.assert_close(feed(model, PROMPT, ours), feed(model, PROMPT, stock), atol=ATOL, rtol=0)
    for tokens, back in PASSES:
        torch.testing.assert_close(feed(model, tokens, ours), feed(model, tokens, stock), atol=ATOL, rtol=0)
        for cache in (ours, stock):
            cache.crop(-back)
        assert ours.get_seq_length() == stock.get_seq_length()
    assert any(isinstance(layer, kv.InPlaceLayer) for layer in ours.layers)


def test_a_pass_writes_in_place_and_a_copy_is_independent(models):
    model = models["olmoe"].model
    cache = kv.new_cache(model)
    feed(model, PROMPT, cache)
    layer = cache.layers[0]
    buffer = layer._buffers[0].data_ptr()
    feed(model, [7, 8], cache)
    cache.crop(-2)
    feed(model, [9], cache)
    assert layer._buffers[0].data_ptr() == buffer and layer.keys.data_ptr() == buffer
    twin = copy.deepcopy(cache)
    before = twin.layers[0].keys.clone()
    feed(model, [10, 11, 12], cache)
    assert twin.get_seq_length() == len(PROMPT) + 1
    torch.testing.assert_close(twin.layers[0].keys, before, atol=0, rtol=0)
    assert twin.layers[0].keys.data_ptr() == twin.layers[0]._buffers[0].data_ptr()  # still a view of its buffer


def test_keys_replaced_from_outside_are_kept(models):
    """A cache method that replaces the keys with a new tensor (a beam reorder, batch_select_indices) is honoured:
    the next pass appends to those keys, not to the buffer's stale rows."""
    model = models["olmoe"].model
    ours, stock = kv.new_cache(model), stock_cache(model)
    for cache in (ours, stock):
        feed(model, PROMPT, cache)
        for layer in cache.layers:
            layer.keys, layer.values = layer.keys.clone(), 2 * layer.values  # new tensors, other values
    torch.testing.assert_close(feed(model, [7, 8], ours), feed(model, [7, 8], stock), atol=ATOL, rtol=0)

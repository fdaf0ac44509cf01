"""The engine's KV cache: transformers' DynamicCache with its full-attention layers written in place.

Physics first. A verification pass at depth d reads the d cached keys and values of every layer once (the
attention), and writes its n new ones. transformers' DynamicLayer appends with torch.cat, which copies the whole
cache of the layer at every pass: at the demo's depth of 512 (OLMoE shapes, 16 heads x 128, bf16) that is 4 MB
read and 4 MB written per layer and pass, twice the bytes the attention itself needs, and it grows with d. llama.cpp
writes the n new rows into a preallocated cache instead. `InPlaceLayer` does the same: its keys and values live in
buffers with room to grow (doubled when full, so a long decoding copies O(d) bytes in all, not per pass), `keys`
and `values` are views of the first `length` rows, a pass writes only its n rows, and crop (the speculative
rollback) shortens the views without touching memory. `reserve` and `advance` let a native layer
(moespec.kernels.layer) write its rows into the buffers itself.

Sliding-window and other layer kinds keep transformers' own classes (their crop restores tokens past the window).
Shapes: keys [batch, heads, length, head_dim] and values [batch, heads, length, v_head_dim] (MLA's differ).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from moespec.kernels import pages

MIN_ROWS = 256  # the first buffer's positions: a prompt and some passes fit without growing


class InPlaceLayer(DynamicLayer):
    """A full-attention cache layer that appends by writing into a preallocated buffer (see the module doc)."""

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self._buffers: tuple[torch.Tensor, torch.Tensor] | None = None

    def _room(self, key_states: torch.Tensor, value_states: torch.Tensor, rows: int) -> None:
        """Buffers that hold `rows` positions and the batch/head shape of these states (grown or made anew)."""
        if self._buffers is not None:
            keys, values = self._buffers
            ours = not self.keys.numel() or (self.keys.data_ptr() == keys.data_ptr()
                                             and self.values.data_ptr() == values.data_ptr())
            if ours and rows <= keys.shape[-2] and keys.shape[:-2] == key_states.shape[:-2] \
                    and values.shape[:-2] == value_states.shape[:-2]:
                return  # otherwise: full, another batch shape, or keys replaced from outside (a beam reorder)
        capacity = max(MIN_ROWS, 2 * rows)
        made = []
        for old, new in ((self.keys, key_states), (self.values, value_states)):
            shape = (*new.shape[:-2], capacity, new.shape[-1])
            buffer = pages.empty(shape, new.dtype) if new.device.type == "cpu" else new.new_empty(shape)
            if old.numel():
                buffer[..., :old.shape[-2], :].copy_(old)
            made.append(buffer)
        self._buffers = (made[0], made[1])

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start = self.get_seq_length()
        end = start + key_states.shape[-2]
        self._room(key_states, value_states, end)
        keys, values = self._buffers
        keys[..., start:end, :].copy_(key_states)
        values[..., start:end, :].copy_(value_states)
        self.keys, self.values = keys[..., :end, :], values[..., :end, :]
        return self.keys, self.values

    def reserve(self, n: int) -> tuple[torch.Tensor, torch.Tensor, int] | None:
        """(keys buffer, values buffer, start) with room for n rows after the current length, for a writer that
        fills rows start .. start + n - 1 itself and then calls `advance(n)`; None before the first update."""
        if not self.is_initialized or not self.keys.numel():
            return None
        start = self.get_seq_length()
        self._room(self.keys, self.values, start + n)
        keys, values = self._buffers
        return keys, values, start

    def advance(self, n: int) -> None:
        """Take the n rows a `reserve` caller wrote into the cache."""
        keys, values = self._buffers
        end = self.get_seq_length() + n
        self.keys, self.values = keys[..., :end, :], values[..., :end, :]

    def reset(self) -> None:
        self._buffers = None
        super().reset()


def new_cache(model: Any) -> DynamicCache:
    """An empty cache for `model`: its full-attention layers InPlaceLayer, the other kinds transformers' own."""
    cache = DynamicCache(config=model.config)
    cache.layers = [InPlaceLayer() if type(layer) is DynamicLayer else layer for layer in cache.layers]
    if getattr(cache, "layer_class_to_replicate", None) is DynamicLayer:  # layers made lazily, one per layer seen
        cache.layer_class_to_replicate = InPlaceLayer
    cache.activate_past_recording()  # sliding-window layers keep what crop may need to restore
    return cache

"""Placement: how fast the memory behind each expert's pages reads, relative to the ceiling's buffer.

On a virtual machine the host decides which physical memory backs each guest page, and two buffers of one process
read at steadily different rates: on a 2-core KVM guest of a Zen 1 EPYC, six 64 MiB buffers read at 7-15 GB/s, each
within ~3% over a minute of interleaved reads, all in 2 MiB pages. A kernel then streams at the rate of its own
weights' memory, not at the ceiling sampled on another buffer: one Mixtral-8x7B layer drawn three times in one process
read its two experts at 7.0, 18.5 and 8.8 GB/s, the per-slot kernel reached 6.9, 14.9 and 8.5, and the ceiling's
buffer read 14.3-14.7 throughout. So a measurement that compares a kernel with the ceiling (the structural model's
profile and its validation) takes the ratio of each expert's read to the ceiling's, read right after it: p_e
(moespec.kernels.structure.pass_time's `placement`).

Experts are read in blocks of consecutive ids of at least BLOCK_BYTES (a read that long reaches the streaming rate
past its threads' start; an expert of more is a block of its own; a layer of less has no placement), each block
read once, then timed after a cache flush (a timed call's experts are read once before its flush too:
moespec.measure.timing.read_pages), with one ceiling sample after it, over REPS rounds rotated as the bench's; p_e
is its block's median ratio. Tensors on a GPU, or with no native reader, have no placement (None): their reads are not the host's
memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Callable

import numpy as np
import torch

from moespec import ArgumentError
from moespec.arguments import show
from moespec.kernels import native
from moespec.measure.timing import Timer, read_gbps, read_pages

BLOCK_BYTES = 16 << 20  # the CPU's streaming read at 4-16 MiB chunks is within ~3% of its rate at 256 MiB
REPS = 5  # rounds of reads per block: a median that one disturbed read does not move


def blocks(expert_bytes: int, experts: int) -> list[range]:
    """Consecutive expert ids in blocks of at least BLOCK_BYTES (the last takes the remainder; all in one block
    where the experts hold less in all)."""
    if expert_bytes < 1 or experts < 1:
        raise ArgumentError(f"expert_bytes and experts must be >= 1, got {show(expert_bytes)} and {show(experts)}")
    size = max(1, -(-BLOCK_BYTES // expert_bytes))
    starts = list(range(0, experts, size))
    if len(starts) > 1 and experts - starts[-1] < size:
        starts.pop()  # a short tail joins the block before it
    return [range(a, b) for a, b in zip(starts, [*starts[1:], experts])]


def expert_placement(tensors: Sequence[torch.Tensor], timer: Timer, sample: Callable[[], float],
                     reps: int = REPS) -> list[float] | None:
    """p_e for each expert of `tensors` (each [E, ...], contiguous, the experts along dim 0: gate_up, down and any
    biases) against the ceiling `sample` (the buffer whose samples the measurement's calls are predicted at), or
    None where the tensors are not in the CPU's memory, there is no native reader, or they hold less than
    BLOCK_BYTES in all."""
    if not tensors or any(t.device.type != "cpu" or not t.is_contiguous() for t in tensors) or native.load() is None:
        return None
    experts = tensors[0].shape[0]
    if any(t.shape[0] != experts for t in tensors):
        raise ArgumentError(f"tensors must share their expert count, got {[t.shape[0] for t in tensors]}")
    per_expert = sum(t[0].numel() * t.element_size() for t in tensors)
    if per_expert * experts < BLOCK_BYTES:
        return None  # a read this short is its threads' start, not its memory's rate
    spans = blocks(per_expert, experts)
    ratios: list[list[float]] = [[] for _ in spans]
    for rep in range(reps):
        for i in [(rep + j) % len(spans) for j in range(len(spans))]:
            block = [t[spans[i].start:spans[i].stop] for t in tensors]
            read_pages(block)  # the rate of memory in place, as a timed call reads it
            timer.flush()
            got = read_gbps(block)
            ratios[i].append(got / sample())
    out = [0.0] * experts
    for span, values in zip(spans, ratios):
        for e in span:
            out[e] = float(np.median(values))
    return out


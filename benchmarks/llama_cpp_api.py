"""llama.cpp's verify pass as speculative decoding runs it, through its C API (llama-cpp-python's low-level bindings).

Why beside llama-bench. llama-bench's prompt pass asks for the logits of its last token only and times its
samples back to back; a speculative verify pass needs the logits of all n tokens (each drafted token is checked
against the target's choice at its position, as llama.cpp's own speculative decoding does), and moespec's engine
evicts the last-level cache before every timed pass. This module times llama.cpp under the engine's discipline:
one prefill of the DEPTH-token context, then per sample the pass's positions removed from the KV cache
(llama_memory_seq_rm: the rollback of a rejected draft), the last-level cache evicted by the same streaming read
the engine uses (moespec.measure.timing.StreamRead), and one llama_decode of n tokens with every logit requested,
timed up to llama_synchronize. The batch is filled before the clock starts.

Context settings are llama-bench's defaults (n_batch 2048, n_ubatch 512, f16 K and V, flash attention "auto",
the model's default buffer types), so the two llama.cpp columns differ only in the logits and the cache.

llama-cpp-python is imported where it is installed (its wheel builds llama.cpp); where it is not, a source tree
of it (the sdist beside a built libllama) can be given: LLAMA_CPP_LIB_PATH names the folder with libllama.so,
which the bindings load instead of their own.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

from moespec import MoespecError
from moespec.measure.llama_run import timed_pass
from moespec.measure.timing import StreamRead
from moespec.model import llama_cpp
from moespec.model.llama_cpp import LlamaContext

EVICT_BYTES = 64 << 20  # the engine's REFERENCE_BYTES: twice this CPU's 32 MiB last-level cache
MAX_BATCH = 2048  # llama-bench's n_batch: the prefill of the context goes in one batch up to this size


class Unavailable(Exception):
    """Why llama.cpp's C API cannot be used here (one line)."""


def bindings(python_src: Path | None = None, lib_dir: Path | None = None) -> Any:
    """The low-level module llama_cpp.llama_cpp (moespec.model.llama_cpp): the installed one, else the one in
    `python_src` (a llama-cpp-python source tree) loading libllama from `lib_dir`."""
    if lib_dir is not None:
        os.environ["LLAMA_CPP_LIB_PATH"] = str(lib_dir)
    if python_src is not None and str(python_src) not in sys.path:
        sys.path.insert(0, str(python_src))
    try:
        return llama_cpp.bindings()
    except MoespecError as e:
        raise Unavailable(str(e)) from None


class Passes:
    """A llama.cpp context (moespec.model.llama_cpp.LlamaContext) holding one prefilled DEPTH-token context of the
    GGUF model at `gguf`; `time(tokens)` is the seconds of one verify pass of those tokens after it (see the module
    docstring), timed by the engine's own moespec.measure.llama_run.timed_pass."""

    def __init__(self, gguf: Path, depth: int, n_max: int, threads: int, seed: int) -> None:
        try:
            self.context = LlamaContext(str(gguf), depth + n_max, threads, n_batch=MAX_BATCH)
            rng = np.random.default_rng(seed)
            self.context.forward(rng.integers(3, self.context.vocab_size, size=depth).tolist(), last_only=True)
        except MoespecError as e:
            raise Unavailable(str(e)) from None
        self.vocab = self.context.vocab_size
        self.evict = StreamRead(EVICT_BYTES)

    def time(self, tokens: list[int]) -> float:
        """Seconds of one pass of `tokens` (all logits) after the context; the cache is rolled back after it."""
        self.evict()
        try:
            return timed_pass(self.context, tokens)
        except MoespecError as e:
            raise Unavailable(str(e)) from None

    def samples(self, ns: list[int], reps: int, rng: np.random.Generator) -> dict[int, list[float]]:
        """`reps` passes per n of random tokens, the n interleaved pass by pass; one untimed warm-up per n."""
        draws = {n: rng.integers(3, self.vocab, size=(reps + 1, n)).tolist() for n in ns}
        for n in ns:
            self.time(draws[n][0])
        out: dict[int, list[float]] = {n: [] for n in ns}
        for rep in range(1, reps + 1):
            for n in ns:
                out[n].append(self.time(draws[n][rep]))
        return out

    def close(self) -> None:
        self.context.close()

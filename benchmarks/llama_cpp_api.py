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

import ctypes
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from moespec import MoespecError
from moespec.measure.timing import StreamRead
from moespec.model import llama_cpp

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
    """A llama.cpp context holding one prefilled DEPTH-token context of the GGUF model at `gguf`; `time(tokens)`
    is the seconds of one verify pass of those tokens after it (see the module docstring)."""

    def __init__(self, api: Any, gguf: Path, depth: int, n_max: int, threads: int, seed: int) -> None:
        self.api, self.depth = api, depth
        api.llama_backend_init()
        api.llama_log_set(llama_cpp.quiet_log, ctypes.c_void_p(0))
        self.model = api.llama_model_load_from_file(str(gguf).encode(), api.llama_model_default_params())
        if not self.model:
            raise Unavailable(f"llama.cpp could not load {gguf}")
        params = api.llama_context_default_params()
        params.n_ctx, params.n_batch, params.n_ubatch = depth + n_max, MAX_BATCH, 512
        params.n_threads = params.n_threads_batch = threads
        self.ctx = api.llama_init_from_model(self.model, params)
        if not self.ctx:
            api.llama_model_free(self.model)
            raise Unavailable("llama.cpp could not make a context")
        self.memory = api.llama_get_memory(self.ctx)
        self.vocab = api.llama_vocab_n_tokens(api.llama_model_get_vocab(self.model))
        self.batch = api.llama_batch_init(max(depth, n_max), 0, 1)
        self.evict = StreamRead(EVICT_BYTES)
        rng = np.random.default_rng(seed)
        self._decode(rng.integers(3, self.vocab, size=depth).tolist(), 0, every_logit=False)

    def _fill(self, tokens: list[int], start: int, every_logit: bool) -> None:
        b = self.batch
        b.n_tokens = len(tokens)
        for i, token in enumerate(tokens):
            b.token[i], b.pos[i], b.n_seq_id[i], b.seq_id[i][0] = token, start + i, 1, 0
            b.logits[i] = every_logit or i == len(tokens) - 1

    def _decode(self, tokens: list[int], start: int, every_logit: bool) -> None:
        self._fill(tokens, start, every_logit)
        rc = self.api.llama_decode(self.ctx, self.batch)
        if rc != 0:
            raise Unavailable(f"llama_decode failed (code {rc}) on {len(tokens)} tokens at position {start}")
        self.api.llama_synchronize(self.ctx)

    def time(self, tokens: list[int]) -> float:
        """Seconds of one pass of `tokens` (all logits) after the context; the cache is rolled back after it."""
        self._fill(tokens, self.depth, every_logit=True)
        self.evict()
        start = time.perf_counter()
        rc = self.api.llama_decode(self.ctx, self.batch)
        self.api.llama_synchronize(self.ctx)
        seconds = time.perf_counter() - start
        self.api.llama_memory_seq_rm(self.memory, 0, self.depth, -1)
        if rc != 0:
            raise Unavailable(f"llama_decode failed (code {rc}) on a pass of {len(tokens)} tokens")
        return seconds

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
        self.api.llama_batch_free(self.batch)
        self.api.llama_free(self.ctx)
        self.api.llama_model_free(self.model)

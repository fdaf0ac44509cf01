"""Routing recorded from llama.cpp itself: the m experts each token selects in every MoE layer of a GGUF model,
read from llama.cpp's own graph while it evaluates the documents (`moespec trace --gguf`).

How. llama.cpp names the tensors of its MoE block per layer: `ffn_moe_probs-L` [N, tokens] (the router's gate
probabilities, softmax for OLMoE, Qwen3-MoE and Mixtral) and `ffn_moe_topk-L` [m, tokens] (the selected experts,
by decreasing probability). A context's eval callback (cb_eval) asks the scheduler for those two per layer and
copies them out after they are computed; every token of a batch is marked as an output, so the last layer routes
all of them too (llama.cpp otherwise keeps only the rows it must return). A document is fed in chunks of `chunk`
tokens after its KV cache is cleared, as the Hugging Face tracer teacher-forces it (moespec.routing.tracer), and
the weights are the probabilities of the selected experts. The trace equals the Hugging Face tracer's on the same
model wherever the two routers agree up to ties (bf16 rounding reorders near-equal probabilities).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np

from moespec import MoespecError
from moespec.model.gguf import GgufModel, read_gguf
from moespec.model.llama_cpp import EVAL_CALLBACK, GgmlTensor, LlamaContext, backend
from moespec.model.llama_cpp import tokenize as llama_tokenize
from moespec.routing.documents import HASH_CHARS, tokenize


class GgufRouter:
    """One GGUF model in a llama.cpp context that records its routing (see the module docstring)."""

    def __init__(self, path: str | Path, chunk: int, threads: int) -> None:
        self.path, self.chunk = Path(path), chunk
        self.model_file: GgufModel = read_gguf(self.path)
        self.spec = self.model_file.spec
        self.api = api = backend()
        self.model = api.llama_model_load_from_file(str(self.path).encode(), api.llama_model_default_params())
        if not self.model:
            raise MoespecError(f"{self.path}: llama.cpp could not load this model")
        self.vocab = api.llama_model_get_vocab(self.model)
        self.layer_of = {block: l for l, block in enumerate(self.spec.moe_layers)}
        self.names = {f"ffn_moe_{kind}-{block}" for block in self.layer_of for kind in ("probs", "topk")}
        self.got: dict[str, list[np.ndarray]] = {}
        self.callback = EVAL_CALLBACK(self._observe)  # kept alive as long as the context
        self.context: LlamaContext | None = None
        self.threads = threads

    def _observe(self, tensor: int, ask: bool, user: Any) -> bool:
        t = GgmlTensor.from_address(tensor)
        name = t.name.decode(errors="replace")
        if name not in self.names:
            return not ask  # not wanted; after a computed tensor, carry on
        if not ask:
            self.got.setdefault(name, []).append(t.matrix())
        return True

    def _context(self, tokens: int) -> LlamaContext:
        """A context holding `tokens` positions (made anew when a longer document comes), its cache cleared."""
        if self.context is None or tokens > self.context.n_ctx:
            if self.context is not None:
                self.context.close()
            self.context = LlamaContext(str(self.path), tokens, self.threads, n_batch=self.chunk,
                                        n_ubatch=self.chunk, cb_eval=self.callback, model=self.model)
        self.context.clear()
        return self.context

    def tokenize(self, docs: list[str], max_tokens: int | None) -> list[np.ndarray]:
        """Token ids per document with the model's own tokenizer, truncated to max_tokens in all."""
        return tokenize(lambda doc: llama_tokenize(self.api, self.vocab, doc, str(self.path)), docs, max_tokens)

    def trace_document(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """experts [T, L, m] and weights [T, L, m] of one document, fed in chunks after a cleared cache."""
        context = self._context(int(ids.size))
        self.got = {}
        for start in range(0, ids.size, self.chunk):
            context.fill(ids[start:start + self.chunk].tolist(), every_logit=True)  # the last layer routes all
            context.decode()
        experts, weights = [], []
        for block in self.spec.moe_layers:
            topk = np.concatenate(self.got.get(f"ffn_moe_topk-{block}", [np.empty((0, self.spec.m), np.int32)]))
            probs = np.concatenate(self.got.get(f"ffn_moe_probs-{block}", [np.empty((0, self.spec.N), np.float32)]))
            if topk.shape != (ids.size, self.spec.m) or probs.shape != (ids.size, self.spec.N):
                raise MoespecError(f"{self.path}: llama.cpp's graph gave layer {block}'s routing for "
                                   f"{topk.shape[0]} of {ids.size} tokens (no ffn_moe_topk-{block} tensor?)")
            experts.append(topk.astype(np.int64))
            weights.append(np.take_along_axis(probs, topk.astype(np.int64), axis=1))
        return np.stack(experts, axis=1), np.stack(weights, axis=1).astype(np.float32)

    def model_id(self) -> str:
        """sha256 prefix of the file's first MiB and its size (hashing GBs of weights is slow)."""
        with open(self.path, "rb") as f:
            digest = hashlib.sha256(f.read(1 << 20))
        digest.update(str(self.path.stat().st_size).encode())
        return digest.hexdigest()[:HASH_CHARS]

    def tokenizer_id(self) -> str:
        n = self.api.llama_vocab_n_tokens(self.vocab)
        return f"llama.cpp:{n}:{self.model_id()}"

    def close(self) -> None:
        if self.context is not None:
            self.context.close()
            self.context = None
        self.api.llama_model_free(self.model)

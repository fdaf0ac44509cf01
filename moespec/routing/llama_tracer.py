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

import ctypes
import hashlib
from pathlib import Path
from typing import Any

import numpy as np

from moespec import MoespecError
from moespec.model.gguf import GgufModel, read_gguf
from moespec.model.llama_cpp import EVAL_CALLBACK, GgmlTensor, bindings, quiet_log
from moespec.routing.documents import HASH_CHARS, tokenize


class GgufRouter:
    """One GGUF model in a llama.cpp context that records its routing (see the module docstring)."""

    def __init__(self, path: str | Path, chunk: int, threads: int) -> None:
        self.path, self.chunk = Path(path), chunk
        self.model_file: GgufModel = read_gguf(self.path)
        self.spec = self.model_file.spec
        self.api = api = bindings()
        api.llama_backend_init()
        api.llama_log_set(quiet_log, ctypes.c_void_p(0))
        self.model = api.llama_model_load_from_file(str(self.path).encode(), api.llama_model_default_params())
        if not self.model:
            raise MoespecError(f"{self.path}: llama.cpp could not load this model")
        self.vocab = api.llama_model_get_vocab(self.model)
        self.layer_of = {block: l for l, block in enumerate(self.spec.moe_layers)}
        self.names = {f"ffn_moe_{kind}-{block}" for block in self.layer_of for kind in ("probs", "topk")}
        self.got: dict[str, list[np.ndarray]] = {}
        self.callback = EVAL_CALLBACK(self._observe)  # kept alive as long as the context
        self.context_tokens = 0
        self.ctx = None
        self.threads = threads

    def _observe(self, tensor: int, ask: bool, user: Any) -> bool:
        t = GgmlTensor.from_address(tensor)
        name = t.name.decode(errors="replace")
        if name not in self.names:
            return not ask  # not wanted; after a computed tensor, carry on
        if not ask:
            self.got.setdefault(name, []).append(t.matrix())
        return True

    def _context(self, tokens: int) -> None:
        """A context holding `tokens` positions (made anew when a longer document comes)."""
        if self.ctx is not None and tokens <= self.context_tokens:
            return
        if self.ctx is not None:
            self.api.llama_free(self.ctx)
        params = self.api.llama_context_default_params()
        params.n_ctx, params.n_batch, params.n_ubatch = tokens, self.chunk, self.chunk
        params.n_threads = params.n_threads_batch = self.threads
        params.cb_eval, params.cb_eval_user_data = self.callback, None
        self.ctx = self.api.llama_init_from_model(self.model, params)
        if not self.ctx:
            raise MoespecError(f"{self.path}: llama.cpp could not make a context of {tokens} tokens")
        self.context_tokens = tokens

    def _encode(self, doc: str) -> list[int]:
        """One document's token ids with the model's own tokenizer (special tokens as the vocabulary adds them)."""
        text = doc.encode()
        room = len(text) + 8  # a byte-level tokenizer gives at most one token per byte, plus BOS/EOS
        buf = (self.api.llama_token * room)()
        n = self.api.llama_tokenize(self.vocab, text, len(text), buf, room, True, False)
        if n < 0:
            raise MoespecError(f"{self.path}: llama.cpp could not tokenize a document")
        return buf[:n]

    def tokenize(self, docs: list[str], max_tokens: int | None) -> list[np.ndarray]:
        """Token ids per document with the model's own tokenizer, truncated to max_tokens in all."""
        return tokenize(self._encode, docs, max_tokens)

    def trace_document(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """experts [T, L, m] and weights [T, L, m] of one document, fed in chunks after a cleared cache."""
        self._context(int(ids.size))
        api = self.api
        api.llama_memory_clear(api.llama_get_memory(self.ctx), True)
        batch = api.llama_batch_init(self.chunk, 0, 1)
        self.got = {}
        try:
            for start in range(0, ids.size, self.chunk):
                piece = ids[start:start + self.chunk]
                batch.n_tokens = piece.size
                for i, token in enumerate(piece.tolist()):
                    batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.seq_id[i][0] = token, start + i, 1, 0
                    batch.logits[i] = True  # every token an output: the last layer routes them all
                rc = api.llama_decode(self.ctx, batch)
                if rc != 0:
                    raise MoespecError(f"{self.path}: llama_decode failed (code {rc}) at token {start}")
        finally:
            api.llama_batch_free(batch)
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
        if self.ctx is not None:
            self.api.llama_free(self.ctx)
            self.ctx = None
        self.api.llama_model_free(self.model)

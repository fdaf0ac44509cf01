"""llama.cpp from Python: llama-cpp-python's low-level bindings (an optional peer), and the one ggml structure moespec
reads from llama.cpp's graph while it evaluates (a tensor's name, shape, strides and data).

llama-cpp-python builds llama.cpp from source when pip installs it (about 10 minutes on 2 cores); where it is not
installed, `bindings()` says so in one line. LLAMA_CPP_LIB_PATH, the bindings' own setting, makes them load a
libllama built elsewhere (for example beside llama-bench).

Shape legend of GgmlTensor (ggml order: the fastest dimension first)
    ne[0..3]  elements per dimension       nb[0..3]  strides in bytes
    a 2-D view [ne0, ne1] holds row r at data + r nb[1] (rows of a view of a wider tensor are not contiguous)
The layout is ggml.h's `struct ggml_tensor` (GGML_MAX_DIMS 4, GGML_MAX_OP_PARAMS 64 bytes, GGML_MAX_SRC 10,
GGML_MAX_NAME 64) of the llama.cpp that llama-cpp-python 0.3.36 vendors.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import numpy as np

from moespec import MoespecError

GGML_F32, GGML_I32 = 0, 26  # ggml_type codes of the tensors read here
_NUMPY = {GGML_F32: np.float32, GGML_I32: np.int32}


def bindings() -> Any:
    """The module llama_cpp.llama_cpp (llama-cpp-python's ctypes bindings), or a one-line error."""
    try:
        import llama_cpp.llama_cpp as api  # optional peer (pyproject: peers)
    except ImportError as e:
        raise MoespecError(f"llama.cpp is not available: llama-cpp-python cannot be imported ({e}); "
                           "pip install llama-cpp-python") from None
    except (OSError, RuntimeError) as e:  # the bindings found no loadable libllama
        raise MoespecError(f"llama.cpp is not available: llama-cpp-python cannot load libllama ({e})") from None
    return api


class GgmlTensor(ctypes.Structure):
    """ggml.h's struct ggml_tensor (module docstring)."""

    _fields_ = [("type", ctypes.c_int), ("buffer", ctypes.c_void_p), ("ne", ctypes.c_int64 * 4),
                ("nb", ctypes.c_size_t * 4), ("op", ctypes.c_int), ("op_params", ctypes.c_int32 * 16),
                ("flags", ctypes.c_int32), ("src", ctypes.c_void_p * 10), ("view_src", ctypes.c_void_p),
                ("view_offs", ctypes.c_size_t), ("data", ctypes.c_void_p), ("name", ctypes.c_char * 64),
                ("extra", ctypes.c_void_p), ("padding", ctypes.c_char * 8)]

    def matrix(self) -> np.ndarray:
        """A copy of this 2-D f32 or i32 tensor in host memory as [ne1, ne0] (rows at stride nb[1])."""
        kind = _NUMPY.get(self.type)
        if kind is None or self.ne[2] != 1 or self.ne[3] != 1 or not self.data:
            raise MoespecError(f"llama.cpp tensor {self.name.decode()!r}: not a 2-D f32/i32 tensor in host memory")
        cols, rows, size = self.ne[0], self.ne[1], np.dtype(kind).itemsize
        stride = self.nb[1] // size
        flat = np.ctypeslib.as_array((ctypes.c_byte * (size * (stride * (rows - 1) + cols))).from_address(self.data))
        return np.lib.stride_tricks.as_strided(flat.view(kind), (rows, cols), (self.nb[1], size)).copy()


EVAL_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_bool, ctypes.c_void_p, ctypes.c_bool, ctypes.c_void_p)


@ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
def quiet_log(level: int, text: bytes, data: Any) -> None:
    """A log callback for llama_log_set that keeps llama.cpp's load messages off the terminal."""


def backend() -> Any:
    """The bindings with llama.cpp's backend initialized and its log kept off the terminal (quiet_log)."""
    api = bindings()
    api.llama_backend_init()
    api.llama_log_set(quiet_log, ctypes.c_void_p(0))
    return api


def tokenize(api: Any, vocab: Any, text: str, where: str) -> list[int]:
    """`text`'s token ids with a llama.cpp model's own tokenizer (`vocab`: llama_model_get_vocab), special tokens
    as the vocabulary adds them (BOS where it has one); `where` names the model in an error."""
    raw = text.encode()
    room = len(raw) + 8  # a byte-level tokenizer gives at most one token per byte, plus BOS/EOS
    buf = (api.llama_token * room)()
    n = api.llama_tokenize(vocab, raw, len(raw), buf, room, True, False)
    if n < 0:
        raise MoespecError(f"{where}: llama.cpp could not tokenize a text")
    return list(buf[:n])


class LlamaContext:
    """A GGUF model in one llama.cpp context: its KV cache holds `length` tokens at positions 0..length-1 of
    sequence 0. `forward` feeds tokens after them (a verify pass, a draft step, a chunk of a prefill) and
    `rollback` drops the last ones (llama_memory_seq_rm), as a rejected draft is dropped. `cb_eval`, an
    EVAL_CALLBACK, observes every tensor of the graph as it is computed (moespec.routing.llama_tracer).

    Context settings are llama-bench's defaults (n_batch 2048, n_ubatch 512, f16 K and V, flash attention "auto",
    the model's default buffer types) unless given; a batch longer than n_batch goes in n_batch pieces."""

    def __init__(self, path: str, n_ctx: int, threads: int, n_batch: int = 2048, n_ubatch: int = 512,
                 cb_eval: Any = None, model: Any = None, sequences: int = 1) -> None:
        """`sequences`: llama.cpp's n_seq_max, the sequence ids the context holds (LlamaSequences uses more than
        one; each then has n_ctx / sequences cells of its own)."""
        if n_ctx < 1 or threads < 1 or n_batch < 1 or n_ubatch < 1 or sequences < 1:
            raise ValueError(f"n_ctx, threads, n_batch, n_ubatch, sequences: each must be >= 1, got {n_ctx}, "
                             f"{threads}, {n_batch}, {n_ubatch}, {sequences}")
        self.path, self.api = path, backend()
        api = self.api
        self.owns_model = model is None
        self.model = model or api.llama_model_load_from_file(str(path).encode(), api.llama_model_default_params())
        if not self.model:
            raise MoespecError(f"{path}: llama.cpp could not load this model")
        params = api.llama_context_default_params()
        params.n_ctx, params.n_batch, params.n_ubatch = n_ctx, n_batch, min(n_ubatch, n_batch)
        params.n_threads = params.n_threads_batch = threads
        params.n_seq_max = sequences
        if cb_eval is not None:
            params.cb_eval, params.cb_eval_user_data = cb_eval, None
        self.ctx = api.llama_init_from_model(self.model, params)
        if not self.ctx:
            self._free_model()
            raise MoespecError(f"{path}: llama.cpp could not make a context of {n_ctx} tokens")
        self.n_ctx, self.n_batch, self.length = n_ctx, n_batch, 0
        self.gaps: list[float] = []
        self.memory = api.llama_get_memory(self.ctx)
        self.vocab = api.llama_model_get_vocab(self.model)
        self.vocab_size = api.llama_vocab_n_tokens(self.vocab)
        self.batch = api.llama_batch_init(n_batch, 0, 1)

    def fill(self, tokens: list[int], every_logit: bool) -> None:
        """Put `tokens` at positions length.. into the batch (logits of all of them, or of the last one)."""
        if not 1 <= len(tokens) <= self.n_batch or self.length + len(tokens) > self.n_ctx:
            raise MoespecError(f"{self.path}: a batch of {len(tokens)} tokens after {self.length} does not fit "
                               f"(n_batch {self.n_batch}, n_ctx {self.n_ctx})")
        b = self.batch
        b.n_tokens = len(tokens)
        for i, token in enumerate(tokens):
            b.token[i], b.pos[i], b.n_seq_id[i], b.seq_id[i][0] = token, self.length + i, 1, 0
            b.logits[i] = every_logit or i == len(tokens) - 1

    def decode(self) -> None:
        """Evaluate the filled batch up to llama_synchronize; its tokens join the cache."""
        rc = self.api.llama_decode(self.ctx, self.batch)
        self.api.llama_synchronize(self.ctx)
        if rc != 0:
            raise MoespecError(f"{self.path}: llama_decode failed (code {rc}) on {self.batch.n_tokens} tokens at "
                               f"position {self.length}")
        self.length += self.batch.n_tokens

    def logits(self, rows: int) -> np.ndarray:
        """A copy of the last decode's logits [rows, vocab] (rows: the outputs it asked for)."""
        flat = self.api.llama_get_logits(self.ctx)
        return np.ctypeslib.as_array(flat, shape=(rows * self.vocab_size,)).reshape(rows, self.vocab_size).copy()

    def forward(self, tokens: list[int], last_only: bool = False) -> list[int]:
        """The greedy (argmax) token after each prefix of `tokens` fed after the cache (only the last with
        `last_only`; of the last n_batch tokens where a longer batch goes in pieces); `gaps` then holds the gap
        between the two largest logits of each."""
        for start in range(0, len(tokens), self.n_batch):
            piece = tokens[start:start + self.n_batch]
            last = start + self.n_batch >= len(tokens)
            self.fill(piece, every_logit=last and not last_only)
            self.decode()
        logits = self.logits(1 if last_only else len(piece))
        top2 = np.partition(logits, -2, axis=-1)[:, -2:]
        self.gaps = (top2[:, 1] - top2[:, 0]).tolist()  # how near each greedy choice was to a tie
        return logits.argmax(-1).tolist()

    def rollback(self, tokens: int) -> None:
        """Drop the last `tokens` positions from the cache."""
        if not 0 <= tokens <= self.length:
            raise ValueError(f"tokens: must lie in 0..{self.length}, got {tokens}")
        self.length -= tokens
        self.api.llama_memory_seq_rm(self.memory, 0, self.length, -1)

    def clear(self) -> None:
        self.api.llama_memory_clear(self.memory, True)
        self.length = 0

    def _free_model(self) -> None:
        if self.owns_model and self.model:
            self.api.llama_model_free(self.model)
        self.model = None

    def close(self) -> None:
        if self.ctx:
            self.api.llama_batch_free(self.batch)
            self.api.llama_free(self.ctx)
            self.ctx = None
        self._free_model()


class LlamaSequences:
    """B sequences of a GGUF model in one llama.cpp context, as a server holds its batch: sequence b has sequence
    id b and KV cells of its own, `lengths[b]` positions of them filled. `prefill` feeds one sequence's context;
    `forward` decodes ONE llama_batch holding the n_b tokens of every sequence b given (each token with its sequence
    id, its position after that sequence's cache and its logits requested), which is a batched verify pass; and
    `rollback` drops each sequence's last positions (llama_memory_seq_rm per sequence id), as rejected drafts are.

    This follows llama.cpp's tools/batched-bench/batched-bench.cpp (ggml-org/llama.cpp, commit 0a1f017): n_seq_max
    set to the most sequences a pass holds, one llama_batch whose every token carries its sequence id and position
    (common_batch_add), one llama_decode, then llama_synchronize. The KV cache is llama.cpp's default, one stream
    per sequence (kv_unified false): each sequence gets llama_n_ctx_seq = n_ctx / sequences cells and its
    attention reads them alone, as moespec's one cache per sequence (moespec.model.batched) does.

    Shapes: tokens[b] the n_b >= 1 token ids fed after sequence b's cache (b = 0..B-1, B <= sequences); the batch's
    rows in sequence order; `forward` returns logits [n_b, vocab] per sequence."""

    def __init__(self, path: str, sequences: int, room: int, threads: int, n_batch: int = 2048) -> None:
        """`room`: the positions each sequence may hold (its context plus the longest pass fed after it)."""
        for name, value in (("sequences", sequences), ("room", room), ("threads", threads), ("n_batch", n_batch)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
        most = backend().llama_max_parallel_sequences()
        if sequences > most:
            raise ValueError(f"sequences must be at most llama.cpp's {most}, got {sequences}")
        self.context = LlamaContext(path, sequences * room, threads, n_batch=n_batch, sequences=sequences)
        api, ctx = self.context.api, self.context.ctx
        given = api.llama_n_seq_max(ctx), api.llama_n_ctx_seq(ctx)
        if given[0] < sequences or given[1] < room:
            self.context.close()
            raise MoespecError(f"{path}: llama.cpp made {given[0]} sequences of {given[1]} positions where "
                               f"{sequences} of {room} were asked for")
        self.path, self.room, self.vocab_size = path, room, self.context.vocab_size
        self.lengths = [0] * sequences
        self.filled: list[int] = []  # tokens per sequence in the filled batch

    def _check_ids(self, seq: int, ids: Sequence[int], name: str) -> None:
        """`ids` (the argument `name`) are token ids that fit after sequence `seq`'s cache."""
        if not isinstance(ids, Sequence) or not ids or not all(
                isinstance(t, int) and not isinstance(t, bool) and 0 <= t < self.vocab_size for t in ids):
            raise ValueError(f"{name} must be a non-empty list of token ids in 0..{self.vocab_size - 1}")
        if self.lengths[seq] + len(ids) > self.room:
            raise ValueError(f"{name}: {len(ids)} tokens after {self.lengths[seq]} pass the room of {self.room} "
                             "positions")

    def _check(self, tokens: Sequence[Sequence[int]]) -> None:
        if not isinstance(tokens, Sequence) or not 1 <= len(tokens) <= len(self.lengths):
            raise ValueError(f"tokens must be a list of 1..{len(self.lengths)} sequences' token lists")
        for b, ids in enumerate(tokens):
            self._check_ids(b, ids, f"tokens[{b}]")
        if sum(len(ids) for ids in tokens) > self.context.n_batch:
            raise ValueError(f"tokens: {sum(len(ids) for ids in tokens)} tokens in all pass n_batch "
                             f"{self.context.n_batch}")

    def _fill(self, parts: list[tuple[int, Sequence[int]]], every_logit: bool) -> None:
        """Put each (sequence id, tokens) after that sequence's cache into the batch."""
        b, i = self.context.batch, 0
        self.filled = [0] * len(self.lengths)
        for seq, ids in parts:
            for j, token in enumerate(ids):
                b.token[i], b.pos[i], b.n_seq_id[i], b.seq_id[i][0] = token, self.lengths[seq] + j, 1, seq
                b.logits[i] = every_logit or j == len(ids) - 1
                i += 1
            self.filled[seq] = len(ids)
        b.n_tokens = i

    def fill(self, tokens: Sequence[Sequence[int]]) -> None:
        """Put every sequence's tokens into one batch, every logit requested (outside any timed interval)."""
        self._check(tokens)
        self._fill(list(enumerate(tokens)), every_logit=True)

    def decode(self) -> None:
        """Evaluate the filled batch in one llama_decode, up to llama_synchronize; its tokens join the caches."""
        api = self.context.api
        rc = api.llama_decode(self.context.ctx, self.context.batch)
        api.llama_synchronize(self.context.ctx)
        if rc != 0:
            raise MoespecError(f"{self.path}: llama_decode failed (code {rc}) on a batch of {self.filled} tokens "
                               f"per sequence after {self.lengths}")
        self.lengths = [length + n for length, n in zip(self.lengths, self.filled)]

    def prefill(self, seq: int, tokens: Sequence[int]) -> None:
        """Feed `tokens` after sequence `seq`'s cache, n_batch at a time, the last token's logits only."""
        if isinstance(seq, bool) or not isinstance(seq, int) or not 0 <= seq < len(self.lengths):
            raise ValueError(f"seq must be a sequence id in 0..{len(self.lengths) - 1}, got {seq!r}")
        self._check_ids(seq, tokens, "tokens")
        for start in range(0, len(tokens), self.context.n_batch):
            self._fill([(seq, tokens[start:start + self.context.n_batch])], every_logit=False)
            self.decode()

    def forward(self, tokens: Sequence[Sequence[int]]) -> list[np.ndarray]:
        """Logits [n_b, vocab] of each sequence's tokens fed after its cache, in one decode of all of them."""
        self.fill(tokens)
        self.decode()
        logits = self.context.logits(sum(len(ids) for ids in tokens))
        ends = np.cumsum([len(ids) for ids in tokens])
        return np.split(logits, ends[:-1])

    def rollback(self, counts: Sequence[int]) -> None:
        """Drop the last counts[b] positions of sequence b (b = 0..len(counts)-1)."""
        if not isinstance(counts, Sequence) or len(counts) > len(self.lengths) or not all(
                isinstance(c, int) and not isinstance(c, bool) and 0 <= c <= length
                for c, length in zip(counts, self.lengths)):
            raise ValueError(f"counts must give each of up to {len(self.lengths)} sequences 0..its length "
                             f"{self.lengths} positions to drop, got {counts!r}")
        for seq, count in enumerate(counts):
            self.lengths[seq] -= count
            self.context.api.llama_memory_seq_rm(self.context.memory, seq, self.lengths[seq], -1)

    def close(self) -> None:
        self.context.close()

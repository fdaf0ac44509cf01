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
                 cb_eval: Any = None, model: Any = None) -> None:
        if n_ctx < 1 or threads < 1 or n_batch < 1 or n_ubatch < 1:
            raise ValueError(f"n_ctx, threads, n_batch, n_ubatch: each must be >= 1, got {n_ctx}, {threads}, "
                             f"{n_batch}, {n_ubatch}")
        self.path, self.api = path, backend()
        api = self.api
        self.owns_model = model is None
        self.model = model or api.llama_model_load_from_file(str(path).encode(), api.llama_model_default_params())
        if not self.model:
            raise MoespecError(f"{path}: llama.cpp could not load this model")
        params = api.llama_context_default_params()
        params.n_ctx, params.n_batch, params.n_ubatch = n_ctx, n_batch, min(n_ubatch, n_batch)
        params.n_threads = params.n_threads_batch = threads
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

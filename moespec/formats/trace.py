"""Routing traces: which m of the N experts every MoE layer selected for each token of a token sequence.

A routing process is the array of expert sets S_{l,t} (paper Section 1): layer l, token position t, |S_{l,t}| = m
distinct ids in [0, N). A trace is one recorded (or synthesized) realization of it, split into documents. Every
quantity the rest of moespec needs from routing is a statistic over windows of n consecutive tokens: the reuse
rho_l(n) of (1), the union X_{l,t}(n) = |S_{l,t} ∪ ... ∪ S_{l,t+n-1}| and its mean U_l(n) of (2), and through them
the expert bytes (3) and (11). Following the estimator of Appendix D.2, a window never crosses a document
boundary: consecutive documents are unrelated texts, so the routing of one says nothing about the next.

Storage. One .npz file, uncompressed (zlib shrinks synthetic calibrated traces only to 72-79% and takes ~10 s per
million tokens of a 48-layer model), holding
  experts     [T, L, m]  uint8 when N <= 256, else int16
  doc_starts  [D + 1]    int64, 0 = s_0 < s_1 < ... < s_D = T (document d is tokens s_d .. s_{d+1} - 1)
  weights     [T, L, m]  float32 router weights (optional)
  header      JSON text (utf-8 bytes): format "moespec-trace", version, N, m, L, T, D and the metadata.
Loading validates all of it and fails with one line naming the file and the problem. Writes are atomic.

Bitsets. `chunk_masks` turns ids into one bit per expert (ceil(N/64) uint64 words per token). A set
union is then a bitwise OR and an intersection size a popcount, which is what makes the reuse statistics over
millions of tokens fast (moespec.routing.reuse); the loader uses the same masks to check that every token's m ids are
distinct (popcount = m).
"""

from __future__ import annotations

import json
import os
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from moespec import MoespecError, printable
from moespec.formats.files import atomic_write, check_input, parse_json

FORMAT_NAME = "moespec-trace"
FORMAT_VERSION = 1
# Ids are stored in the smallest type that holds them: uint8 covers every model up to 256 experts; int16 covers
# the rest (no public MoE has more than 32767 experts per layer).
MAX_UINT8_EXPERTS = 256
MAX_EXPERTS = np.iinfo(np.int16).max
WORD_BITS = 64  # experts per uint64 mask word
# Tokens per chunk when masks are built for validation: small enough to stay in cache for 48-layer models.
_MASK_CHUNK = 4096
# member -> (dtype kinds, dimensions) it must have: ids and offsets integers, weights floats, the header utf-8 bytes
_MEMBERS = {"experts": ("iu", 3), "doc_starts": ("iu", 1), "weights": ("f", 3), "header": ("u", 1)}


def popcount(words: np.ndarray) -> np.ndarray:
    """Number of set bits of each uint64 (uint8 result). numpy >= 2.0 has a native popcount; older numpy
    counts through a 256-entry byte table."""
    if hasattr(np, "bitwise_count"):
        return np.bitwise_count(words)
    table = np.array([bin(i).count("1") for i in range(256)], dtype=np.uint8)
    return table[words.view(np.uint8).reshape(*words.shape, 8)].sum(axis=-1, dtype=np.uint8)


def mask_words(num_experts: int) -> int:
    """uint64 words needed for one bit per expert."""
    return -(-num_experts // WORD_BITS)


def chunk_masks(ids: np.ndarray, num_experts: int, length: int | None = None) -> np.ndarray:
    """Bitsets of expert sets: ids [T, L, m] (values in [0, N)) -> uint64 [words, length, L], bit e of word e//64
    set for expert e; tokens past T (up to `length`, default T) are empty sets. Repeated ids within a token
    collapse to one bit, so popcount < m flags a repeated id.

    Word w holds 1 << (id - 64 w); numpy defines a shift by 64 or more as 0, and the subtraction wraps around in
    the unsigned id type to a large shift for ids below 64 w, so every id lands in exactly one word."""
    t, num_layers, m = ids.shape
    length = t if length is None else length
    unsigned = np.ascontiguousarray(ids.transpose(2, 0, 1)).astype(np.uint8 if num_experts <= MAX_UINT8_EXPERTS
                                                                   else np.uint16, copy=False)  # [m, T, L]
    masks = np.zeros((mask_words(num_experts), length, num_layers), dtype=np.uint64)
    bit = np.empty((t, num_layers), dtype=np.uint64)
    shift = np.empty((t, num_layers), dtype=unsigned.dtype)
    for j in range(m):
        for w in range(masks.shape[0]):
            offset = unsigned[j] if w == 0 else np.subtract(unsigned[j], unsigned.dtype.type(WORD_BITS * w), out=shift)
            np.left_shift(np.uint64(1), offset, out=bit)
            masks[w, :t] |= bit
    return masks


def depth_map(from_layers: int, to_layers: int) -> list[int]:
    """For each of `to_layers` layers, the one of `from_layers` at the same relative depth: round(l (F - 1) / (T - 1))
    (the first to the first, the last to the last)."""
    if from_layers < 1 or to_layers < 1:
        raise MoespecError(f"layers: need at least one on each side, got {from_layers} and {to_layers}")
    return [round(l * (from_layers - 1) / max(to_layers - 1, 1)) for l in range(to_layers)]


@dataclass(frozen=True, eq=False)
class Trace:
    """T tokens x L MoE layers x m expert ids, split into D documents. Build with `from_arrays` (validates)."""

    experts: np.ndarray
    doc_starts: np.ndarray
    num_experts: int
    weights: np.ndarray | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    # ---- construction -------------------------------------------------------------------------------------
    @classmethod
    def from_arrays(
        cls,
        experts: Any,
        doc_starts: Any,
        num_experts: int,
        weights: Any = None,
        meta: dict[str, Any] | None = None,
    ) -> "Trace":
        """Validate and store: experts int [T, L, m] with m distinct ids in [0, N) per token and layer,
        doc_starts [D+1] from 0 strictly increasing to T, optional weights [T, L, m]. Raises MoespecError."""
        return _build(experts, doc_starts, num_experts, weights, meta, where="trace")

    @classmethod
    def empty(cls, num_experts: int, num_layers: int, m: int, meta: dict[str, Any] | None = None,
              with_weights: bool = False) -> "Trace":
        """A trace with no documents yet, to grow with `append_document` (e.g. one checkpoint per document)."""
        experts = np.zeros((0, num_layers, m), dtype=np.int64)
        weights = np.zeros((0, num_layers, m), dtype=np.float32) if with_weights else None
        return cls.from_arrays(experts, [0], num_experts, weights, meta)

    def append_document(self, experts: Any, weights: Any = None) -> "Trace":
        """A new trace with one more document (experts [T_d, L, m], weights [T_d, L, m] iff this trace has them)."""
        experts = np.asarray(experts)
        if experts.ndim != 3 or experts.shape[0] == 0:
            raise MoespecError(f"trace: a document needs experts of shape [tokens >= 1, L, m], got {experts.shape}")
        if (weights is None) != (self.weights is None):
            raise MoespecError("trace: router weights must be given for every document or for none")
        starts = np.append(self.doc_starts, self.num_tokens + experts.shape[0])
        new_weights = None if weights is None else np.concatenate([self.weights, np.asarray(weights, np.float32)])
        return _build(np.concatenate([self.experts, experts]), starts, self.num_experts, new_weights,
                      self.meta, where="trace")

    def by_relative_depth(self, num_layers: int, meta: dict[str, Any] | None = None) -> "Trace":
        """A trace of `num_layers` MoE layers whose layer l replays this trace's layer at the same relative depth
        (depth_map): a 4-layer model's routing on a 16-layer model's shape. Router weights are dropped; `meta`
        updates the metadata (its model), which records the layers taken."""
        source = depth_map(self.num_layers, num_layers)
        kept = {k: v for k, v in self.meta.items() if k != "num_layers"}  # the new shape is the arrays'
        info = {**kept, **(meta or {}), "layers_from": {"num_layers": self.num_layers, "source": source}}
        return _build(self.experts[:, source], self.doc_starts, self.num_experts, None, info, where="trace")

    # ---- shape ---------------------------------------------------------------------------------------------
    @property
    def num_tokens(self) -> int:
        return int(self.experts.shape[0])

    @property
    def num_layers(self) -> int:
        return int(self.experts.shape[1])

    @property
    def m(self) -> int:
        return int(self.experts.shape[2])

    @property
    def num_documents(self) -> int:
        return int(self.doc_starts.size - 1)

    @property
    def document_lengths(self) -> np.ndarray:
        return np.diff(self.doc_starts)

    def documents(self) -> list[tuple[int, int]]:
        """(start, stop) token range of every document, in order."""
        s = self.doc_starts.tolist()
        return list(zip(s[:-1], s[1:]))

    # ---- windows (App. D.2: every window of n consecutive tokens inside one document) -------------------
    def window_counts(self, n: int) -> np.ndarray:
        """Windows of n tokens in each document: max(0, length - n + 1)."""
        _check_n(n)
        return np.maximum(self.document_lengths - n + 1, 0)

    def window_starts(self, n: int) -> np.ndarray:
        """First token of every window of n consecutive tokens that lies inside one document (int64, sorted)."""
        counts = self.window_counts(n)
        total = int(counts.sum())
        # position within its document's run of windows, plus that document's start
        offsets = np.repeat(np.cumsum(counts) - counts, counts)
        return np.arange(total, dtype=np.int64) - offsets + np.repeat(self.doc_starts[:-1], counts)

    def windows(self, layer: int, n: int) -> np.ndarray:
        """Expert ids of every in-document window of n tokens at one layer: [num_windows, n, m]."""
        if not 0 <= layer < self.num_layers:
            raise MoespecError(f"trace: layer {layer} outside [0, {self.num_layers})")
        starts = self.window_starts(n)
        return self.experts[starts[:, None] + np.arange(n), layer]

    # ---- I/O -----------------------------------------------------------------------------------------------
    def header(self) -> dict[str, Any]:
        """The JSON header written into the file: format, version, sizes and the metadata."""
        return {**self.meta, "num_tokens": self.num_tokens, "num_documents": self.num_documents,
                "has_weights": self.weights is not None}

    def check_fits(self, spec: Any, where: str, prefix: bool = False, model: str | None = None) -> None:
        """Refuse a trace that cannot route `spec` (a ModelSpec): other N or m, other MoE layers (or, with `prefix`,
        fewer: a model built with its first L MoE layers replays a trace's first L), or, given the model's name,
        a trace that records another model."""
        named = self.meta.get("model")
        if model is not None and named is not None and named != model:
            raise MoespecError(f"{where}: a trace of {printable(str(named))}, not of {model}")
        layers_fit = self.num_layers >= spec.L if prefix else self.num_layers == spec.L
        if (self.num_experts, self.m) != (spec.N, spec.m) or not layers_fit:
            raise MoespecError(f"{where}: routes N={self.num_experts}, m={self.m}, L={self.num_layers} but {spec.name} "
                               f"has N={spec.N}, m={spec.m}, L={spec.L}" + (" (a trace of at least L MoE layers "
                                                                            "replays its first L)" if prefix else ""))

    def save(self, path: str | os.PathLike) -> Path:
        """Write the trace atomically as one .npz (see the module docstring for the layout)."""
        arrays = {"experts": self.experts, "doc_starts": self.doc_starts,
                  "header": np.frombuffer(json.dumps(self.header()).encode(), dtype=np.uint8)}
        if self.weights is not None:
            arrays["weights"] = self.weights

        def write(tmp: Path) -> None:
            with open(tmp, "wb") as f:  # a file object: np.savez would append ".npz" to a bare name
                np.savez(f, **arrays)

        return atomic_write(path, write)


def load_trace(path: str | os.PathLike) -> Trace:
    """Read and fully validate a trace file; any problem raises MoespecError naming the file."""
    where = str(path)
    check_input(path, "trace")
    try:
        if not zipfile.is_zipfile(path):
            raise MoespecError(f"{where}: not a moespec trace (not an .npz archive; truncated or another format)")
        with np.load(path, allow_pickle=False) as npz:
            names = set(npz.files)
            missing = {"experts", "doc_starts", "header"} - names
            if missing:
                raise MoespecError(f"{where}: not a moespec trace (missing {', '.join(sorted(missing))})")
            unknown = names - set(_MEMBERS)
            if unknown:
                raise MoespecError(f"{where}: unexpected arrays {printable(', '.join(sorted(unknown)))}")
            arrays = {name: npz[name] for name in names}
    except MoespecError:
        raise
    except Exception as e:  # noqa: BLE001 - zip/npy corruption surfaces as many exception types
        raise MoespecError(f"{where}: corrupt or truncated archive ({type(e).__name__}: {_one_line(e)})") from None
    for name, array in arrays.items():
        _check_member(name, array, where)
    header = _parse_header(arrays["header"], where)
    trace = _build(arrays["experts"], arrays["doc_starts"], header.get("num_experts"), arrays.get("weights"),
                   header, where=where)
    for key, actual in (("num_tokens", trace.num_tokens), ("num_documents", trace.num_documents),
                        ("has_weights", trace.weights is not None)):
        if header.get(key) != actual:
            raise MoespecError(f"{where}: header says {key} = {header.get(key)!r} but the arrays give {actual!r}")
    return trace


# ---- validation ------------------------------------------------------------------------------------------
def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())[:200]


def _check_member(name: str, array: Any, where: str) -> None:
    """A member of the archive is a .npy array of its kind and dimensions (_MEMBERS); numpy hands any other member
    back as raw bytes."""
    kinds, ndim = _MEMBERS[name]
    if not isinstance(array, np.ndarray):
        raise MoespecError(f"{where}: member {name!r} is not a .npy array")
    if array.dtype.kind not in kinds or array.ndim != ndim:
        what = {"i": "integers", "u": "unsigned integers", "f": "floats"}[kinds[0]]
        raise MoespecError(f"{where}: {name} must be a {ndim}-D array of {what}, got {array.dtype} of shape "
                           f"{array.shape}")


def _parse_header(arr: np.ndarray, where: str) -> dict[str, Any]:
    if arr.dtype != np.uint8 or arr.ndim != 1:
        raise MoespecError(f"{where}: not a moespec trace (header is not utf-8 JSON bytes)")
    header = parse_json(arr.tobytes(), f"{where}: header")
    if not isinstance(header, dict) or header.get("format") != FORMAT_NAME:
        raise MoespecError(f"{where}: not a moespec trace (header format is not {FORMAT_NAME!r})")
    if header.get("version") != FORMAT_VERSION:
        raise MoespecError(f"{where}: trace format version {header.get('version')!r} is not supported "
                           f"(this moespec reads version {FORMAT_VERSION})")
    for key in ("num_experts", "num_layers", "m"):
        if type(header.get(key)) is not int:
            raise MoespecError(f"{where}: header field {key!r} must be an integer, got {header.get(key)!r}")
    return header


def _int_array(a: Any, name: str, where: str) -> np.ndarray:
    a = np.asarray(a)
    if a.dtype.kind not in "iu":
        raise MoespecError(f"{where}: {name} must hold integers, got dtype {a.dtype}")
    return a


def _check_n(n: int) -> None:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise MoespecError(f"window length n must be an integer >= 1, got {n!r}")


def _build(experts: Any, doc_starts: Any, num_experts: Any, weights: Any, meta: dict[str, Any] | None,
           where: str) -> Trace:
    """Validate every invariant of a trace and return it with compact, read-only arrays."""
    if isinstance(num_experts, bool) or not isinstance(num_experts, (int, np.integer)) \
            or not 2 <= num_experts <= MAX_EXPERTS:
        raise MoespecError(f"{where}: number of experts N must be an integer in [2, {MAX_EXPERTS}], "
                           f"got {num_experts!r}")
    n_exp = int(num_experts)
    experts = _int_array(experts, "experts", where)
    if experts.ndim != 3 or experts.shape[1] < 1 or experts.shape[2] < 1:
        raise MoespecError(f"{where}: experts must have shape [tokens, layers >= 1, m >= 1], got {experts.shape}")
    t, num_layers, m = experts.shape
    if m >= n_exp:
        raise MoespecError(f"{where}: m = {m} experts per token must be below N = {n_exp}")
    starts = _int_array(doc_starts, "doc_starts", where)
    if starts.ndim != 1:
        raise MoespecError(f"{where}: doc_starts must be 1-D, got shape {starts.shape}")
    if starts.size < 1 or starts[0] != 0 or starts[-1] != t \
            or (starts.size > 1 and np.any(np.diff(starts.astype(np.int64)) <= 0)):
        raise MoespecError(f"{where}: document offsets do not add up: doc_starts must run from 0, strictly "
                           f"increasing, to the {t} tokens (got {starts.size} offsets"
                           f"{', last ' + str(int(starts[-1])) if starts.size else ''})")
    if t and (int(experts.min()) < 0 or int(experts.max()) >= n_exp):
        raise MoespecError(f"{where}: expert ids must lie in [0, {n_exp}), found "
                           f"{int(experts.min())}..{int(experts.max())}")
    _check_distinct(experts, n_exp, where)
    if weights is not None:
        weights = np.asarray(weights)
        if weights.shape != experts.shape or weights.dtype.kind != "f":
            raise MoespecError(f"{where}: router weights must be floats of the experts' shape {experts.shape}, "
                               f"got {weights.dtype} {weights.shape}")
        weights = weights.astype(np.float32)
        if not np.all(np.isfinite(weights)):
            raise MoespecError(f"{where}: router weights contain NaN or infinity")
        weights.setflags(write=False)
    meta = _merge_meta(meta, n_exp, num_layers, m, where)
    compact = np.uint8 if n_exp <= MAX_UINT8_EXPERTS else np.int16
    experts = experts.astype(compact)
    starts = starts.astype(np.int64)
    experts.setflags(write=False)
    starts.setflags(write=False)
    return Trace(experts=experts, doc_starts=starts, num_experts=n_exp, weights=weights, meta=meta)


def _check_distinct(experts: np.ndarray, num_experts: int, where: str) -> None:
    """Every token's m ids in a layer must be distinct: the popcount of their bitset must equal m."""
    m = experts.shape[2]
    for lo in range(0, experts.shape[0], _MASK_CHUNK):
        counts = popcount(chunk_masks(experts[lo:lo + _MASK_CHUNK], num_experts)).sum(axis=0, dtype=np.int64)
        bad = np.argwhere(counts != m)
        if bad.size:
            tok, layer = lo + int(bad[0, 0]), int(bad[0, 1])
            raise MoespecError(f"{where}: token {tok} layer {layer} repeats an expert id "
                               f"({experts[tok, layer].tolist()}); the m ids of a token must be distinct")


# metadata keys every trace carries (None when unknown); sizes and format are set from the arrays
_META_DEFAULTS: dict[str, Any] = {"model": None, "source": None, "tokenizer": None, "synthetic": False}


def _merge_meta(meta: dict[str, Any] | None, n_exp: int, num_layers: int, m: int, where: str) -> dict[str, Any]:
    meta = dict(meta or {})
    for key in ("num_tokens", "num_documents", "has_weights"):
        meta.pop(key, None)  # file-level sizes: recomputed on save, checked on load
    derived = {"num_experts": n_exp, "num_layers": num_layers, "m": m, "format": FORMAT_NAME,
               "version": FORMAT_VERSION}
    for key, value in derived.items():
        if key in meta and meta[key] != value:
            raise MoespecError(f"{where}: header says {key} = {meta[key]!r} but the arrays give {value!r}")
    try:
        json.dumps(meta)
    except (TypeError, ValueError):
        raise MoespecError(f"{where}: trace metadata must be JSON-serializable") from None
    return {**_META_DEFAULTS, **meta, **derived}


def concatenate(traces: Iterable[Trace], meta: dict[str, Any] | None = None) -> Trace:
    """One trace holding the documents of several (same N, L, m), e.g. per-document checkpoints."""
    traces = list(traces)
    if not traces:
        raise MoespecError("trace: nothing to concatenate")
    first = traces[0]
    lengths = np.concatenate([t.document_lengths for t in traces])
    starts = np.concatenate([[0], np.cumsum(lengths)])
    has_w = [t.weights is not None for t in traces]
    if any(t.num_experts != first.num_experts for t in traces):
        raise MoespecError("trace: cannot concatenate traces with different numbers of experts")
    weights = np.concatenate([t.weights for t in traces]) if all(has_w) else None
    if any(has_w) and not all(has_w):
        raise MoespecError("trace: cannot concatenate traces with and without router weights")
    try:
        experts = np.concatenate([t.experts for t in traces])
    except ValueError:
        raise MoespecError("trace: cannot concatenate traces with different layers or m") from None
    return _build(experts, starts, first.num_experts, weights, first.meta if meta is None else meta, where="trace")

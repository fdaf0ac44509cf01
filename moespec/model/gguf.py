"""A llama.cpp model file (GGUF) read for moespec: its ModelSpec, and the bytes of every tensor in the file's own
formats, so the byte model of a quantized model is the file's, not an estimate.

Physics first. What a verification pass reads is what the file stores: llama.cpp keeps each tensor in one format
(q8_0, q4_K, bf16, ...; a "q4_K_M" file mixes several, and keeps norms and routers in f32), so the bytes of an
expert, of the dense part and of the head are sums over the file's tensors, read from its tensor table. The
shapes that fix routing and the KV cache (N experts, top-m, hidden size, heads, layers) are the file's metadata.

Names. Metadata keys and tensor names are the `gguf` package's tables (gguf.Keys, gguf.TENSOR_NAMES), the same
ones llama.cpp's converter writes: `{arch}.expert_count`, `blk.{bid}.ffn_gate_exps`, ... GGUF architectures map to
the Hugging Face classes moespec models (ARCHITECTURES); llama.cpp stores Mixtral as "llama" with experts.
DeepSeek-V2 ("deepseek2": MLA, its key and value lengths named differently across llama.cpp versions) is not read
yet: a one-line refusal names the architectures that are.

Byte model (the contract of ModelSpec.byte_model, at the file's formats):
    w_l   bytes of layer l's routed-expert tensors (gate, up, down, fused gate_up, their biases) over N
    D     every other tensor, except the token embedding, of which a pass reads one row per token (the whole table
          is the output head where the file has no `output` tensor: tied embeddings)
    kv(k) the KV cache of the spec at the cache format (llama.cpp's default: f16 keys and values)
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from moespec import MoespecError, printable
from moespec.formats.files import check_input
from moespec.model.spec import ModelSpec, check_size, resolve, shown
from moespec.model.weights import format_name

# GGUF general.architecture -> Hugging Face model_type, for the MoE architectures moespec reads from a GGUF file
ARCHITECTURES = {"olmoe": "olmoe", "qwen3moe": "qwen3_moe", "llama": "mixtral", "gpt-oss": "gpt_oss"}
QK_NORM = {"olmoe": "proj", "qwen3moe": "head"}  # OLMoE normalizes the q/k projections, Qwen3 each head
KV_FORMAT = "fp16"  # llama.cpp's default cache type (f16 K and V)


def gguf_module() -> Any:
    try:
        import gguf  # the gguf package: llama.cpp's own reader and name tables
    except ImportError:
        raise MoespecError("reading a GGUF file needs the gguf package (pip install gguf)") from None
    return gguf


@dataclass(frozen=True)
class GgufTensor:
    """One tensor of the file: its name, llama.cpp type (F32, BF16, Q8_0, Q4_K, ...), shape in ggml order
    (fastest dimension first) and bytes."""

    name: str
    type: str
    shape: tuple[int, ...]
    bytes: int


@dataclass(frozen=True)
class GgufModel:
    """A GGUF file's spec and tensors (read_gguf)."""

    path: str
    arch: str
    spec: ModelSpec
    tensors: tuple[GgufTensor, ...]

    def _expert_names(self, block: int) -> set[str]:
        gguf = gguf_module()
        kinds = (gguf.MODEL_TENSOR.FFN_GATE_EXP, gguf.MODEL_TENSOR.FFN_UP_EXP, gguf.MODEL_TENSOR.FFN_DOWN_EXP,
                 gguf.MODEL_TENSOR.FFN_GATE_UP_EXP)
        return {f"{gguf.TENSOR_NAMES[k].format(bid=block)}.{part}" for k in kinds for part in ("weight", "bias")}

    @cached_property
    def _tensor_bytes(self) -> dict[str, int]:
        return {t.name: t.bytes for t in self.tensors}

    def expert_tensor_names(self) -> set[str]:
        """The names of every routed-expert tensor of the file (all MoE layers)."""
        return set().union(*(self._expert_names(b) for b in self.spec.moe_layers))

    def expert_format(self) -> str:
        """The file's weight format as runs, benches and plans name a dtype: the type of its expert tensors in
        moespec's name (bf16, q8_0, fp32 for F32: weights.format_name), "gguf-mixed" where they differ (a q4_K_M
        file)."""
        names = self.expert_tensor_names()
        kinds = {t.type.lower() for t in self.tensors if t.name in names}
        return format_name(kinds.pop()) if len(kinds) == 1 else "gguf-mixed"

    def expert_bytes(self, layer: int) -> int:
        """w_l: bytes of one routed expert of MoE layer `layer` (0..L-1) as stored in the file."""
        if not 0 <= layer < self.spec.L:
            raise MoespecError(f"{self.path}: MoE layer {layer} outside 0..{self.spec.L - 1}")
        sizes = self._tensor_bytes
        return sum(sizes.get(name, 0) for name in self._expert_names(self.spec.moe_layers[layer])) // self.spec.N

    def W(self) -> int:  # noqa: N802 - the paper's symbol
        """W = sum over MoE layers of w_l."""
        return sum(self.expert_bytes(layer) for layer in range(self.spec.L))

    def dense_bytes(self, tokens: int = 1) -> int:
        """D: bytes a pass of `tokens` tokens reads whatever the routing (the module docstring)."""
        if tokens < 1:
            raise MoespecError(f"{self.path}: tokens must be >= 1, got {tokens}")
        experts = self.expert_tensor_names()
        embed = gguf_module().TENSOR_NAMES[gguf_module().MODEL_TENSOR.TOKEN_EMBD] + ".weight"
        total = 0
        for t in self.tensors:
            if t.name in experts:
                continue
            if t.name == embed and not self.spec.tied_embeddings:
                total += t.bytes * tokens // self.spec.vocab  # one row per token
            else:
                total += t.bytes
        return total

    def byte_model(self, depth: int, kmax: int, kv_dtype: str = KV_FORMAT) -> tuple[int, int, list[int]]:
        """(mW, D, kv) as ModelSpec.byte_model, from the file's tensor bytes."""
        D = [self.dense_bytes(k + 1) for k in range(kmax + 1)]
        kv = [self.spec.kv_bytes(k, depth, kv_dtype) + D[k] - D[0] for k in range(kmax + 1)]
        return self.spec.m * self.W(), D[0], kv

    def summary(self, depth: int, kmax: int, kv_dtype: str = KV_FORMAT) -> dict[str, Any]:
        """The keys of moespec.model.spec.summary, at the file's formats (format: the types it holds)."""
        types = sorted({t.type for t in self.tensors})
        return {"spec": self.spec.to_dict(), "format": "gguf: " + ", ".join(types), "kv_dtype": kv_dtype,
                "depth": depth, "gguf": self.path, "arch": self.arch,
                "expert_bytes": [self.expert_bytes(layer) for layer in range(self.spec.L)], "W": self.W(),
                "D": self.dense_bytes(), "kv": [self.spec.kv_bytes(k, depth, kv_dtype) for k in range(kmax + 1)]}


class _Metadata:
    """Typed reads of a GGUF file's metadata, naming the file and the key in one line when one is missing, of
    another type, or a size out of its ModelSpec range (spec.check_size). Strings come back printable."""

    _REQUIRED = object()

    def __init__(self, fields: dict[str, Any], path: Path) -> None:
        self.fields, self.path = fields, path

    def _value(self, key: str, default: Any) -> Any:
        field = self.fields.get(key)
        if field is None:
            if default is self._REQUIRED:
                raise MoespecError(f"{self.path}: metadata key {key!r} missing")
            return None
        try:
            return field.contents()
        except (ValueError, TypeError, IndexError) as e:  # bad UTF-8 (a ValueError) or a malformed array
            raise MoespecError(f"{self.path}: metadata key {key!r} unreadable ({type(e).__name__})") from None

    def size(self, key: str, size: str, default: Any = _REQUIRED, least: int | None = None) -> Any:
        """metadata[key] as a size of the kind of ModelSpec field `size`; `default` where absent."""
        value = self._value(key, default)
        return default if value is None else check_size(value, f"{self.path}: {key}", size, least)

    def text(self, key: str, default: Any = _REQUIRED) -> str:
        """metadata[key] as a string, its control characters escaped (moespec.printable); `default` where absent."""
        value = self._value(key, default)
        if value is None:
            return default
        if not isinstance(value, str):
            raise MoespecError(f"{self.path}: {key} = {shown(value)} must be a string")
        return printable(value)


def read_gguf(path: str | Path) -> GgufModel:
    """The spec and tensor table of a GGUF file; one-line errors name the file and what is wrong (not a GGUF or
    truncated, an architecture moespec does not read, a dense model, a key or tensor missing, of another type, out
    of range or inconsistent)."""
    gguf = gguf_module()
    path = Path(path)
    check_input(path, "GGUF")  # a FIFO is no GGUF file either (reading one would wait forever)
    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as e:  # noqa: BLE001 - the reader raises many kinds on a damaged file
        raise MoespecError(f"{path}: not a readable GGUF file ({type(e).__name__}: {shown(str(e), 200)})") from None
    meta = _Metadata(dict(reader.fields), path)
    arch = meta.text(gguf.Keys.General.ARCHITECTURE)
    if arch not in ARCHITECTURES:
        raise MoespecError(f"{path}: architecture {arch!r} is not one moespec reads from GGUF "
                           f"({', '.join(ARCHITECTURES)})")
    key = lambda k: k.format(arch=arch)  # noqa: E731
    experts = meta.size(key(gguf.Keys.LLM.EXPERT_COUNT), "num_experts", 0, least=0)
    if experts < 2:
        raise MoespecError(f"{path}: a dense model ({key(gguf.Keys.LLM.EXPERT_COUNT)} = {experts}): moespec plans "
                           "mixture-of-experts models")
    tensors = tuple(GgufTensor(printable(t.name), t.tensor_type.name, tuple(int(d) for d in t.shape), int(t.n_bytes))
                    for t in reader.tensors)
    by_name = {t.name: t for t in tensors}
    names = gguf.TENSOR_NAMES
    embed_name = names[gguf.MODEL_TENSOR.TOKEN_EMBD] + ".weight"
    embed = by_name.get(embed_name)
    if embed is None or len(embed.shape) != 2:
        raise MoespecError(f"{path}: no 2-D token embedding tensor")
    vocab = check_size(embed.shape[1], f"{path}: rows of {embed_name}", "vocab")
    hidden = meta.size(key(gguf.Keys.LLM.EMBEDDING_LENGTH), "hidden")
    layers = meta.size(key(gguf.Keys.LLM.BLOCK_COUNT), "layers")
    heads = meta.size(key(gguf.Keys.Attention.HEAD_COUNT), "heads")
    width = meta.size(key(gguf.Keys.LLM.EXPERT_FEED_FORWARD_LENGTH), "expert_width", None) or \
        meta.size(key(gguf.Keys.LLM.FEED_FORWARD_LENGTH), "expert_width")
    gate = names[gguf.MODEL_TENSOR.FFN_GATE_EXP] + ".weight"
    moe = [b for b in range(layers) if gate.format(bid=b) in by_name]
    if not moe:
        raise MoespecError(f"{path}: expert_count {experts} but no {gate.format(bid='N')} tensor")
    for b in moe:
        shape = by_name[gate.format(bid=b)].shape
        if shape != (hidden, width, experts):
            raise MoespecError(f"{path}: {gate.format(bid=b)} has shape {shown(list(shape))}, the metadata says "
                               f"[{hidden}, {width}, {experts}] (hidden, expert width, experts)")
    dense = tuple(b for b in range(layers) if b not in moe)
    extras: dict[str, Any] = {}
    if arch == "gpt-oss":  # biases everywhere, one sink logit per head, sliding window on even layers (llama.cpp's
        # swa pattern 2, as GptOssConfig's default layer_types)
        window = meta.size(key(gguf.Keys.Attention.SLIDING_WINDOW), "sliding_window")
        extras = dict(expert_bias=True, router_bias=True, attention_bias=True, attention_sinks=True,
                      sliding_window=window, sliding_layers=tuple(range(0, layers, 2)))
    up = names[gguf.MODEL_TENSOR.FFN_UP] + ".weight"
    dense_width = by_name[up.format(bid=dense[0])].shape[1] if dense and up.format(bid=dense[0]) in by_name else 0
    try:
        spec = ModelSpec(
            name=meta.text(gguf.Keys.General.NAME, printable(path.stem)), model_type=ARCHITECTURES[arch],
            hidden=hidden, layers=layers, num_experts=experts,
            top_k=meta.size(key(gguf.Keys.LLM.EXPERT_USED_COUNT), "top_k"), expert_width=width, vocab=vocab,
            heads=heads, kv_heads=meta.size(key(gguf.Keys.Attention.HEAD_COUNT_KV), "kv_heads", heads),
            head_dim=meta.size(key(gguf.Keys.Attention.KEY_LENGTH), "head_dim", hidden // heads),
            dense_layers=dense, dense_width=dense_width, qk_norm=QK_NORM.get(arch, "none"),
            tied_embeddings=names[gguf.MODEL_TENSOR.OUTPUT] + ".weight" not in by_name,
            notes=f"GGUF {printable(path.name)}", **extras)
    except MoespecError as e:
        raise MoespecError(f"{path}: {e}") from None
    return GgufModel(str(path), arch, spec, tensors)


def is_gguf(model: str) -> bool:
    """Whether a model argument names a GGUF file (by its suffix, as every command reads it)."""
    return str(model).endswith(".gguf")


def resolve_model(model: str) -> ModelSpec:
    """A preset name, a checkpoint folder or config.json (moespec.model.spec.resolve), or a GGUF file's spec."""
    return read_gguf(model).spec if is_gguf(model) else resolve(model)

"""A Hugging Face MoE model written as a llama.cpp model file (GGUF), so llama.cpp runs the very weights moespec's
engine runs (`moespec export`).

Physics first. A verify pass reads what the file stores, so the export decides the bytes llama.cpp moves: bf16
keeps the engine's weights bit for bit (the byte model of the engine and of llama.cpp are then the same); q8_0
(34 bytes per 32 weights) and q4_0 (18 per 32) shrink every weight matrix, and a q4_K_M file mixes formats the
way llama.cpp's quantizer chooses (most tensors q4_K, some q6_K). Norms and routers stay f32, as llama.cpp's own
converter keeps them: they are small and their precision decides the routing.

Names and keys are the `gguf` package's tables (gguf.get_tensor_name_map, the GGUFWriter's key setters), the ones
llama.cpp's converter uses, so no tensor name is written by hand. What the export itself owns is the layout:
  experts   transformers stores a layer's experts fused, gate_up_proj [N, 2f, h] and down_proj [N, h, f];
            llama.cpp wants ffn_gate_exps and ffn_up_exps {h, f, N} and ffn_down_exps {f, h, N} (ggml order, the
            fastest dimension first: the same bytes as torch's [N, f, h] and [N, h, f]), gate the first half
  rotary    llama.cpp's "llama" architecture (Mixtral) rotates adjacent pairs, transformers rotates the two halves
            of each head, so q_proj and k_proj rows are permuted per head ((half, 2) -> (2, half)); OLMoE and
            Qwen3-MoE are NeoX-rotary in llama.cpp too and are written as they are
  vocabulary a checkpoint's BPE tokenizer is written as it is (tokens, merges); a model without one (a preset with
            random weights) gets a constructed byte-level vocabulary of exactly its embedding's rows: the 256
            byte symbols, then merges of byte pairs in a fixed order, then one end-of-text token (bos and eos).
            Token ids are what a verify pass and a trace feed; the text it tokenizes is never scored

Architectures: OLMoE ("olmoe"), Qwen3-MoE ("qwen3moe", every layer MoE and top-k renormalized, as llama.cpp's
graph computes it) and Mixtral ("llama" with experts). gpt-oss (MXFP4 experts, attention sinks) and DeepSeek-V2
(MLA) are refused in one line: llama.cpp's own convert_hf_to_gguf.py writes them.
"""

from __future__ import annotations

import ctypes
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from moespec import MoespecError
from moespec.formats.files import atomic_write, check_output
from moespec.model.gguf import GgufModel, gguf_module, read_gguf
from moespec.model.load import LoadedModel
from moespec.model.spec import ModelSpec

# HF model_type -> GGUF architecture name (gguf.MODEL_ARCH member)
ARCHS = {"olmoe": "OLMOE", "qwen3_moe": "QWEN3MOE", "mixtral": "LLAMA"}
# --type -> (GGUF type of the weight matrices, llama.cpp file type); q4_K_M goes through llama.cpp's quantizer
TYPES = {"f32": ("F32", "ALL_F32"), "bf16": ("BF16", "MOSTLY_BF16"), "q8_0": ("Q8_0", "MOSTLY_Q8_0"),
         "q4_0": ("Q4_0", "MOSTLY_Q4_0"), "q4_K_M": (None, "MOSTLY_Q4_K_M")}
QUANTIZER_TYPES = {"q4_K_M"}  # written by llama.cpp's own quantizer (llama_model_quantize) from a bf16 export
EOS = "<|endoftext|>"
KEEP_F32 = ("ffn_gate_inp",)  # routers stay f32 (as llama.cpp's converter keeps them): they decide the routing


def check_exportable(config: Any) -> None:
    """Refuse, in one line, a transformers config whose model llama.cpp would not compute as transformers does."""
    kind = config.model_type
    if kind not in ARCHS:
        raise MoespecError(f"export: a {kind} model is not exported by moespec (it exports {', '.join(ARCHS)}); "
                           "llama.cpp's convert_hf_to_gguf.py writes it")
    rope = getattr(config, "rope_parameters", None) or {}
    if rope.get("rope_type", "default") != "default":
        raise MoespecError(f"export: rope scaling {rope.get('rope_type')!r} is not exported (default rotary only)")
    if kind == "olmoe" and config.num_key_value_heads != config.num_attention_heads:
        raise MoespecError("export: llama.cpp's olmoe normalizes the keys over the hidden size (k_norm of "
                           f"{config.hidden_size}); this checkpoint has {config.num_key_value_heads} key-value heads "
                           f"of {config.num_attention_heads}")
    if kind == "qwen3_moe":
        if getattr(config, "mlp_only_layers", []) or getattr(config, "decoder_sparse_step", 1) != 1:
            raise MoespecError("export: llama.cpp's qwen3moe makes every layer MoE; this checkpoint has dense "
                               "layers (mlp_only_layers / decoder_sparse_step)")
        if not getattr(config, "norm_topk_prob", False):
            raise MoespecError("export: llama.cpp's qwen3moe renormalizes the top-k weights; this checkpoint has "
                               "norm_topk_prob false, so llama.cpp would compute another model")


def truncated(lm: LoadedModel, layers: int) -> LoadedModel:
    """The model's first `layers` decoder layers with its embeddings, final norm and head (the weights shared,
    not copied): a layer-skip draft, which agrees with the whole model where the later layers change little."""
    config = lm.model.config
    if not 1 <= layers <= config.num_hidden_layers:
        raise MoespecError(f"--truncate {layers}: the model has 1..{config.num_hidden_layers} decoder layers")
    lm.model.model.layers = lm.model.model.layers[:layers]
    config.num_hidden_layers = layers
    if isinstance(getattr(config, "layer_types", None), list):  # one entry per layer
        config.layer_types = config.layer_types[:layers]
    if isinstance(getattr(config, "mlp_only_layers", None), list):  # layer indices
        config.mlp_only_layers = [i for i in config.mlp_only_layers if i < layers]
    spec = ModelSpec.from_config_dict(config.to_dict(), lm.spec.name)
    return LoadedModel(lm.model, lm.tokenizer, spec, lm.device, lm.dtype, f"{lm.source}, first {layers} layers")


def _rope_pairs(w: torch.Tensor, heads: int) -> torch.Tensor:
    """q/k projection rows from transformers' half-split rotary to llama.cpp's adjacent pairs (module docstring)."""
    rows = w.shape[0]
    return w.reshape(heads, 2, rows // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _tensors(model: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """(Hugging Face name with its .weight/.bias suffix, tensor) in llama.cpp's layout (module docstring)."""
    config = model.config
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    for name, t in model.state_dict().items():
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue  # llama.cpp reads the token embedding as the head when the file has no output tensor
        if name.endswith("mlp.experts.gate_up_proj"):
            gate, up = t.chunk(2, dim=1)
            base = name.removesuffix(".gate_up_proj")
            yield f"{base}.gate_proj.weight", gate
            yield f"{base}.up_proj.weight", up
            continue
        if name.endswith("mlp.experts.down_proj"):
            yield f"{name}.weight", t
            continue
        if config.model_type == "mixtral" and name.endswith(("self_attn.q_proj.weight", "self_attn.k_proj.weight")):
            t = _rope_pairs(t, heads if ".q_proj." in name else kv_heads)
        yield name, t


def _encode(t: torch.Tensor, qtype: Any, gguf: Any) -> tuple[np.ndarray, Any]:
    """(data, raw_dtype) of one tensor at `qtype`; bf16 weights go in as their bits (no rounding)."""
    Q = gguf.GGMLQuantizationType
    if qtype == Q.F32:
        return t.detach().float().contiguous().numpy(), Q.F32
    if qtype == Q.BF16 and t.dtype == torch.bfloat16:
        return t.detach().contiguous().view(torch.int16).numpy().view(np.uint16), Q.BF16
    return gguf.quants.quantize(t.detach().float().contiguous().numpy(), qtype), qtype


def _weight_type(gguf_name: str, t: torch.Tensor, wanted: Any, gguf: Any) -> Any:
    """The GGUF type of one tensor: f32 for vectors and routers, else `wanted`, else bf16 where a row is not a
    whole number of the format's blocks (llama.cpp's converter falls back the same way)."""
    Q = gguf.GGMLQuantizationType
    if t.ndim == 1 or any(part in gguf_name for part in KEEP_F32):
        return Q.F32
    block = gguf.GGML_QUANT_SIZES[wanted][0]
    return wanted if t.shape[-1] % block == 0 else Q.BF16


def _byte_vocabulary(vocab: int) -> tuple[list[str], list[str]]:
    """(tokens, merges) of the constructed byte-level vocabulary of `vocab` ids (module docstring)."""
    from tokenizers import pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tokens, merges = alphabet[:vocab - 1], []
    for a in alphabet:
        for b in alphabet:
            if len(tokens) >= vocab - 1:
                break
            tokens.append(a + b)
            merges.append(f"{a} {b}")
    return tokens + [EOS], merges or [f"{alphabet[0]} {alphabet[1]}"]


def _checkpoint_vocabulary(tokenizer: Any, vocab: int) -> tuple[list[str], list[str], str, int | None] | None:
    """(tokens, merges, pre-tokenizer, eos id) of a checkpoint's BPE tokenizer filling the embedding, else None."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    doc = json.loads(backend.to_str())
    model = doc.get("model", {})
    if model.get("type") != "BPE":
        return None
    by_id = {i: s for s, i in model["vocab"].items()} | {a["id"]: a["content"] for a in doc.get("added_tokens", [])}
    if sorted(by_id) != list(range(vocab)):
        return None  # ids with gaps or past the embedding: llama.cpp needs one token per embedding row
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    pre = doc.get("pre_tokenizer") or {}
    gpt2 = pre.get("type") == "ByteLevel" and pre.get("use_regex", True)
    return [by_id[i] for i in range(vocab)], merges, "gpt-2" if gpt2 else "default", tokenizer.eos_token_id


def _add_vocabulary(writer: Any, lm: LoadedModel, gguf: Any) -> str:
    vocab = lm.model.get_input_embeddings().weight.shape[0]
    got = _checkpoint_vocabulary(lm.tokenizer, vocab) if lm.tokenizer is not None else None
    if got is None:
        tokens, merges = _byte_vocabulary(vocab)
        pre, eos, what = "gpt-2", vocab - 1, "constructed byte-level"
    else:
        tokens, merges, pre, eos = got
        what = "the checkpoint's BPE"
    specials = {eos} if eos is not None else set()
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.CONTROL if i in specials else gguf.TokenType.NORMAL
                            for i in range(len(tokens))])
    writer.add_token_merges(merges)
    if eos is not None:
        writer.add_bos_token_id(eos)
        writer.add_eos_token_id(eos)
    writer.add_add_bos_token(False)
    return what


def _add_hyperparameters(writer: Any, config: Any, arch: str) -> None:
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    experts = getattr(config, "num_experts", None) or config.num_local_experts
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_freq_base(float((config.rope_parameters or {}).get("rope_theta", 10000.0)))
    writer.add_layer_norm_rms_eps(float(config.rms_norm_eps))
    writer.add_expert_count(experts)
    writer.add_expert_used_count(config.num_experts_per_tok)
    if arch == "QWEN3MOE":
        writer.add_expert_feed_forward_length(config.moe_intermediate_size)
    if head_dim * config.num_attention_heads != config.hidden_size or arch == "QWEN3MOE":
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    if arch == "LLAMA":
        writer.add_rope_dimension_count(head_dim)


def _write(lm: LoadedModel, path: Path, kind: str, name: str) -> str:
    """Write the GGUF file at `path` in one of the directly written types; returns the vocabulary's origin."""
    gguf = gguf_module()
    config = lm.model.config
    arch = ARCHS[config.model_type]
    qname, ftype = TYPES[kind]
    wanted = gguf.GGMLQuantizationType[qname]
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch], config.num_hidden_layers)
    writer = gguf.GGUFWriter(str(path), gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH[arch]])
    writer.add_name(name)
    _add_hyperparameters(writer, config, arch)
    writer.add_file_type(gguf.LlamaFileType[ftype])
    if wanted not in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.BF16):
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    vocabulary = _add_vocabulary(writer, lm, gguf)
    for hf_name, t in _tensors(lm.model):
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise MoespecError(f"export: the gguf package's table has no llama.cpp name for {hf_name} ({arch})")
        data, raw = _encode(t, _weight_type(name, t, wanted, gguf), gguf)
        writer.add_tensor(name, data, raw_dtype=raw)  # the writer reads a quantized shape from the bytes
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return vocabulary


def _quantize(source: Path, out: Path, kind: str, threads: int) -> None:
    """llama.cpp's own quantizer (llama_model_quantize) from `source` to `out` at file type `kind`."""
    from moespec.model.llama_cpp import backend

    api = backend()
    params = api.llama_model_quantize_default_params()
    params.ftype = int(gguf_module().LlamaFileType[TYPES[kind][1]])
    params.nthread = threads
    rc = api.llama_model_quantize(str(source).encode(), str(out).encode(), ctypes.byref(params))
    if rc != 0:
        raise MoespecError(f"export: llama.cpp's quantizer failed on {source} (code {rc})")


def export_gguf(lm: LoadedModel, out: str | Path, kind: str = "bf16", threads: int = 2,
                name: str | None = None) -> tuple[GgufModel, str]:
    """Write `lm`'s model to the GGUF file `out` at `kind` (TYPES) under `name` (general.name: the model's name as
    plans and runs know it; default its spec's); returns the file as read back (read_gguf) and where its
    vocabulary came from. Atomic; refuses an architecture or layout llama.cpp would compute otherwise."""
    if kind not in TYPES:
        raise ValueError(f"kind: {kind!r} is not one of {', '.join(TYPES)}")
    if threads < 1:
        raise ValueError(f"threads: must be >= 1, got {threads}")
    check_exportable(lm.model.config)
    out = check_output(out)
    vocabulary = ""

    def write(tmp: Path) -> None:
        nonlocal vocabulary
        if kind not in QUANTIZER_TYPES:
            vocabulary = _write(lm, tmp, kind, name or lm.spec.name)
            return
        with tempfile.TemporaryDirectory(dir=tmp.parent, prefix=".export-") as scratch:
            source = Path(scratch) / "bf16.gguf"
            vocabulary = _write(lm, source, "bf16", name or lm.spec.name)
            _quantize(source, tmp, kind, threads)

    if kind in QUANTIZER_TYPES:
        from moespec.model.llama_cpp import bindings

        bindings()  # llama-cpp-python absent: one line before any work
    atomic_write(out, write)
    return read_gguf(out), vocabulary

"""`moespec export`: a Hugging Face MoE checkpoint or a preset with random weights written as a llama.cpp GGUF file
(moespec.model.gguf_export), so llama.cpp runs, traces and is measured on the very model moespec's engine runs."""

from __future__ import annotations

import argparse
from typing import Any

from moespec import MoespecError
from moespec.cli.args import CHECKPOINT_FILES, add_model_source, bounded, seed
from moespec.defaults import LAYERS_LIMIT, MODEL, THREADS_LIMIT
from moespec.formats.files import check_output
from moespec.measure.run import DEFAULT_LAYERS
from moespec.model.gguf_export import TYPES, check_exportable, export_gguf, truncated
from moespec.model.load import PRESET_VOCAB, load_model, preset_config
from moespec.model.spec import ModelSpec

_GIB = 2**30


# the path flags kept apart before any work (moespec.cli.args.check_paths)
OUTPUTS = ("--out",)
INPUTS = {"--model": CHECKPOINT_FILES}


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_source(p, "OLMoE, Qwen3-MoE or Mixtral", f"{DEFAULT_LAYERS}, as `moespec run` builds it")
    p.add_argument("--vocab", type=bounded(2, 1 << 20), default=PRESET_VOCAB,
                   help=f"vocabulary of a preset model (default {PRESET_VOCAB}, as `moespec run` builds it)")
    p.add_argument("--truncate", type=bounded(1, LAYERS_LIMIT), metavar="K",
                   help="keep the first K decoder layers only, with the same embeddings, final norm and head: a "
                        "layer-skip draft of the model (self-speculative drafting)")
    p.add_argument("--seed", type=seed, default=0, help="seed of a preset's random weights (default 0, as run's)")
    p.add_argument("--type", default="bf16", choices=list(TYPES),
                   help="weight format: f32, bf16, q8_0, q4_0 (written here), q4_K_M (llama.cpp's quantizer; "
                        "needs llama-cpp-python); norms and routers stay f32 (default bf16)")
    p.add_argument("--threads", type=bounded(1, THREADS_LIMIT), default=2,
                   help="threads of llama.cpp's quantizer (q4_K_M; default 2)")
    p.add_argument("--out", required=True, help="the GGUF file to write")


def _config(args: argparse.Namespace, preset: str | None) -> Any:
    """The model's transformers config, read before any weight is (a refused architecture costs nothing)."""
    if preset is not None:
        return preset_config(ModelSpec.from_name(preset), args.layers or DEFAULT_LAYERS, args.vocab)[0]
    ModelSpec.from_config(args.model)  # a folder without a supported MoE config.json: one line
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(args.model, local_files_only=True)


def run(args: argparse.Namespace) -> int:
    check_output(args.out)
    preset = None if args.model else args.preset or MODEL
    config = _config(args, preset)
    check_exportable(config)
    if args.truncate is not None and args.truncate > config.num_hidden_layers:
        raise MoespecError(f"--truncate {args.truncate}: the model has {config.num_hidden_layers} decoder layers")
    layers = None if args.model else args.layers or DEFAULT_LAYERS
    lm = load_model(path=args.model, preset=preset, layers=layers,
                    vocab=args.vocab if preset else None, dtype="fp32" if args.type == "f32" else "bf16",
                    seed=args.seed)
    name = preset or lm.spec.name
    if args.truncate is not None:
        lm = truncated(lm, args.truncate)
        name = f"{name} (first {args.truncate} layers)"
    model, vocabulary = export_gguf(lm, args.out, args.type, args.threads, name=name)
    size = sum(t.bytes for t in model.tensors)
    print(f"wrote {args.out}: {model.spec.name} as llama.cpp {model.arch}, {len(model.tensors)} tensors, "
          f"{size / _GIB:.2f} GiB ({', '.join(sorted({t.type for t in model.tensors}))}); expert bytes w_l "
          f"{model.expert_bytes(0):,}, W {model.W():,}, D {model.dense_bytes():,}; vocabulary: {vocabulary}")
    return 0

"""`moespec trace`: record the experts a local Hugging Face MoE checkpoint (moespec.routing.tracer) or a llama.cpp
GGUF model, routed by llama.cpp itself (moespec.routing.llama_tracer), sends each token to, on a text file, a JSONL
file, or without either moespec's sample text (moespec.defaults.SAMPLE_TEXT)."""

from __future__ import annotations

import argparse

from moespec.cli.args import CHECKPOINT_FILES, add_checkpoint_flags, bounded
from moespec.defaults import DEPTH_LIMIT, DTYPES, SAMPLE_TEXT, THREADS_LIMIT, TOKENS_LIMIT
from moespec.routing.tracer import TraceConfig, trace


# the path flags kept apart before any work (moespec.cli.args.check_paths)
OUTPUTS = ("--out",)
INPUTS = {"--model": CHECKPOINT_FILES, "--gguf": (), "--text": (), "--jsonl": ()}


# -- command -----------------------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    model = parser.add_mutually_exclusive_group(required=True)
    model.add_argument("--model", help="local Hugging Face checkpoint folder (no hub access)")
    model.add_argument("--gguf", help="a llama.cpp GGUF model, traced through llama.cpp's own graph (needs "
                                      "llama-cpp-python)")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--text", help="raw text; WikiText top-level headings ' = Title = ' start documents "
                                       f"(default, without --jsonl: moespec's sample text, {SAMPLE_TEXT.name})")
    source.add_argument("--jsonl", help="JSONL file, one document per record")
    parser.add_argument("--field", default="text", help="JSONL key: a string or a list of strings (default text)")
    parser.add_argument("--out", required=True, help="trace file to write (.npz)")
    parser.add_argument("--max-tokens", type=bounded(1, TOKENS_LIMIT), default=None,
                        help=f"stop after this many tokens in all (default: every token of the input; at most "
                             f"{TOKENS_LIMIT:,})")
    parser.add_argument("--device", default="cpu", help="torch device (default cpu)")
    parser.add_argument("--dtype", choices=DTYPES, default=TraceConfig.dtype,
                        help=f"compute dtype (default {TraceConfig.dtype})")
    parser.add_argument("--chunk", type=bounded(1, DEPTH_LIMIT), default=TraceConfig.chunk,
                        help=f"tokens per forward pass (default {TraceConfig.chunk}, at most {DEPTH_LIMIT:,})")
    parser.add_argument("--threads", type=bounded(1, THREADS_LIMIT), default=None,
                        help="threads of the trace (torch's, or llama.cpp's for --gguf), with --ray of each worker "
                             "(default: torch's)")
    parser.add_argument("--ray", metavar="ADDRESS",
                        help="trace on a Ray cluster, documents sharded over workers that each hold the model once "
                             "(a GPU each with --device cuda, --threads CPUs each otherwise): local (a Ray instance "
                             "on this machine), auto, HOST:PORT or ray://HOST:PORT; every node reads the same paths "
                             "(`pip install 'moespec[ray]'`; moespec.cluster)")
    add_checkpoint_flags(parser)


def run(args: argparse.Namespace) -> int:
    sample = args.text is None and args.jsonl is None  # no text given: the shipped sample
    text = str(SAMPLE_TEXT) if sample else args.text
    done = trace(TraceConfig(model=args.model, out=args.out, text=text, jsonl=args.jsonl, field=args.field,
                             max_tokens=args.max_tokens, device=args.device, dtype=args.dtype, chunk=args.chunk,
                             fresh=args.fresh, gguf=args.gguf, threads=args.threads, ray=args.ray))
    t = done.trace
    print(f"traced {t.num_tokens} tokens in {t.num_documents} documents ({t.num_layers} MoE layers, m={t.m}) "
          f"at {done.traced_tokens / max(done.seconds, 1e-9):,.0f} tokens/s -> {args.out}"
          f"{f' (text: moespec sample, {SAMPLE_TEXT})' if sample else ''}")
    return 0

"""`moespec spec`: a model's shapes and the bytes a pass reads per weight format: w_l, W, D, kv(k)
(moespec.model.spec); for a GGUF file, at the formats its tensors are stored in (moespec.model.gguf)."""

from __future__ import annotations

import argparse
import json

from moespec import MoespecError
from moespec.cli.args import bounded
from moespec.defaults import DEPTH, DEPTH_LIMIT, FORMAT, KMAX, KMAX_LIMIT
from moespec.model.gguf import KV_FORMAT, read_gguf
from moespec.model.spec import PRESETS, resolve, summary
from moespec.model.weights import ALL_FORMATS, FORMATS

# -- command: moespec spec ----------------------------------------------------------------------------
_GIB = 2**30


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", nargs="?", help="preset name, a checkpoint folder / config.json, or a GGUF file")
    parser.add_argument("--list", action="store_true", help="list the presets and their shapes")
    parser.add_argument("--format", choices=ALL_FORMATS,
                        help=f"weights: {', '.join(ALL_FORMATS)} (default {FORMAT}; a GGUF file has its own)")
    parser.add_argument("--kv-dtype", choices=list(FORMATS),
                        help=f"KV-cache format (default bf16; {KV_FORMAT} for a GGUF file, llama.cpp's default)")
    parser.add_argument("--depth", type=bounded(0, DEPTH_LIMIT), default=DEPTH,
                        help=f"context depth d for kv(k) (default {DEPTH}, at most {DEPTH_LIMIT:,})")
    parser.add_argument("--kmax", type=bounded(0, KMAX_LIMIT), default=KMAX,
                        help=f"largest draft length k for kv(k) (default {KMAX}, at most {KMAX_LIMIT})")
    parser.add_argument("--json", action="store_true", help="print one JSON document")


def run(args: argparse.Namespace) -> int:
    if args.list or not args.model:
        if args.json:
            print(json.dumps({name: s.to_dict() for name, s in PRESETS.items()}, indent=1))
            return 0
        print(f"{'name':<18}{'type':<13}{'hidden':>7}{'layers':>7}{'L':>4}{'N':>5}{'m':>3}{'f':>7}"
              f"{'W bf16 GiB':>12}{'D bf16 GiB':>12}  notes")
        for s in PRESETS.values():
            print(f"{s.name:<18}{s.model_type:<13}{s.hidden:>7}{s.layers:>7}{s.L:>4}{s.N:>5}{s.m:>3}"
                  f"{s.expert_width:>7}{s.W('bf16') / _GIB:>12.3f}{s.dense_bytes('bf16') / _GIB:>12.3f}  {s.notes}")
        return 0
    if args.model.endswith(".gguf"):
        if args.format:
            raise MoespecError(f"--format {args.format}: a GGUF file stores its tensors in their own formats")
        gguf = read_gguf(args.model)
        spec, args.format = gguf.spec, "the file's formats"
        s = gguf.summary(args.depth, args.kmax, args.kv_dtype or KV_FORMAT)
        args.kv_dtype = s["kv_dtype"]
    else:
        spec = resolve(args.model)
        args.format, args.kv_dtype = args.format or FORMAT, args.kv_dtype or "bf16"
        s = summary(spec, args.format, args.kv_dtype, args.depth, args.kmax)
    if args.json:
        print(json.dumps(s, indent=1))
        return 0
    widths = sorted(set(s["expert_bytes"]))
    print(f"{spec.name} ({spec.model_type}): L={spec.L} MoE layers of {spec.layers}, N={spec.N}, m={spec.m}, "
          f"f={spec.expert_width}; weights {args.format}")
    print(f"  w_l   {' / '.join(f'{w / 2**20:.3f}' for w in widths)} MiB")
    print(f"  W     {s['W'] / _GIB:.4f} GiB   (m W = {spec.m * s['W'] / _GIB:.4f} GiB per token per slot)")
    print(f"  D     {s['D'] / _GIB:.4f} GiB")
    kv = "  ".join(f"{k}:{b / 2**20:.2f}" for k, b in enumerate(s["kv"]))
    print(f"  kv(k) at depth {args.depth}, {args.kv_dtype} [MiB]  {kv}")
    return 0

"""The native kernels' two one-token paths side by side: rows read one after the other with no software prefetch, or
in the prefetched tiles of kTileRows rows that larger calls use (moespec/kernels/csrc/simd_common.h,
one_token_tiles, which picks one by the CPU's vendor; MOESPEC_NATIVE_ONE_TOKEN forces one).

Each round runs one fresh process per path (the switch is read once per process), in alternating order; each
process times, cold (after the flush), an LM head of 32768 x 2048 bf16 rows (dense.linear) and one OLMoE-shaped MoE
layer's expert op at one token (N = 64, m = 8, d = 2048, f = 1024, bf16; both kernels), DEFAULT_CALLS calls each,
with a streaming read beside them. Printed and written: per path and op the median GB/s over rounds with its 95%
interval, the median streaming read (the ceiling), and the ratio tiles / rows per round, its median and interval.

    .venv/bin/python benchmarks/one_token_paths.py --rounds 5 --out results/one-token-paths/DEVICE.json
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

from moespec import MoespecError
from moespec.formats.files import check_output, provenance, write_json

PATHS = ("rows", "tiles")
OPS = ("lm_head", "slot", "dedup")
DEFAULT_CALLS = 7  # cold calls of each op per process: its median is that process's figure
LM_HEAD = (32768, 2048)  # rows x columns of bf16: 128 MiB, past the cache the flush evicts
OLMOE = (64, 8, 2048, 1024)  # N, m, d, f


def child(calls: int) -> dict[str, float]:
    """One process's medians (GB/s) of each op at one token, and of the streaming read."""
    from moespec import kernels as K
    from moespec.kernels import dense, native
    from moespec.measure.timing import CpuTimer

    if native.load() is None:
        raise MoespecError(f"the native kernels are needed: {native.status()}")
    timer = CpuTimer()
    ceiling = timer.sampler()
    gen = torch.Generator().manual_seed(0)
    wt = (0.02 * torch.randn(*LM_HEAD, generator=gen)).bfloat16()
    x = torch.randn(1, LM_HEAD[1], generator=gen).bfloat16()
    n_exp, m, d, f = OLMOE
    gu = (0.02 * torch.randn(n_exp, 2 * f, d, generator=gen)).bfloat16()
    dn = (0.02 * torch.randn(n_exp, d, f, generator=gen)).bfloat16()
    ids = torch.randperm(n_exp, generator=gen)[:m].reshape(1, m)
    w = torch.softmax(torch.randn(1, m, generator=gen), -1).bfloat16()
    xe = torch.randn(1, d, generator=gen).bfloat16()
    work = {"lm_head": (lambda: dense.linear(x, wt), wt.numel() * 2),
            **{kind: (lambda kind=kind: K.expert_op(kind, xe, ids, w, gu, dn), m * 3 * d * f * 2)
               for kind in ("slot", "dedup")}}
    rates: dict[str, list[float]] = {op: [] for op in OPS}
    reads = []
    for fn, _ in work.values():
        fn()  # warm-up: code and buffers ready
    for _ in range(calls):
        for op, (fn, nbytes) in work.items():
            timer.flush()
            rates[op].append(nbytes / timer.time(fn) / 1e9)
        reads.append(ceiling())
    return {"ceiling_gbps": statistics.median(reads), **{op: statistics.median(v) for op, v in rates.items()}}


def interval(values: list[float]) -> list[float]:
    """The 95% interval of the median: order statistics of the binomial(n, 1/2) (the whole range under 6 values)."""
    v = sorted(values)
    if len(v) < 6:
        return [v[0], v[-1]]
    half = 1.96 * (len(v) ** 0.5) / 2
    lo, hi = int(np.floor(len(v) / 2 - half)), int(np.ceil(len(v) / 2 + half))
    return [v[max(lo, 0)], v[min(hi, len(v) - 1)]]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="fresh processes per path (default 5)")
    parser.add_argument("--calls", type=int, default=DEFAULT_CALLS, help=f"cold calls per op and process "
                                                                        f"(default {DEFAULT_CALLS})")
    parser.add_argument("--out", help="JSON file to write (default: print only)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.calls < 1:
        parser.error("--rounds and --calls: whole numbers >= 1")
    try:
        if args.child:
            print(json.dumps(child(args.calls)))
            return 0
        if args.out:
            check_output(args.out)
        return compare(args)
    except MoespecError as e:
        parser.error(str(e))


def compare(args: argparse.Namespace) -> int:
    """Alternating fresh processes per path (module docstring); the summary printed and written."""
    runs: dict[str, list[dict[str, float]]] = {p: [] for p in PATHS}
    for r in range(args.rounds):
        for path in PATHS if r % 2 == 0 else PATHS[::-1]:
            proc = subprocess.run([sys.executable, __file__, "--child", "--calls", str(args.calls)],
                                  env={**os.environ, "MOESPEC_NATIVE_ONE_TOKEN": path}, capture_output=True, text=True)
            if proc.returncode != 0:
                raise MoespecError(f"the {path} process failed: {proc.stderr.strip().splitlines()[-1:]}")
            runs[path].append(json.loads(proc.stdout.strip().splitlines()[-1]))
            print(f"round {r + 1} {path}: " + ", ".join(f"{k} {v:.1f}" for k, v in runs[path][-1].items()), flush=True)
    summary = {path: {key: {"median_gbps": statistics.median(v[key] for v in runs[path]),
                            "interval_gbps": interval([v[key] for v in runs[path]])}
                      for key in ("ceiling_gbps", *OPS)} for path in PATHS}
    ratios = {op: [t[op] / r[op] for r, t in zip(runs["rows"], runs["tiles"])] for op in OPS}
    summary["tiles_over_rows"] = {op: {"median": statistics.median(v), "interval": interval(v)}
                                  for op, v in ratios.items()}
    for op in OPS:
        rows, tiles, ratio = summary["rows"], summary["tiles"], summary["tiles_over_rows"][op]
        print(f"{op}: rows {rows[op]['median_gbps']:.1f} GB/s, tiles {tiles[op]['median_gbps']:.1f} GB/s, tiles / rows "
              f"{ratio['median']:.2f} (95% {ratio['interval'][0]:.2f}-{ratio['interval'][1]:.2f}); streaming read "
              f"{rows['ceiling_gbps']['median_gbps']:.1f} / {tiles['ceiling_gbps']['median_gbps']:.1f} GB/s")
    if args.out:
        write_json(args.out, {"summary": summary, "runs": runs, "shapes": {"lm_head": list(LM_HEAD),
                                                                          "olmoe_N_m_d_f": list(OLMOE)},
                              "rounds": args.rounds, "calls": args.calls,
                              "command": shlex.join([sys.executable, *sys.argv]),
                              "provenance": provenance("cpu", "bf16")})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

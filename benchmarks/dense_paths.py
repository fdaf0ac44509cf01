"""The paths of a bf16 dense layer side by side at 1..72 rows (a verification pass's tokens, and a batched pass's B n):
the native kernel as the engine calls it (moespec.kernels.dense.linear, isa "auto": its AMX path where the CPU's tiles
run, else its dot path where the CPU has AVX512-BF16, else lanes from 16 rows, else fma), the native vector paths alone
(isa "dot" or "fma", to 16 rows), the native lanes path (isa "lanes", every row count), past 16 rows the vector path
in row blocks of 16 rows (each reading W again), and, where torch's oneDNN multiplies bf16, its packed copy of the
weight (dense.pack, dense.packed_linear). Past the rows the native kernel takes (dense.native_rows) the engine takes the
packed copy where there is one, else the lanes path.

One process, interleaved rounds: each round times every (weight, rows, path) cold (after the flush), the order rotated
from round to round, with a streaming read after each call; the matmul peak (timing.matmul_dtype) before and after.
Weights: the LM head of the demo's model (OLMoE's 50304 x 2048) and one attention projection (2048 x 2048). Printed and
written: per cell the median time over rounds with its 95% interval, GB/s and GFLOP/s at that time, and the ratios
packed, vector and lanes over native (where native runs, else over the row blocks) per round (median and interval); the
rows from which packed, and lanes, is the faster in median, per weight.

    .venv/bin/python benchmarks/dense_paths.py --rounds 9 --out results/dense-paths/DEVICE.json
"""

from __future__ import annotations

import argparse
import shlex
import sys

import numpy as np
import torch

from moespec import MoespecError
from moespec.formats.files import check_output, provenance, write_json
from moespec.kernels import dense, native, pages
from moespec.measure.rounds import bootstrap_median
from moespec.measure.timing import CpuTimer, matmul_dtype, matmul_peak

WEIGHTS = {"lm_head": (50304, 2048), "attention_projection": (2048, 2048)}  # rows x columns, bf16
ROWS = (1, 2, 4, 5, 8, 16, 18, 24, 32, 36, 72)  # a batched pass's B n: 2 x 9, 4 x 9, 8 x 9
PATHS = ("native", "vector", "lanes", "blocks", "packed")


def vector_isa() -> str:
    """The native vector path a bf16 call takes without the tiles: dot where the CPU has AVX512-BF16, else fma."""
    return "dot" if dense.has_dot_path() else "fma"


def calls(gen: torch.Generator) -> dict[tuple[str, int, str], object]:
    """(weight, rows, path) -> its call, inputs drawn once; the vector paths to MAX_TOKENS rows, the native kernel to
    the rows it takes, the row blocks past them, packed where oneDNN packs; the weights in the pages the engine's
    are in."""
    out, isa = {}, vector_isa()  # looked up once, outside the timed calls
    for name, (m, k) in WEIGHTS.items():
        w = pages.huge((0.02 * torch.randn(m, k, generator=gen)).bfloat16())
        packed = dense.pack(w)
        for n in ROWS:
            x = torch.randn(n, k, generator=gen).bfloat16()
            if n <= dense.native_rows(x, w):
                out[name, n, "native"] = lambda x=x, w=w: dense.linear(x, w)
            else:
                out[name, n, "blocks"] = lambda x=x, w=w: torch.cat([dense.linear(x[i:i + dense.MAX_TOKENS], w, isa=isa)
                                                                     for i in range(0, len(x), dense.MAX_TOKENS)])
            if n <= dense.MAX_TOKENS:
                out[name, n, "vector"] = lambda x=x, w=w: dense.linear(x, w, isa=isa)
            out[name, n, "lanes"] = lambda x=x, w=w: dense.linear(x, w, isa="lanes")
            if packed is not None:
                out[name, n, "packed"] = lambda x=x, p=packed: dense.packed_linear(x, p)
    return out


def measure(rounds: int) -> dict:
    """Every cell's times and ceiling samples over interleaved rounds (module docstring)."""
    if native.load() is None:
        raise MoespecError(f"the native kernel is needed: {native.status()}")
    timer = CpuTimer()
    ceiling = timer.sampler()
    work = calls(torch.Generator().manual_seed(0))
    for fn in work.values():
        fn()
    keys = list(work)
    peak_before = matmul_peak(timer, torch.bfloat16)
    seconds: dict = {key: [] for key in keys}
    reads: list[float] = []
    for r in range(rounds):
        start = r * len(keys) // rounds
        for key in keys[start:] + keys[:start]:
            timer.flush()
            seconds[key].append(timer.time(work[key]))
            reads.append(ceiling())
        print(f"round {r + 1} of {rounds} done", flush=True)
    return {"seconds": seconds, "reads": reads,
            "peak_gflops": [*peak_before, *matmul_peak(timer, torch.bfloat16)], "flush_bytes": timer.flush_bytes}


def summarize(data: dict) -> dict:
    """Medians, intervals, rates and ratios per cell (the paths timed there); the first row count where packed, and
    lanes, wins (over native, or over the row blocks where native does not run), per weight."""
    rng = np.random.default_rng(0)
    seconds = data["seconds"]
    cells, faster_from = [], {"packed": {}, "lanes": {}}
    for name, (m, k) in WEIGHTS.items():
        for n in ROWS:
            row = {"weight": name, "rows": n}
            for path in PATHS:
                if (name, n, path) not in seconds:
                    continue
                med, lo, hi = bootstrap_median(seconds[name, n, path], rng)
                row[path] = {"median_s": med, "interval_s": [lo, hi], "gbps": m * k * 2 / med / 1e9,
                             "gflops": 2 * m * k * n / med / 1e9}
            base = "native" if "native" in row else "blocks"
            for path in ("packed", "vector", "lanes"):
                if path in row:
                    ratio = [p / q for p, q in zip(seconds[name, n, path], seconds[name, n, base])]
                    med, lo, hi = bootstrap_median(ratio, rng)
                    row[f"{path}_over_{base}"] = {"median": med, "interval": [lo, hi]}
            cells.append(row)
        for path in faster_from:
            wins = [c["rows"] for c in cells if c["weight"] == name and any(
                c.get(f"{path}_over_{base}", {}).get("median", 2) < 1 for base in ("native", "blocks"))]
            faster_from[path][name] = min(wins) if wins else None
    return {"cells": cells, "packed_faster_from_rows": faster_from["packed"],
            "lanes_faster_from_rows": faster_from["lanes"],
            "streaming_read_gbps": float(np.median(data["reads"])),
            "matmul_peak_gflops": float(np.median(data["peak_gflops"]))}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=9, help="interleaved rounds (default 9)")
    parser.add_argument("--out", help="JSON file to write (default: print only)")
    args = parser.parse_args(argv)
    if args.rounds < 2:
        parser.error("--rounds: a whole number >= 2")
    try:
        if args.out:
            check_output(args.out)
        summary = summarize(data := measure(args.rounds))
    except MoespecError as e:
        parser.error(str(e))
    amx, most = dense.amx_path(), dense.native_rows(torch.zeros(1, 2048, dtype=torch.bfloat16))
    past = "packed" if dense.packs_bf16() else "lanes"
    mm = str(matmul_dtype(torch.bfloat16, "cpu")).removeprefix("torch.")  # fp32 where torch has no bf16 GEMM
    print(f"streaming read {summary['streaming_read_gbps']:.1f} GB/s, {mm} matmul {summary['matmul_peak_gflops']:.0f} "
          f"GFLOP/s; native AMX path: {'yes' if amx else 'no'}; vector path {vector_isa()}; the engine takes the "
          f"native kernel to {most} rows, {past} past; weights in {pages.placement()}")
    for c in summary["cells"]:
        parts = [f"{path} {c[path]['median_s'] * 1e3:6.2f} ms ({c[path]['gbps']:5.1f} GB/s, "
                 f"{c[path]['gflops']:4.0f} GFLOP/s)" for path in PATHS if path in c]
        parts += [f"{path} / {base} {c[key]['median']:.2f} "
                  f"(95% {c[key]['interval'][0]:.2f}-{c[key]['interval'][1]:.2f})"
                  for path in ("vector", "lanes", "packed") for base in ("native", "blocks")
                  if (key := f"{path}_over_{base}") in c]
        print(f"{c['weight']} {c['rows']:2d} rows: " + "; ".join(parts))
    for path in ("packed", "lanes"):
        print(f"{path} faster from rows: "
              + ", ".join(f"{k} {v}" for k, v in summary[f"{path}_faster_from_rows"].items()))
    if args.out:
        write_json(args.out, {"summary": summary, "seconds": {f"{w}/{n}/{p}": v for (w, n, p), v in
                                                               data["seconds"].items()},
                              "weights": {k: list(v) for k, v in WEIGHTS.items()}, "rounds": args.rounds,
                              "amx": amx, "native_rows": most, "vector_isa": vector_isa(),
                              "pages": pages.placement(),
                              "flush_bytes": data["flush_bytes"], "command": shlex.join([sys.executable, *sys.argv]),
                              "provenance": provenance("cpu", "bf16")})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The two paths of a bf16 dense layer side by side at 1..16 rows: the native kernel (moespec.kernels.dense.linear, its
dot path where the CPU has AVX512-BF16) and oneDNN's packed copy of the weight (dense.pack, dense.packed_linear), which
the engine takes from dense.packed_rows() rows (AMX_PACKED_ROWS on a CPU with AMX tiles, else past MAX_TOKENS).

One process, interleaved rounds: each round times every (weight, rows, path) cold (after the flush), the order rotated
from round to round, with a streaming read after each call; the bf16 matmul peak before and after. Weights: the LM
head of the demo's model (OLMoE's 50304 x 2048) and one attention projection (2048 x 2048). Printed and written: per
cell the median time over rounds with its 95% interval, GB/s and GFLOP/s at that time, and the ratio packed /
native per round (median and interval); the rows from which packed is the faster in median, per weight.

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
from moespec.kernels import dense, native
from moespec.measure.rounds import bootstrap_median
from moespec.measure.timing import CpuTimer, matmul_peak

WEIGHTS = {"lm_head": (50304, 2048), "attention_projection": (2048, 2048)}  # rows x columns, bf16
ROWS = (1, 2, 4, 5, 6, 8, 12, 16)
PATHS = ("native", "packed")


def calls(gen: torch.Generator) -> dict[tuple[str, int, str], object]:
    """(weight, rows, path) -> its call, inputs drawn once."""
    out = {}
    for name, (m, k) in WEIGHTS.items():
        w = (0.02 * torch.randn(m, k, generator=gen)).bfloat16()
        packed = dense.pack(w)
        for n in ROWS:
            x = torch.randn(n, k, generator=gen).bfloat16()
            out[name, n, "native"] = lambda x=x, w=w: dense.linear(x, w)
            out[name, n, "packed"] = lambda x=x, p=packed: dense.packed_linear(x, p)
    return out


def measure(rounds: int) -> dict:
    """Every cell's times and ceiling samples over interleaved rounds (module docstring)."""
    if native.load() is None or dense.pack(torch.zeros(2, 2, dtype=torch.bfloat16)) is None:
        raise MoespecError(f"both paths are needed: native ({native.status()}) and torch's oneDNN")
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
    """Medians, intervals, rates and ratios per cell; the first row count where packed wins, per weight."""
    rng = np.random.default_rng(0)
    cells, faster_from = [], {}
    for name, (m, k) in WEIGHTS.items():
        for n in ROWS:
            row = {"weight": name, "rows": n}
            for path in PATHS:
                med, lo, hi = bootstrap_median(data["seconds"][name, n, path], rng)
                row[path] = {"median_s": med, "interval_s": [lo, hi], "gbps": m * k * 2 / med / 1e9,
                             "gflops": 2 * m * k * n / med / 1e9}
            ratio = [p / q for p, q in zip(data["seconds"][name, n, "packed"], data["seconds"][name, n, "native"])]
            med, lo, hi = bootstrap_median(ratio, rng)
            row["packed_over_native"] = {"median": med, "interval": [lo, hi]}
            cells.append(row)
        wins = [c["rows"] for c in cells if c["weight"] == name and c["packed_over_native"]["median"] < 1]
        faster_from[name] = min(wins) if wins else None
    return {"cells": cells, "packed_faster_from_rows": faster_from,
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
    amx = dense.amx_tiles()
    print(f"streaming read {summary['streaming_read_gbps']:.1f} GB/s, bf16 matmul {summary['matmul_peak_gflops']:.0f} "
          f"GFLOP/s; AMX tiles: {'yes' if amx else 'no'}; the engine packs from "
          f"{dense.packed_rows()} rows")
    for c in summary["cells"]:
        nat, pk, ratio = c["native"], c["packed"], c["packed_over_native"]
        print(f"{c['weight']} {c['rows']:2d} rows: native {nat['median_s'] * 1e3:6.2f} ms ({nat['gbps']:5.1f} GB/s, "
              f"{nat['gflops']:4.0f} GFLOP/s), packed {pk['median_s'] * 1e3:6.2f} ms ({pk['gbps']:5.1f} GB/s, "
              f"{pk['gflops']:4.0f} GFLOP/s); packed / native {ratio['median']:.2f} "
              f"(95% {ratio['interval'][0]:.2f}-{ratio['interval'][1]:.2f})")
    print("packed faster from rows: " + ", ".join(f"{k} {v}" for k, v in summary["packed_faster_from_rows"].items()))
    if args.out:
        write_json(args.out, {"summary": summary, "seconds": {f"{w}/{n}/{p}": v for (w, n, p), v in
                                                               data["seconds"].items()},
                              "weights": {k: list(v) for k, v in WEIGHTS.items()}, "rounds": args.rounds,
                              "amx": amx, "packed_rows": dense.packed_rows(),
                              "flush_bytes": data["flush_bytes"], "command": shlex.join([sys.executable, *sys.argv]),
                              "provenance": provenance("cpu", "bf16")})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Quick expert-kernel benchmark on one OLMoE-1B-7B layer (N = 64 experts, top m = 8, d = 2048, f = 1024).

Physics: the expert operation is memory-bound, so each kernel is judged by its effective bandwidth on the bytes it
requests (per-slot: n*m*b, dedup: U*b, b = one expert's bytes) against the machine's streaming-read bandwidth (the
ceiling: one read of a 256 MiB buffer). Every timed call, ceiling reads included, follows a cache flush (a write of
a buffer larger than the L3, then a clean read), and within every repetition the ceiling and all kernels run back to
back, so the slow drifts of a shared machine hit them alike; each figure is a median with its interquartile range.
Ids are random: each token picks m distinct experts uniformly.

    .venv/bin/python benchmarks/kernel_quick.py [--n 1-9] [--kernels slot,dedup,...] [--reps 5] [--dtype bf16]

The last line of output is one JSON document (ceiling, per-kernel bandwidth per n, r(n) = beta_dedup/beta_slot).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from moespec import MoespecError
from moespec import kernels as K
from moespec.cli.args import parse_ints
from moespec.kernels import native
from moespec.measure.timing import CacheFlusher, StreamRead, median_iqr

# OLMoE-1B-7B's MoE layer shape (DESIGN.md, reference facts).
N_EXPERTS, TOP_M, HIDDEN, WIDTH = 64, 8, 2048, 1024
# Scale of the random weights: roughly the std of a trained expert's entries; only keeps activations finite.
WEIGHT_STD = 0.02
# An IQR wider than this share of the median marks a figure as noisy.
NOISY_IQR = 0.2
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def random_ids(n: int, gen: torch.Generator) -> torch.Tensor:
    return torch.stack([torch.randperm(N_EXPERTS, generator=gen)[:TOP_M] for _ in range(n)])


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", default="1-9", help="pass sizes, e.g. 1-9 or 1,2,9")
    ap.add_argument("--kernels", default=",".join(k for k in K.KERNELS if k != "reference"),
                    help="default: ours and every installed peer")
    ap.add_argument("--reps", type=int, default=5, help="timed calls per kernel and n (after one warm-up)")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    ap.add_argument("--threads", type=int, default=None, help="threads for our kernels (default: torch's)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    ns = parse_ints(args.n, "--n", 1, what="pass sizes")
    kernels, dtype = args.kernels.split(","), DTYPES[args.dtype]
    for name in kernels:
        if name not in K.KERNELS:
            ap.error(f"unknown kernel {name!r}; choose from {', '.join(K.KERNELS)}")

    gen = torch.Generator().manual_seed(args.seed)
    gate_up = torch.empty(N_EXPERTS, 2 * WIDTH, HIDDEN, dtype=dtype).normal_(0, WEIGHT_STD, generator=gen)
    down = torch.empty(N_EXPERTS, HIDDEN, WIDTH, dtype=dtype).normal_(0, WEIGHT_STD, generator=gen)
    b = K.expert_bytes(gate_up, down)
    print(f"# {native.status()}")
    print("# implementations: "
          + ", ".join(f"{k}={K.implementation(k, dtype)}" for k in kernels if k in ("slot", "dedup")))
    print(f"# OLMoE layer N={N_EXPERTS} m={TOP_M} d={HIDDEN} f={WIDTH} {args.dtype}: b = {b / 1e6:.1f} MB per expert; "
          f"median of {args.reps} flushed calls; noisy = IQR > {NOISY_IQR:.0%} of median; "
          f"{args.threads or torch.get_num_threads()} threads")
    print(f"{'n':>2} {'U':>3} {'kernel':<14} {'ms':>8} {'IQR ms':>7} {'GB/s':>6} {'%ceil':>6}")

    flush, read = CacheFlusher(), StreamRead(threads=args.threads)
    read()
    ceiling_samples: list[float] = []
    results: dict[str, dict] = {k: {"beta_gbps": {}, "median_ms": {}, "iqr_ms": {}} for k in kernels}
    for n in ns:
        ids = random_ids(n, gen)
        x = torch.randn(n, HIDDEN, generator=gen).to(dtype)
        weights = torch.softmax(torch.randn(n, TOP_M, generator=gen), dim=-1).to(dtype)
        times: dict[str, list[float]] = {k: [] for k in kernels}
        for name in list(kernels):  # warm-up: builds peer modules, pages in code paths
            try:
                K.expert_op(name, x, ids, weights, gate_up, down, threads=args.threads)
            except MoespecError as err:  # a peer that cannot run this dtype or shape
                print(f"# skipping {name}: {err}")
                kernels.remove(name)
                del times[name], results[name]
        for _ in range(args.reps):
            flush()
            ceiling_samples.append(read())
            for name in kernels:
                flush()
                start = time.perf_counter()
                K.expert_op(name, x, ids, weights, gate_up, down, threads=args.threads)
                times[name].append(time.perf_counter() - start)
        ceiling = median_iqr(ceiling_samples)[0]  # so far: the %ceil column uses the current median
        for name in kernels:
            med, iqr = median_iqr(times[name])
            beta = K.requested_bytes(name, ids, gate_up, down) / med / 1e9
            results[name]["beta_gbps"][n] = round(beta, 2)
            results[name]["median_ms"][n] = round(med * 1e3, 3)
            results[name]["iqr_ms"][n] = round(iqr * 1e3, 3)
            flag = "  noisy" if iqr > NOISY_IQR * med else ""
            print(f"{n:>2} {K.distinct_experts(ids):>3} {name:<14} {med * 1e3:8.2f} {iqr * 1e3:7.2f} {beta:6.1f} "
                  f"{100 * beta / ceiling:5.0f}%{flag}", flush=True)

    ceiling, ceiling_iqr = median_iqr(ceiling_samples)
    print(f"# streaming read (ceiling, flushed, interleaved with the kernels): {ceiling:.1f} GB/s "
          f"(IQR {ceiling_iqr:.1f})")
    summary = {
        "device": "cpu", "dtype": args.dtype, "threads": args.threads or torch.get_num_threads(),
        "native": native.status(), "ceiling_gbps": round(ceiling, 2), "ceiling_iqr_gbps": round(ceiling_iqr, 2),
        "kernels": results,
    }
    if "slot" in kernels and "dedup" in kernels:
        summary["r"] = {n: round(results["dedup"]["beta_gbps"][n] / results["slot"]["beta_gbps"][n], 3) for n in ns}
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main(sys.argv[1:])

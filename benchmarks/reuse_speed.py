"""Speed of the reuse statistics (App. D.2 estimator) at the size the issue fixes: 1M tokens x 48 layers x m = 8
(N = 128, Qwen3-30B-A3B's routing shape), windows n <= 9, then 2000 bootstrap resamples over documents.

Targets on a 2-core CPU: <= 10 s for the estimates, <= 10 s more for the bootstrap. The trace comes from the
calibrated synthetic process (timed too, for reference). Prints the figures, then one JSON line.

    .venv/bin/python benchmarks/reuse_speed.py [--tokens 1000000] [--docs 250] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import time

from moespec.formats.files import provenance
from moespec.routing.reuse import reuse_stats
from moespec.routing.synth import synthesize

MODEL = "qwen3-30b-a3b"  # N = 128, m = 8, L = 48
N_MAX = 9
RESAMPLES = 2000
TARGET_S = 10.0  # the budget for each of the two stages


def best_of(repeats: int, fn) -> tuple[float, object]:
    """Smallest wall time over `repeats` calls (the machine's noise only ever adds time) and the last result."""
    best, result = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=1_000_000)
    parser.add_argument("--docs", type=int, default=250, help="documents (250 of 4000 tokens ~ WikiText articles)")
    parser.add_argument("--repeats", type=int, default=2, help="timed repetitions; the best is reported")
    args = parser.parse_args()

    start = time.perf_counter()
    trace = synthesize(MODEL, "calibrated", args.tokens, args.docs, seed=0)
    synth_s = time.perf_counter() - start
    print(f"trace: {trace.num_tokens:,} tokens x {trace.num_layers} layers x m={trace.m} (N={trace.num_experts}), "
          f"{trace.num_documents} documents; synthesized and validated in {synth_s:.1f} s")

    reuse_s, stats = best_of(args.repeats, lambda: reuse_stats(trace, N_MAX, bootstrap=0))
    total_s, boot = best_of(args.repeats, lambda: reuse_stats(trace, N_MAX, bootstrap=RESAMPLES, seed=0))
    bootstrap_s = max(total_s - reuse_s, 0.0)
    print(f"reuse statistics, n <= {N_MAX}:   {reuse_s:6.2f} s  (target <= {TARGET_S:.0f} s)")
    print(f"bootstrap, {RESAMPLES} resamples: {bootstrap_s:6.2f} s more  (target <= {TARGET_S:.0f} s)")
    lo, hi = boot.ci["rho_mean"]
    print(f"layer-mean rho(2) = {stats.rho_mean[2]:.4f} [{lo[2]:.4f}, {hi[2]:.4f}], "
          f"rho(9) = {stats.rho_mean[9]:.4f} [{lo[9]:.4f}, {hi[9]:.4f}] (calibrated to "
          f"{trace.meta['calibrated_to']['rho']})")
    print(json.dumps({"benchmark": "reuse_speed", "tokens": trace.num_tokens, "layers": trace.num_layers,
                      "m": trace.m, "num_experts": trace.num_experts, "documents": trace.num_documents,
                      "n_max": N_MAX, "resamples": RESAMPLES, "synth_s": round(synth_s, 3),
                      "reuse_s": round(reuse_s, 3), "bootstrap_s": round(bootstrap_s, 3),
                      "within_target": reuse_s <= TARGET_S and bootstrap_s <= TARGET_S,
                      "provenance": provenance()}))


if __name__ == "__main__":
    main()

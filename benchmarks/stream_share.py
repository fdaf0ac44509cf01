"""How much of a cold expert pass's time follows the streaming read, per kernel: the structural model's cold rate
(moespec.kernels.structure) is 1 / C + x per byte, all of the stream's time plus a loop excess x that a faster
memory does not shorten. On a shared host whose streaming read C moves between states, that form is testable: time
the same cold one-token pass (after a flush) again and again with C sampled right after each call, and fit
t / b = x + s / C over the calls. s = 1 is the model's form; s near 0 is a loop-bound pass whose time ignores C.

    .venv/bin/python benchmarks/stream_share.py --seconds 150 --out results/structure-model/stream-share.json

Each round times our dedup kernel at bf16 and ggml's MUL_MAT_ID at q8_0 (moespec.measure.device_profile's Weights,
a synthetic OLMoE-sized expert: d = 2048, f = 1024, 16 experts, one token on all of them), interleaved. The split at
the median C gives each kernel's GB/s in the host's slower and faster half. The fit only says something when C
moved during the run (its 5-95% range is printed); on a quiet host it does not.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time

import numpy as np

from moespec.formats.files import check_output, provenance, write_json
from moespec.measure import device_profile
from moespec.measure.timing import CpuTimer, StreamRead

SHAPE, EXPERTS = (2048, 1024), 16  # OLMoE's expert (d, f); 16 experts of it, ~200 MB in bf16: far past the cache
KERNELS = {"bf16": "dedup", "q8_0": "ggml-mul_mat_id"}  # one token: every group of G = 1, both kernels alike


def fit(samples: list[tuple[float, float]]) -> dict:
    """samples (seconds per byte, GB/s right after): x and s of t / b = x + s / C, their correlation, and the
    GB/s and x = t / b - 1 / C in the halves below and above the median C."""
    y, c = (np.array(v) for v in zip(*samples))
    u = 1 / (c * 1e9)
    s, x = np.polyfit(u, y, 1)
    halves = {"low": c < np.median(c), "high": c >= np.median(c)}
    return {"calls": len(samples), "ceiling_p5_p95_gbps": [float(np.percentile(c, 5)), float(np.percentile(c, 95))],
            "x_s_per_byte": float(x), "s": float(s), "correlation": float(np.corrcoef(u, y)[0, 1]),
            "gbps": {h: float(1 / np.median(y[m]) / 1e9) for h, m in halves.items()},
            "excess_s_per_byte": {h: float(np.median((y - u)[m])) for h, m in halves.items()}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=150.0, help="how long to keep timing (default %(default)s)")
    p.add_argument("--out", default="out/stream-share.json", help="the result JSON (default %(default)s)")
    args = p.parse_args(argv)
    if not 1 <= args.seconds <= 3600:
        p.error("--seconds: 1..3600")
    check_output(args.out, "--out")
    started = provenance("cpu", ",".join(KERNELS)) | {"command": shlex.join([sys.executable, *sys.argv])}
    timer, read = CpuTimer(), StreamRead()
    calls = {}
    for dtype, kernel in KERNELS.items():
        w = device_profile.Weights.draw(*SHAPE, EXPERTS, dtype)
        calls[dtype] = (w.call(kernel, device_profile._same_experts(1, EXPERTS), None), EXPERTS * w.expert_bytes)
    samples: dict[str, list[tuple[float, float]]] = {dtype: [] for dtype in KERNELS}
    end = time.perf_counter() + args.seconds
    while time.perf_counter() < end:
        for dtype, (fn, nbytes) in calls.items():
            timer.flush()
            seconds = timer.time(fn)
            samples[dtype].append((seconds / nbytes, read()))
    result = {"format": "moespec-stream-share", "format_version": 1, "shape": list(SHAPE), "experts": EXPERTS,
              "kernels": KERNELS, "seconds": args.seconds, "provenance": started,
              "fits": {dtype: fit(s) for dtype, s in samples.items()}}
    for dtype, f in result["fits"].items():
        lo, hi = f["ceiling_p5_p95_gbps"]
        print(f"{dtype} {KERNELS[dtype]}: {f['calls']} calls, C {lo:.0f}-{hi:.0f} GB/s; t/b = "
              f"{f['x_s_per_byte'] * 1e12:.1f} ps + {f['s']:.2f} / C (correlation {f['correlation']:.2f}); GB/s "
              f"{f['gbps']['low']:.1f} in the slower half, {f['gbps']['high']:.1f} in the faster; x = t/b - 1/C "
              f"{f['excess_s_per_byte']['low'] * 1e12:.1f} and {f['excess_s_per_byte']['high'] * 1e12:.1f} ps/byte")
    write_json(args.out, result)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

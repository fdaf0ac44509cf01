"""GPU expert-operation benchmark: moespec's Triton kernels and the peers on one CUDA device, in one run.

Physics. On an H200 a pass's expert weights stream from HBM at up to ~4.8 TB/s while the tensor cores idle,
so each kernel is judged, as on the CPU, by its effective bandwidth on the bytes it requests (per-slot:
n m b; deduplicating: U b) beside the device's ceiling, here a measured device-to-device copy (read + write
bytes over its time; a plain read is timed beside it). The deduplicating kernel wins a pass exactly where the
byte share u(n) lies below the bandwidth ratio r(n) = beta_dedup / beta_slot (paper eq. 7); the goal is
r(n) >= 1 at n = 2..9, so deduplication wins wherever consecutive tokens share experts.

Stages, each guarded (a failure is recorded and the next stage runs), all in one process so Triton compiles
each kernel once:
1. the device, library versions and the ceilings;
2. every kernel that runs here against the float64 reference on each model's real layer shape (n = 1 and 9);
3. `moespec bench --device cuda --kernels all` per model (chosen ids and windows of the calibrated synthetic
   trace; CUDA events, an L2 flush before every timed call): bench-MODEL.json and fig2-MODEL.png;
4. the summary: per model beta_p(n) on requested bytes, r(n), u(n), the crossover, eps, the share of the
   ceiling our kernels reach and whether the issue's targets hold; rewritten after every model.

    PYTHONPATH=. python3 benchmarks/gpu_expert_op.py --out OUT [--models a,b] [--budget-s 420]

`--device cpu --kernels slot,dedup --n 1,2 --reps 1` rehearses every stage on the CPU (our native kernels
there; the copy ceiling becomes the streaming read), so the script is tested before a GPU is lent.

The last line of output is one JSON document (the summary's headline numbers).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
import traceback
from pathlib import Path

import numpy as np
import torch

if importlib.util.find_spec("rich") is None:  # the GPU machine may lack rich: a pure-Python copy travels along
    sys.path.append(str(Path(__file__).resolve().parents[1] / ".gpu_deps"))

from moespec import MoespecError  # noqa: E402
from moespec import kernels as K  # noqa: E402
from moespec.cli.args import parse_ints  # noqa: E402
from moespec.formats.files import provenance, write_json  # noqa: E402
from moespec.measure import bench, level, passes, timing  # noqa: E402
from moespec.model.spec import resolve  # noqa: E402
from moespec.report.figures import bandwidth_figure, save_figure  # noqa: E402

MODELS = "olmoe-1b-7b,qwen3-30b-a3b,gpt-oss-20b"
# The targets: dedup r(n) >= 1 at n = 2..9; our kernels >= 80% of the ceiling on the bytes they request.
R_TARGET, CEILING_SHARE_TARGET = 1.0, 0.8
CHECK_NS = (1, 9)  # correctness passes: one token (both kernels read the same m experts) and the largest pass
BF16_TOL = 3e-2  # the peers' bf16 tolerance of tests/test_kernels.py (ours are within it too)
# A model's bench takes ~1-2 min here; none is started with less than this left of the budget.
MODEL_SECONDS = 90
LAUNCH_SAMPLES = 5  # host-side launch timings per kernel (after compilation)


def read_bandwidth(timer: timing.Timer, nbytes: int = 1 << 30, repeats: int = 7) -> list[float]:
    """GB/s of a plain read (a sum over an nbytes buffer), timed as the kernels are: the other ceiling."""
    buf = torch.ones(nbytes // 4, dtype=torch.float32, device=timer.device)
    buf.sum()
    return [nbytes / timer.time(buf.sum) / 1e9 for _ in range(repeats)]


def environment(timer: timing.Timer) -> dict:
    import transformers

    device = timer.device
    env = {"device": timer.name, "python": sys.version.split()[0], "torch": torch.__version__,
           "cuda": torch.version.cuda, "transformers": transformers.__version__}
    if importlib.util.find_spec("triton") is not None:
        import triton

        env["triton"] = triton.__version__
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(device)
        env |= {"capability": f"sm{props.major}{props.minor}", "memory_gib": round(props.total_memory / 2**30, 1),
                "sms": props.multi_processor_count, "l2_bytes": getattr(props, "L2_cache_size", None)}
    return env


def check_kernels(model: str, kernels: list[str], timer: timing.Timer) -> dict:
    """Largest error / largest reference output of each kernel on the model's real layer shape (bf16), and the
    host time our kernels take to launch a pass beside the flush's device time (the lead the events rely on)."""
    device = timer.device
    spec = resolve(model)
    layer = bench.layer_weights(spec, 0, "bf16", seed=0, device=device)
    rng, gen = np.random.default_rng(0), torch.Generator().manual_seed(0)
    errors: dict[str, dict[str, float | str]] = {k: {} for k in kernels}
    for n in CHECK_NS:
        lo, hi = spec.m, min(n * spec.m, spec.N)
        ids = torch.from_numpy(passes.chosen_ids(n, spec.m, spec.N, (lo + hi) // 2, rng))
        x = torch.randn(n, spec.hidden, generator=gen).to(torch.bfloat16)
        w = torch.softmax(torch.randn(n, spec.m, generator=gen), dim=-1).to(torch.bfloat16)
        ref = K.reference_float64(x, ids, w, layer.gate_up, layer.down, layer.gate_up_bias, layer.down_bias,
                                  layer.act)
        for kernel in kernels:
            try:
                y = layer.run(kernel, x.to(device), ids.to(device), w.to(device)).cpu()
                errors[kernel][str(n)] = float((y.double() - ref).abs().max() / ref.abs().max())
            except Exception as e:  # noqa: BLE001 - a peer that cannot run here (bench skips it too)
                errors[kernel][str(n)] = f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"
    bad = {k: e for k, e in errors.items() if any(isinstance(v, str) or v > BF16_TOL for v in e.values())}
    if bad:
        print(f"{model}: kernels beyond the bf16 tolerance {BF16_TOL}: {bad}", flush=True)
    launch, inputs = {}, (x.to(device), ids.to(device), w.to(device))  # the n = 9 pass
    for kernel in ("slot", "dedup"):
        host = []
        for _ in range(LAUNCH_SAMPLES):
            timer.flush()
            start = time.perf_counter()
            layer.run(kernel, *inputs)
            host.append(time.perf_counter() - start)
            timer.time(lambda: None)  # waits for the device
        launch[kernel] = timing.median_iqr(host)[0]
    flush = timing.median_iqr([timer.time(timer.flush) for _ in range(LAUNCH_SAMPLES)])[0]
    return {"max_rel_err": errors, "host_launch_s": launch, "flush_device_s": flush}


def bench_model(model: str, args: argparse.Namespace, plot: bool) -> dict:
    """The bench (moespec.measure.bench) with the script's device, kernels, n and reps; returns its bench.json."""
    config = bench.BenchConfig(out=str(Path(args.out) / f"bench-{model}.json"), model=model, device=args.device,
                               kernels=args.kernels, n=tuple(parse_ints(args.n, "--n", 1)), reps=args.reps,
                               level_wait_s=level.WAIT_S)  # a CPU rehearsal pins as it always has; a GPU never does
    print(f"$ bench {config}", flush=True)
    doc = bench.run_bench(config, say=lambda text: print(text, flush=True))
    if plot:
        save_figure(bandwidth_figure(doc), str(Path(args.out) / f"fig2-{model}.png"))
    return doc.doc


def headline(doc: dict) -> dict:
    """The numbers the issue asks for, from one bench.json, with the targets checked."""
    ns = [n for n in doc["n"] if n >= 2]
    ceiling = doc["ceiling_gbps"]
    beta = {k: v["beta_gbps"] for k, v in doc["kernels"].items()}
    share = {k: {n: beta[k][str(n)] / ceiling for n in map(str, doc["n"])} for k in ("slot", "dedup") if k in beta}
    r = {int(n): v for n, v in doc["r"].items()}
    return {"ceiling_gbps": ceiling, "ceiling_kind": doc.get("ceiling_kind"), "beta_gbps": beta, "r": doc["r"],
            "u": doc["u"], "crossover": doc["crossover"], "eps": doc["eps"], "ceiling_share": share,
            "targets": {
                "dedup_r_at_least_1_n2_9": all(r.get(n, 0.0) >= R_TARGET for n in ns),
                "dedup_80pct_ceiling_n2_9": all(share.get("dedup", {}).get(str(n), 0.0) >= CEILING_SHARE_TARGET
                                                for n in ns),
                "slot_80pct_ceiling_n2_9": all(share.get("slot", {}).get(str(n), 0.0) >= CEILING_SHARE_TARGET
                                               for n in ns)}}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="results/gpu", help="folder for the JSON files and figures")
    ap.add_argument("--models", default=MODELS, help=f"comma-separated presets (default {MODELS})")
    ap.add_argument("--reps", type=int, default=7, help="timed repetitions per pass (default 7)")
    ap.add_argument("--device", default="cuda", help="cuda (default), or cpu to rehearse the stages")
    ap.add_argument("--kernels", default="all", help="kernels to bench (default all that run here)")
    ap.add_argument("--n", default="1-9", help="pass sizes (default 1-9)")
    ap.add_argument("--budget-s", type=float, default=420.0, help="stop starting models after this (default 420)")
    args = ap.parse_args(argv)
    started = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    timer = timing.timer_for(args.device)
    summary: dict = {"format": "moespec-gpu-expert-op", "targets": {"r": R_TARGET, "ceiling_share":
                     CEILING_SHARE_TARGET}, "models": {}, "errors": {}}
    summary_path = out / "gpu_expert_op.json"

    def stage(name: str, fn):
        t0 = time.perf_counter()
        try:
            return fn()
        except Exception:  # noqa: BLE001 - one failing stage must not lose the others' measurements
            summary["errors"][name] = traceback.format_exc()[-3000:]
            print(f"stage {name} failed:\n{summary['errors'][name]}", flush=True)
            return None
        finally:
            summary.setdefault("stage_seconds", {})[name] = round(time.perf_counter() - t0, 1)
            summary["provenance"] = provenance(timer.name, "bf16")
            write_json(summary_path, summary)

    summary["environment"] = stage("environment", lambda: environment(timer))
    print(json.dumps(summary["environment"]), flush=True)
    copy = stage("ceiling", timer.ceiling)
    read = stage("read", lambda: read_bandwidth(timer))
    if copy and read:
        summary["ceiling"] = {"kind": timer.ceiling_kind, "gbps": timing.median_iqr(copy),
                              "read_gbps": timing.median_iqr(read)}
        print(f"ceiling: {timer.ceiling_kind} {timing.median_iqr(copy)[0]:.0f} GB/s, "
              f"read {timing.median_iqr(read)[0]:.0f} GB/s", flush=True)
    plot = importlib.util.find_spec("matplotlib") is not None
    kernels = list(bench.bench_kernels()) if args.kernels == "all" else args.kernels.split(",")
    for model in args.models.split(","):
        left = args.budget_s - (time.perf_counter() - started)
        if left < MODEL_SECONDS:
            summary["errors"][model] = f"skipped: {left:.0f} s of the {args.budget_s:.0f} s budget left"
            continue
        entry = summary["models"].setdefault(model, {})
        entry["check"] = stage(f"check {model}", lambda: check_kernels(model, kernels, timer))
        doc = stage(f"bench {model}", lambda: bench_model(model, args, plot))
        if doc is not None:
            entry.update(headline(doc))
            if "moespec.kernels.triton_experts" in sys.modules:
                entry["tuned_tiles"] = sys.modules["moespec.kernels.triton_experts"].tuned_configs()
        write_json(summary_path, summary)
    summary["elapsed_s"] = round(time.perf_counter() - started, 1)
    write_json(summary_path, summary)
    line = {"ceiling": summary.get("ceiling"), "errors": sorted(summary["errors"]),
            **{m: {k: e.get(k) for k in ("r", "crossover", "targets")} for m, e in summary["models"].items()}}
    print(json.dumps(line))
    return summary


if __name__ == "__main__":
    try:
        main()
    except MoespecError as e:  # bad input (e.g. --device cuda without a GPU): one line, no traceback
        sys.exit(f"gpu_expert_op: error: {e}")

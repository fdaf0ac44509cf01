"""The batch plan's fidelity as a distribution over runs: the pre-registered chain at batch sizes B, N times.

Each repetition, in a folder of its own:
1. `moespec run --batch B,.. --no-throughput`: verify times of passes of B sequences x n tokens, both kernels;
2. `moespec plan --batch B,..` from them (with the bench and the trace): V_B(k), k_hat*(a, B), the crossover per B
   and B_stop(a), written before step 3 (pre-registered);
3. `moespec run --batch B,.. --plan plan.json`: the oracle's throughput at each B under the plan's AUTO per B;
4. the batch rules (moespec.predict.batch_score): k_hat*(a, B) within one of the measured best, the crossover
   within one, B_stop(a) within one grid step.
The summary gives per B the median and range over repetitions of the acceptances within one and of the crossover
rule, B_stop's pass rate, and each repetition's streaming-read ceiling (what moves the timings on a shared host).

Usage (the demo's model: OLMoE-1B-7B's shape, 2 of its layers, bf16, depth 512, the demo's bench and trace):
    .venv/bin/python benchmarks/batch_fidelity.py --bench out/demo/bench.json --trace out/demo/trace.npz \\
        --work out/batch-fidelity --repeats 5 --out results/batch-engine/fidelity.json
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

import numpy as np

from moespec.formats.files import check_output, provenance, write_json
from moespec.formats.planfile import load_plan
from moespec.measure.run import RunConfig, run_engine
from moespec.predict.batch_score import score_batches
from moespec.predict.plan import PlanConfig, make_plan

DEFAULT_BATCHES = (1, 2, 4, 8)
DEFAULT_A = (0.2, 0.5, 0.8, 0.95)  # a spread of the paper's grid: a scored run of 4 acceptances takes ~5 min here


def repetition(args: argparse.Namespace, folder: Path, seed: int) -> dict:
    """One pass of the chain (module docstring); its batch rules and ceilings."""
    folder.mkdir(parents=True, exist_ok=True)
    common = dict(preset=args.preset, layers=args.layers, dtype="bf16", depth=args.depth, n=tuple(range(1, 10)),
                  reps=5, max_reps=5, budget_s=3.0, replay=args.trace, batch=tuple(args.batches), seed=seed,
                  fresh=True)
    verify = run_engine(RunConfig(out=str(folder / "runs-verify.json"), throughput=False, **common))
    make_plan(PlanConfig(bench=args.bench, trace=args.trace, runs=str(folder / "runs-verify.json"),
                         batch=tuple(args.batches), out=str(folder / "plan.json")))
    runs = run_engine(RunConfig(out=str(folder / "runs.json"), plan=str(folder / "plan.json"), k=tuple(range(9)),
                                a=tuple(args.a), prompts=4, tokens=8, **common))
    scored = score_batches(load_plan(folder / "plan.json"), runs)
    return {"folder": str(folder), "seed": seed, "rules": scored,
            "ceiling_gbps": {"verify": verify["ceiling_gbps"], "scored": runs["ceiling_gbps"]}}


def summary(reps: list[dict]) -> dict:
    """Per B: acceptances within one and the crossover rule, median and range; B_stop's and all rules' pass rates."""
    out = {}
    for b in reps[0]["rules"]["per_batch"]:
        within = [r["rules"]["per_batch"][b]["k_hat_within_one"] for r in reps]
        out[b] = {"k_hat_within_one": {"median": float(np.median(within)), "min": min(within), "max": max(within),
                                       "of": reps[0]["rules"]["per_batch"][b]["acceptances"]},
                  "k_hat_holds": sum(r["rules"]["per_batch"][b]["k_hat_holds"] for r in reps),
                  "crossover_holds": sum(r["rules"]["per_batch"][b]["crossover_holds"] for r in reps)}
    return {"per_batch": out, "b_stop_holds": sum(r["rules"]["b_stop_holds"] for r in reps),
            "all_hold": sum(r["rules"]["all_hold"] for r in reps), "repeats": len(reps)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bench", required=True, help="bench.json of the model (the demo's: out/demo/bench.json)")
    p.add_argument("--trace", required=True, help="its routing trace, replayed in every pass")
    p.add_argument("--preset", default="olmoe-1b-7b")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--depth", type=int, default=512)
    p.add_argument("--batches", type=lambda t: [int(b) for b in t.split(",")], default=list(DEFAULT_BATCHES))
    p.add_argument("--a", type=lambda t: [float(a) for a in t.split(",")], default=list(DEFAULT_A))
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--work", default="out/batch-fidelity", help="one folder per repetition under it")
    p.add_argument("--out", required=True, help="the summary JSON")
    args = p.parse_args()
    check_output(args.out)
    started = provenance("cpu", "bf16")
    reps = []
    for i in range(args.repeats):
        reps.append(repetition(args, Path(args.work) / f"rep{i + 1}", seed=i))
        rules = reps[-1]["rules"]
        print(f"repetition {i + 1}: " + "; ".join(f"B = {b}: {e['k_hat_within_one']} of {e['acceptances']} within one, "
                                                   f"crossover {e['crossover']}/{e['measured_crossover']}"
                                                   for b, e in rules["per_batch"].items())
              + f"; B_stop {'holds' if rules['b_stop_holds'] else 'fails'}", flush=True)
    doc = {"command": " ".join(map(shlex.quote, sys.argv)), "summary": summary(reps), "repetitions": reps,
           "provenance": started}
    write_json(args.out, doc)
    for b, e in doc["summary"]["per_batch"].items():
        w = e["k_hat_within_one"]
        print(f"B = {b}: k_hat within one at {w['median']:g} of {w['of']} (median; range {w['min']}-{w['max']}); "
              f"k_hat rule {e['k_hat_holds']} of {len(reps)}, crossover rule {e['crossover_holds']} of {len(reps)}")
    print(f"B_stop rule {doc['summary']['b_stop_holds']} of {len(reps)}; all batch rules {doc['summary']['all_hold']} "
          f"of {len(reps)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

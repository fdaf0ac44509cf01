"""The batch plan's fidelity as a distribution over runs: the pre-registered chain at batch sizes B, N times.

Each repetition, in a folder of its own:
1. `moespec run --batch B,.. --no-throughput`: verify times of passes of B sequences x n tokens, both kernels;
2. `moespec plan --batch B,..` from them (with the bench and the trace): V_B(k), k_hat*(a, B), the crossover per B
   and B_stop(a), written before step 3 (pre-registered);
3. `moespec run --batch B,.. --plan plan.json`: the oracle's throughput at each B under the plan's AUTO per B;
4. the batch rules (moespec.predict.batch_score) of each version of the plan's batch map, the measured map and the
   prediction from the bench: k_hat*(a, B) within one of the measured best, the crossover within one, B_stop(a)
   within one grid step; the measured best on the rate the plan names (--rate; DEFAULT_RATE says why computed).
The summary gives per version and B the median and range over repetitions of the acceptances within one and of the
crossover rule, B_stop's pass rate, and each repetition's streaming-read ceiling (what moves the timings on a shared
host). A repetition whose folder holds its plan and both runs is scored from them, not run again, so a stopped run
resumes, and `--repeats N` after a run of fewer adds the missing ones.

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

from moespec import MoespecError
from moespec.cli.args import bounded
from moespec.defaults import GENERATED_LIMIT, REPS_LIMIT, SAMPLES_LIMIT
from moespec.formats.benchfile import load_bench
from moespec.formats.files import check_output, provenance, write_json
from moespec.formats.planfile import load_plan
from moespec.formats.runsfile import RATES, load_runs
from moespec.formats.trace import load_trace
from moespec.measure.run import RunConfig, run_engine
from moespec.predict.acceptance import plan_rate
from moespec.predict.batch_score import VERSIONS, score_batches
from moespec.predict.plan import PlanConfig, make_plan

DEFAULT_BATCHES = (1, 2, 4, 8)
DEFAULT_A = (0.2, 0.5, 0.8, 0.95)  # a spread of the paper's grid: a repetition of 4 acceptances takes ~4 min here
DEFAULT_PROMPTS = 11  # batch one's cells give each prompt one acceptance: 11 puts a prompt at each of the paper's 11
DEFAULT_TOKENS = 16  # per sequence and cell: ~2 minutes of decoding at B = 8, 11 acceptances, k = 0..8 on 2 cores
# The oracle's acceptance is known: G_a(k) over the measured step time ranks k; the tokens a short cell happens to
# emit do not (at 16 tokens a sequence sees ~2 wrong drafts at a = 0.9); the paper counted 256 tokens x 6 prompts
# x 3-4 runs per cell. The counted rate's best k is kept beside it in every repetition (measured_best_by_rate).
DEFAULT_RATE = "computed"


def repetition(args: argparse.Namespace, folder: Path, seed: int) -> dict:
    """One pass of the chain (module docstring); its batch rules and ceilings."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = {name: folder / f"{name}.json" for name in ("runs-verify", "plan", "runs")}
    if all(path.exists() for path in paths.values()):
        verify, runs = load_runs(paths["runs-verify"]), load_runs(paths["runs"])
        return scored(folder, seed, verify, runs)
    common = dict(preset=args.preset, layers=args.layers, dtype="bf16", depth=args.depth, n=tuple(range(1, 10)),
                  reps=5, max_reps=5, budget_s=3.0, replay=args.trace, batch=tuple(args.batches), seed=seed,
                  fresh=True)
    verify = run_engine(RunConfig(out=str(folder / "runs-verify.json"), throughput=False, **common))
    make_plan(PlanConfig(bench=args.bench, trace=args.trace, runs=str(folder / "runs-verify.json"),
                         batch=tuple(args.batches), rate=args.rate, out=str(folder / "plan.json")))
    runs = run_engine(RunConfig(out=str(folder / "runs.json"), plan=str(folder / "plan.json"), k=tuple(range(9)),
                                a=tuple(args.a), prompts=args.prompts, tokens=args.tokens, **common))
    return scored(folder, seed, verify, runs)


def scored(folder: Path, seed: int, verify: dict, runs: dict) -> dict:
    """One repetition's batch rules, per version of its plan's batch map (those the plan has), on the rate the plan
    names (`rules`) and on the other (`rules_by_rate`), and its ceilings."""
    plan = load_plan(folder / "plan.json")
    versions = [v for v in VERSIONS if v == "measured" or plan["batch"].get("predicted") is not None]
    other = {rate: {v: score_batches(plan | {"throughput_rate": rate}, runs, version=v) for v in versions}
             for rate in RATES if rate != plan_rate(plan)}
    return {"folder": str(folder), "seed": seed, "rate": plan_rate(plan),
            "rules": {v: score_batches(plan, runs, version=v) for v in versions}, "rules_by_rate": other,
            "ceiling_gbps": {"verify": verify["ceiling_gbps"], "scored": runs["ceiling_gbps"]}}


def summary(reps: list[dict], version: str, rate: str | None = None) -> dict:
    """One version's rules over the repetitions that score it (on the plan's rate, or on `rate`): per B the
    acceptances within one and the crossover rule, median and range; B_stop's and all rules' pass rates."""
    rules = [r["rules"][version] if rate in (None, r["rate"]) else r["rules_by_rate"][rate][version]
             for r in reps if version in r["rules"]]
    out = {}
    for b in rules[0]["per_batch"]:
        within = [r["per_batch"][b]["k_hat_within_one"] for r in rules]
        out[b] = {"k_hat_within_one": {"median": float(np.median(within)), "min": min(within), "max": max(within),
                                       "of": rules[0]["per_batch"][b]["acceptances"]},
                  "k_hat_holds": sum(r["per_batch"][b]["k_hat_holds"] for r in rules),
                  "crossover_holds": sum(r["per_batch"][b]["crossover_holds"] for r in rules)}
    return {"per_batch": out, "b_stop_holds": sum(r["b_stop_holds"] for r in rules),
            "all_hold": sum(r["all_hold"] for r in rules), "repeats": len(rules)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bench", required=True, help="bench.json of the model (the demo's: out/demo/bench.json)")
    p.add_argument("--trace", required=True, help="its routing trace, replayed in every pass")
    p.add_argument("--preset", default="olmoe-1b-7b")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--depth", type=int, default=512)
    p.add_argument("--batches", type=lambda t: [int(b) for b in t.split(",")], default=list(DEFAULT_BATCHES))
    p.add_argument("--a", type=lambda t: [float(a) for a in t.split(",")], default=list(DEFAULT_A))
    p.add_argument("--prompts", type=bounded(1, SAMPLES_LIMIT), default=DEFAULT_PROMPTS,
                   help="batch one's prompts per cell")
    p.add_argument("--tokens", type=bounded(1, GENERATED_LIMIT), default=DEFAULT_TOKENS,
                   help="tokens per sequence and cell")
    p.add_argument("--rate", choices=sorted(RATES), default=DEFAULT_RATE, help="the throughput rate the plan names")
    p.add_argument("--repeats", type=bounded(1, REPS_LIMIT), default=5)
    p.add_argument("--work", default="out/batch-fidelity", help="one folder per repetition under it")
    p.add_argument("--out", required=True, help="the summary JSON")
    args = p.parse_args()
    check_output(args.out)
    load_bench(args.bench), load_trace(args.trace)  # both readable before any folder is made or pass is timed
    started = provenance("cpu", "bf16")
    reps = []
    for i in range(args.repeats):
        reps.append(repetition(args, Path(args.work) / f"rep{i + 1}", seed=i))
        for version, rules in reps[-1]["rules"].items():
            print(f"repetition {i + 1}, {version}: "
                  + "; ".join(f"B = {b}: {e['k_hat_within_one']} of {e['acceptances']} within one, "
                              f"crossover {e['crossover']}/{e['measured_crossover']}"
                              for b, e in rules["per_batch"].items())
                  + f"; B_stop {'holds' if rules['b_stop_holds'] else 'fails'}", flush=True)
    versions = [v for v in VERSIONS if any(v in r["rules"] for r in reps)]
    other = sorted({rate for r in reps for rate in r["rules_by_rate"]})
    doc = {"command": " ".join(map(shlex.quote, sys.argv)), "summary": {v: summary(reps, v) for v in versions},
           "summary_by_rate": {rate: {v: summary(reps, v, rate) for v in versions} for rate in other},
           "repetitions": reps, "provenance": started}
    write_json(args.out, doc)
    named = "/".join(sorted({r["rate"] for r in reps}))  # the rate the plans name
    blocks = [(f"{v} ({named} rate, the plan's)", b) for v, b in doc["summary"].items()] + [
        (f"{v} ({rate} rate)", b) for rate, by in doc["summary_by_rate"].items() for v, b in by.items()]
    for name, block in blocks:
        n = block["repeats"]
        for b, e in block["per_batch"].items():
            w = e["k_hat_within_one"]
            print(f"{name}, B = {b}: k_hat within one at {w['median']:g} of {w['of']} (median; range "
                  f"{w['min']}-{w['max']}); k_hat rule {e['k_hat_holds']} of {n}, crossover rule "
                  f"{e['crossover_holds']} of {n}")
        print(f"{name}: B_stop rule {block['b_stop_holds']} of {n}; all batch rules {block['all_hold']} of {n}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except MoespecError as err:  # bad input met by the chain (a bench, trace or output path): one line
        print(f"batch_fidelity: {err}", file=sys.stderr)
        sys.exit(2)

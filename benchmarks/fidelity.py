"""The pre-registered chain's fidelity as a distribution over runs: `moespec demo` N times, each scored.

Each run, in a folder of its own under --work, is the whole chain of `make demo` (routing, bench, verify-only run,
plan, the run with the plan) on the built-in default; the drafting step on the trained pair, which no rule reads,
is left out. Every version of each run's plan is scored against its run by the paper's six rules, on the throughput
rate the plan names and on the other one (`moespec score --rate`), and the batch map by its rules. The summary
gives, per version and rate, the rules held (median and range over the runs), each rule's pass rate, the largest
verify-time error and the k_hat* misses (median and range), and per run the streaming-read ceiling its measurements
saw (what moves the timings on a shared host), its wall time and how far the counted throughput sits from the
computed one. A run whose folder holds a finished demo is read, not rerun: an interrupted benchmark resumes.

Usage:
    .venv/bin/python benchmarks/fidelity.py --runs 5 --work out/fidelity \\
        --out results/fidelity/fidelity-cpu.json --table results/fidelity/README.md
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from moespec.demo import DemoConfig, demo
from moespec.formats.files import atomic_write, check_output, provenance, read_json, write_json
from moespec.formats.planfile import load_plan
from moespec.formats.runsfile import RATES, load_runs
from moespec.predict.acceptance import VERSIONS, plan_rate
from moespec.predict.batch_score import VERSIONS as BATCH_VERSIONS
from moespec.predict.batch_score import score_batches
from moespec.predict.score import score_files

DEFAULT_RUNS = 5  # the least count a fidelity target is read over (median and range)
RULES = ("crossover", "k_hat", "throughput_loss", "saving_sign", "verify_time", "speedup_band")


def scored(folder: Path) -> dict[str, Any]:
    """One finished demo folder scored: per version and rate, the rules held, the verify-time error and the k_hat*
    misses; the batch rules per version; the ceilings and the counted rate against the computed one."""
    plan_path, runs_path = str(folder / "plan.json"), str(folder / "runs.json")
    plan, runs = load_plan(plan_path), load_runs(runs_path)
    out: dict[str, Any] = {}
    for version, keys in VERSIONS.items():
        if keys.table not in plan:
            continue
        out[version] = {}
        for rate in RATES:
            result = score_files(plan_path, runs_path, version, rate=rate)
            rules = {r.name: r for r in result.rules}
            out[version][rate] = {
                "held": [r.name for r in result.rules if r.holds], "of": result.applicable,
                "verify_error": rules["verify_time"].value,
                "k_hat_misses": rules["k_hat"].detail["of"] - rules["k_hat"].value,
                "pre_registered": result.pre_registered}
    ratios = [r["counted_tokens_per_s"] / r["tokens_per_s"] for r in runs["throughput"]
              if r["policy"] == "auto" and r["k"] and r.get("counted_tokens_per_s")]
    widths = [(r["counted_tokens_per_s_ci"][1] - r["counted_tokens_per_s_ci"][0]) / r["counted_tokens_per_s"]
              for r in runs["throughput"] if r["policy"] == "auto" and r.get("counted_tokens_per_s_ci")]
    bench = read_json(folder / "bench.json", "bench")
    return {"folder": str(folder), "plan_rate": plan_rate(plan), "versions": out,
            "batch": {v: score_batches(plan, runs, v)["all_hold"] for v in BATCH_VERSIONS
                      if v == "measured" or (plan.get("batch") or {}).get("predicted") is not None},
            "ceiling_gbps": {"bench": bench.get("ceiling_gbps"), "runs": runs.get("ceiling_gbps")},
            "counted_over_computed": _spread(ratios), "counted_interval_width": _spread(widths)}


def _spread(values: list[float]) -> dict[str, float] | None:
    """Median and range, or None for no values."""
    return None if not values else {"median": float(np.median(values)), "min": float(min(values)),
                                    "max": float(max(values))}


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per version and rate over the runs: rules held, each rule's passes, verify-time error and k_hat* misses."""
    out: dict[str, Any] = {}
    for version in runs[0]["versions"]:
        out[version] = {}
        for rate in RATES:
            each = [r["versions"][version][rate] for r in runs if version in r["versions"]]
            out[version][rate] = {
                "rules_held": _spread([len(e["held"]) for e in each]),
                "passes": {rule: sum(rule in e["held"] for e in each) for rule in RULES},
                "verify_error": _spread([e["verify_error"] for e in each]),
                "k_hat_misses": _spread([e["k_hat_misses"] for e in each]), "runs": len(each)}
    return out


def table(doc: dict[str, Any]) -> str:
    """The summary as markdown: rules held and each rule's passes per version and rate, then one row per run."""
    n = doc["summary"]
    git = doc["provenance"].get("git") or {}
    commit = git.get("commit", "-")[:7] + (" (dirty)" if git.get("dirty") else "")
    lines = [f"`{doc['command']}` at commit {commit}, "
             f"{doc['provenance'].get('timestamp', '-')}, {len(doc['runs'])} runs on {doc['provenance']['device']}.",
             "", "| version | rate | rules held, median (range) | " + " | ".join(RULES)
             + " | verify-time error, median (range) | k_hat* misses, median (range) |",
             "|---|---|---|" + "---|" * len(RULES) + "---|---|"]
    for version, by_rate in n.items():
        for rate, e in by_rate.items():
            scored_rate = rate + (" (scored)" if rate == doc["runs"][0]["plan_rate"] else "")
            lines.append(f"| {version} | {scored_rate} | {_range(e['rules_held'], 'g')} of 6 | "
                         + " | ".join(f"{e['passes'][r]}/{e['runs']}" for r in RULES)
                         + f" | {_range(e['verify_error'], '.1%')} | {_range(e['k_hat_misses'], 'g')} |")
    lines += ["", "| run | wall | ceiling GB/s (bench; runs) | rules held (" + ", ".join(n) + ") | batch rules "
              "(measured, prediction) | counted / computed at k >= 1, median (range) |", "|---|---|---|---|---|---|"]
    for i, r in enumerate(doc["runs"], start=1):
        held = " / ".join(str(len(v[r["plan_rate"]]["held"])) for v in r["versions"].values())
        ceiling = r["ceiling_gbps"]
        lines.append(f"| {i} | {_wall(r.get('wall_s'))} | {_gbps(ceiling['bench'])}; {_gbps(ceiling['runs'])} | "
                     f"{held} | "
                     + ", ".join("hold" if v else "fail" for v in r["batch"].values())
                     + f" | {_range(r['counted_over_computed'], '.3f')} |")
    return "\n".join(lines) + "\n"


def _range(s: dict[str, float] | None, spec: str) -> str:
    return "-" if s is None else f"{s['median']:{spec}} ({s['min']:{spec}}-{s['max']:{spec}})"


def _gbps(found: float | dict[str, float] | None) -> str:
    """A ceiling (bench.json: one number) or the range of several (runs.json: by when it was read)."""
    if not found:
        return "-"
    values = list(found.values()) if isinstance(found, dict) else [found]
    return "-".join(dict.fromkeys(f"{v:.0f}" for v in (min(values), max(values))))


def _wall(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds / 60:.1f} min"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=DEFAULT_RUNS, help=f"demo runs (default {DEFAULT_RUNS})")
    p.add_argument("--work", default="out/fidelity", help="one folder per run under it (run-1, run-2, ...)")
    p.add_argument("--seed", type=int, default=0, help="the demo's trace seed, the same in every run")
    p.add_argument("--out", required=True, help="the summary JSON")
    p.add_argument("--table", help="also write the summary as a markdown table here")
    args = p.parse_args()
    if args.runs < 1:
        p.error(f"--runs must be >= 1, got {args.runs}")
    for path in (args.out, args.table):
        if path:
            check_output(path)
    started = provenance("cpu", "bf16")
    runs = []
    for i in range(1, args.runs + 1):
        folder = Path(args.work) / f"run-{i}"
        begun = time.perf_counter()
        finished = (folder / "demo.json").is_file()
        demo(DemoConfig(out=str(folder), seed=args.seed, drafting=0))
        runs.append(scored(folder) | {"wall_s": None if finished else time.perf_counter() - begun})
        held = ", ".join(f"{v} {len(e[runs[-1]['plan_rate']]['held'])}" for v, e in runs[-1]["versions"].items())
        print(f"run {i}: rules held of 6: {held}", flush=True)
    doc = {"command": " ".join(map(shlex.quote, sys.argv)), "summary": summary(runs), "runs": runs,
           "provenance": started}
    write_json(args.out, doc)
    text = table(doc)
    if args.table:
        atomic_write(args.table, lambda tmp: tmp.write_text(text, encoding="utf-8"))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

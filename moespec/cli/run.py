"""`moespec run`: speculative decoding on an HF MoE model: verify time per kernel, throughput, oracle or model draft
(moespec.measure.run)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from typing import Any

from rich.console import Console
from rich.table import Table

from moespec import MoespecError
from moespec.cli.args import (
    CHECKPOINT_FILES,
    add_checkpoint_flags,
    add_level_flags,
    add_model_source,
    bounded,
    check_number,
    parse_ints,
    seed,
)
from moespec.console import console
from moespec.defaults import (
    BATCH_LIMIT,
    DEPTH,
    DEPTH_LIMIT,
    DTYPES,
    ENGINES,
    GENERATED_LIMIT,
    KMAX,
    N_MAX,
    REPS_LIMIT,
    SAMPLES_LIMIT,
    THREADS_LIMIT,
)
from moespec.formats.runsfile import RATES
from moespec.measure.level import describe as describe_level
from moespec.measure.llama_run import run_llama_cpp
from moespec.measure.run import DEFAULT_LAYERS, DEFAULT_REPS, DRAFT_MODEL_PROMPTS, RunConfig, run_engine
from moespec.model.dense import DENSE
from moespec.predict.verdict import measured_crossover


def report(doc: Mapping[str, Any], path: str, out: Console) -> None:
    """Verify times and the saving per n, the best measured k per acceptance, and one closing JSON line."""
    policies = list(doc["verify_time_s"])
    table = Table(title=f"verify time at depth {doc['depth']} (ms, median [95% interval]); {doc['model']} "
                        f"{doc['moe_layers']} MoE layers {doc['dtype']}")
    saving = bool(doc["saving_s"])  # an engine of one kernel (llama.cpp) records no saving
    for col in ["n", *policies, *(["saving S(n)"] if saving else []), *(["auto / best"] if doc["auto_ratio"] else [])]:
        table.add_column(col, justify="right")
    for n in doc["verify_time_s"][policies[0]]:
        cells = [f"{doc['verify_time_s'][p][n] * 1e3:.2f} [{doc['verify_time_ci_s'][p][n][0] * 1e3:.2f}, "
                 f"{doc['verify_time_ci_s'][p][n][1] * 1e3:.2f}]" for p in policies]
        if saving:
            s = doc["saving_s"][n]
            cells.append(f"{s['median'] * 1e3:+.2f} [{s['lo'] * 1e3:+.2f}, {s['hi'] * 1e3:+.2f}]")
        if doc["auto_ratio"]:
            cells.append(f"{doc['auto_ratio'][n]:.3f}")
        table.add_row(n, *cells)
    out.print(table)
    if saving:
        out.print(f"measured crossover: {measured_crossover(doc)}")
    else:
        out.print(f"one expert kernel ({', '.join(policies)}): no saving or crossover to measure")
    noise = doc.get("noise")
    if noise:
        short = [n for n, v in noise["per_n"].items() if not v["met"]]
        ceiling = ", ".join(f"{when} {v:.1f}" for when, v in doc["ceiling_gbps"].items())
        out.print(f"noise: every median within +-{noise['target']:.0%} (95% interval) "
                  + ("at every n" if not short else f"[bold red]except at n = {', '.join(short)}[/] (budget or "
                                                    f"round limit reached; the machine stayed noisy)")
                  + f"; {noise['repeated']} disturbed round(s) dropped and repeated; ceiling GB/s {ceiling}")
    if line := describe_level(doc.get("level")):
        out.print(line)
    for row in doc["throughput_draft_model"]:
        rate = "-" if row["realized_acceptance"] is None else f"{row['realized_acceptance']:.2f}"
        out.print(f"draft model, {row['policy']} k = {row['k']}: {row['tokens_per_s']:.1f} tokens/s, acceptance {rate}")
    for name, key in RATES.items():
        best = {}
        for row in doc["throughput"]:
            at = (row["policy"], row["a"])
            if row.get(key) is not None and (at not in best or row[key] > best[at][key]):
                best[at] = row
        if best:
            table = Table(title=f"best measured draft length per acceptance (oracle draft), {name} rate: k* "
                                f"(tokens/s)")
            grid = sorted({a for _, a in best})
            table.add_column("policy")
            for a in grid:
                table.add_column(f"a={a:g}", justify="right")
            for policy in dict.fromkeys(p for p, _ in best):
                table.add_row(policy, *(f"{best[policy, a]['k']} ({best[policy, a][key]:.1f})" if (policy, a) in best
                                        else "-" for a in grid))
            out.print(table)
    rows = doc["throughput"] + doc["throughput_draft_model"]
    gaps = [m["plain_top2_gap"] for r in rows for m in r["mismatches"]]
    where = sorted({(r["policy"], r["k"]) for r in rows if not r["greedy_exact"]})
    if doc["overhead_share"] is not None:
        out.print(f"engine overhead: {doc['overhead_share']:.1%} of step time (median over cells); greedy tokens "
                  f"equal plain decoding's: " + ("yes" if doc["greedy_exact"] else
                                                 f"{'up to exact ties' if doc['greedy_match'] else '[bold red]NO[/]'}"
                                                 f" (they differ in {len(where)} (policy, k) cells "
                                                 f"{', '.join(f'{p} k={k}' for p, k in where)}; plain decoding's "
                                                 f"top-2 logit gap where they first differ: "
                                                 f"{', '.join(sorted({f'{g:.3g}' for g in gaps if g is not None}))})"))
    out.print(f"wrote {path}")
    print(json.dumps({"model": doc["model"], "depth": doc["depth"], "crossover": doc["crossover"],
                      "verify_time_ms": {p: {n: round(v * 1e3, 3) for n, v in d.items()}
                                         for p, d in doc["verify_time_s"].items()},
                      "best_k": {f"{p}@{a:g}": r["k"] for (p, a), r in best.items()},
                      "greedy_match": doc["greedy_match"], "out": path}))


# the path flags kept apart before any work (moespec.cli.args.check_paths)
OUTPUTS = ("--out",)
INPUTS = {"--model": CHECKPOINT_FILES, "--draft-model": CHECKPOINT_FILES, "--plan": (), "--gguf": (),
          "--draft-gguf": (), "--replay": ()}


# ---- command: moespec run ---------------------------------------------------------------------------------
def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_source(p, "any of the five MoE architectures", str(DEFAULT_LAYERS))
    p.add_argument("--dtype", default=RunConfig.dtype, choices=DTYPES,
                   help=f"weights dtype (default {RunConfig.dtype})")
    p.add_argument("--device", default="cpu", help="cpu or cuda (our Triton kernels on cuda)")
    p.add_argument("--dense", default=RunConfig.dense, choices=DENSE,
                   help=f"dense weights and attention of verify passes: our native kernels or torch's F.linear and "
                        f"sdpa (default {RunConfig.dense})")
    p.add_argument("--plan", help="plan.json: its AUTO policy (kernel per n) is run and recorded beside slot and dedup")
    p.add_argument("--depth", type=bounded(1, DEPTH_LIMIT), default=DEPTH,
                   help=f"context depth d: tokens prefilled (default {DEPTH}, at most {DEPTH_LIMIT:,})")
    p.add_argument("--n", default=f"1-{N_MAX}", help=f"verify pass sizes (default 1-{N_MAX})")
    p.add_argument("--reps", type=bounded(2, REPS_LIMIT), default=DEFAULT_REPS,
                   help=f"verify samples per policy and n (default {DEFAULT_REPS}, at most {REPS_LIMIT:,})")
    p.add_argument("--max-reps", type=bounded(2, REPS_LIMIT), default=RunConfig.max_reps,
                   help=f"verify rounds at most (default {RunConfig.max_reps}, at most {REPS_LIMIT:,})")
    p.add_argument("--target", type=float, default=RunConfig.target,
                   help=f"rounds go on until each median's 95%% interval is within +-TARGET of it (default "
                        f"{RunConfig.target})")
    p.add_argument("--budget", type=float, default=RunConfig.budget_s,
                   help=f"seconds of verify rounds per pass size at most (default {RunConfig.budget_s:g})")
    add_level_flags(p)
    p.add_argument("--k", default=f"0-{KMAX}", help=f"draft lengths of the throughput grid (default 0-{KMAX})")
    p.add_argument("--a", help="acceptances of the throughput grid, each in [0, 1) (default the paper's 11, "
                               "0.2..0.98)")
    p.add_argument("--prompts", type=bounded(1, SAMPLES_LIMIT), default=RunConfig.prompts,
                   help=f"prompts per throughput cell (policy, k), the oracle's taking the acceptances in turn "
                        f"(default one per acceptance, so the counted rate has every (k, a); {DRAFT_MODEL_PROMPTS} "
                        f"with a draft model; at most {SAMPLES_LIMIT:,})")
    p.add_argument("--tokens", type=bounded(1, GENERATED_LIMIT), default=RunConfig.tokens,
                   help=f"tokens generated per prompt (default {RunConfig.tokens}, at most {GENERATED_LIMIT:,})")
    p.add_argument("--no-throughput", action="store_true", help="measure the verify times only")
    p.add_argument("--draft-model", help="a local HF causal LM sharing the tokenizer: the throughput grid drafts with "
                                         "it (greedy) over --k instead of the oracle over --a")
    p.add_argument("--engine", default=RunConfig.engine, choices=ENGINES,
                   help="moespec (our engine on an HF model) or llama.cpp (on --gguf; llama-cpp-python needed)")
    p.add_argument("--gguf", help="--engine llama.cpp: the GGUF model file (moespec export writes one)")
    p.add_argument("--draft-gguf", help="--engine llama.cpp: a GGUF draft model sharing the vocabulary: the "
                                        "throughput grid drafts with it (greedy) over --k instead of the oracle")
    p.add_argument("--threads", type=bounded(1, THREADS_LIMIT), default=RunConfig.threads,
                   help="threads of a pass, either engine (default: one per core of the machine it runs on)")
    p.add_argument("--batch", metavar="B,..",
                   help=f"also measure verify passes and oracle throughput of B sequences at once for each B > 1 "
                        f"(1..{BATCH_LIMIT}; runs.json `batch`; a plan's per-B AUTO policy where it has one)")
    p.add_argument("--replay", help="trace (.npz) whose windows the MoE layers select during verify passes")
    p.add_argument("--seed", type=seed, default=0, help="seed of weights, prompts, windows and drafts (default 0)")
    p.add_argument("--out", default=RunConfig.out, help=f"results file (default {RunConfig.out})")
    add_checkpoint_flags(p)


def parse_acceptances(text: str | None) -> tuple[float, ...] | None:
    """--a as numbers (None, --a not given: the paper's grid; an empty list is refused, not read as the default)."""
    if text is None:
        return None
    try:
        return tuple(float(a) for a in text.split(","))
    except ValueError:
        raise MoespecError(f"--a {text!r}: give acceptances like 0.4,0.6,0.8") from None


def run(args: argparse.Namespace) -> int:
    check_number("--budget", args.budget, "time", positive=True)
    config = RunConfig(out=args.out, model=args.model, preset=args.preset, layers=args.layers, dtype=args.dtype,
                       device=args.device, plan=args.plan, depth=args.depth,
                       n=tuple(parse_ints(args.n, "--n", 1, N_MAX, "pass sizes")), reps=args.reps,
                       max_reps=args.max_reps, target=args.target, budget_s=args.budget,
                       k=tuple(parse_ints(args.k, "--k", 0, KMAX, "draft lengths")), a=parse_acceptances(args.a),
                       prompts=args.prompts, tokens=args.tokens, throughput=not args.no_throughput,
                       draft_model=args.draft_model, replay=args.replay, seed=args.seed, fresh=args.fresh,
                       dense=args.dense, engine=args.engine, gguf=args.gguf, draft_gguf=args.draft_gguf,
                       threads=args.threads, level_gbps=args.pin_gbps, level_wait_s=args.pin_wait,
                       batch=tuple(parse_ints(args.batch, "--batch", 1, BATCH_LIMIT, "batch sizes"))
                       if args.batch is not None else ())
    if config.batch and config.engine != "moespec":
        raise MoespecError("--batch runs moespec's engine (llama.cpp at batch: benchmarks/batch_pass.py)")
    out = console()
    runs = (run_llama_cpp if config.engine == "llama.cpp" else run_engine)(config, say=out.print)
    report(runs, args.out, out)
    return 0

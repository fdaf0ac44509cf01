"""`moespec run`: the engine measures, on a whole model, what `moespec plan` predicts (paper Section 4, App. D.2,
D.3, E).

Physics. A verification pass of n tokens at context depth d costs tau_p(n): the dense weights and the KV cache
read once, plus the expert operation of every MoE layer, which requests n m experts per layer with the per-slot
kernel and the U distinct ones with the deduplicating kernel. Speculative decoding with draft length k spends
V(k) = tau(k + 1) + h(k) per step (h: draft and host time) and yields G_a(k) = (1 - a^(k+1)) / (1 - a) tokens
at acceptance a (B.1), so throughput is T_a(k) = G_a(k) / V(k). The run measures both halves:

1. verify time: the context of d tokens is prefilled once; each sample crops the KV cache back to d and times
   one forward of n new tokens, for n = 1..9 and each kernel policy (interleaved, their order rotated per
   repetition, so drift hits all alike). With --replay, every MoE layer of each pass selects the experts of a
   window of the trace (moespec.engine), so a random-weight model verifies passes with realistic reuse.
   Medians with 95% bootstrap intervals; the saving S(n) = tau_slot(n) - tau_dedup(n) with its interval.
2. throughput: per prompt, the target's greedy continuation by plain decoding first; then speculative decoding
   with the ORACLE draft (that continuation, each token corrupted with probability 1 - a, so acceptance is
   geometric at rate a) for every policy, k = 0..8 and acceptance of the paper's grid (k = 0 drafts nothing, so
   it runs once per policy and serves every a). Each cell reports tokens/s, the realized acceptance, tokens per
   step beside G_a(k), the engine's overhead (time outside the model forwards) and whether the tokens equal
   plain decoding's.
Every finished unit (one n's verify samples, one throughput cell) is checkpointed to OUT.partial: --resume
re-measures nothing already done.

runs.json (FORMAT_NAME, FORMAT_VERSION; n, k keys are strings):
  model, spec, source, moe_layers, device, device_kind, dtype, depth, prompts, tokens, replay (trace or null),
  plan {path, sha256} or null, kernel_by_n (the AUTO policy used, or null)
  verify_time_s       {policy: {n: median s}}        verify_time_ci_s {policy: {n: [lo, hi]}} (95% bootstrap)
  verify_samples_s    {policy: {n: [s, ...]}}
  saving_s            {n: {median, lo, hi}}           S(n) = tau_slot(n) - tau_dedup(n), 95% bootstrap interval
  crossover           smallest n >= 2 from which the median saving stays positive (null if none)
  auto_ratio          {n: tau_auto(n) / min(tau_slot(n), tau_dedup(n))} when a plan gave the AUTO policy
  throughput          [{policy, k, a, tokens_per_s, realized_acceptance, tokens_per_step, G_a, steps,
                        step_time_s, verify_time_s, overhead_share, greedy_exact, greedy_match, mismatches}]
                      greedy_exact: the tokens equal plain decoding's; greedy_match: they do, or they first differ
                      where plain decoding's two largest logits are exactly equal (a tie in the model's dtype,
                      bf16 logits tie often on a random-weight model: either token is the greedy choice)
                      mismatches: [{prompt, position, plain_top2_gap}] where the tokens first differ from plain
                      decoding's and the gap between plain decoding's two largest logits there (a near tie,
                      which rounding in a pass of another size can flip, or a real disagreement)
  draft_model, throughput_draft_model   with --draft-model: its path and the rows above at a = null (the
                      realized acceptance is the model's), drafted by it instead of the oracle
  draft_time_s        {k: median draft + host time per step}, the h(k) `moespec plan --draft-time` reads
  overhead_share      median over cells of the engine's share of step time
  greedy_match, greedy_exact   over every cell (above)
  provenance          device, dtype, versions, timestamp (the start of the run), command
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path
from typing import Any

import numpy as np

from moespec import MoespecError, theory
from moespec.io import Checkpoint, console, parse_ints, progress, provenance, read_json, write_json

FORMAT_NAME = "moespec-runs"
FORMAT_VERSION = 1
VERIFY_POLICIES = ("slot", "dedup")
DEFAULT_PRESET = "olmoe-1b-7b"
DEFAULT_LAYERS = 4  # OLMoE's real layer shapes, 4 of its 16 layers: ~1.7 GB of bf16 weights, fits 24 GiB easily
DEFAULT_REPS = 7  # verify-time samples per (policy, n): a median and a bootstrap interval of it
BOOTSTRAP = 2000  # resamples for the 95% intervals: their ends move by < 1% of the interval between seeds
CONFIDENCE = 0.95
MAX_K = 8  # the paper drafts up to 8 tokens: passes of up to 9
# Prompts are prefilled by transformers' eager experts (a GEMM per hit expert): the policies under test are made
# for verify passes of <= 9 tokens, and a per-slot kernel would stream every expert once per prompt token.
PREFILL_POLICY = "eager"


def read_runs(path: str | Path) -> dict[str, Any]:
    """A runs.json's document after the checks every reader needs (a JSON object of this format and version);
    plan and score check the keys they read."""
    doc = read_json(path, "runs")
    if not isinstance(doc, dict) or doc.get("format") != FORMAT_NAME:
        raise MoespecError(f"{path}: not a moespec runs file (format is not {FORMAT_NAME!r})")
    if doc.get("format_version") != FORMAT_VERSION:
        raise MoespecError(f"{path}: runs format version {doc.get('format_version')!r} is not supported (this "
                           f"moespec reads version {FORMAT_VERSION})")
    return doc


def bootstrap_median(samples: list[float], rng: np.random.Generator) -> tuple[float, float, float]:
    """(median, lo, hi): the 95% percentile-bootstrap interval of the median."""
    x = np.asarray(samples, dtype=float)
    meds = np.median(rng.choice(x, size=(BOOTSTRAP, x.size)), axis=1)
    lo, hi = np.quantile(meds, [(1 - CONFIDENCE) / 2, (1 + CONFIDENCE) / 2])
    return float(np.median(x)), float(lo), float(hi)


def bootstrap_saving(slot: list[float], dedup: list[float], rng: np.random.Generator) -> dict[str, float]:
    """S = median(slot) - median(dedup) with the 95% bootstrap interval (both sample sets resampled)."""
    a, b = np.asarray(slot, dtype=float), np.asarray(dedup, dtype=float)
    diffs = (np.median(rng.choice(a, size=(BOOTSTRAP, a.size)), axis=1)
             - np.median(rng.choice(b, size=(BOOTSTRAP, b.size)), axis=1))
    lo, hi = np.quantile(diffs, [(1 - CONFIDENCE) / 2, (1 + CONFIDENCE) / 2])
    return {"median": float(np.median(a) - np.median(b)), "lo": float(lo), "hi": float(hi)}


def crossover(saving: dict[int, float]) -> int | None:
    """Smallest n >= 2 from which the saving stays positive at every larger n measured (DESIGN.md)."""
    ns = sorted(n for n in saving if n >= 2)
    for i, n in enumerate(ns):
        if all(saving[m] > 0 for m in ns[i:]):
            return n
    return None


# ---- the model, the prompts and the replayed routing ------------------------------------------------------
def load_plan_kernels(path: str | None) -> tuple[dict[str, Any] | None, dict[int, str] | None]:
    """The plan's identity (path, sha256, model) and its AUTO policy (kernel per n)."""
    if path is None:
        return None, None
    from moespec.plan import load_plan

    plan = load_plan(path)
    digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    info = {"path": path, "sha256": digest, "model": plan["model"],
            "moe_layers": plan.get("coverage", {}).get("num_moe_layers")}
    return info, {int(n): k for n, k in plan["kernel_by_n"].items()}


def check_replay(trace: Any, path: str, spec: Any) -> None:
    if (trace.num_experts, trace.m) != (spec.N, spec.m) or trace.num_layers < spec.L:
        raise MoespecError(f"{path}: routes N={trace.num_experts}, m={trace.m} over {trace.num_layers} layers; the "
                           f"model needs N={spec.N}, m={spec.m} over {spec.L} MoE layers")


def replay_windows(trace: Any, path: str, spec: Any, n: int, count: int, seed: int) -> list[np.ndarray] | None:
    """`count` windows [n, L, m] of the trace (the model's L MoE layers), sampled with a seeded generator."""
    if trace is None:
        return None
    starts = trace.window_starts(n)
    if starts.size == 0:
        raise MoespecError(f"{path}: no window of {n} tokens inside one document")
    picks = np.random.default_rng([seed, n]).choice(starts, size=count, replace=starts.size < count)
    return [trace.experts[s:s + n, :spec.L].astype(np.int64) for s in picks.tolist()]


def replay_documents(trace: Any, path: str, spec: Any, count: int, length: int, seed: int) -> list[np.ndarray]:
    """The first `length` rows [length, L, m] of `count` seeded documents that long: generated position p of
    prompt i replays row p of document i, whatever pass carries it."""
    docs = [(s, e) for s, e in trace.documents() if e - s >= length]
    if not docs:
        raise MoespecError(f"{path}: no document of {length} tokens to replay while decoding (lower --tokens)")
    picks = np.random.default_rng([seed, length]).choice(len(docs), size=count, replace=len(docs) < count)
    return [trace.experts[docs[i][0]:docs[i][0] + length, :spec.L].astype(np.int64) for i in picks.tolist()]


def model_name(lm: Any, args: argparse.Namespace) -> str:
    """The model's name as plans and scores know it: the preset's (its layer count is `moe_layers`), or the
    checkpoint's spec name."""
    return lm.spec.name if args.model else args.preset or DEFAULT_PRESET


def prompts(count: int, depth: int, vocab: int, seed: int) -> list[list[int]]:
    """Seeded random token ids: a random-weight model has no text to prefer, and the context length (not its
    content) is what the verify time depends on."""
    rng = np.random.default_rng([seed, depth])
    return [rng.integers(3, vocab, size=depth).tolist() for _ in range(count)]


# ---- 1. verify time ---------------------------------------------------------------------------------------
def measure_verify(lm: Any, args: argparse.Namespace, ns: list[int], policies: list[str],
                   kernel_by_n: dict[int, str] | None, trace: Any, checkpoint: Checkpoint,
                   advance: Any) -> dict[str, dict[int, list[float]]]:
    """Samples of the verify time per policy and n at depth d (one prefill; the cache cropped before each pass)."""
    import torch

    from moespec import engine, speculative

    context = prompts(1, args.depth, lm.model.config.vocab_size, args.seed)[0]
    state = None
    samples: dict[str, dict[int, list[float]]] = {p: {} for p in policies}
    rng = np.random.default_rng(args.seed)
    for n in ns:
        key = f"verify n {n}"
        if key not in checkpoint.units:
            if state is None:
                engine.set_policy(lm.model, PREFILL_POLICY)
                state = speculative.prefill(lm.model, torch.tensor([context], device=lm.device))
            windows = replay_windows(trace, args.replay, lm.spec, n, args.reps, args.seed)
            tokens = rng.integers(3, lm.model.config.vocab_size, size=(args.reps, n))
            unit: dict[str, list[float]] = {p: [] for p in policies}
            for policy in policies:  # untimed: first-call costs (weight layout, allocations) stay out of the samples
                engine.set_policy(lm.model, policy, kernel_by_n)
                engine.set_replay(lm.model, None if windows is None else windows[0])
                speculative.timed_forward(lm.model, tokens[0].tolist(), state)
            for rep in range(args.reps):
                order = policies[rep % len(policies):] + policies[:rep % len(policies)]
                for policy in order:
                    engine.set_policy(lm.model, policy, kernel_by_n)
                    engine.set_replay(lm.model, None if windows is None else windows[rep])
                    unit[policy].append(speculative.timed_forward(lm.model, tokens[rep].tolist(), state))
                    advance(1)
            engine.set_replay(lm.model, None)
            checkpoint.save(key, unit)
        for policy in policies:
            samples[policy][n] = checkpoint.units[key][policy]
    return samples


# ---- 2. throughput ----------------------------------------------------------------------------------------
def throughput_cells(policies: list[str], ks: list[int], acceptances: list[float]) -> list[tuple[str, int, float]]:
    """(policy, k, a) to run: k = 0 once per policy (it drafts nothing, so a does not enter)."""
    return [(p, k, a) for p in policies for k in ks for a in (acceptances if k else [acceptances[0]])]


class Prompts:
    """The throughput prompts, each prefilled once, and each policy's plain greedy decoding of them (the oracle's
    continuation and the tokens every speculative run must reproduce), made on first use."""

    def __init__(self, lm: Any, args: argparse.Namespace, trace: Any) -> None:
        self.lm, self.args = lm, args
        self.contexts = prompts(args.prompts, args.depth, lm.model.config.vocab_size, args.seed + 1)
        self.states: list[Any] | None = None
        self.plain: dict[str, list[list[int]]] = {}
        self.margins: dict[str, list[list[float]]] = {}
        self.rows = None if trace is None else replay_documents(trace, args.replay, lm.spec, args.prompts,
                                                                 args.tokens + MAX_K + 1, args.seed)

    def route(self, i: int) -> Any:
        """Prompt i's router for decoding: replay its document's rows by generated position (or None)."""
        if self.rows is None:
            return None
        from moespec import engine

        rows = self.rows[i]
        return lambda position, n: engine.set_replay(self.lm.model, rows[position:position + n])

    def prefilled(self) -> list[Any]:
        from moespec import engine, speculative

        if self.states is None:
            engine.set_policy(self.lm.model, PREFILL_POLICY)
            self.states = [speculative.prefill(self.lm.model, self.ids(c)) for c in self.contexts]
        return self.states

    def continuations(self, policy: str, kernel_by_n: dict[int, str] | None) -> list[list[int]]:
        from moespec import engine, speculative

        if policy not in self.plain:
            states = self.prefilled()
            engine.set_policy(self.lm.model, policy, kernel_by_n)
            self.margins[policy] = [[] for _ in self.contexts]
            self.plain[policy] = [speculative.plain_decode(self.lm.model, self.ids(c), self.args.tokens + MAX_K + 1,
                                                           prefilled=s, route=self.route(i),
                                                           margins=self.margins[policy][i])
                                  for i, (c, s) in enumerate(zip(self.contexts, states))]
            engine.set_replay(self.lm.model, None)
        return self.plain[policy]

    def ids(self, context: list[int]) -> Any:
        import torch

        return torch.tensor([context], device=self.lm.device)


def measure_cell(lm: Any, policy: str, k: int, a: float | None, kernel_by_n: dict[int, str] | None, ps: Prompts,
                 args: argparse.Namespace, drafter: Any = None) -> dict:
    """One throughput cell over all prompts: speculative decoding at (policy, k) with the oracle draft at
    acceptance a, or with the draft model `drafter` (a is then None and the acceptance is what it achieves)."""
    from moespec import engine, speculative

    conts = ps.continuations(policy, kernel_by_n)
    engine.set_policy(lm.model, policy, kernel_by_n)
    tokens, mismatches, records = 0, [], []
    for i, (context, cont, state) in enumerate(zip(ps.contexts, conts, ps.prefilled())):
        draft = speculative.ModelDraft(drafter) if drafter is not None else \
            speculative.OracleDraft(cont, a, args.seed + i, lm.model.config.vocab_size, len(context))
        out, recs = speculative.speculative_decode(lm.model, ps.ids(context), draft, k, args.tokens, prefilled=state,
                                                   route=ps.route(i))
        if out != cont[:args.tokens]:  # where it first differs and how near greedy was to a tie there
            p = next(j for j, (x, y) in enumerate(zip(out, cont)) if x != y)
            mismatches.append({"prompt": i, "position": p, "plain_top2_gap": ps.margins[policy][i][p - 1]
                               if p else None})
        tokens += len(out)
        records += recs
    engine.set_replay(lm.model, None)
    steps = len(records)
    wall = sum(r.step_s for r in records)
    verify = sum(r.verify_s for r in records)
    host = sum(r.host_s + r.draft_s for r in records)
    rate = speculative.acceptance_rate(records)
    rate = None if np.isnan(rate) else rate
    return {"policy": policy, "k": k, "a": a if k else None, "draft": "oracle" if drafter is None else "model",
            "tokens_per_s": tokens / wall, "realized_acceptance": rate,
            "accepted_per_drafted": None if not k else speculative.realized_acceptance(records),
            "tokens_per_step": tokens / steps,
            "G_a": float(theory.geometric_sum(rate if a is None else a, k)) if k and rate is not None else 1.0,
            "steps": steps, "step_time_s": wall / steps,
            "verify_time_s": verify / steps, "draft_host_s": host / steps, "overhead_share": host / wall,
            "greedy_exact": not mismatches, "greedy_match": all(m["plain_top2_gap"] == 0 for m in mismatches),
            "mismatches": mismatches}


def expand_k0(cells: list[dict], acceptances: list[float]) -> list[dict]:
    """Throughput rows with the k = 0 measurement listed at every acceptance (plain decoding ignores a)."""
    rows = []
    for cell in cells:
        rows += [cell | {"a": a} for a in acceptances] if cell["k"] == 0 else [cell]
    return rows


# ---- results ----------------------------------------------------------------------------------------------
def summarize(lm: Any, args: argparse.Namespace, samples: dict[str, dict[int, list[float]]], policies: list[str],
              cells: list[dict], acceptances: list[float], plan_info: dict | None,
              kernel_by_n: dict[int, str] | None, started: dict[str, Any]) -> dict[str, Any]:
    """runs.json from the measured samples and cells (keys in the module docstring)."""
    rng = np.random.default_rng(args.seed)
    stats = {p: {n: bootstrap_median(v, rng) for n, v in samples[p].items()} for p in policies}
    ns = sorted(samples["slot"])
    saving = {n: bootstrap_saving(samples["slot"][n], samples["dedup"][n], rng) for n in ns}
    rows = [] if args.draft_model else expand_k0(cells, acceptances)
    per_k: dict[int, list[float]] = {}
    for cell in cells:
        per_k.setdefault(cell["k"], []).append(cell["draft_host_s"])
    doc = {
        "format": FORMAT_NAME, "format_version": FORMAT_VERSION, "model": model_name(lm, args),
        "spec": lm.spec.to_dict(),
        "source": lm.source, "moe_layers": lm.spec.L, "device": started["device"],
        "device_kind": started["device"].split(":")[0], "dtype": args.dtype, "depth": args.depth,
        "prompts": args.prompts, "tokens": args.tokens, "replay": args.replay, "plan": plan_info,
        "kernel_by_n": None if kernel_by_n is None else {str(n): k for n, k in sorted(kernel_by_n.items())},
        "verify_time_s": {p: {str(n): stats[p][n][0] for n in ns} for p in policies},
        "verify_time_ci_s": {p: {str(n): [stats[p][n][1], stats[p][n][2]] for n in ns} for p in policies},
        "verify_samples_s": {p: {str(n): samples[p][n] for n in ns} for p in policies},
        "saving_s": {str(n): v for n, v in saving.items()},
        "crossover": crossover({n: v["median"] for n, v in saving.items()}),
        "auto_ratio": None if "auto" not in policies else {
            str(n): stats["auto"][n][0] / min(stats["slot"][n][0], stats["dedup"][n][0]) for n in ns},
        "throughput": rows, "draft_model": args.draft_model,
        "throughput_draft_model": cells if args.draft_model else [],
        "draft_time_s": {str(k): float(np.median(v)) for k, v in sorted(per_k.items())},
        "overhead_share": float(np.median([c["overhead_share"] for c in cells])) if cells else None,
        "greedy_match": all(c["greedy_match"] for c in cells),
        "greedy_exact": all(c["greedy_exact"] for c in cells),
        "provenance": started,
    }
    return doc


def report(doc: dict[str, Any], path: str, out: Any) -> None:
    """Verify times and the saving per n, the best measured k per acceptance, and one closing JSON line."""
    import json

    from rich.table import Table

    policies = list(doc["verify_time_s"])
    table = Table(title=f"verify time at depth {doc['depth']} (ms, median [95% interval]); {doc['model']} "
                        f"{doc['moe_layers']} MoE layers {doc['dtype']}")
    for col in ["n", *policies, "saving S(n)", *(["auto / best"] if doc["auto_ratio"] else [])]:
        table.add_column(col, justify="right")
    for n in doc["verify_time_s"]["slot"]:
        cells = [f"{doc['verify_time_s'][p][n] * 1e3:.2f} [{doc['verify_time_ci_s'][p][n][0] * 1e3:.2f}, "
                 f"{doc['verify_time_ci_s'][p][n][1] * 1e3:.2f}]" for p in policies]
        s = doc["saving_s"][n]
        cells.append(f"{s['median'] * 1e3:+.2f} [{s['lo'] * 1e3:+.2f}, {s['hi'] * 1e3:+.2f}]")
        if doc["auto_ratio"]:
            cells.append(f"{doc['auto_ratio'][n]:.3f}")
        table.add_row(n, *cells)
    out.print(table)
    out.print(f"measured crossover: {doc['crossover'] or 'none'} (smallest n from which the saving stays positive)")
    for row in doc["throughput_draft_model"]:
        rate = "-" if row["realized_acceptance"] is None else f"{row['realized_acceptance']:.2f}"
        out.print(f"draft model, {row['policy']} k = {row['k']}: {row['tokens_per_s']:.1f} tokens/s, acceptance {rate}")
    best = {}
    for row in doc["throughput"]:
        key = (row["policy"], row["a"])
        if key not in best or row["tokens_per_s"] > best[key]["tokens_per_s"]:
            best[key] = row
    if best:
        table = Table(title="best measured draft length per acceptance (oracle draft): k* (tokens/s)")
        grid = sorted({a for _, a in best})
        table.add_column("policy")
        for a in grid:
            table.add_column(f"a={a:g}", justify="right")
        for policy in dict.fromkeys(p for p, _ in best):
            table.add_row(policy, *(f"{best[policy, a]['k']} ({best[policy, a]['tokens_per_s']:.1f})" for a in grid))
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


# ---- command: moespec run ---------------------------------------------------------------------------------
def add_arguments(p: argparse.ArgumentParser) -> None:
    source = p.add_mutually_exclusive_group()
    source.add_argument("--model", help="a local HF checkpoint folder (any of the five MoE architectures)")
    source.add_argument("--preset", help=f"a model preset with random weights (default {DEFAULT_PRESET})")
    p.add_argument("--layers", type=int, help=f"decoder layers of a preset model (default {DEFAULT_LAYERS})")
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp32"), help="weights dtype (default bf16)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (our Triton kernels on cuda)")
    p.add_argument("--plan", help="plan.json: its AUTO policy (kernel per n) is run and recorded beside slot and dedup")
    p.add_argument("--depth", type=int, default=512, help="context depth d: tokens prefilled (default 512)")
    p.add_argument("--n", default="1-9", help="verify pass sizes (default 1-9)")
    p.add_argument("--reps", type=int, default=DEFAULT_REPS, help=f"verify samples per policy and n "
                                                                  f"(default {DEFAULT_REPS})")
    p.add_argument("--k", default="0-8", help="draft lengths of the throughput grid (default 0-8)")
    p.add_argument("--a", help="acceptances of the throughput grid (default the paper's 11, 0.2..0.98)")
    p.add_argument("--prompts", type=int, default=2, help="prompts per throughput cell (default 2)")
    p.add_argument("--tokens", type=int, default=32, help="tokens generated per prompt (default 32)")
    p.add_argument("--no-throughput", action="store_true", help="measure the verify times only")
    p.add_argument("--draft-model", help="a local HF causal LM sharing the tokenizer: the throughput grid drafts with "
                                         "it (greedy) over --k instead of the oracle over --a")
    p.add_argument("--replay", help="trace (.npz) whose windows the MoE layers select during verify passes")
    p.add_argument("--seed", type=int, default=0, help="seed of weights, prompts, windows and drafts (default 0)")
    p.add_argument("--out", default="runs.json", help="results file (default runs.json)")
    p.add_argument("--resume", action="store_true", help="continue an interrupted run from OUT.partial")


def parse_grid(args: argparse.Namespace) -> tuple[list[int], list[int], list[float]]:
    """The pass sizes n, draft lengths k and acceptances a asked for, checked."""
    for flag, value, least in (("--depth", args.depth, 1), ("--reps", args.reps, 2), ("--prompts", args.prompts, 1),
                               ("--tokens", args.tokens, 1)):
        if value < least:
            raise MoespecError(f"{flag} must be >= {least}, got {value}")
    ns = parse_ints(args.n, "--n", 1, MAX_K + 1, "pass sizes")
    ks = parse_ints(args.k, "--k", 0, MAX_K, "draft lengths")
    if not args.a:
        return ns, ks, [float(a) for a in theory.PAPER_ACCEPTANCES]
    try:
        acceptances = [float(a) for a in args.a.split(",")]
    except ValueError:
        raise MoespecError(f"--a {args.a!r}: give acceptances like 0.4,0.6,0.8") from None
    for a in acceptances:
        if not 0 <= a <= 1:
            raise MoespecError(f"--a: acceptance {a} outside [0, 1]")
    return ns, ks, acceptances


def run(args: argparse.Namespace) -> int:
    ns, ks, acceptances = parse_grid(args)
    from moespec import engine
    from moespec.timing import resolve_device

    device = resolve_device(args.device)
    started = provenance(device, args.dtype)  # the timestamp says when the run began (score: pre-registration)
    plan_info, kernel_by_n = load_plan_kernels(args.plan)  # inputs are checked before the model loads
    trace = None
    if args.replay:
        from moespec.trace import load_trace

        trace = load_trace(args.replay)
    layers = args.layers if args.layers is not None or args.model else DEFAULT_LAYERS
    lm = engine.load_model(path=args.model, preset=None if args.model else args.preset or DEFAULT_PRESET,
                           layers=layers, dtype=args.dtype, device=device, seed=args.seed)
    if plan_info and plan_info["model"] != model_name(lm, args):
        raise MoespecError(f"{args.plan}: a plan for {plan_info['model']}, but the run is of {model_name(lm, args)}")
    if plan_info and plan_info["moe_layers"] not in (None, lm.spec.L):
        console().print(f"[yellow]note[/]: {args.plan} plans {plan_info['moe_layers']} MoE layers, this model has "
                        f"{lm.spec.L}: its AUTO policy applies, its verify times do not (score will refuse the pair)")
    if trace is not None:
        check_replay(trace, args.replay, lm.spec)
    policies = list(VERIFY_POLICIES) + (["auto"] if kernel_by_n else [])
    drafter = None
    if args.draft_model:
        drafter = engine.load_model(path=args.draft_model, dtype=args.dtype, device=device).model
        if drafter.config.vocab_size != lm.model.config.vocab_size:
            raise MoespecError(f"{args.draft_model}: vocabulary of {drafter.config.vocab_size} tokens, the target's "
                               f"has {lm.model.config.vocab_size}: a draft must share the tokenizer")
    cells = [] if args.no_throughput else [(p, k, None) for p in policies for k in ks] if drafter else \
        throughput_cells(policies, ks, acceptances)
    config = {"source": lm.source, "dtype": args.dtype, "device_kind": device.split(":")[0], "depth": args.depth,
              "n": args.n, "reps": args.reps, "k": ks, "a": acceptances, "prompts": args.prompts,
              "tokens": args.tokens, "replay": args.replay, "plan": plan_info, "seed": args.seed,
              "draft_model": args.draft_model}
    checkpoint = Checkpoint(args.out, config, args.resume, "run")
    out = console()
    out.print(f"moespec run: {lm.source} ({lm.spec.L} MoE layers, {args.dtype}, {device}); policies "
              f"{', '.join(policies)}; depth {args.depth}; replay {args.replay or 'off (the router decides)'}")
    total = len(ns) * args.reps * len(policies) + len(cells) * args.prompts
    with progress("run", total, enabled=sys.stderr.isatty()) as advance:
        samples = measure_verify(lm, args, ns, policies, kernel_by_n, trace, checkpoint, advance)
        ps, measured = Prompts(lm, args, trace), []
        for policy, k, a in cells:
            key = f"cell {policy} k {k} a {a if k else '-'}"
            if key not in checkpoint.units:
                checkpoint.save(key, measure_cell(lm, policy, k, a, kernel_by_n, ps, args, drafter))
            measured.append(checkpoint.units[key])
            advance(args.prompts)
    doc = summarize(lm, args, samples, policies, measured, acceptances, plan_info, kernel_by_n, started)
    write_json(args.out, doc)
    checkpoint.remove()
    report(doc, args.out, out)
    return 0

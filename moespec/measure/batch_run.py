"""`moespec run --batch`: the engine's verify times and throughput at batch sizes B > 1 (moespec.model.batched),
measured after the run's own batch-one measurements and written as runs.json's `batch` block.

Physics. A server's step verifies B sequences' drafts in one pass of B (k + 1) tokens: V_B(k) = tau_p(B, k + 1) +
h_B(k). Each sequence accepts on its own, so a step emits B G_a(k) tokens on average and the throughput is
B G_a(k) / V_B(k) (DESIGN "Batch B > 1"). The pass's expert bytes are the union U^B(n) of the experts its B n tokens
select, so the kernel AUTO runs is the plan's for the pass's total token count.

1. verify time at batch B: B contexts of the run's depth, each prefilled once in a cache of its own; per sample,
   n random tokens for each sequence in one pass (`batch_logits`), timed, and every sequence's n positions rolled
   back. Routing replayed from the trace is B windows of n tokens from B distinct documents (sequences are
   independent). The rounds, their reference reads, the level and the stopping rule are the run's
   (moespec.measure.rounds.timed_rounds), one set of rounds per B.
2. throughput at batch B: one round per acceptance a of the grid, in which B prompts of the run's depth are decoded
   together (`batch_decode_steps`, until the first reaches the run's tokens) at every k in turn (k = 0: plain
   decoding; ascending and descending in alternate rounds), so the k compared at one a run seconds apart, under
   one state of the host, as interleaved rounds compare kernels. Each sequence's oracle draft is seeded by the
   sequence alone: every k decodes it on the same right and wrong positions (common random numbers), and the
   k at one a differ by their length, not by their luck. Recorded per (policy, k, a): the median step time
   V_B(k) over every round's steps at k (a step's time does not depend on a), the computed rate B G_a(k) / V_B(k)
   (`tokens_per_s`, the statistic of the batch-one rows), the counted rate, every emitted token of every sequence
   over the steps' time in a's round (`counted_tokens_per_s`), and whether each sequence's tokens are its plain
   greedy decoding's at that k.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch

from moespec import theory
from moespec.defaults import KERNELS
from moespec.formats.checkpoint import Checkpoint, UnitChecks, is_count, require, unit_rng
from moespec.formats.files import is_number
from moespec.formats.planfile import load_plan
from moespec.formats.trace import Trace
from moespec.measure.contention import Cores
from moespec.measure.decoding import prefill_prompts, prompts
from moespec.measure.level import Level
from moespec.measure.passes import documents_holding, starts_apart
from moespec.measure.decoding import replay_documents
from moespec.measure.rounds import timed_rounds, verify_done, verify_statistics, verify_unit_check
from moespec.model import speculative
from moespec.model.batched import BatchGreedy, batch_decode_steps
from moespec.model.load import LoadedModel
from moespec.model.policies import set_policy, set_replay

BATCH_UNIT = "batch verify rounds {}"  # the checkpoint unit of batch B's verify rounds
ROUND_UNIT = "batch round {} {} {}"  # (B, policy, a): one acceptance's decodings at every k
ROUND_KEYS = ("steps", "emitted", "seconds", "exact")  # per k of a round unit


def batch_unit_checks(ns: list[int], policies: list[str]) -> UnitChecks:
    """The checks of a resumed run's batch units (moespec.formats.checkpoint): verify rounds and finished rounds
    of the throughput grid."""
    def check_round(unit: Any, where: str) -> None:
        per_k = unit.get("per_k") if isinstance(unit, dict) else None
        require(isinstance(per_k, dict) and all(isinstance(v, dict) and tuple(v) == ROUND_KEYS
                                                for v in per_k.values()), where,
                f"per_k must map each k to an object with the keys {', '.join(ROUND_KEYS)}")
        for k, v in per_k.items():
            require(isinstance(v["steps"], list) and bool(v["steps"]) and all(is_number(t) and t > 0
                                                                             for t in v["steps"]),
                    where, f"per_k.{k}.steps must be positive step times")
            require(is_count(v["emitted"]) and is_number(v["seconds"]) and v["seconds"] > 0
                    and isinstance(v["exact"], bool), where,
                    f"per_k.{k} needs emitted >= 0 tokens, seconds > 0 and exact true or false")
    return {BATCH_UNIT.format(""): verify_unit_check(ns, policies), ROUND_UNIT.format("", "", "").rstrip(): check_round}


def pass_kernels(kernel_by_n: dict[int, str] | None, batch: int) -> dict[int, str] | None:
    """The AUTO table of batch B for the engine, keyed by the pass's token count B n (kernel_by_n: per n)."""
    return None if kernel_by_n is None else {batch * n: kernel for n, kernel in kernel_by_n.items()}


def check_trace(trace: Trace | None, path: str | None, batches: list[int], n: int) -> None:
    """Before any work: the trace holds a window of n tokens in as many documents as the largest batch."""
    if trace is not None and batches:
        documents_holding(trace, n, max(batches), str(path))


def batch_windows(trace: Trace | None, L: int, n: int, batch: int, count: int, seed: int  # noqa: N803
                  ) -> list[np.ndarray] | None:
    """`count` replays [B n, L, m] of a pass of B sequences: B windows of n tokens, each from another document
    (moespec.measure.passes.starts_apart, as the bench draws them)."""
    if trace is None:
        return None
    holding = documents_holding(trace, n, batch)
    rng = np.random.default_rng([seed, n, batch])
    return [np.concatenate([trace.experts[s:s + n, :L] for s in starts_apart(trace, holding, n, batch, rng)])
            .astype(np.int64) for _ in range(count)]


def measure_batch_verify(lm: LoadedModel, batch: int, ns: list[int], policies: list[str], config: Any,
                         kernel_by_n: dict[int, str] | None, trace: Trace | None, checkpoint: Checkpoint,
                         advance: Any, level: Level, cores: Cores) -> dict[int, dict[str, Any]]:
    """timed_rounds' units of batch B: samples per policy and n of a pass of B sequences x n tokens at depth."""
    unit = BATCH_UNIT.format(batch)
    vocab = lm.model.config.vocab_size
    contexts = prompts(batch, config.depth, vocab, config.seed + batch)
    target = None
    if not verify_done(checkpoint, unit):
        states = prefill_prompts(lm.model, contexts)
        target = BatchGreedy(lm.model, [s.cache for s in states])
    windows = {n: batch_windows(trace, lm.spec.L, n, batch, config.max_reps, config.seed) for n in ns}
    tokens = {n: unit_rng(config.seed, f"batch {batch} verify n {n}").integers(3, vocab, size=(config.max_reps,
                                                                                                batch, n)) for n in ns}
    table = pass_kernels(kernel_by_n, batch)

    def time_pass(n: int, policy: str, rep: int) -> float:
        set_policy(lm.model, policy, table)
        set_replay(lm.model, None if windows[n] is None else windows[n][rep % config.max_reps])
        return target.timed(tokens[n][rep % config.max_reps].tolist())

    for n in ns if target is not None else []:  # untimed: first-call costs stay out of the samples
        for policy in policies:
            time_pass(n, policy, 0)
    units = timed_rounds(time_pass, ns, policies, config, unit_rng(config.seed, unit), advance, level, checkpoint,
                         cores, unit=unit)
    set_replay(lm.model, None)
    return units


def verify_summary(units: dict[int, dict[str, Any]], policies: list[str], seed: int) -> dict[str, Any]:
    """The verify part of one batch's entry: medians, 95% intervals, the saving and the crossover, the noise."""
    ns = sorted(units)
    samples = {p: {n: units[n]["samples"][p] for n in ns} for p in policies}
    return verify_statistics(samples, np.random.default_rng(seed)) | {
        "noise": {str(n): {k: units[n]["noise"][k] for k in ("rounds", "met", "stopped_by", "reference_gbps")}
                  for n in ns}}


def measure_batch_round(lm: LoadedModel, batch: int, policy: str, a: float, order: list[int], config: Any,
                        kernel_by_n: dict[int, str] | None, prompts_: BatchPrompts, checkpoint: Checkpoint,
                        advance: Any) -> dict[str, Any]:
    """Acceptance a's round at batch B: the B prompts decoded together at every k of `order` in turn, the oracle at
    a (k = 0: plain decoding); per k its step times, the tokens emitted, their seconds, and whether each sequence's
    tokens are its plain greedy decoding's (module docstring)."""
    key = ROUND_UNIT.format(batch, policy, a)
    if key in checkpoint.units:
        return checkpoint.units[key]
    states, want = prompts_.plain(policy, kernel_by_n)
    set_policy(lm.model, policy, pass_kernels(kernel_by_n, batch))
    vocab, per_k = lm.model.config.vocab_size, {}
    with torch.inference_mode():
        for k in order:
            drafts = [speculative.OracleDraft(w, a, seed=config.seed + 97 * b, vocab_size=vocab,
                                              prompt_len=s.length) if k else speculative.NO_DRAFT
                      for b, (w, s) in enumerate(zip(want, states))]
            target = BatchGreedy(lm.model, [copy.deepcopy(s.cache) for s in states])
            tokens, records = batch_decode_steps(target, prompts_.contexts, [s.first for s in states], drafts, k,
                                                 config.tokens, prompts_.route, until_first=True)
            per_k[str(k)] = {"steps": [r.step_s for r in records],
                             "emitted": sum(sum(j + 1 for j in r.accepted) for r in records),
                             "seconds": sum(r.step_s for r in records),
                             "exact": all(t == w[:len(t)] for t, w in zip(tokens, want))}
            advance(1)
    set_replay(lm.model, None)
    unit = {"per_k": per_k}
    checkpoint.save(key, unit)
    return unit


def round_order(ks: list[int], index: int) -> list[int]:
    """The k of the index-th round in the order they run: ascending in even rounds, descending in odd ones."""
    return sorted(ks, reverse=index % 2 == 1)


def throughput_rows(rounds: dict[float, dict[str, Any]], batch: int, policy: str, ks: list[int]) -> list[dict]:
    """The batch throughput rows (BATCH_ROW_KEYS) of one policy per (k, a) from its rounds ({a: round unit}):
    V_B(k) the median step time over every round at k, the computed rate B G_a(k) / V_B(k), the counted rate of
    a's round at k."""
    rows = []
    for k in ks:
        cells = [r["per_k"][str(k)] for r in rounds.values()]
        V = float(np.median([t for c in cells for t in c["steps"]]))
        exact = all(c["exact"] for c in cells)
        for a, r in rounds.items():
            cell = r["per_k"][str(k)]
            rows.append({"policy": policy, "k": k, "a": a, "step_time_s": V,
                         "tokens_per_s": batch * float(theory.geometric_sum(a, k)) / V,
                         "counted_tokens_per_s": cell["emitted"] / cell["seconds"],
                         "steps": len(cell["steps"]), "greedy_exact": exact})
    return rows


def plan_kernels(path: str | None, batches: list[int], kernel_by_n: dict[int, str] | None
                 ) -> dict[int, dict[int, str] | None]:
    """The AUTO policy (kernel per n) at each B: the plan's for that B where its `batch` block has one, else the
    plan's batch-one policy (None without a plan)."""
    per_batch = {} if path is None else (load_plan(path).get("batch") or {}).get("per_batch", {})
    return {b: {int(n): v for n, v in per_batch[str(b)]["kernel_by_n"].items()} if str(b) in per_batch
            else kernel_by_n for b in batches}


def measure_batches(lm: LoadedModel, batches: list[int], ns: list[int], ks: list[int], acceptances: list[float],
                    config: Any, kernels: dict[int, dict[int, str] | None], trace: Trace | None, throughput: bool,
                    checkpoint: Checkpoint, advance: Any, level: Level, cores: Cores) -> dict[str, Any]:
    """runs.json's `batch` block (moespec.formats.runsfile) for the batch sizes B > 1 of `batches`; kernels: the
    AUTO policy per B (plan_kernels)."""
    per_batch = {}
    for batch in batches:
        kernel_by_n = kernels[batch]
        policies = list(KERNELS) + (["auto"] if kernel_by_n else [])
        cell_policies = ["auto"] if kernel_by_n else list(KERNELS)
        units = measure_batch_verify(lm, batch, ns, policies, config, kernel_by_n, trace, checkpoint, advance,
                                     level, cores)
        entry = verify_summary(units, policies, config.seed + batch)
        entry["kernel_by_n"] = None if kernel_by_n is None else {str(n): v for n, v in sorted(kernel_by_n.items())}
        entry["throughput"] = []
        if throughput:
            batch_prompts = BatchPrompts(lm, batch, config, trace)
            for policy in cell_policies:
                rounds = {a: measure_batch_round(lm, batch, policy, a, round_order(ks, i), config, kernel_by_n,
                                                 batch_prompts, checkpoint, advance)
                          for i, a in enumerate(acceptances)}
                entry["throughput"] += throughput_rows(rounds, batch, policy, ks)
        per_batch[str(batch)] = entry
    return {"batches": batches, "per_batch": per_batch}


class BatchPrompts:
    """The B prompts of a batch's throughput cells (the run's depth each), their prefills, each policy's plain greedy
    decoding of them (the oracle's continuations, long enough for a sequence that accepts every draft while the
    first reaches the run's tokens), and the replay of B trace documents by generated position."""

    def __init__(self, lm: LoadedModel, batch: int, config: Any, trace: Trace | None) -> None:
        self.lm, self.length = lm, config.tokens + max(config.k) + 1
        self.contexts = prompts(batch, config.depth, lm.model.config.vocab_size, config.seed + 1 + batch)
        self.rows = None if trace is None else replay_documents(trace, config.replay, lm.spec, batch,
                                                                 self.length + max(config.k) + 1, config.seed + batch)
        self.states: list[speculative.Prefill] | None = None  # prefilled once, every policy decodes from copies
        self.made: dict[str, tuple[list, list[list[int]]]] = {}

    def route(self, positions: list[int], n: int) -> None:
        """Replay sequence b's document rows positions[b] .. + n - 1, the pass's rows in sequence order."""
        if self.rows is not None:
            set_replay(self.lm.model, np.concatenate([r[p:p + n] for r, p in zip(self.rows, positions)]))

    def plain(self, policy: str, kernel_by_n: dict[int, str] | None) -> tuple[list, list[list[int]]]:
        if policy not in self.made:
            model = self.lm.model
            if self.states is None:
                self.states = prefill_prompts(model, self.contexts)
            states, ids = self.states, [torch.tensor([c], device=self.lm.device) for c in self.contexts]
            set_policy(model, policy, kernel_by_n)
            routes = [None if self.rows is None else
                      (lambda p, n, r=r: set_replay(model, r[p:p + n])) for r in (self.rows or [None] * len(ids))]
            self.made[policy] = states, [speculative.plain_decode(model, i, self.length, prefilled=s, route=route)
                                         for i, s, route in zip(ids, states, routes)]
            set_replay(model, None)
        return self.made[policy]

"""The engine's decoding for `moespec run`: the prompts, their prefill, and the throughput cells (paper App. B.1).

Physics. Speculative decoding with draft length k spends V(k) = tau(k + 1) + h(k) per step and yields G_a(k) =
(1 - a^(k+1)) / (1 - a) tokens at acceptance a, so throughput is T_a(k) = G_a(k) / V(k). Per prompt, the target's
greedy continuation comes from plain decoding first; then speculative decoding with the ORACLE draft (that
continuation, each token corrupted with probability 1 - a, so acceptance is geometric at rate a) for every cell
(policy, k, a); k = 0 drafts nothing, so it runs once per policy and serves every a. The cells run interleaved, one
prompt of every cell per round (measure_throughput), so the machine's drift hits every cell alike. Each cell
reports tokens/s, the realized acceptance, tokens per step beside G_a(k), the engine's overhead (time outside the
model forwards) and whether the tokens equal plain decoding's (keys: moespec.formats.runsfile).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch

from moespec import MoespecError, theory
from moespec.defaults import KMAX
from moespec.formats.checkpoint import Checkpoint
from moespec.formats.trace import Trace
from moespec.measure.level import Level
from moespec.model import speculative
from moespec.model.load import LoadedModel
from moespec.model.policies import set_policy, set_replay
from moespec.model.spec import ModelSpec

# Prompts are prefilled by transformers' eager experts (a GEMM per hit expert): the policies under test are made
# for verify passes of <= 9 tokens, and a per-slot kernel would stream every expert once per prompt token.
PREFILL_POLICY = "eager"


def prompts(count: int, depth: int, vocab: int, seed: int) -> list[list[int]]:
    """Seeded random token ids: a random-weight model has no text to prefer, and the context length (not its
    content) is what the verify time depends on."""
    rng = np.random.default_rng([seed, depth])
    return [rng.integers(3, vocab, size=depth).tolist() for _ in range(count)]


def replay_documents(trace: Trace, path: str, spec: ModelSpec, count: int, length: int, seed: int) -> list[np.ndarray]:
    """The first `length` rows [length, L, m] of `count` seeded documents that long: generated position p of
    prompt i replays row p of document i, whatever pass carries it."""
    docs = [(s, e) for s, e in trace.documents() if e - s >= length]
    if not docs:
        raise MoespecError(f"{path}: no document of {length} tokens to replay while decoding (lower --tokens)")
    picks = np.random.default_rng([seed, length]).choice(len(docs), size=count, replace=len(docs) < count)
    return [trace.experts[docs[i][0]:docs[i][0] + length, :spec.L].astype(np.int64) for i in picks.tolist()]


def throughput_cells(policies: list[str], ks: list[int], acceptances: list[float]) -> list[tuple[str, int, float]]:
    """(policy, k, a) to run: k = 0 once per policy (it drafts nothing, so a does not enter)."""
    return [(p, k, a) for p in policies for k in ks for a in (acceptances if k else [acceptances[0]])]


class Prompts:
    """The throughput prompts, each prefilled once, and each policy's plain greedy decoding of them (the oracle's
    continuation and the tokens every speculative run must reproduce), made on first use."""

    def __init__(self, lm: LoadedModel, count: int, depth: int, tokens: int, seed: int, trace: Trace | None,
                 replay: str | None) -> None:
        self.lm, self.count, self.tokens, self.seed = lm, count, tokens, seed
        self.contexts = prompts(count, depth, lm.model.config.vocab_size, seed + 1)
        self.states: list[Any] | None = None
        self.plain: dict[str, list[list[int]]] = {}
        self.margins: dict[str, list[list[float]]] = {}
        self.rows = None if trace is None else replay_documents(trace, replay, lm.spec, count, tokens + KMAX + 1,
                                                                 seed)

    def route(self, i: int) -> Any:
        """Prompt i's router for decoding: replay its document's rows by generated position (or None)."""
        if self.rows is None:
            return None
        rows = self.rows[i]
        return lambda position, n: set_replay(self.lm.model, rows[position:position + n])

    def prefilled(self) -> list[Any]:
        if self.states is None:
            set_policy(self.lm.model, PREFILL_POLICY)
            self.states = [speculative.prefill(self.lm.model, self.ids(c)) for c in self.contexts]
        return self.states

    def continuations(self, policy: str, kernel_by_n: dict[int, str] | None) -> list[list[int]]:
        if policy not in self.plain:
            states = self.prefilled()
            set_policy(self.lm.model, policy, kernel_by_n)
            self.margins[policy] = [[] for _ in self.contexts]
            self.plain[policy] = [speculative.plain_decode(self.lm.model, self.ids(c), self.tokens + KMAX + 1,
                                                           prefilled=s, route=self.route(i),
                                                           margins=self.margins[policy][i])
                                  for i, (c, s) in enumerate(zip(self.contexts, states))]
            set_replay(self.lm.model, None)
        return self.plain[policy]

    def ids(self, context: list[int]) -> Any:
        return torch.tensor([context], device=self.lm.device)


def decode_prompt(lm: LoadedModel, policy: str, k: int, a: float | None, kernel_by_n: dict[int, str] | None,
                  ps: Prompts, i: int, drafter: Any = None) -> dict:
    """Prompt i of one throughput cell: speculative decoding at (policy, k) with the oracle draft at acceptance a,
    or with the draft model `drafter` (a is then None and the acceptance is what it achieves). Returns the
    steps (drafted, accepted and the four times of each), the tokens generated and where they first differ from
    plain decoding's, if they do."""
    conts = ps.continuations(policy, kernel_by_n)
    set_policy(lm.model, policy, kernel_by_n)
    context, cont, state = ps.contexts[i], conts[i], ps.prefilled()[i]
    if drafter is not None:
        draft: speculative.Draft = speculative.ModelDraft(drafter)
        draft.prefill(context)
    else:
        draft = speculative.OracleDraft(cont, a, ps.seed + i, lm.model.config.vocab_size, len(context))
    out, recs = speculative.speculative_decode(lm.model, ps.ids(context), draft, k, ps.tokens, prefilled=state,
                                               route=ps.route(i))
    set_replay(lm.model, None)
    return prompt_unit(out, recs, cont, ps.margins[policy][i], i)


def prompt_unit(out: list[int], records: list[speculative.StepRecord], plain: list[int], margins: list[float],
                i: int) -> dict:
    """One (cell, prompt) checkpoint unit of either engine: the steps (drafted, accepted and the four times of
    each), the tokens generated and where they first differ from plain decoding's `plain` with plain decoding's
    top-2 logit gap there (`margins[j]`: the gap behind plain token j + 1), if they do."""
    p = next((j for j, (x, y) in enumerate(zip(out, plain)) if x != y), None)
    return {"steps": [[r.drafted, r.accepted, r.verify_s, r.step_s, r.draft_s, r.host_s] for r in records],
            "tokens": len(out),
            "mismatch": None if p is None else {"prompt": i, "position": p,
                                                "plain_top2_gap": margins[p - 1] if p else None}}


def cell_record(policy: str, k: int, a: float | None, prompts: list[dict], oracle: bool) -> dict:
    """One throughput cell (the row documented in moespec.formats.runsfile) from its prompts' decode_prompt."""
    records = [speculative.StepRecord(int(d), int(acc), v, s, dr, h) for unit in prompts
               for d, acc, v, s, dr, h in unit["steps"]]
    mismatches = [unit["mismatch"] for unit in prompts if unit["mismatch"] is not None]
    steps = len(records)
    # Steady-state throughput, T_a(k) = G_a(k) / V(k) (B.1). The realized rate counts every step's accepted drafts
    # plus one token, in full even where the last step overshoots the generated length (a finite run's truncation,
    # which would count against long drafts), the prompt's first token (no step emits it) left out. For the oracle
    # draft, whose acceptance is geometric at rate a by construction, tokens_per_s takes G_a(k) exactly instead of
    # the realized tokens per step (a Rao-Blackwellized estimate: the same expectation, without the spread of a few
    # hundred Bernoulli draws, which at a = 0.6 is +-0.05 in a and up to 10% in T per cell), over the measured V(k).
    emitted = sum(r.accepted + 1 for r in records)
    wall = sum(r.step_s for r in records)
    verify = sum(r.verify_s for r in records)
    host = sum(r.host_s + r.draft_s for r in records)
    rate = speculative.acceptance_rate(records)
    rate = None if np.isnan(rate) else rate
    profile = theory.estimate_profile([(r.drafted, r.accepted) for r in records], k) if k else []
    g = float(theory.geometric_sum(rate if a is None else a, k)) if k and (a is not None or rate is not None) else 1.0
    return {"policy": policy, "k": k, "a": a if k else None, "draft": "oracle" if oracle else "model",
            "tokens_per_s": (g * steps if oracle else emitted) / wall,
            "realized_tokens_per_s": emitted / wall, "tokens": sum(unit["tokens"] for unit in prompts),
            "realized_acceptance": rate, "acceptance_profile": profile,
            "accepted_per_drafted": None if not k else speculative.realized_acceptance(records),
            "tokens_per_step": emitted / steps, "G_a": g, "steps": steps, "step_time_s": wall / steps,
            "verify_time_s": verify / steps, "draft_host_s": host / steps, "overhead_share": host / wall,
            "greedy_exact": not mismatches, "greedy_match": all(m["plain_top2_gap"] == 0 for m in mismatches),
            "mismatches": mismatches}


Cell = tuple[str, int, float | None]  # (policy, k, a): a None for a draft model


def interleaved(cells: list[Cell], count: int, checkpoint: Checkpoint, unit: Callable[[Cell, int], dict],
                advance: Any) -> list[tuple[Cell, list[dict]]]:
    """Every cell over `count` prompts, interleaved: round i runs `unit(cell, i)` (prompt i of the cell) for every
    cell, in order on even rounds and in reverse on odd ones (A B C, C B A), so the machine's drift over the
    grid's minutes hits every (policy, k, a) alike instead of the cells run last. Each (cell, prompt) is a
    checkpoint unit. Returns each cell with its prompts' units."""
    def key(cell: Cell, i: int) -> str:
        policy, k, a = cell
        return f"cell {policy} k {k} a {a if k else '-'} prompt {i}"

    for i in range(count):
        for cell in cells if i % 2 == 0 else cells[::-1]:
            if key(cell, i) not in checkpoint.units:
                checkpoint.save(key(cell, i), unit(cell, i))
            advance(1)
    return [(cell, [checkpoint.units[key(cell, i)] for i in range(count)]) for cell in cells]


def measure_throughput(lm: LoadedModel, cells: list[Cell], kernel_by_n: dict[int, str] | None,
                       ps: Prompts, checkpoint: Checkpoint, drafter: Any, advance: Any, level: Level) -> list[dict]:
    """Every throughput cell on the engine, interleaved over the prompts (interleaved), each prompt decoded at the
    run's bandwidth level (Level.measured), as runs.json rows."""
    done = interleaved(cells, ps.count, checkpoint,
                       lambda cell, i: level.measured(lambda: decode_prompt(lm, *cell, kernel_by_n, ps, i, drafter)),
                       advance)
    return [cell_record(*cell, units, drafter is None) for cell, units in done]


def expand_k0(cells: list[dict], acceptances: list[float]) -> list[dict]:
    """Throughput rows with the k = 0 measurement listed at every acceptance (plain decoding ignores a)."""
    rows = []
    for cell in cells:
        rows += [cell | {"a": a} for a in acceptances] if cell["k"] == 0 else [cell]
    return rows

"""The engine's decoding for `moespec run`: the prompts, their prefill, and the throughput cells (paper App. B.1).

Physics. Speculative decoding with draft length k spends V(k) = tau(k + 1) + h(k) per step and yields G_a(k) =
(1 - a^(k+1)) / (1 - a) tokens at acceptance a, so throughput is T_a(k) = G_a(k) / V(k). Per prompt, the target's
greedy continuation comes from plain decoding first; then speculative decoding for every cell (policy, k) with the
ORACLE draft (that continuation, each token corrupted with probability 1 - a, so acceptance is geometric at rate a).
A step's time does not depend on what the draft got right (a pass of k + 1 tokens, then a cache cut), so a cell is
one measurement of V(k) for every a: its prompts take the grid's acceptances in turn (prompt_acceptance), V(k) is the
median step time over all of them, and each a gets the row T_a(k) = G_a(k) / V(k) beside what its own prompts realized
(cell_rows). The k* of every a then reads one V curve, and the grid costs one decoding per prompt and cell instead of
one per acceptance. k = 0 drafts nothing and serves every a. The cells run interleaved, one prompt of every cell per
round (measure_throughput), so the machine's drift hits every cell alike. Each row reports tokens/s, the realized
acceptance, tokens per step beside G_a(k), the engine's overhead (time outside the model forwards) and whether the
tokens equal plain decoding's (keys: moespec.formats.runsfile).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import torch

from moespec import MoespecError, theory
from moespec.defaults import KMAX
from moespec.formats.checkpoint import Checkpoint, UnitChecks, is_count, require
from moespec.formats.files import check_contention_record, is_number
from moespec.formats.trace import Trace
from moespec.measure.contention import Cores, merge
from moespec.measure.level import LEVEL_UNIT, Level
from moespec.measure.level import check_unit as check_level_unit
from moespec.measure.rounds import VERIFY_UNIT, bootstrap_rate, verify_unit_check
from moespec.measure.timing import matmul_dtype
from moespec.model import speculative
from moespec.model.load import LoadedModel
from moespec.model.policies import set_policy, set_replay
from moespec.model.spec import ModelSpec

# Prompts are prefilled by transformers' eager experts (a GEMM per hit expert): the policies under test are made
# for verify passes of <= 9 tokens, and a per-slot kernel would stream every expert once per prompt token.
PREFILL_POLICY = "eager"
# ... except a bf16 model on a CPU where torch has no bf16 GEMM (AVX2: its bf16 F.linear runs ~7-11 GFLOP/s): there
# the dedup kernel, which reads each hit expert once as well (a 512-token prompt of the demo's model 12-15 -> 5.7 s).
PREFILL_POLICY_NO_BF16_GEMM = "dedup"


# Prompts share a prefix and differ in their last tokens (a served system prompt, then each user's turn): the prefix
# is prefilled once (speculative.prefill_all), so 24 prompts of 512 tokens cost one prefill and 24 short passes.
PROMPT_OWN_TOKENS = 16


def set_prefill_policy(model: Any) -> str:
    """Set and return the experts policy a prompt of `model` is prefilled with (PREFILL_POLICY*)."""
    weight = next(model.parameters())
    slow = weight.dtype == torch.bfloat16 and matmul_dtype(torch.bfloat16, weight.device.type) != torch.bfloat16
    policy = PREFILL_POLICY_NO_BF16_GEMM if slow else PREFILL_POLICY
    set_policy(model, policy)
    return policy


def prefill_prompts(model: Any, contexts: list[list[int]]) -> list[speculative.Prefill]:
    """Each context's prefill (speculative.prefill_all: a shared prefix fed once) under the prefill policy
    (set_prefill_policy); the caller sets the policy under test afterwards."""
    set_prefill_policy(model)
    return speculative.prefill_all(model, contexts)


def prompts(count: int, depth: int, vocab: int, seed: int) -> list[list[int]]:
    """`count` prompts of `depth` seeded random token ids, sharing all but their last PROMPT_OWN_TOKENS: a
    random-weight model has no text to prefer, and the context length (not its content) is what the verify time
    depends on."""
    rng = np.random.default_rng([seed, depth])
    shared = rng.integers(3, vocab, size=max(depth - PROMPT_OWN_TOKENS, 0)).tolist()
    return [shared + rng.integers(3, vocab, size=depth - len(shared)).tolist() for _ in range(count)]


def replay_documents(trace: Trace, path: str, spec: ModelSpec, count: int, length: int, seed: int) -> list[np.ndarray]:
    """The first `length` rows [length, L, m] of `count` seeded documents that long: generated position p of
    prompt i replays row p of document i, whatever pass carries it."""
    docs = [(s, e) for s, e in trace.documents() if e - s >= length]
    if not docs:
        raise MoespecError(f"{path}: no document of {length} tokens to replay while decoding (lower --tokens)")
    picks = np.random.default_rng([seed, length]).choice(len(docs), size=count, replace=len(docs) < count)
    return [trace.experts[docs[i][0]:docs[i][0] + length, :spec.L].astype(np.int64) for i in picks.tolist()]


Cell = tuple[str, int]  # (policy, k): one throughput cell


def throughput_cells(policies: list[str], ks: list[int]) -> list[Cell]:
    """The (policy, k) cells to run, each decoding every prompt once."""
    return [(p, k) for p in policies for k in ks]


def prompt_acceptance(k: int, i: int, acceptances: Sequence[float] | None) -> float | None:
    """The oracle's acceptance for prompt i of a cell at draft length k: the grid's acceptances in turn, started at
    k, so that across the draft lengths every prompt meets every a (at k = 0 it does not enter); None for a draft
    model (acceptances None)."""
    return None if acceptances is None else acceptances[(i + k) % len(acceptances)]


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
            self.states = prefill_prompts(self.lm.model, self.contexts)
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
    return prompt_unit(out, recs, cont, ps.margins[policy][i], i, a)


def prompt_unit(out: list[int], records: list[speculative.StepRecord], plain: list[int], margins: list[float],
                i: int, a: float | None) -> dict:
    """One (cell, prompt) checkpoint unit of either engine: the oracle's acceptance a (None: a draft model), the
    steps (drafted, accepted and the four times of each), the tokens generated and where they first differ from
    plain decoding's `plain` with plain decoding's top-2 logit gap there (`margins[j]`: the gap behind plain
    token j + 1), if they do."""
    p = next((j for j, (x, y) in enumerate(zip(out, plain)) if x != y), None)
    return {"a": a, "steps": [[r.drafted, r.accepted, r.verify_s, r.step_s, r.draft_s, r.host_s] for r in records],
            "tokens": len(out),
            "mismatch": None if p is None else {"prompt": i, "position": p,
                                                "plain_top2_gap": margins[p - 1] if p else None}}


PROMPT_UNIT = "cell "  # the prefix of every (cell, prompt) unit's key (interleaved)


def check_prompt_unit(unit: Any, where: str) -> None:
    """A resumed (cell, prompt) unit (prompt_unit, with its contention record): the acceptance, every step's
    counts and four times, the tokens and the first mismatch, of the types prompt_unit writes."""
    require(isinstance(unit, dict) and isinstance(unit.get("steps"), list), where, "no list of steps")
    a, mismatch = unit.get("a"), unit.get("mismatch")
    require(a is None or (is_number(a) and 0 <= a < 1), where, f"acceptance a = {a!r} must be null or in [0, 1)")
    for j, step in enumerate(unit["steps"]):
        require(isinstance(step, list) and len(step) == 6 and is_count(step[0]) and is_count(step[1]) and
                step[1] <= step[0] and all(is_number(t) and t >= 0 for t in step[2:]), where,
                f"steps[{j}] must be [drafted, accepted <= drafted, four times >= 0]")
    require(is_count(unit.get("tokens")), where, "tokens must be a whole number >= 0")
    require(mismatch is None or (isinstance(mismatch, dict) and is_count(mismatch.get("prompt")) and
                                 is_count(mismatch.get("position")) and
                                 (mismatch.get("plain_top2_gap") is None or is_number(mismatch["plain_top2_gap"]))),
            where, "mismatch must be null or {prompt, position, plain_top2_gap}")
    check_contention_record(unit.get("contention"), where, "contention")


def run_unit_checks(ns: list[int], policies: list[str]) -> UnitChecks:
    """The checks of a resumed run's units, either engine: its verify rounds over `ns` and `policies`, its level and
    its (cell, prompt) units."""
    return {VERIFY_UNIT: verify_unit_check(ns, policies), LEVEL_UNIT: check_level_unit, PROMPT_UNIT: check_prompt_unit}


def _records(units: list[dict]) -> list[speculative.StepRecord]:
    return [speculative.StepRecord(int(d), int(acc), v, s, dr, h) for unit in units
            for d, acc, v, s, dr, h in unit["steps"]]


def cell_record(policy: str, k: int, a: float | None, prompts: list[dict], oracle: bool,
                timed: list[dict] | None = None) -> dict:
    """One throughput row (documented in moespec.formats.runsfile) from the decode_prompt units `prompts`; its
    step times (V(k) and its parts) from the units `timed` (default: the same prompts)."""
    records = _records(prompts)
    clock_units = prompts if timed is None else timed
    clock = _records(clock_units)
    mismatches = [unit["mismatch"] for unit in prompts if unit["mismatch"] is not None]
    steps = len(records)
    # Two rates. COUNTED (the paper's): every step's accepted drafts plus one token over the steps' measured time,
    # the last step in full even where it overshoots the generated length (a finite run's truncation, which would
    # count against long drafts), the prompt's first token left out (no step emits it); its 95% interval resamples
    # the steps. COMPUTED, the steady state T_a(k) = G_a(k) / V(k) (B.1): for the oracle draft, geometric at rate a
    # by construction, G_a(k) exactly instead of the counted tokens per step (the same expectation without the
    # spread of a few hundred Bernoulli draws, +-0.05 in a and up to 10% in T per cell at a = 0.6), over the
    # measured V(k); blind to time the steps lose outside V(k). Which one a score reads, the plan names.
    # V(k) is the MEDIAN step time, the statistic of every verify time here: the steps of a cell are one pass size
    # each, so they sample one time, and a step the host disturbed (2-10x slower while another job holds the memory
    # bus) moves a mean V, and with it k*, by a few percent at a few dozen steps a cell (per-pass spread
    # 10% on the 2-core machine), where it moves the median by one rank.
    emitted = sum(r.accepted + 1 for r in records)
    counted = emitted / sum(r.step_s for r in records) if steps else None
    interval = bootstrap_rate([r.accepted + 1 for r in records], [r.step_s for r in records],
                              np.random.default_rng(steps))[1:] if steps >= 2 else None
    clock_wall = sum(r.step_s for r in clock)
    V = float(np.median([r.step_s for r in clock]))
    rate = speculative.acceptance_rate(records) if records else float("nan")
    rate = None if np.isnan(rate) else rate
    profile = theory.estimate_profile([(r.drafted, r.accepted) for r in records], k) if k else []
    g = float(theory.geometric_sum(rate if a is None else a, k)) if k and (a is not None or rate is not None) else 1.0
    host = sum(r.host_s + r.draft_s for r in clock)
    return {"policy": policy, "k": k, "a": a if k else None, "draft": "oracle" if oracle else "model",
            "tokens_per_s": g / V if oracle else counted, "counted_tokens_per_s": counted,
            "counted_tokens_per_s_ci": None if interval is None else list(interval),
            "tokens": sum(u["tokens"] for u in prompts),
            "prompts": len(prompts), "realized_acceptance": rate, "acceptance_profile": profile,
            "accepted_per_drafted": speculative.realized_acceptance(records) if k and steps else None,
            "tokens_per_step": emitted / steps if steps else None, "G_a": g, "steps": steps, "step_time_s": V,
            "verify_time_s": sum(r.verify_s for r in clock) / len(clock), "draft_host_s": host / len(clock),
            "overhead_share": host / clock_wall,
            "greedy_exact": not mismatches, "greedy_match": all(m["plain_top2_gap"] == 0 for m in mismatches),
            "mismatches": mismatches, "contention": merge([u["contention"] for u in clock_units if "contention" in u])}


def cell_rows(policy: str, k: int, units: list[dict], acceptances: Sequence[float] | None) -> list[dict]:
    """A cell's rows: a draft model's one (a None, acceptances None); the oracle's one per acceptance of the grid
    (k = 0: one, which expand_k0 lists at every a), each T_a(k) = G_a(k) / V(k) over the cell's V(k) from all its
    prompts, with what the prompts at that a realized (none where the grid has more acceptances than prompts)."""
    if acceptances is None or not k:
        return [cell_record(policy, k, None, units, acceptances is not None)]
    return [cell_record(policy, k, a, [u for u in units if u["a"] == a], True, timed=units) for a in acceptances]


def interleaved(cells: list[Cell], count: int, checkpoint: Checkpoint, unit: Callable[[Cell, int], dict],
                advance: Any) -> list[tuple[Cell, list[dict]]]:
    """Every cell over `count` prompts, interleaved: round i runs `unit(cell, i)` (prompt i of the cell) for every
    cell, in order on even rounds and in reverse on odd ones (A B C, C B A), so the machine's drift over the
    grid's minutes hits every (policy, k) alike instead of the cells run last. Each (cell, prompt) is a
    checkpoint unit. Returns each cell with its prompts' units."""
    def key(cell: Cell, i: int) -> str:
        return f"{PROMPT_UNIT}{cell[0]} k {cell[1]} prompt {i}"

    for i in range(count):
        for cell in cells if i % 2 == 0 else cells[::-1]:
            if key(cell, i) not in checkpoint.units:
                checkpoint.save(key(cell, i), unit(cell, i))
            advance(1)
    return [(cell, [checkpoint.units[key(cell, i)] for i in range(count)]) for cell in cells]


def measure_throughput(lm: LoadedModel, cells: list[Cell], kernel_by_n: dict[int, str] | None, ps: Prompts,
                       acceptances: Sequence[float] | None, checkpoint: Checkpoint, drafter: Any, advance: Any,
                       level: Level, cores: Cores) -> list[dict]:
    """Every throughput cell on the engine, interleaved over the prompts (interleaved), each prompt decoded at the
    run's bandwidth level (Level.measured) on the threads `cores` fits (each unit with its contention record):
    with the draft model `drafter`, or (acceptances given) the oracle at prompt_acceptance. Returns the runs.json
    rows (cell_rows)."""
    def unit(cell: Cell, i: int) -> dict:
        a = prompt_acceptance(cell[1], i, acceptances)
        return cores.watched(lambda: level.measured(lambda: decode_prompt(lm, *cell, a, kernel_by_n, ps, i, drafter)))

    done = interleaved(cells, ps.count, checkpoint, unit, advance)
    return [row for cell, units in done for row in cell_rows(*cell, units, acceptances)]


def expand_k0(cells: list[dict], acceptances: list[float]) -> list[dict]:
    """Throughput rows with the k = 0 measurement listed at every acceptance (plain decoding ignores a)."""
    rows = []
    for cell in cells:
        rows += [cell | {"a": a} for a in acceptances] if cell["k"] == 0 else [cell]
    return rows

"""`moespec run --engine llama.cpp`: the measurements of moespec.measure.run, made on llama.cpp itself (a GGUF
model through llama-cpp-python's C API), written as the same runs.json, so plan, score and report read them
unchanged.

Physics. llama.cpp's CPU expert operation (ggml's MUL_MAT_ID) groups a pass's rows by expert and reads each
selected expert once: it is a deduplicating kernel, and the only one llama.cpp has on the CPU. Its runs therefore
hold one policy, "dedup"; the saving S(n) and the crossover need a per-slot kernel to compare with and are not
recorded (score then decides the rules that need them as not applicable). What the runs measure is the staircase's
input, V(k) = tau(k + 1) + h(k), at llama.cpp's own step times, and the throughput it gives.

1. verify time: one context of DEPTH random tokens prefilled once; per sample, n random tokens fed after it in
   one llama_decode with every logit requested (a verify pass checks each drafted token), timed to
   llama_synchronize, the positions removed again (llama_memory_seq_rm, the rollback of a rejected draft). The
   rounds, their reference reads (which evict the last-level cache before every pass), the disturbed-round
   repeats and the +-target stopping rule are the main engine's (moespec.measure.rounds.timed_rounds).
2. throughput: per prompt a context of its own, prefilled once (the KV cache is rolled back to the prompt after
   each decoding); plain greedy decoding first gives the oracle's continuation, then speculative decoding
   (moespec.model.speculative.decode_steps) with the oracle draft at every k, each prompt at one acceptance of
   the grid in turn (T_a(k) over the cell's one V(k): moespec.measure.decoding), or with a draft
   GGUF (--draft-gguf: a smaller model sharing the vocabulary, greedy, its own context per prompt rolled back to
   the tokens it shares with the target's), the cells interleaved one prompt per round. This is the greedy
   draft-verify loop of llama.cpp's speculative decoding (its draft proposes greedily, the target verifies the
   batch, the cache keeps the accepted prefix) driven from Python; the time outside llama_decode (Python's loop,
   the argmax over the vocabulary) is the host time h(k) beside the draft's.
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from moespec import MoespecError
from moespec.console import progress
from moespec.formats.checkpoint import Checkpoint, unit_rng
from moespec.formats.files import check_input, holds_outputs, provenance, write_json
from moespec.formats.runsfile import Runs
from moespec.measure.decoding import (
    Cell,
    cell_rows,
    interleaved,
    prompt_acceptance,
    prompt_unit,
    prompts,
    run_unit_checks,
    throughput_cells,
)
from moespec.measure.contention import Cores, on_own_cores
from moespec.measure.level import Level, pin_wait
from moespec.measure.rounds import VERIFY_UNIT, timed_rounds, verify_done
from moespec.measure.run import RunConfig, load_plan_kernels, run_level, say_contention, summarize
from moespec.measure.timing import measure_stream_read
from moespec.model import speculative
from moespec.model.gguf import read_gguf
from moespec.model.llama_cpp import LlamaContext, bindings

POLICY = "dedup"  # llama.cpp's CPU MUL_MAT_ID reads each selected expert once (the module docstring)


class Contexts:
    """One llama.cpp model and the contexts a run needs: `verify` (the verify-time context) and one per prompt."""

    def __init__(self, path: str, n_ctx: int, threads: int) -> None:
        self.first = LlamaContext(path, n_ctx, threads)
        self.path, self.n_ctx, self.threads = path, n_ctx, threads
        self.made = [self.first]

    def new(self) -> LlamaContext:
        context = LlamaContext(self.path, self.n_ctx, self.threads, model=self.first.model)
        self.made.append(context)
        return context

    def close(self) -> None:
        for context in reversed(self.made):  # the first owns the model: freed last
            context.close()


def timed_pass(context: LlamaContext, tokens: list[int]) -> float:
    """Seconds of one verify pass of `tokens` after the context's cache (every logit), rolled back after."""
    context.fill(tokens, every_logit=True)
    start = time.perf_counter()
    context.decode()
    seconds = time.perf_counter() - start
    context.rollback(len(tokens))
    return seconds


def measure_verify(context: LlamaContext, config: RunConfig, ns: list[int], checkpoint: Checkpoint,
                   advance: Any, level: Level, cores: Cores) -> dict[int, dict[str, Any]]:
    """Verify-time samples of POLICY per n at depth d (module docstring, 1), in the main engine's rounds over
    every pass size at the run's bandwidth level (moespec.measure.rounds.timed_rounds), `cores` watching for
    another process beside each pass (llama.cpp's threads are fixed when its context is made)."""
    tokens = {n: unit_rng(config.seed, f"verify n {n}").integers(3, context.vocab_size,
                                                                  size=(config.max_reps, n)).tolist() for n in ns}
    if not verify_done(checkpoint):
        if context.length == 0:
            context.forward(prompts(1, config.depth, context.vocab_size, config.seed)[0], last_only=True)
        for n in ns:
            timed_pass(context, tokens[n][0])  # untimed: the first pass of a size allocates its buffers
    return timed_rounds(lambda n, policy, rep: timed_pass(context, tokens[n][rep % config.max_reps]), ns, [POLICY],
                        config, unit_rng(config.seed, VERIFY_UNIT), advance, level, checkpoint, cores)


class _Recording:
    """A context as a Greedy that keeps the top-2 logit gap of every token it returns."""

    def __init__(self, context: LlamaContext, gaps: list[float]) -> None:
        self.context, self.gaps = context, gaps

    def forward(self, tokens: list[int], last_only: bool = False) -> list[int]:
        out = self.context.forward(tokens, last_only)
        self.gaps += self.context.gaps
        return out

    def rollback(self, tokens: int) -> None:
        self.context.rollback(tokens)


class Prompt:
    """One throughput prompt in its own target context (and draft context), prefilled once."""

    def __init__(self, ids: list[int], target: LlamaContext, draft: LlamaContext | None, length: int) -> None:
        """`length`: the tokens of plain greedy decoding to keep (the oracle's continuation must cover the
        generated tokens and the longest draft past them)."""
        self.ids, self.target, self.draft = ids, target, draft
        self.first = target.forward(ids, last_only=True)[-1]
        self.margins: list[float] = []  # plain decoding's top-2 logit gap behind each token after the first
        recording = _Recording(target, self.margins)
        self.continuation = speculative.decode_steps(recording, ids, self.first, speculative.NO_DRAFT, 0, length)[0]
        target.rollback(target.length - len(ids))

    def decode(self, draft: speculative.Draft, k: int, tokens: int) -> tuple[list[int], list]:
        out = speculative.decode_steps(self.target, self.ids, self.first, draft, k, tokens)
        self.target.rollback(self.target.length - len(self.ids))
        return out


def decode_cell(prompt: Prompt, i: int, k: int, a: float | None, seed: int, tokens: int) -> dict:
    """One (cell, prompt) unit: speculative decoding with the oracle draft at a, or the draft model (a None)."""
    if prompt.draft is None:
        draft: speculative.Draft = speculative.OracleDraft(prompt.continuation, a, seed, prompt.target.vocab_size,
                                                           len(prompt.ids))
    else:
        prompt.draft.clear()
        draft = speculative.GreedyDraft(prompt.draft)
        draft.prefill(prompt.ids)
    out, records = prompt.decode(draft, k, tokens)
    return prompt_unit(out, records, prompt.continuation, prompt.margins, i, a)


def check(config: RunConfig) -> None:
    """The llama.cpp run's own arguments, before any work (RunConfig.check checks the shared ones)."""
    for flag, value in (("--model", config.model), ("--preset", config.preset), ("--replay", config.replay),
                        ("--draft-model", config.draft_model)):
        if value is not None:
            raise MoespecError(f"{flag} applies to moespec's engine; --engine llama.cpp runs --gguf (and "
                               "--draft-gguf)")
    if config.device != "cpu":
        raise MoespecError(f"--device {config.device}: --engine llama.cpp runs llama-cpp-python's CPU build here")
    if config.gguf is None:
        raise MoespecError("--engine llama.cpp needs --gguf MODEL.gguf")
    check_input(config.gguf, "--gguf")
    if config.draft_gguf is not None:
        check_input(config.draft_gguf, "--draft-gguf")


@holds_outputs(lambda config: [config.out])
@on_own_cores
def run_llama_cpp(config: RunConfig, say: Callable[[str], None] = lambda text: None) -> Runs:
    """Measure llama.cpp's verify times and throughput grid on config.gguf (the module docstring), write runs.json
    to config.out (locked meanwhile) and return it."""
    config.check()
    check(config)
    model = read_gguf(config.gguf)  # a dense, truncated or unknown-architecture file: one line
    bindings()  # llama-cpp-python absent: one line, before any work
    ns, ks, acceptances = sorted(set(config.n)), sorted(set(config.k)), config.acceptances
    started = provenance("cpu", model.expert_format())
    # --plan: recorded (its sha256) so score can call the plan pre-registered; llama.cpp runs its one kernel
    plan_info, _ = load_plan_kernels(config.plan, started["dtype"], "cpu")
    if plan_info and plan_info["model"] != model.spec.name:
        raise MoespecError(f"{config.plan}: a plan for {plan_info['model']}, but {config.gguf} is "
                           f"{model.spec.name}")
    started["llama_cpp"] = {"gguf": str(Path(config.gguf).resolve()), "threads": config.threads,
                            "draft_gguf": None if config.draft_gguf is None else str(Path(config.draft_gguf).resolve())}
    n_ctx = config.depth + max(max(ns), config.tokens + max(ks) + 2) + 8
    contexts = Contexts(config.gguf, n_ctx, config.threads)
    drafts = None
    try:
        vocab = contexts.first.vocab_size
        if config.draft_gguf is not None:
            drafts = Contexts(config.draft_gguf, n_ctx, config.threads)
            if drafts.first.vocab_size != vocab:
                raise MoespecError(f"{config.draft_gguf}: vocabulary of {drafts.first.vocab_size} tokens, the "
                                   f"target's has {vocab}: a draft must share the tokenizer")
        cells = throughput_cells([POLICY], ks) if config.throughput else []
        oracle = None if drafts else acceptances
        key = {"engine": "llama.cpp", "gguf": started["llama_cpp"]["gguf"], "draft_gguf": config.draft_gguf,
               "threads": config.threads, "depth": config.depth, "n": ns, "reps": config.reps,
               "max_reps": config.max_reps, "target": config.target, "budget_s": config.budget_s, "k": ks,
               "a": acceptances, "prompts": config.prompt_count, "tokens": config.tokens, "seed": config.seed,
               "plan": plan_info, "level_gbps": config.level_gbps,
               "level_wait_s": pin_wait(config.level_gbps, config.level_wait_s)}
        checkpoint = Checkpoint(config.out, key, "run", config.fresh, run_unit_checks(ns, [POLICY]))
        say(f"moespec run: llama.cpp, {config.gguf} ({model.spec.L} MoE layers, {started['dtype']}, "
            f"{config.threads} threads); policy {POLICY} (llama.cpp's CPU MUL_MAT_ID); depth {config.depth}")
        if note := checkpoint.describe():
            say(note)
        ceilings = {"before": measure_stream_read()}
        level = run_level(config, plan_info, checkpoint, say)
        with checkpoint, progress("run", len(ns) * config.reps + len(cells) * config.prompt_count,
                                  enabled=sys.stderr.isatty()) as advance:
            cores = Cores(config.threads, fit=False)
            units = measure_verify(contexts.first, config, ns, checkpoint, advance, level, cores)
            ceilings["between"] = measure_stream_read()
            ps = [Prompt(ids, contexts.new(), drafts.new() if drafts else None, config.tokens + max(ks))
                  for ids in prompts(config.prompt_count, config.depth, vocab, config.seed)] if cells else []

            def unit(cell: Cell, i: int) -> dict:
                a = prompt_acceptance(cell[1], i, oracle)
                return cores.watched(lambda: level.measured(
                    lambda: decode_cell(ps[i], i, cell[1], a, config.seed + i, config.tokens)))

            measured = [row for cell, prompts_done in interleaved(cells, config.prompt_count, checkpoint, unit, advance)
                        for row in cell_rows(*cell, prompts_done, oracle)]
        ceilings["after"] = measure_stream_read()
    finally:
        contexts.close()
        if drafts is not None:
            drafts.close()
    identity = {"model": model.spec.name, "spec": model.spec.to_dict(), "source": f"llama.cpp, GGUF {config.gguf}",
                "moe_layers": model.spec.L}
    doc = summarize(identity, replace(config, dtype=started["dtype"]), units, [POLICY], measured, acceptances,
                    plan_info, None, started, ceilings, level)
    doc["engine"] = "llama.cpp"
    doc["dense"], doc["verify_pass"] = "llama.cpp", "llama.cpp (its own graph, through its C API)"
    say_contention(doc, say)
    write_json(config.out, doc)
    checkpoint.remove()
    return Runs(doc, config.out)

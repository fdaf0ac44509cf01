"""The draft length chosen four ways on a real target and draft pair, side by side (issue 16): every constant k,
transformers' +2/-1 heuristic and the online policy (moespec.model.adaptive), optionally transformers' own
generate(assistant_model=...). `benchmarks/adaptive_draft.py` runs it on Spec-Bench and WikiText prompts; the demo
runs it on the shipped trained pair (moespec/data/pair).

Physics first. A step drafting k tokens costs V(k) (the target's verify pass of k + 1 tokens plus k draft passes
plus host time) and yields G(k) = 1 + a_1 + a_1 a_2 + ... tokens (moespec.theory.profile). The best constant k
maximizes G(k)/V(k) on the text at hand; the plan's k_hat is that k for the profile and step times measured on
calibration prompts; the policies choose k step by step.

How. Per kind of prompt: the first `calibration` prompts (CALIBRATION by default) are decoded at every constant k
first (not scored; interleaved, the order reversed every other prompt): their mean step time per k is V(k), and
the steps of every k >= 1, pooled, give the profile (calibration_profile). Then every cell decodes every
other prompt, interleaved prompt by prompt (the order reversed every other round). Every decoding is kept at one
bandwidth level of the host (moespec.measure.level.Level.measured: one whose reference read after it is off the
level is decoded again; a policy's repeat starts from the state it had before the prompt), and each prompt of each
cell can be decoded `repeats` times in interleaved rounds, the one of median time kept (_median_of); the heuristic
and the online policy are one object per kind, carried from prompt to prompt (as transformers keeps its assistant's
draft length across generate calls); the online policy starts from the plan, V(k) and the calibration profile as its
prior, where the heuristic starts from transformers' default. Greedy throughout: every cell must give plain
decoding's tokens. tokens/s: tokens generated over decoding time (the prefill left out); beside it each cell's ratio
to the best constant k paired prompt by prompt (both decoded in one round) with its 95% bootstrap interval, its
ratio to the best constant chosen on held-out prompts (held_out_best: free of the winner's curse of a maximum over
noisy cells), and the streaming-read ceiling before and after the cells (the machine's state; a step moves kilobytes
to megabytes of a small model, so it is reported, not divided by).

Replay. A measured cell carries the machine's noise: the host moves by tens of percent within minutes, and a cell
is one decoding of each prompt. The policies' own quality is measured apart from it, exactly: with greedy drafts,
step acceptance is a function of the text alone. While drafts match, the draft's context is the true prefix, so
a step from position p drafting k tokens accepts the run of ones in agree[p:p + k], where agree[j] says whether
the draft's greedy token given the target's first j tokens is the target's token j (one teacher-forced draft
forward over plain decoding's tokens), and that forward's softmax gives the draft's confidence in each of its
tokens, which the online policy reads to stop a step (moespec.model.adaptive.Online.more). `replay` decodes every
prompt again on those sequences with the calibration's V(k) as each step's time: tokens / sum V(k) per cell,
deterministic, for every constant k and every policy, beside the measured cells.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from moespec import MoespecError, theory
from moespec.measure.level import Level
from moespec.measure.rounds import bootstrap_median
from moespec.measure.timing import measure_stream_read
from moespec.model.adaptive import DraftLength, Heuristic, Online
from moespec.model.cache import new_cache
from moespec.model.speculative import ModelDraft, forward_logits, prefill, speculative_decode

CALIBRATION = 2  # prompts per kind decoded at every constant k first by default: V(k) and the profile the plan uses
HF_ASSISTED = "transformers-assisted"


def decode(target: Any, draft: Any, prompt: list[int], k: int | Heuristic | Online, tokens: int) -> dict:
    """One greedy speculative decoding of `prompt` (k: a constant or a policy), both models prefilled outside the
    clock: tokens, seconds, steps."""
    ids = torch.tensor([prompt])
    state = prefill(target, ids)
    drafter = ModelDraft(draft)
    drafter.prefill(prompt)
    start = time.perf_counter()
    out, records = speculative_decode(target, ids, drafter, k, tokens, prefilled=state)
    seconds = time.perf_counter() - start
    return {"tokens": out, "seconds": seconds, "steps": [[r.drafted, r.accepted, r.step_s] for r in records]}


def hf_assisted(target: Any, draft: Any, prompt: list[int], tokens: int) -> dict:
    """transformers' own assisted generation (greedy, its heuristic schedule from 20) of `tokens` tokens."""
    draft.generation_config.num_assistant_tokens_schedule = "heuristic"
    draft.generation_config.num_assistant_tokens = 20
    with torch.inference_mode():
        ids = torch.tensor([prompt])
        start = time.perf_counter()
        out = target.generate(ids, assistant_model=draft, max_new_tokens=tokens, min_new_tokens=tokens,
                              do_sample=False)
        seconds = time.perf_counter() - start
    return {"tokens": out[0, len(prompt):].tolist(), "seconds": seconds, "steps": []}


def agreement(draft: Any, prompt: list[int], plain: list[int]) -> tuple[list[int], list[float]]:
    """agree[j - 1] for j = 1..len(plain) - 1: 1 where the draft's greedy token after prompt + plain[:j] is plain[j]
    (plain: the target's greedy tokens, its first one the prefill's), and beside it that token's probability under
    the draft (its confidence); one teacher-forced forward of the draft."""
    with torch.inference_mode():
        logits = forward_logits(draft, prompt + plain, new_cache(draft), keep=len(plain)).float()
    top, predicted = torch.softmax(logits, -1).max(-1)  # [i]: the draft's token after prompt + plain[:i + 1]
    predicted, top = predicted.tolist(), top.tolist()
    return [int(predicted[j - 1] == plain[j]) for j in range(1, len(plain))], top[:len(plain) - 1]


def _replayed_step(agree: list[int], confidence: list[float] | None, position: int, k: int | DraftLength
                   ) -> tuple[int, int]:
    """(drafted, accepted) of one replayed step from `position`; a policy with `more`, given the confidences, drafts
    token by token as with a model draft. Past the first disagreement the confidences are the teacher-forced ones
    (the true text's), not those of the draft's wrong continuation; the step is lost there either way."""
    reads = not isinstance(k, int) and confidence is not None and hasattr(k, "more")
    if isinstance(k, int):
        drafted = k
    elif not reads:
        drafted = k.next_k()
    else:
        drafted = min(k.first(), len(confidence) - position)
        while 0 < drafted < k.kmax and position + drafted < len(confidence) and \
                k.more(confidence[position:position + drafted]):
            drafted += 1
    accepted = 0
    while accepted < drafted and position + accepted < len(agree) and agree[position + accepted]:
        accepted += 1
    if reads:
        k.update(drafted, accepted, confidence[position:position + drafted])
    elif not isinstance(k, int):
        k.update(drafted, accepted)
    return drafted, accepted


def replayed(agree: list[int], V: list[float], k: int | DraftLength, tokens: int,
             confidence: list[float] | None = None) -> tuple[int, float]:
    """(tokens, seconds) of one decoding replayed on an agreement sequence (module docstring), with the draft's
    confidences where a policy reads them: the prefill's token, then steps until `tokens` are out, each V(k) long; a
    policy is told each step's outcome. As in the measured cells, `tokens` are counted (the last step's overshoot is
    not), so a sequence of plain decoding's `tokens` tokens decides every step: only the last one may reach past it,
    and it ends the decoding either way."""
    emitted, position, seconds = 1, 0, 0.0
    while emitted < tokens:
        drafted, accepted = _replayed_step(agree, confidence, position, k)
        emitted, position, seconds = emitted + accepted + 1, position + accepted + 1, seconds + V[drafted]
    return min(emitted, tokens), seconds


def replay(agree: list[list[int]], V: list[float], profile: list[float], tokens: int,
           confidence: list[list[float]] | None = None) -> dict[str, float]:
    """Every constant k, the heuristic and the online policy (one object per kind, carried across prompts, as in
    the measured cells) replayed on the scored prompts' agreement sequences (and the draft's confidences, which the
    online policy reads): each cell's tokens/s over the best constant k's."""
    kmax = len(V) - 1
    policies: dict[str, int | Heuristic | Online] = {f"k={k}": k for k in range(kmax + 1)}
    policies |= {"heuristic": Heuristic(kmax), "online": Online(V, prior_profile=profile)}
    confidence = confidence or [None] * len(agree)
    rate = {}
    for cell, k in policies.items():
        done = [replayed(a, V, k, tokens, c) for a, c in zip(agree, confidence)]
        rate[cell] = sum(t for t, _ in done) / sum(s for _, s in done)
    best = max(rate[f"k={k}"] for k in range(kmax + 1))
    return {cell: r / best for cell, r in rate.items()}


def summarize(units: list[dict], kmax: int) -> dict:
    """One cell: tokens/s, steps, tokens per step, its mean k and its measured profile."""
    steps = [s for u in units for s in u["steps"]]
    tokens = sum(len(u["tokens"]) for u in units)
    seconds = sum(u["seconds"] for u in units)
    drafted = [d for d, _, _ in steps]
    return {"tokens_per_s": tokens / seconds, "seconds": seconds, "steps": len(steps),
            "tokens_per_step": tokens / len(steps) if steps else None,
            "mean_k": float(np.mean(drafted)) if drafted else None,
            "profile": theory.estimate_profile([(d, a) for d, a, _ in steps], kmax)}


def _decode_cell(target: Any, draft: Any, prompt: list[int], cell: str, policies: dict[str, DraftLength],
                 tokens: int) -> dict:
    """One prompt of one cell. A policy decodes as a copy of its state, returned under "policy": a decoding run
    again off the level (Level.measured) starts from the state the policy had, not from one that saw the prompt."""
    if cell == HF_ASSISTED:
        return hf_assisted(target, draft, prompt, tokens)
    if cell not in policies:
        return decode(target, draft, prompt, int(cell[2:]), tokens)
    policy = copy.deepcopy(policies[cell])
    return decode(target, draft, prompt, policy, tokens) | {"policy": policy}


def _median_of(repeats: int, cells: list, decode_one: Callable[[Any], dict], level: Level, flip: bool
               ) -> dict[Any, dict]:
    """Every cell's decoding of one prompt, `repeats` times in interleaved rounds (the order reversed every other
    round, starting reversed where `flip`), each kept at the level: per cell the decoding of median time (the lower
    one of an even count). A burst of the host that slows one round reaches one decoding of each cell, not the cell."""
    tries: dict[Any, list[dict]] = {cell: [] for cell in cells}
    for r in range(repeats):
        for cell in cells if (r + flip) % 2 == 0 else cells[::-1]:
            tries[cell].append(level.measured(lambda: decode_one(cell)))
    return {cell: sorted(got, key=lambda u: u["seconds"])[(len(got) - 1) // 2] for cell, got in tries.items()}


def compare(target: Any, draft: Any, prompts: list[list[int]], tokens: int, kmax: int,
            with_hf: bool = False, level: Level | None = None, calibration: int = CALIBRATION,
            repeats: int = 1) -> dict[str, Any]:
    """The comparison of the module docstring on one kind of prompt (`calibration` + at least one); every decoding
    kept at `level` (moespec.measure.level.Level.measured; default none pinned), each prompt of each cell decoded
    `repeats` times and the median one kept (_median_of)."""
    if calibration < 1 or len(prompts) <= calibration or tokens < 2 or kmax < 1 or repeats < 1:
        raise MoespecError(f"drafting: need calibration >= 1, more prompts than it, tokens >= 2, kmax >= 1 and "
                           f"repeats >= 1, got {calibration}, {len(prompts)}, {tokens}, {kmax} and {repeats}")
    fixed = list(range(kmax + 1))
    level = level or Level(wait_s=0)
    ceilings = {"before": float(np.median(measure_stream_read()))}  # the machine's state around the cells
    calibrated: dict[int, list[dict]] = {k: [] for k in fixed}
    for i, prompt in enumerate(prompts[:calibration]):  # interleaved: a level change reaches every k alike
        got = _median_of(repeats, fixed, lambda k: decode(target, draft, prompt, k, tokens), level, i % 2 == 1)
        for k in fixed:
            calibrated[k].append(got[k])
    V = [float(np.mean([s[2] for u in calibrated[k] for s in u["steps"]])) for k in fixed]
    profile = calibration_profile(calibrated, kmax)
    k_hat = int(theory.best_draft_length_for(V, profile))
    cells = [*(f"k={k}" for k in fixed), "heuristic", "online", *([HF_ASSISTED] if with_hf else [])]
    units: dict[str, list[dict]] = {c: [] for c in cells}
    policies: dict[str, DraftLength] = {"heuristic": Heuristic(kmax), "online": Online(V, prior_profile=profile)}
    for i, prompt in enumerate(prompts[calibration:]):
        got = _median_of(repeats, cells, lambda cell: _decode_cell(target, draft, prompt, cell, policies, tokens),
                         level, i % 2 == 1)
        for cell in cells:
            if cell in policies:  # carried to the next prompt: the state the kept decoding left
                policies[cell] = got[cell].pop("policy")
            units[cell].append(got[cell])
    ceilings["after"] = float(np.median(measure_stream_read()))
    plain = [u["tokens"] for u in units["k=0"]]
    agree, confidence = zip(*(agreement(draft, prompt, tokens_out)
                              for prompt, tokens_out in zip(prompts[calibration:], plain)))
    rows = {c: summarize(u, kmax) | {"greedy_exact": [x["tokens"] for x in u] == plain} for c, u in units.items()}
    best = max(fixed, key=lambda k: rows[f"k={k}"]["tokens_per_s"])
    rng = np.random.default_rng(0)
    for cell, row in rows.items():
        row["vs_best_constant"] = row["tokens_per_s"] / rows[f"k={best}"]["tokens_per_s"]
        # paired by prompt (both decoded in the same round): the median ratio with its 95% bootstrap interval
        ratios = [b["seconds"] / u["seconds"] for u, b in zip(units[cell], units[f"k={best}"])]
        row["vs_best_constant_paired"] = list(bootstrap_median(ratios, rng))
    held_out = held_out_best(units, fixed)
    for row in rows.values():
        row["vs_best_held_out"] = None if held_out is None else row["tokens_per_s"] / held_out[0]
    return {"V_s": V, "profile_calibration": profile, "k_hat_plan": k_hat, "best_constant_k": best,
            "best_held_out_k": None if held_out is None else held_out[1],
            "prompts": len(prompts) - calibration, "calibration_prompts": calibration, "repeats": repeats,
            "tokens": tokens,
            "ceiling_gbps": ceilings, "cells": rows,
            "replay": replay(list(agree), V, profile, tokens, list(confidence)), "level": level.record()}


def calibration_profile(calibrated: dict[int, list[dict]], kmax: int) -> list[float]:
    """The plan's profile a_1..a_kmax from the calibration's decodings at every k (units per k, their steps
    [drafted, accepted, seconds]): every step of every k >= 1 pooled, estimate_profile with a Beta(1, 1) prior.
    Position j is tested by every step that reached it, so a_1 reads k = 1..kmax's steps, not the longest draft's
    alone: replayed exactly on the pair's agreement sequences (100 draws of 6 calibration and 24 scored prompts,
    the V(k) of two runs; results/adaptive-draft/README.md), the plan's k_hat came within one of the scored
    prompts' best constant in 86-94% of draws on Spec-Bench and 51-60% on WikiText, against 81-90% and 45-55% from
    the longest draft's steps."""
    missing = [k for k in range(1, kmax + 1) if k not in calibrated]
    if missing:
        raise ValueError(f"calibrated: no decodings at k = {missing} (needs every k = 1..kmax = {kmax})")
    steps = [(d, a) for k in range(1, kmax + 1) for u in calibrated[k] for d, a, _ in u["steps"]]
    return theory.estimate_profile(steps, kmax, prior=(1, 1))


def held_out_best(units: dict[str, list[dict]], fixed: list[int]) -> tuple[float, list[int]] | None:
    """tokens/s of the best constant k chosen out of sample, with the two k chosen: the k best on the odd-numbered
    prompts decodes the even ones, and the other way round. The largest of kmax + 1 measured constants reads high by
    their noise (the winner's curse: on a curve flat to a few percent it picks whichever cell ran luckiest); a k
    chosen on other prompts does not. None with fewer than two scored prompts."""
    if len(units[f"k={fixed[0]}"]) < 2:
        return None

    def totals(k: int, half: int) -> tuple[int, float]:
        kept = units[f"k={k}"][half::2]
        return sum(len(u["tokens"]) for u in kept), sum(u["seconds"] for u in kept)

    def rate(k: int, half: int) -> float:
        tokens, seconds = totals(k, half)
        return tokens / seconds

    chosen = [max(fixed, key=lambda k: rate(k, 1 - half)) for half in (0, 1)]
    tokens, seconds = map(sum, zip(*(totals(k, half) for half, k in enumerate(chosen))))
    return tokens / seconds, chosen


def sampled_prompts(target: Any, count: int, length: int, seed: int) -> list[list[int]]:
    """`count` prompts of `length` tokens sampled from the target itself (temperature 1, seeded): text in the
    target's own distribution, where no text may be read (the demo reads no third-party data)."""
    generator = torch.Generator().manual_seed(seed)
    out = []
    with torch.inference_mode():
        for _ in range(count):
            ids = [int(target.config.bos_token_id or 0)]
            cache = new_cache(target)
            feed = ids
            while len(ids) < length + 1:
                logits = forward_logits(target, feed, cache, keep=1)[-1].float()
                token = int(torch.multinomial(torch.softmax(logits, -1), 1, generator=generator))
                ids.append(token)
                feed = [token]
            out.append(ids[1:])
    return out

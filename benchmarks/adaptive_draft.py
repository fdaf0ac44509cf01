"""The draft length, chosen four ways, on the trained pair (moespec/data/pair: an OLMoE-class target at N = 64,
m = 8 and a dense Llama-class draft sharing its tokenizer; issue 16), side by side in one run.

Physics first. A step drafting k tokens costs V(k) (the target's verify pass of k + 1 tokens plus k draft passes
plus host time) and yields G(k) = 1 + a_1 + a_1 a_2 + ... tokens, a_j the draft's acceptance at position j given
the ones before (moespec.theory.profile). The best constant k maximizes G(k)/V(k) on the text at hand; the online
policy (moespec.model.adaptive.Online) estimates the profile while it decodes and drafts k*(profile) each step;
transformers' assisted generation steers k by +2 after a fully accepted step, -1 otherwise (its "heuristic"
schedule, reproduced in moespec.model.adaptive.Heuristic and also run through transformers' own
generate(assistant_model=...)).

What it does.
1. Prompts: Spec-Bench questions (../shared/data/spec_bench/question.jsonl, first turn) and WikiText-2 test
   passages, tokenized by the pair's tokenizer; --prompts of each kind, --tokens generated per prompt (greedy).
   CALIBRATION prompts of each kind are decoded first at every constant k, not scored: their mean step time per
   k is V(k) for the online policy and the plan, and their k = KMAX steps give the measured profile.
2. Cells, interleaved prompt by prompt (the order reversed every other round): k = 0..KMAX constant, the
   heuristic, the online policy (each one object per kind of prompt, carried across its prompts, as transformers
   keeps its assistant's draft length across generate calls), and transformers' generate with the assistant
   (its own loop and kernels).
3. Per cell and kind of prompt: tokens/s (tokens generated over the decoding time), tokens per step, the realized
   per-position acceptance; the plan's k_hat = best_draft_length_for(V, measured profile) beside the best constant
   k measured in hindsight; ratios to the best constant k.
Ends with one JSON line; --out writes the result file (device, dtype, versions, timestamp, command).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

import numpy as np
import torch

from moespec import theory
from moespec.formats.files import provenance, write_json
from moespec.model.adaptive import Heuristic, Online
from moespec.model.cache import new_cache
from moespec.model.load import load_draft
from moespec.model.speculative import GreedyDraft, TorchGreedy, decode_steps

PAIR = Path(__file__).resolve().parents[1] / "moespec" / "data" / "pair"
KMAX = 8
CONTEXT_TOKENS = 96  # prompt tokens kept (the pair was trained on 128-token sequences)
CALIBRATION = 2  # prompts per kind decoded at every constant k first: V(k) and the profile the plan uses


def prompts(tokenizer, data: Path, count: int) -> dict[str, list[list[int]]]:
    """Token ids of CALIBRATION + `count` prompts per kind (the first CALIBRATION calibrate)."""
    out: dict[str, list[list[int]]] = {}
    bench = data / "spec_bench" / "question.jsonl"
    if bench.is_file():
        rows = [json.loads(line) for line in bench.read_text().splitlines() if line.strip()]
        texts = [r["turns"][0] for r in rows if r.get("turns")]
        out["spec-bench"] = [tokenizer(t)["input_ids"][-CONTEXT_TOKENS:] for t in texts[:count + CALIBRATION]]
    wiki = data / "wikitext-2" / "wiki.test.raw"
    if wiki.is_file():
        ids = tokenizer(wiki.read_text(encoding="utf-8"))["input_ids"]
        starts = np.random.default_rng(0).integers(0, len(ids) - CONTEXT_TOKENS, size=count + CALIBRATION)
        out["wikitext"] = [ids[s:s + CONTEXT_TOKENS] for s in starts.tolist()]
    if not out:
        raise SystemExit(f"no prompts: neither {bench} nor {wiki} is here")
    return out


def decode(target, draft_model, prompt: list[int], k, tokens: int) -> dict:
    """One speculative decoding of `prompt` (k: an int or a policy); seconds and steps."""
    with torch.inference_mode():
        cache = new_cache(target)
        ids = torch.tensor([prompt])
        start = time.perf_counter()
        first = int(target(input_ids=ids, use_cache=True, past_key_values=cache, logits_to_keep=1).logits[0, -1]
                    .argmax())
        prefill = time.perf_counter() - start
        drafter = GreedyDraft(TorchGreedy(draft_model, new_cache(draft_model)))
        drafter.prefill(prompt)
        start = time.perf_counter()
        out, records = decode_steps(TorchGreedy(target, cache), prompt, first, drafter, k, tokens)
        seconds = time.perf_counter() - start
    return {"tokens": out, "seconds": seconds, "prefill_s": prefill,
            "steps": [[r.drafted, r.accepted, r.step_s] for r in records]}


def hf_assisted(target, draft_model, prompt: list[int], tokens: int) -> dict:
    """transformers' own assisted generation (greedy, heuristic schedule) of `tokens` tokens."""
    draft_model.generation_config.num_assistant_tokens_schedule = "heuristic"
    draft_model.generation_config.num_assistant_tokens = 20
    with torch.inference_mode():
        ids = torch.tensor([prompt])
        start = time.perf_counter()
        out = target.generate(ids, assistant_model=draft_model, max_new_tokens=tokens, min_new_tokens=tokens,
                              do_sample=False)
        seconds = time.perf_counter() - start
    return {"tokens": out[0, len(prompt):].tolist(), "seconds": seconds, "steps": []}


def summarize(units: list[dict], tokens: int) -> dict:
    steps = [s for u in units for s in u["steps"]]
    seconds = sum(u["seconds"] for u in units)
    rate = theory.estimate_profile([(d, a) for d, a, _ in steps], KMAX)
    drafted = [d for d, _, _ in steps]
    return {"tokens_per_s": len(units) * tokens / seconds, "seconds": seconds, "steps": len(steps),
            "tokens_per_step": (len(units) * tokens / len(steps)) if steps else None,
            "mean_k": float(np.mean(drafted)) if drafted else None, "profile": rate}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pair", default=str(PAIR))
    p.add_argument("--data", default=str(Path(__file__).resolve().parents[2] / "shared" / "data"))
    p.add_argument("--prompts", type=int, default=6, help="prompts per kind (default 6)")
    p.add_argument("--tokens", type=int, default=64, help="tokens generated per prompt (default 64)")
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    p.add_argument("--out", help="write the result JSON here")
    args = p.parse_args(argv)
    from transformers import AutoTokenizer

    torch.set_num_threads(2)
    pair = Path(args.pair)
    tokenizer = AutoTokenizer.from_pretrained(pair / "target", local_files_only=True)
    target, draft_model = load_draft(str(pair / "target"), args.dtype), load_draft(str(pair / "draft"), args.dtype)
    started = provenance("cpu", args.dtype) | {"command": shlex.join([sys.executable, *sys.argv])}
    kinds = prompts(tokenizer, Path(args.data), args.prompts)
    fixed = list(range(KMAX + 1))
    result: dict = {"provenance": started, "pair": str(pair), "tokens": args.tokens, "kinds": {}}
    for kind, ps in kinds.items():
        calibration = {k: [decode(target, draft_model, p, k, args.tokens) for p in ps[:CALIBRATION]] for k in fixed}
        V = [float(np.mean([s[2] for u in calibration[k] for s in u["steps"]])) for k in fixed]
        profile = theory.estimate_profile([(d, a) for u in calibration[KMAX] for d, a, _ in u["steps"]], KMAX,
                                          prior=(1, 1))
        k_hat = int(theory.best_draft_length_for(V, profile))
        cells = [*(f"k={k}" for k in fixed), "heuristic", "online", "transformers-assisted"]
        units: dict[str, list[dict]] = {c: [] for c in cells}
        # one policy object per kind, carried from prompt to prompt (as transformers keeps num_assistant_tokens
        # across generate calls with one assistant): what an engine serving a stream of requests does
        policies = {"heuristic": Heuristic(KMAX), "online": Online(V)}
        for i, prompt in enumerate(ps[CALIBRATION:]):
            for cell in cells if i % 2 == 0 else cells[::-1]:
                if cell == "transformers-assisted":
                    units[cell].append(hf_assisted(target, draft_model, prompt, args.tokens))
                    continue
                k = policies.get(cell, None) or int(cell[2:])
                units[cell].append(decode(target, draft_model, prompt, k, args.tokens))
        plain = [u["tokens"] for u in units["k=0"]]
        rows = {c: summarize(u, args.tokens) | {"greedy_exact": [x["tokens"] for x in u] == plain}
                for c, u in units.items()}
        best = max(fixed, key=lambda k: rows[f"k={k}"]["tokens_per_s"])
        for row in rows.values():
            row["vs_best_constant"] = row["tokens_per_s"] / rows[f"k={best}"]["tokens_per_s"]
        result["kinds"][kind] = {"V_s": V, "profile_calibration": profile, "k_hat_plan": k_hat,
                                 "best_constant_k": best, "cells": rows}
        print(f"{kind}: V(k) ms {[round(v * 1e3, 2) for v in V]}; profile "
              f"{[None if a is None else round(a, 3) for a in profile]}; plan k_hat {k_hat}, best constant k {best}")
        for cell, row in rows.items():
            print(f"  {cell:>22}: {row['tokens_per_s']:7.1f} tok/s  x{row['vs_best_constant']:.3f} of best constant"
                  f"  mean k {row['mean_k'] if row['mean_k'] is None else round(row['mean_k'], 2)}"
                  f"  greedy {'=' if row['greedy_exact'] else '!='} plain")
    if args.out:
        write_json(args.out, result)
    print(json.dumps({kind: {"best_constant_k": v["best_constant_k"], "k_hat_plan": v["k_hat_plan"],
                             **{c: round(v["cells"][c]["vs_best_constant"], 3) for c in
                                ("online", "heuristic", "transformers-assisted")}}
                      for kind, v in result["kinds"].items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

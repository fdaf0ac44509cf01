"""The draft length chosen four ways on the trained pair (moespec/data/pair: an OLMoE-class target at N = 64, m = 8
and a dense Llama-class draft sharing its tokenizer; issue 16), side by side in one run: every constant k,
transformers' heuristic schedule (in moespec's loop), the online policy, and transformers' own
generate(assistant_model=...), measured, and beside each the same cell replayed exactly on the prompts' agreement
sequences with the calibration's step times (the policy's quality without the machine's noise). The method is
moespec.measure.drafting's (physics in its docstring).

Prompts: Spec-Bench questions (../shared/data/spec_bench/question.jsonl, first turn, a seeded sample over its 13
categories) and WikiText-2 test passages (seeded starts), tokenized by the pair's tokenizer, CONTEXT_TOKENS each;
--prompts scored ones of each kind after --calibration calibration prompts; --tokens generated per prompt (greedy).
Ends with one JSON line; --out writes the result file (device, dtype, versions, timestamp, command).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

import numpy as np
import torch

from moespec import MoespecError
from moespec.console import console
from moespec.defaults import PAIR_DIR
from moespec.formats.files import provenance, write_json
from moespec.measure.drafting import HF_ASSISTED, compare
from moespec.measure.level import Level, check_level, describe
from moespec.model.load import load_draft

KMAX = 8
# Calibration prompts per kind: V(k) and the profile the plan and the online policy start from. Two let the profile
# of one passage decide (WikiText, 2026-12-01: k_hat 4 against a measured best of 0). Replayed on the pair's
# agreement sequences (2026-12-02, 100 draws, the pooled profile), k_hat came within one of 24 scored prompts' best
# constant in 86-94% of draws on Spec-Bench and 51-60% on WikiText with six, 99% and 60-74% with twelve; each costs
# ~20 s per kind (every k, REPEATS times).
CALIBRATION_PROMPTS = 12
# Decodings of each prompt per cell, the median kept: one decoding is ~0.7 s, and the host slows whole seconds of
# them by 10-40% (2026-12-01: the largest of nine constants read 10% above the same k chosen on held-out prompts).
REPEATS = 3
LEVEL_WAIT_S = 120.0  # a kind's cells take ~5 minutes at 24 prompts; the host holds a level for seconds to minutes
CONTEXT_TOKENS = 96  # prompt tokens kept (the pair was trained on 128-token sequences)


def prompts(tokenizer, data: Path, count: int) -> dict[str, list[list[int]]]:
    """Token ids of `count` prompts per kind (the first --calibration of them calibrate)."""
    out: dict[str, list[list[int]]] = {}
    bench = data / "spec_bench" / "question.jsonl"
    if bench.is_file():
        rows = [json.loads(line) for line in bench.read_text().splitlines() if line.strip()]
        texts = [r["turns"][0] for r in rows if r.get("turns")]
        # a seeded sample over the whole file: it is ordered by category (10 writing questions first, ...), so its
        # first prompts would calibrate on one category and score on others
        picks = np.random.default_rng(0).permutation(len(texts))[:count]
        out["spec-bench"] = [tokenizer(texts[i])["input_ids"][-CONTEXT_TOKENS:] for i in picks.tolist()]
    wiki = data / "wikitext-2" / "wiki.test.raw"
    if wiki.is_file():
        ids = tokenizer(wiki.read_text(encoding="utf-8"))["input_ids"]
        starts = np.random.default_rng(0).integers(0, len(ids) - CONTEXT_TOKENS, size=count)
        out["wikitext"] = [ids[s:s + CONTEXT_TOKENS] for s in starts.tolist()]
    if not out:
        raise SystemExit(f"no prompts: neither {bench} nor {wiki} is here")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pair", default=str(PAIR_DIR))
    p.add_argument("--data", default=str(Path(__file__).resolve().parents[2] / "shared" / "data"))
    p.add_argument("--prompts", type=int, default=12, help="scored prompts per kind (default 12)")
    p.add_argument("--calibration", type=int, default=CALIBRATION_PROMPTS,
                   help=f"calibration prompts per kind, before the scored ones (default {CALIBRATION_PROMPTS})")
    p.add_argument("--repeats", type=int, default=REPEATS,
                   help=f"decodings of each prompt per cell, the median kept (default {REPEATS})")
    p.add_argument("--tokens", type=int, default=128, help="tokens generated per prompt (default 128)")
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    p.add_argument("--pin-wait", type=float, default=LEVEL_WAIT_S,
                   help=f"seconds per kind of prompt to wait for the host's bandwidth level (default {LEVEL_WAIT_S:g}; "
                        "0: no pinning)")
    p.add_argument("--out", help="write the result JSON here")
    args = p.parse_args(argv)
    try:  # every argument checked before the models load: one line and exit 2
        check_level(None, args.pin_wait)
    except MoespecError as e:
        p.error(str(e))
    for flag, value in (("--prompts", args.prompts), ("--calibration", args.calibration), ("--repeats", args.repeats),
                        ("--tokens", args.tokens - 1)):
        if value < 1:
            p.error(f"{flag} must be >= {2 if flag == '--tokens' else 1}")
    from transformers import AutoTokenizer

    torch.set_num_threads(2)
    pair = Path(args.pair)
    tokenizer = AutoTokenizer.from_pretrained(pair / "target", local_files_only=True)
    target, draft = load_draft(str(pair / "target"), args.dtype), load_draft(str(pair / "draft"), args.dtype)
    result: dict = {"provenance": provenance("cpu", args.dtype) | {"command": shlex.join([sys.executable, *sys.argv])},
                    "pair": str(pair), "tokens": args.tokens, "kinds": {}}
    for kind, ps in prompts(tokenizer, Path(args.data), args.calibration + args.prompts).items():
        found = result["kinds"][kind] = compare(target, draft, ps, args.tokens, KMAX, with_hf=True,
                                                level=Level(wait_s=args.pin_wait), calibration=args.calibration,
                                                repeats=args.repeats)
        print(f"{kind}: V(k) ms {[round(v * 1e3, 2) for v in found['V_s']]}; profile "
              f"{[round(a, 3) for a in found['profile_calibration']]}; plan k_hat {found['k_hat_plan']}, best "
              f"constant k {found['best_constant_k']} (held out: k = {found['best_held_out_k']})")
        ceiling = found["ceiling_gbps"]
        print(f"  ceiling (streaming read): {ceiling['before']:.1f} GB/s before the cells, {ceiling['after']:.1f} "
              "after")
        console().print(f"  {describe(found['level']) or 'level: none pinned'}")
        for cell, row in found["cells"].items():
            mean_k = "-" if row["mean_k"] is None else f"{row['mean_k']:.2f}"
            med, lo, hi = row["vs_best_constant_paired"]
            replayed = f"x{found['replay'][cell]:.3f}" if cell in found["replay"] else "  -   "
            print(f"  {cell:>22}: {row['tokens_per_s']:7.1f} tok/s  x{row['vs_best_constant']:.3f} of best "
                  f"constant, x{row['vs_best_held_out']:.3f} of the held-out best (per prompt {med:.3f} "
                  f"[{lo:.3f}, {hi:.3f}]; replayed {replayed})  mean k {mean_k}  "
                  f"greedy {'=' if row['greedy_exact'] else '!='} plain")
    if args.out:
        write_json(args.out, result)
    print(json.dumps({kind: {"best_constant_k": v["best_constant_k"], "k_hat_plan": v["k_hat_plan"],
                             **{c: round(v["cells"][c]["vs_best_constant"], 3) for c in
                                ("online", "heuristic", HF_ASSISTED)},
                             "held_out": {c: round(v["cells"][c]["vs_best_held_out"], 3) for c in
                                          ("online", "heuristic")},
                             "replayed": {c: round(v["replay"][c], 3) for c in ("online", "heuristic")}}
                      for kind, v in result["kinds"].items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

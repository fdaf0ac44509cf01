"""Train the project's MoE target and dense draft on WikiText-2, on this 2-core CPU, and write them as Hugging Face
checkpoints with a model card (issue 16). Run once by a developer; the results are committed under
moespec/data/pair/, so tests and the demo never need ../shared or a download. The library never imports this file.

What it trains (every number below is a named constant):
- a byte-level BPE tokenizer (the `tokenizers` library) of VOCAB ids on the training split;
- the target: OLMoE (transformers' OlmoeForCausalLM) at OLMoE-1B-7B's routing shape, N = 64 experts and top
  m = 8 per token, with LAYERS small layers (hidden HIDDEN, expert width EXPERT_WIDTH), the router's
  load-balancing loss on (router_aux_loss_coef), so it learns routing, not a collapse onto a few experts;
- the draft: a dense Llama-class model (LlamaForCausalLM) of DRAFT_LAYERS layers sharing the tokenizer.
Both train on the same token stream (AdamW, cosine decay, seeded), in bf16 weights for the files (trained in fp32).
Splits: ../shared/data/wikitext-2 holds the valid and test splits (no train split); training uses wiki.valid.tokens
(its last 5% held back to stop training when it stops improving) and wiki.test.raw is held out for the card's
numbers (loss, the draft's greedy agreement with the target).

Usage: .venv/bin/python scripts/train_pair.py [--data ../shared/data/wikitext-2] [--out moespec/data/pair]
       [--minutes 45]
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
import time
from pathlib import Path

import numpy as np
import torch

VOCAB = 4096  # BPE ids: ~4 bytes per token on English text; a small embedding table (the files stay a few MB)
HIDDEN, LAYERS, HEADS = 128, 4, 4
N_EXPERTS, TOP_K, EXPERT_WIDTH = 64, 8, 32  # OLMoE-1B-7B's N and m; its f is 1024, here 32
DRAFT_HIDDEN, DRAFT_LAYERS, DRAFT_WIDTH = 128, 2, 256
CONTEXT = 128  # tokens per training sequence
BATCH = 16  # sequences per step
LR, WARMUP, WEIGHT_DECAY = 3e-3, 50, 0.1
AUX = 0.01  # OLMoE's router_aux_loss_coef: balances the experts' load
SEED = 0
EVAL_TOKENS = 20_000  # held-out tokens for the card's loss
STOP_SHARE = 0.05  # the last 5% of the training split, held back to stop early (never the test split)
CHECK_EVERY, PATIENCE = 50, 3
ACCEPT_PROMPTS, ACCEPT_LEN, ACCEPT_DRAFT = 32, 64, 4  # held-out greedy agreement: prompts of 64 tokens, 4 drafted


def tokenizer_for(text: str):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([text], trainer)
    return tok


def configs():
    from transformers import LlamaConfig, OlmoeConfig

    common = dict(vocab_size=VOCAB, max_position_embeddings=4 * CONTEXT, bos_token_id=0, eos_token_id=0,
                  pad_token_id=0, tie_word_embeddings=False, rms_norm_eps=1e-5)
    target = OlmoeConfig(**common, hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                         num_key_value_heads=HEADS, num_experts=N_EXPERTS, num_experts_per_tok=TOP_K,
                         intermediate_size=EXPERT_WIDTH, router_aux_loss_coef=AUX, output_router_logits=True)
    draft = LlamaConfig(**common, hidden_size=DRAFT_HIDDEN, num_hidden_layers=DRAFT_LAYERS, num_attention_heads=HEADS,
                        num_key_value_heads=HEADS, intermediate_size=DRAFT_WIDTH)
    return target, draft


def batches(ids: np.ndarray, rng: np.random.Generator):
    while True:
        starts = rng.integers(0, ids.size - CONTEXT - 1, size=BATCH)
        yield torch.from_numpy(np.stack([ids[s:s + CONTEXT + 1] for s in starts]).astype(np.int64))


def train(model, ids: np.ndarray, stop_ids: np.ndarray, seconds: float, name: str) -> list[dict]:
    """AdamW with warm-up and cosine decay over the time budget, stopped early (the weights of the best check
    kept) once the loss on `stop_ids` (a slice of the training split held back) has not improved for PATIENCE
    checks of every CHECK_EVERY steps: 300k tokens overfit a few-million-parameter model within a few epochs.
    Returns the loss curve (every 20 steps, and each check's stop loss)."""
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY, betas=(0.9, 0.95))
    rng = np.random.default_rng(SEED)
    curve, start, step, recent = [], time.time(), 0, []
    best, best_state, waited = float("inf"), None, 0
    model.train()
    for batch in batches(ids, rng):
        spent = time.time() - start
        if spent > seconds:
            break
        if step and step % CHECK_EVERY == 0:
            model.eval()
            check = held_out_loss(model, stop_ids)
            model.train()
            curve.append({"step": step, "seconds": round(spent, 1), "stop_loss": round(check, 4)})
            print(f"{name} step {step} stop loss {check:.4f}", flush=True)
            if check < best:
                best, waited = check, 0
                best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
            else:
                waited += 1
                if waited >= PATIENCE:
                    break
        frac = spent / seconds
        for group in opt.param_groups:
            group["lr"] = LR * min(1.0, (step + 1) / WARMUP) * 0.5 * (1 + math.cos(math.pi * frac))
        out = model(input_ids=batch[:, :-1], labels=batch[:, :-1].clone())
        loss = out.loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        recent.append(float(loss))
        step += 1
        if step % 20 == 0:
            curve.append({"step": step, "seconds": round(spent, 1), "loss": round(float(np.mean(recent)), 4)})
            recent = []
            print(f"{name} step {step} {spent:.0f}s loss {curve[-1]['loss']}", flush=True)
    if best_state is not None:
        model.load_state_dict(best_state)
    model.eval()
    return curve


@torch.no_grad()
def held_out_loss(model, ids: np.ndarray) -> float:
    """Next-token cross-entropy (nats) on held-out text, the router's balancing loss left out."""
    losses = []
    for s in range(0, min(ids.size, EVAL_TOKENS) - CONTEXT - 1, CONTEXT):
        chunk = torch.from_numpy(ids[s:s + CONTEXT + 1].astype(np.int64))[None]
        logits = model(input_ids=chunk[:, :-1]).logits[0]
        losses.append(float(torch.nn.functional.cross_entropy(logits.float(), chunk[0, 1:])))
    return float(np.mean(losses))


@torch.no_grad()
def greedy_agreement(target, draft, ids: np.ndarray) -> float:
    """The share of positions where the draft's greedy token equals the target's, on held-out prefixes: the
    per-position acceptance of greedy drafting when the draft follows the target's own context."""
    rng = np.random.default_rng(SEED)
    hits = total = 0
    for s in rng.integers(0, ids.size - ACCEPT_LEN - 1, size=ACCEPT_PROMPTS):
        x = torch.from_numpy(ids[s:s + ACCEPT_LEN].astype(np.int64))[None]
        t = target(input_ids=x).logits.argmax(-1)
        d = draft(input_ids=x).logits.argmax(-1)
        hits += int((t == d).sum())
        total += t.numel()
    return hits / total


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default="../shared/data/wikitext-2")
    p.add_argument("--out", default="moespec/data/pair")
    p.add_argument("--minutes", type=float, default=45.0, help="training time, target and draft together")
    args = p.parse_args(argv)
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(SEED)
    torch.set_num_threads(2)
    data = Path(args.data)
    train_text = (data / "wiki.valid.tokens").read_text(encoding="utf-8")
    held_text = (data / "wiki.test.raw").read_text(encoding="utf-8")
    tok = tokenizer_for(train_text)
    all_ids = np.array(tok.encode(train_text).ids, dtype=np.int32)
    cut = int(all_ids.size * (1 - STOP_SHARE))
    train_ids, stop_ids = all_ids[:cut], all_ids[cut:]
    held_ids = np.array(tok.encode(held_text).ids, dtype=np.int32)
    print(f"tokens: train {train_ids.size:,}, held out {held_ids.size:,}", flush=True)
    target_cfg, draft_cfg = configs()
    target = AutoModelForCausalLM.from_config(target_cfg)
    draft = AutoModelForCausalLM.from_config(draft_cfg)
    budget = args.minutes * 60
    curves = {"target": train(target, train_ids, stop_ids, 0.75 * budget, "target"),
              "draft": train(draft, train_ids, stop_ids, 0.25 * budget, "draft")}
    card = {"command": shlex.join([sys.executable, *sys.argv]), "data": {
                "train": "WikiText-2 wiki.valid.tokens (its last 5% held back to stop early)",
                "held_out": "WikiText-2 wiki.test.raw", "train_tokens": int(train_ids.size),
                "stop_tokens": int(stop_ids.size), "held_out_tokens": int(held_ids.size)},
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "torch": torch.__version__,
            "settings": {k: v for k, v in globals().items() if k.isupper()},
            "loss_curve": curves,
            "held_out_loss": {"target": held_out_loss(target, held_ids), "draft": held_out_loss(draft, held_ids)},
            "held_out_greedy_agreement": greedy_agreement(target, draft, held_ids), "chance": 1 / VOCAB}
    out = Path(args.out)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>")
    target.config.output_router_logits = False  # a checkpoint for inference: no balancing loss
    for name, model in (("target", target), ("draft", draft)):
        model.to(torch.bfloat16).save_pretrained(out / name)
        fast.save_pretrained(out / name)
    (out / "card.json").write_text(json.dumps(card, indent=1) + "\n")
    print(json.dumps({k: card[k] for k in ("held_out_loss", "held_out_greedy_agreement")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A verification pass of B sequences in one, and greedy speculative decoding of B sequences at once.

Physics first. A server verifies the drafts of B sequences in one pass of T = n_1 + ... + n_B tokens. The dense
weights are read once per pass whatever B; each sequence's attention reads its own KV cache, at its own length
(lengths part as soon as two sequences accept differently); and the expert operation of each MoE layer reads the
union of the experts the pass's T tokens select: U^B(n) of the model's N experts (moespec.routing.batch), which at
B n of some tens of tokens is nearly all of them. So the pass is one call of each matrix and of the MoE block over
all T rows, and one attention per sequence over its own cache; the kernel of the expert operation (slot, dedup, or
AUTO's choice) is picked by the pass's T tokens (moespec.model.policies).

Two ways a pass runs, both computing the function that feeding each sequence alone computes:
- lean (OLMoE, Qwen3-MoE, Mixtral where moespec.model.lean applies): the lean pass's decoder layer on all T rows,
  the projections once, rotary and attention per sequence (`Lean.attention_block` with one part per sequence);
- layers (the five supported classes otherwise, e.g. DeepSeek-V2's MLA and gpt-oss's sliding windows):
  transformers' own attention module per sequence with its own causal mask, positions and cache, then the
  post-attention norm and the MLP module once over all T rows.
A model of another class, or a call with hooks on the model, is fed one sequence at a time (no union of experts).
B = 1 is the single-sequence engine's own pass (moespec.model.speculative.forward_logits).

Decoding. Every sequence drafts the same k a step (as vLLM, SGLang and TensorRT-LLM do at one step), the B
proposals are verified in one pass, and each sequence keeps its own agreeing prefix and the target's token after
it: each accepts independently, so a step emits sum_b (accepted_b + 1) tokens, and each sequence's tokens are
exactly its greedy decoding's (tests/test_batched.py, all five classes). Sequences that reach max_new stay in the
batch to its end (a server would refill the slot), so every pass of a decoding has B sequences.

Shapes: tokens[b] the n_b >= 1 tokens sequence b feeds after caches[b]; the pass's rows T in sequence order;
logits [n_b, vocab] per sequence.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

from moespec import MoespecError
from moespec.defaults import BATCH_LIMIT
from moespec.model import lean as lean_module
from moespec.model.dense import lean_pass
from moespec.model.spec import SUPPORTED_MODEL_TYPES
from moespec.model.speculative import Draft, Prefill, sync_device, forward_logits, prefill

__all__ = ["BatchStep", "batch_logits", "batch_pass_kind", "BatchGreedy", "batch_decode_steps",
           "batch_speculative_decode"]

MASKS = {"full_attention": create_causal_mask, "sliding_attention": create_sliding_window_causal_mask}

# Called before each pass with (positions, n): sequence b's pass feeds n tokens, the first of them its
# positions[b]-th generated token; outside every timed interval (moespec.measure.batch_run replays routing by it).
BatchRoute = Callable[[list[int], int], None]


def _layout_problem(model: Any) -> str | None:
    """Why the layers path does not take this model (None: it does)."""
    if getattr(model.config, "model_type", None) not in SUPPORTED_MODEL_TYPES:
        return f"model type {getattr(model.config, 'model_type', None)!r} is not one of moespec's five classes"
    body = getattr(model, "model", None)
    if body is None or not all(hasattr(body, a) for a in ("embed_tokens", "rotary_emb", "layers", "norm")):
        return "the model has no embed_tokens, rotary_emb, layers and norm"
    for layer in body.layers:
        if not all(hasattr(layer, a) for a in ("input_layernorm", "self_attn", "post_attention_layernorm", "mlp")):
            return f"decoder layer {type(layer).__name__} is not the pre-norm attention + mlp layout"
    return None


def _lean_takes(model: Any, tokens: Sequence[Sequence[int]], caches: Sequence[Any]) -> lean_module.Lean | None:
    lean = lean_pass(model)
    if lean is None or model._forward_hooks or model._forward_pre_hooks or lean_module._global_hooks():
        return None
    for ids, cache in zip(tokens, caches):
        call = {"input_ids": torch.tensor([list(ids)]), "cache": cache}
        if lean_module.takes_call(model, call) is None:
            return None
    return lean


def batch_pass_kind(model: Any, tokens: Sequence[Sequence[int]], caches: Sequence[Any]) -> str:
    """How `batch_logits` runs this pass: "single" (B = 1), "lean", "layers" or "one by one (why)"."""
    if len(tokens) == 1:
        return "single"
    if _lean_takes(model, tokens, caches) is not None:
        return "lean"
    problem = _layout_problem(model)
    if problem is None and not (model._forward_hooks or model._forward_pre_hooks):
        return "layers"
    return f"one by one ({problem or 'hooks on the model'})"


def _check(tokens: Sequence[Sequence[int]], caches: Sequence[Any]) -> None:
    if not isinstance(tokens, Sequence) or not 1 <= len(tokens) <= BATCH_LIMIT:
        raise ValueError(f"tokens must be a list of 1..{BATCH_LIMIT} sequences' token lists")
    if not isinstance(caches, Sequence) or len(caches) != len(tokens):
        raise ValueError(f"caches must hold one cache per sequence ({len(tokens)}), got "
                         f"{len(caches) if isinstance(caches, Sequence) else type(caches).__name__}")
    for b, ids in enumerate(tokens):
        if not isinstance(ids, Sequence) or not ids or not all(isinstance(t, int) and t >= 0 for t in ids):
            raise ValueError(f"tokens[{b}] must be a non-empty list of token ids")
    if len({id(c) for c in caches}) != len(caches):
        raise ValueError("caches: each sequence needs a cache of its own")


def batch_logits(model: Any, tokens: Sequence[Sequence[int]], caches: Sequence[Any]) -> list[torch.Tensor]:
    """Logits [n_b, vocab] of each sequence's tokens fed after its cache, which receives their keys and values, in
    one pass of all the sequences' tokens (module docstring)."""
    _check(tokens, caches)
    kind = batch_pass_kind(model, tokens, caches)
    if kind == "single":
        return [forward_logits(model, list(tokens[0]), caches[0])]
    if kind.startswith("one by one"):
        return [forward_logits(model, list(ids), cache) for ids, cache in zip(tokens, caches)]
    ids = torch.tensor([[t for seq in tokens for t in seq]], device=model.device)
    starts = [0]
    for seq in tokens:
        starts.append(starts[-1] + len(seq))
    rows = [slice(a, b) for a, b in zip(starts, starts[1:])]
    if kind == "lean":
        return _lean_pass(_lean_takes(model, tokens, caches), ids, rows, caches)
    return _layers_pass(model, ids, rows, caches)


def _lean_pass(lean: lean_module.Lean, ids: torch.Tensor, rows: list[slice], caches: Sequence[Any]
               ) -> list[torch.Tensor]:
    h = lean.model.model.embed_tokens(ids)[0]  # [T, d]
    parts = [(r, *lean.rotary(h, cache.get_seq_length(), r.stop - r.start), cache) for r, cache in zip(rows, caches)]
    for layer in lean.model.model.layers:
        h = lean.decoder_layer(layer, h, parts)
    logits = lean.head(h)
    return [logits[r] for r in rows]


def _layer_kind(config: Any, i: int) -> str:
    """The attention of decoder layer i: the config's layer_types where it has them, else one kind for all."""
    kinds = getattr(config, "layer_types", None)
    if kinds:
        return kinds[i]
    return "sliding_attention" if getattr(config, "sliding_window", None) else "full_attention"


def _layers_pass(model: Any, ids: torch.Tensor, rows: list[slice], caches: Sequence[Any]) -> list[torch.Tensor]:
    body, config = model.model, model.config
    h = body.embed_tokens(ids)  # [1, T, d]
    kinds = [_layer_kind(config, i) for i in range(len(body.layers))]
    inputs = []  # per sequence: positions [1, n_b], position embeddings, mask per attention kind
    for r, cache in zip(rows, caches):
        x = h[:, r]
        past = cache.get_seq_length()
        positions = torch.arange(past, past + x.shape[1], device=h.device).unsqueeze(0)
        masks = {kind: MASKS[kind](config=config, inputs_embeds=x, attention_mask=None, cache=cache,
                                   position_ids=positions) for kind in set(kinds)}
        inputs.append((positions, body.rotary_emb(x, positions), masks))
    for layer, kind in zip(body.layers, kinds):
        parts = []
        for r, cache, (positions, embeddings, masks) in zip(rows, caches, inputs):
            x = h[:, r]
            attended, _ = layer.self_attn(hidden_states=layer.input_layernorm(x), attention_mask=masks[kind],
                                          position_ids=positions, cache=cache, use_cache=True,
                                          position_embeddings=embeddings)
            parts.append(x + attended)
        h = torch.cat(parts, dim=1)
        out = layer.mlp(layer.post_attention_layernorm(h))
        h = h + (out[0] if isinstance(out, tuple) else out)  # gpt-oss's MLP also returns its router scores
    logits = model.lm_head(body.norm(h))[0]
    return [logits[r] for r in rows]


# ---------------------------------------------------------------- decoding

@dataclass(frozen=True)
class BatchStep:
    """One speculative step of B sequences: each drafted `drafted` tokens and kept accepted[b]; seconds."""

    drafted: int
    accepted: tuple[int, ...]
    verify_s: float
    step_s: float
    draft_s: float
    host_s: float  # step_s less verify_s and draft_s


@dataclass
class BatchGreedy:
    """A transformers model with one KV cache per sequence, verifying all sequences in one pass."""

    model: Any
    caches: list[Any]

    def forward(self, tokens: Sequence[Sequence[int]]) -> list[list[int]]:
        """The greedy token after each prefix of each sequence's tokens (its work finished when it returns)."""
        out = [logits.argmax(-1).tolist() for logits in batch_logits(self.model, tokens, self.caches)]
        sync_device(self.model.device)
        return out

    def timed(self, tokens: Sequence[Sequence[int]]) -> float:
        """Seconds of one pass of the sequences' tokens (a verify pass of B sequences, every logit computed); the
        caches are rolled back afterwards, so passes can be timed again and again (as speculative.timed_forward)."""
        with torch.inference_mode():
            sync_device(self.model.device)
            start = time.perf_counter()
            batch_logits(self.model, tokens, self.caches)
            sync_device(self.model.device)
            seconds = time.perf_counter() - start
            self.rollback([len(t) for t in tokens])
        return seconds

    def rollback(self, counts: Sequence[int]) -> None:
        """Drop the last counts[b] positions of sequence b's cache (crop(0) still trims sliding layers)."""
        for cache, count in zip(self.caches, counts):
            if cache.get_seq_length() > 0:
                cache.crop(-count)


def batch_decode_steps(target: BatchGreedy, histories: list[list[int]], firsts: list[int], drafts: Sequence[Draft],
                       k: int, max_new: int, route: BatchRoute | None = None, until_first: bool = False
                       ) -> tuple[list[list[int]], list[BatchStep]]:
    """The speculative loop of moespec.model.speculative.decode_steps for B sequences at once: target's cache b
    holds histories[b], firsts[b] is the greedy token after it; each step every draft proposes k tokens, one pass
    verifies all B proposals, each sequence keeps its agreeing prefix and the target's token after it and rolls back
    the rest. Returns max_new tokens per sequence (its first included) and the steps' records; `until_first`:
    stop when the first sequence has max_new tokens (the others then have fewer: a measurement keeps every
    sequence inside its known continuation)."""
    tokens = [[first] for first in firsts]
    histories = [history + [first] for history, first in zip(histories, firsts)]
    records = []
    done = max if until_first else min
    while done(len(t) for t in tokens) < max_new:
        if route is not None:  # outside the step's time
            route([len(t) - 1 for t in tokens], k + 1)
        start = time.perf_counter()
        proposals = [list(draft.propose(history, k)) for draft, history in zip(drafts, histories)]
        if any(len(p) != k for p in proposals):
            raise MoespecError(f"a draft proposed {[len(p) for p in proposals]} tokens when asked for {k}")
        drafted = time.perf_counter()
        greedy = target.forward([[history[-1], *proposal] for history, proposal in zip(histories, proposals)])
        verified = time.perf_counter()
        accepted = [next((i for i, (d, t) in enumerate(zip(p, g)) if d != t), k) for p, g in zip(proposals, greedy)]
        target.rollback([k - j for j in accepted])
        for b, (p, g, j) in enumerate(zip(proposals, greedy, accepted)):
            new = [*p[:j], g[j]]
            tokens[b] += new
            histories[b] += new
        end = time.perf_counter()
        records.append(BatchStep(k, tuple(accepted), verified - drafted, end - start, drafted - start,
                                 end - verified))
    return [t[:max_new] for t in tokens], records


def batch_speculative_decode(model: Any, prompts: Sequence[torch.LongTensor], drafts: Sequence[Draft], k: int,
                             max_new: int, prefilled: Sequence[Prefill] | None = None,
                             route: BatchRoute | None = None) -> tuple[list[list[int]], list[BatchStep]]:
    """max_new greedy tokens for each of B prompts ([1, P_b] each) by speculative decoding of all B at once, k
    draft tokens a step from drafts[b] (k = 0: plain decoding of the batch); `prefilled`: a `prefill` per prompt,
    whose caches are copied, so many decodings share them."""
    if not isinstance(k, int) or isinstance(k, bool) or k < 0:
        raise ValueError(f"k must be a whole number >= 0, got {k!r}")
    if not isinstance(max_new, int) or isinstance(max_new, bool) or max_new < 0:
        raise ValueError(f"max_new must be a whole number >= 0, got {max_new!r}")
    if not 1 <= len(prompts) <= BATCH_LIMIT or len(drafts) != len(prompts):
        raise ValueError(f"prompts and drafts must be 1..{BATCH_LIMIT} of each, one draft per prompt; got "
                         f"{len(prompts)} prompts and {len(drafts)} drafts")
    histories = []
    for b, ids in enumerate(prompts):
        if not isinstance(ids, torch.Tensor) or ids.ndim != 2 or ids.shape[0] != 1 or ids.shape[1] < 1:
            raise ValueError(f"prompts[{b}] must be one sequence [1, P >= 1]")
        histories.append(ids[0].tolist())
    if prefilled is not None and [p.length for p in prefilled] != [len(h) for h in histories]:
        raise ValueError("prefilled must hold one prefill of each prompt, in order")
    if max_new == 0:
        return [[] for _ in prompts], []
    states = list(prefilled) if prefilled is not None else [prefill(model, ids) for ids in prompts]
    target = BatchGreedy(model, [copy.deepcopy(s.cache) for s in states])
    with torch.inference_mode():
        return batch_decode_steps(target, histories, [s.first for s in states], drafts, k, max_new, route)

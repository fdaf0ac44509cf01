"""Greedy speculative decoding, in the spirit of gpt-fast: draft k tokens, verify them in one pass, keep the prefix.

Physics first. Decoding one token costs one pass over the target's bytes, whatever the pass's size as long
as it stays memory-bound; a pass of k+1 tokens therefore costs little more than a pass of one, except for the
expert bytes an MoE pass adds with every distinct expert its tokens route to. A step feeds the last accepted
token and k drafted ones through the target in ONE forward with the KV cache, keeps the longest prefix of
the draft on which the target's greedy choice agrees, and appends the target's own token after it: every step
yields accepted+1 tokens, and the output is exactly greedy decoding's (`plain_decode`), only the number of
passes changes. The rejected drafts' keys and values are cut from the cache (DynamicCache.crop). A draft that
each position matches with probability a, independently, is accepted geometrically: P(accepted >= j) = a^j.

Drafts implement `propose(tokens_so_far, k) -> k tokens`, tokens_so_far being the prompt and every token
decoded so far:
- `OracleDraft`: the target's own greedy continuation, each token replaced with probability 1-a by another
  one at random: acceptance is geometric at rate a exactly, with no draft model to pay for;
- `ModelDraft`: a small causal LM sharing the tokenizer, greedy, with its own KV cache kept in step. It also
  drafts token by token with each token's probability (`propose_while`), for a policy that stops a step where the
  draft is unsure (moespec.model.adaptive.Online.more).

Timing (StepRecord, seconds, perf_counter with CUDA synchronized around the verify forward): draft_s the
proposal, verify_s the target's forward, host_s the rest of the step (argmax, acceptance, cache crop).
transformers v5 notes: crop takes a negative count of tokens to drop, and sliding-window cache layers
(gpt-oss) can only roll back while `activate_past_recording` keeps the tokens past the window until crop.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import numpy as np
import torch

from moespec import MoespecError
from moespec.model.adaptive import DraftLength
from moespec.model.cache import new_cache
from moespec.model.dense import lean_pass
from moespec.model.load import cache_argument

__all__ = ["StepRecord", "Draft", "Greedy", "TorchGreedy", "OracleDraft", "GreedyDraft", "ModelDraft", "NO_DRAFT",
           "Prefill", "prefill", "forward_logits", "sync_device", "timed_forward", "plain_decode", "speculative_decode",
           "decode_steps", "realized_acceptance", "acceptance_rate"]


@dataclass(frozen=True)
class StepRecord:
    """One speculative step: `drafted` tokens proposed, `accepted` of them kept; times in seconds."""

    drafted: int
    accepted: int
    verify_s: float
    step_s: float
    draft_s: float
    host_s: float  # step_s less verify_s and draft_s


# Called before each forward of decoding with (position, n): the pass feeds n tokens, the first of them the
# position-th generated token (0: the prompt's greedy successor). moespec.measure.run uses it to replay the experts of
# trace row `position` at every position, so routing is a function of the position alone and plain and
# speculative decoding see the same model. It runs outside every timed interval.
Route = Callable[[int, int], None]


class Draft(Protocol):
    def propose(self, tokens_so_far: list[int], k: int) -> list[int]:
        """k draft tokens to follow tokens_so_far (the prompt and the tokens decoded so far)."""


class Greedy(Protocol):
    """A causal LM with its KV cache, as speculative decoding drives it (a target or a draft; any engine):
    `forward` feeds tokens after the cache and returns the greedy token after each prefix (the last one only with
    `last_only`), its work finished when it returns; `rollback` drops the last `tokens` positions."""

    def forward(self, tokens: list[int], last_only: bool = False) -> list[int]: ...

    def rollback(self, tokens: int) -> None: ...


# ---------------------------------------------------------------- model plumbing

def forward_logits(model: Any, tokens: list[int], cache: Any, keep: int = 0) -> torch.Tensor:
    """Logits [len(tokens), vocab] of feeding `tokens` after the cache (only the last `keep` when keep > 0): the
    lean pass's direct call where it takes the call (moespec.model.lean), else the model's forward."""
    ids = torch.tensor([tokens], device=model.device)
    lean = lean_pass(model)
    logits = None if lean is None else lean.logits(ids, cache, keep)
    if logits is not None:
        return logits
    out = model(input_ids=ids, use_cache=True, logits_to_keep=keep, **{cache_argument(model): cache})
    return out.logits[0]


def _rollback(cache: Any, tokens: int) -> None:
    """Drop the last `tokens` positions; crop(0) still trims the sliding layers back to their window."""
    if cache.get_seq_length() > 0:
        cache.crop(-tokens)


@dataclass
class TorchGreedy:
    """A transformers model and a KV cache of it as a Greedy (CUDA synchronized before forward returns)."""

    model: Any
    cache: Any

    def forward(self, tokens: list[int], last_only: bool = False) -> list[int]:
        out = forward_logits(self.model, tokens, self.cache, keep=1 if last_only else 0).argmax(-1).tolist()
        sync_device(self.model.device)
        return out

    def forward_top(self, tokens: list[int]) -> tuple[int, float]:
        """As forward(tokens, last_only=True), with the greedy token's probability (softmax in fp32): the draft's
        confidence, which a confidence-aware draft-length policy reads (moespec.model.adaptive.Online.more)."""
        probability, token = torch.softmax(forward_logits(self.model, tokens, self.cache, keep=1)[-1].float(),
                                           -1).max(-1)
        sync_device(self.model.device)
        return int(token), float(probability)

    def rollback(self, tokens: int) -> None:
        _rollback(self.cache, tokens)


def sync_device(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA; nothing on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _prompt(prompt_ids: torch.Tensor) -> list[int]:
    if prompt_ids.ndim != 2 or prompt_ids.shape[0] != 1 or prompt_ids.shape[1] < 1:
        raise MoespecError(f"prompt_ids must be one sequence [1, P >= 1], got {tuple(prompt_ids.shape)}")
    return prompt_ids[0].tolist()


# ---------------------------------------------------------------- prefill and timed passes

@dataclass
class Prefill:
    """The KV cache of a prompt and the greedy token after it: what every decoding of that prompt starts from."""

    cache: Any
    first: int
    length: int


def prefill(model: Any, prompt_ids: torch.LongTensor) -> Prefill:
    """One forward of the whole prompt; decodings that pass `prefilled=` start from a copy of its cache."""
    history = _prompt(prompt_ids)
    cache = new_cache(model)
    with torch.inference_mode():
        first = int(forward_logits(model, history, cache, keep=1)[-1].argmax())
        _rollback(cache, 0)
    return Prefill(cache, first, len(history))


def prefill_all(model: Any, contexts: list[list[int]]) -> list[Prefill]:
    """Each context's `prefill`, their longest common prefix fed once: each context's own tokens extend a copy of
    that prefix's cache (prompts that share a system prompt, as served: moespec.measure.decoding.prompts)."""
    if not contexts or min(map(len, contexts)) < 1:
        raise ValueError(f"contexts must be one or more token lists of >= 1 token, got lengths "
                         f"{[len(c) for c in contexts]}")
    shared = min(map(len, contexts)) - 1  # every context keeps >= 1 own token, whose logits give its first token
    for context in contexts[1:]:
        shared = next((i for i in range(shared) if context[i] != contexts[0][i]), shared)
    if len(contexts) == 1 or shared == 0:
        return [prefill(model, torch.tensor([c], device=model.device)) for c in contexts]
    prefix = new_cache(model)
    with torch.inference_mode():
        forward_logits(model, contexts[0][:shared], prefix, keep=1)
        states = []
        for context in contexts:
            cache = copy.deepcopy(prefix)
            first = int(forward_logits(model, context[shared:], cache, keep=1)[-1].argmax())
            _rollback(cache, 0)
            states.append(Prefill(cache, first, len(context)))
    return states


def timed_forward(model: Any, tokens: list[int], state: Prefill) -> float:
    """Seconds of one forward of `tokens` (a verify pass) after the prefilled context, every logit computed;
    the cache is cropped back to the context afterwards, so passes can be timed again and again."""
    with torch.inference_mode():
        sync_device(model.device)
        start = time.perf_counter()
        forward_logits(model, tokens, state.cache)
        sync_device(model.device)
        seconds = time.perf_counter() - start
        _rollback(state.cache, len(tokens))
    return seconds


# ---------------------------------------------------------------- decoding

def plain_decode(model: Any, prompt_ids: torch.LongTensor, max_new: int, prefilled: Prefill | None = None,
                 route: Route | None = None, margins: list[float] | None = None) -> list[int]:
    """max_new greedy tokens after the prompt, one forward each with a KV cache (no stop at end-of-sequence);
    `prefilled`: a `prefill` of this prompt to start from (its cache is copied); `margins`, when given, receives
    the gap between the two largest logits behind every token after the first: how close greedy was to a tie."""
    prompt = _prompt(prompt_ids)
    if max_new < 0:
        raise MoespecError(f"max_new must be >= 0, got {max_new}")
    if prefilled is not None and prefilled.length != len(prompt):
        raise MoespecError(f"the prefill holds {prefilled.length} tokens but the prompt has {len(prompt)}")
    if max_new == 0:
        return []
    state = prefilled or prefill(model, prompt_ids)
    cache, tokens = copy.deepcopy(state.cache), [state.first]
    with torch.inference_mode():
        while len(tokens) < max_new:
            if route is not None:
                route(len(tokens) - 1, 1)
            logits = forward_logits(model, tokens[-1:], cache, keep=1)[-1]
            tokens.append(int(logits.argmax()))
            if margins is not None:
                top = logits.float().topk(2).values
                margins.append(float(top[0] - top[1]))
    return tokens


def speculative_decode(model: Any, prompt_ids: torch.LongTensor, draft: Draft, k: int | DraftLength, max_new: int,
                       prefilled: Prefill | None = None,
                       route: Route | None = None) -> tuple[list[int], list[StepRecord]]:
    """max_new greedy tokens by speculative decoding with k draft tokens a step (k = 0: plain decoding through
    the same loop), and a record of every step after the prompt's prefill (`prefilled`: a `prefill` of this
    prompt, whose cache is copied, so many decodings share one prefill)."""
    history = _prompt(prompt_ids)
    if (isinstance(k, int) and k < 0) or max_new < 0:
        raise MoespecError(f"need k >= 0 and max_new >= 0, got k={k}, max_new={max_new}")
    if prefilled is not None and prefilled.length != len(history):
        raise MoespecError(f"the prefill holds {prefilled.length} tokens but the prompt has {len(history)}")
    if max_new == 0:
        return [], []
    state = prefilled or prefill(model, prompt_ids)
    with torch.inference_mode():
        return decode_steps(TorchGreedy(model, copy.deepcopy(state.cache)), history, state.first, draft, k,
                            max_new, route)


def decode_steps(target: Greedy, history: list[int], first: int, draft: Draft, k: int | DraftLength, max_new: int,
                 route: Route | None = None) -> tuple[list[int], list[StepRecord]]:
    """The speculative loop on any engine: `target`'s cache holds `history` (the prompt), `first` is the greedy
    token after it; each step drafts k tokens (a fixed k, or a draft-length policy's next_k(), told each step's
    outcome: moespec.model.adaptive), verifies them with the last token in one forward, keeps the agreeing prefix
    and the target's token after it, and rolls the rejected positions back. Returns max_new tokens (first
    included) and the steps' records."""
    records, tokens = [], [first]
    history = history + tokens  # the last token is decoded but not yet in the cache
    policy = None if isinstance(k, int) else k
    # a policy that reads the draft's confidence drafts token by token (Online.first, Online.more), where the draft
    # reports it
    confident = policy is not None and hasattr(policy, "more") and getattr(draft, "confident", False)
    while len(tokens) < max_new:
        choosing = time.perf_counter()
        if policy is not None:
            k = policy.first() if confident else policy.next_k()
        chosen = time.perf_counter()
        if route is not None and not confident:  # outside the step's time
            route(len(tokens) - 1, k + 1)
        start = time.perf_counter() - (chosen - choosing)  # the policy's choice is part of the step
        if confident:
            proposal, confidences = draft.propose_while(history, policy.kmax if k else 0, policy.more)
            k = len(proposal)
        else:
            proposal = list(draft.propose(history, k))
        if len(proposal) != k:
            raise MoespecError(f"the draft proposed {len(proposal)} tokens when asked for {k}")
        drafted = time.perf_counter()
        if route is not None and confident:  # the length is known now; still outside the step's time
            route(len(tokens) - 1, k + 1)
            start += time.perf_counter() - drafted
            drafted = time.perf_counter()
        greedy = target.forward([history[-1], *proposal])  # greedy[i]: the target's token after proposal[:i]
        verified = time.perf_counter()
        accepted = next((i for i, (d, t) in enumerate(zip(proposal, greedy)) if d != t), k)
        target.rollback(k - accepted)
        new = [*proposal[:accepted], greedy[accepted]]
        tokens += new
        history += new
        end = time.perf_counter()
        if confident:
            policy.update(k, accepted, confidences)
        elif policy is not None:
            policy.update(k, accepted)
        records.append(StepRecord(k, accepted, verified - drafted, end - start, drafted - start, end - verified))
    return tokens[:max_new], records


def realized_acceptance(records: list[StepRecord]) -> float:
    """Accepted over drafted tokens over all steps (NaN when nothing was drafted). Under geometric acceptance
    at rate a it tends to a (1 - a^k) / ((1 - a) k): a itself only at k = 1."""
    drafted = sum(r.drafted for r in records)
    return sum(r.accepted for r in records) / drafted if drafted else math.nan


def acceptance_rate(records: list[StepRecord]) -> float:
    """The per-position acceptance a itself: accepted tokens over the positions tested, sum accepted /
    sum (accepted + [accepted < drafted]), the maximum-likelihood estimate of a geometric rate (NaN when
    nothing was drafted)."""
    tested = sum(r.accepted + (r.accepted < r.drafted) for r in records)
    return sum(r.accepted for r in records) / tested if tested else math.nan


# ---------------------------------------------------------------- drafts

@dataclass
class OracleDraft:
    """Proposes the target's greedy continuation of the prompt (`continuation`: plain_decode's tokens, which
    must cover max_new + k - 1 positions; past its end tokens are random), each token independently replaced
    with probability 1-a by a different token drawn uniformly from the vocabulary. `prompt_len` places the
    proposals: position p of the continuation follows prompt_len + p tokens.

    Whether position p is proposed right is decided once per position (a seeded uniform u_p < a), not per
    proposal, as a real greedy draft's agreement is a function of the text (moespec.measure.drafting). A step
    from p accepts the run of right positions from p, so acceptance is geometric at a; and every draft length k,
    and every a (u_p < a is monotone in a), decodes one prompt on the same sequence: cells compared at one seed
    differ by their k, not by their luck (common random numbers)."""

    continuation: list[int]
    a: float
    seed: int
    vocab_size: int
    prompt_len: int
    rng: np.random.Generator = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not 0.0 <= self.a <= 1.0 or self.vocab_size < 2 or self.prompt_len < 1:
            raise MoespecError(f"OracleDraft needs 0 <= a <= 1, vocab_size >= 2, prompt_len >= 1; "
                               f"got a={self.a}, vocab_size={self.vocab_size}, prompt_len={self.prompt_len}")
        self.rng = np.random.default_rng(self.seed)
        positions = len(self.continuation)
        self.right = self.rng.random(positions) < self.a  # [positions] whether p is proposed right
        self.other = self.rng.integers(self.vocab_size - 1, size=positions)  # [positions] a wrong one's rank

    def propose(self, tokens_so_far: list[int], k: int) -> list[int]:
        start = len(tokens_so_far) - self.prompt_len
        out = []
        for p in range(start, start + k):
            if p >= len(self.continuation):  # past the continuation: random tokens
                out.append(int(self.rng.integers(self.vocab_size)))
            elif self.right[p]:
                out.append(self.continuation[p])
            else:  # uniform over the vocabulary less the true token
                other = int(self.other[p])
                out.append(other + (self.continuation[p] <= other))
        return out


class _NoDraft:
    """Proposes nothing: decode_steps at k = 0 is plain greedy decoding."""

    def propose(self, tokens_so_far: list[int], k: int) -> list[int]:
        if k:
            raise MoespecError(f"NO_DRAFT proposes no tokens, asked for {k}")
        return []


NO_DRAFT = _NoDraft()


class GreedyDraft:
    """A draft model (any engine's Greedy) drafting greedily; its KV cache holds the longest prefix it shares with
    the tokens so far, so drafts the target rejected are rolled back before the next proposal."""

    def __init__(self, greedy: Greedy) -> None:
        self.greedy = greedy
        self.cached: list[int] = []  # the tokens whose keys and values the cache holds

    def prefill(self, prompt: list[int]) -> None:
        """Feed all of the prompt but its last token (the first proposal feeds that one), outside any step's
        time: a draft's prefill belongs to the prompt, as the target's does."""
        if len(prompt) > 1:
            self.greedy.forward(prompt[:-1], last_only=True)
            self.cached = list(prompt[:-1])

    def _catch_up(self, tokens_so_far: list[int]) -> list[int]:
        """Roll the cache back to the prefix it shares with tokens_so_far; the tokens to feed next."""
        shared = next((i for i, (a, b) in enumerate(zip(self.cached, tokens_so_far)) if a != b),
                      min(len(self.cached), len(tokens_so_far)))
        keep = min(shared, len(tokens_so_far) - 1)  # feed at least one token to get logits
        self.greedy.rollback(len(self.cached) - keep)
        self.cached = list(tokens_so_far[:keep])
        return list(tokens_so_far[keep:])

    def propose(self, tokens_so_far: list[int], k: int) -> list[int]:
        if k == 0:
            return []
        feed, out = self._catch_up(tokens_so_far), []
        for _ in range(k):
            next_token = self.greedy.forward(feed, last_only=True)[-1]
            self.cached += feed
            feed = [next_token]
            out.append(next_token)
        return out

    @property
    def confident(self) -> bool:
        """Whether it can draft with confidences (propose_while): its greedy engine reports them (forward_top)."""
        return hasattr(self.greedy, "forward_top")

    def propose_while(self, tokens_so_far: list[int], kmax: int, more: Callable[[list[float]], bool]
                      ) -> tuple[list[int], list[float]]:
        """Up to kmax draft tokens, one at a time while more(confidences so far) says to go on, with each token's
        probability under the draft (its greedy engine's forward_top; kmax = 0 drafts nothing)."""
        if kmax == 0:
            return [], []
        if not self.confident:
            raise MoespecError(f"{type(self.greedy).__name__} reports no confidences (forward_top)")
        feed, out, confidences = self._catch_up(tokens_so_far), [], []
        while len(out) < kmax and (not out or more(confidences)):
            next_token, confidence = self.greedy.forward_top(feed)
            self.cached += feed
            feed = [next_token]
            out.append(next_token)
            confidences.append(confidence)
        return out, confidences


class ModelDraft(GreedyDraft):
    """A transformers causal LM as a GreedyDraft."""

    def __init__(self, model: Any) -> None:
        self.model = model
        super().__init__(TorchGreedy(model, new_cache(model)))

    def propose(self, tokens_so_far: list[int], k: int) -> list[int]:
        with torch.inference_mode():
            return super().propose(tokens_so_far, k)

    def propose_while(self, tokens_so_far: list[int], kmax: int, more: Callable[[list[float]], bool]
                      ) -> tuple[list[int], list[float]]:
        with torch.inference_mode():
            return super().propose_while(tokens_so_far, kmax, more)

    def prefill(self, prompt: list[int]) -> None:
        with torch.inference_mode():
            super().prefill(prompt)

"""moespec.model.batched: one verification pass of B sequences, each over its own cache at its own length, equals
feeding each sequence alone; batched speculative decoding gives each sequence its greedy tokens, on all five
classes (fp32 tiny models: the paths differ from the single pass in summation order only)."""

from __future__ import annotations

import copy
from contextlib import contextmanager

import pytest
import torch
from conftest import VOCAB_SIZE

from moespec.model.batched import BatchGreedy, batch_logits, batch_pass_kind, batch_speculative_decode
from moespec.model.cache import new_cache
from moespec.model.dense import set_dense
from moespec.model.policies import pass_kernel, moe_experts, set_policy
from moespec.model.spec import SUPPORTED_MODEL_TYPES
from moespec.model.speculative import ModelDraft, NO_DRAFT, OracleDraft, forward_logits, plain_decode, prefill

ATOL = 2e-5
AUTO = {1: "slot", 4: "dedup", 8: "slot"}
LEAN = {"olmoe", "qwen3_moe", "mixtral"}  # moespec.model.lean's families
PROMPTS = [torch.tensor([[5, 17, 3, 40, 22, 9, 31]]), torch.tensor([[8, 2, 44]]),
           torch.tensor([[12, 19, 7, 7, 60, 3, 1, 25, 33, 4, 50]])]
NEW = 20


@contextmanager
def dense(model, kind: str):
    set_dense(model, kind)
    try:
        yield
    finally:
        set_dense(model, "torch")


def filled_caches(model, lengths: list[int]) -> list:
    """One cache per sequence, holding `lengths[b]` tokens of a prompt of its own."""
    caches = []
    with torch.inference_mode():
        for b, length in enumerate(lengths):
            cache = new_cache(model)
            forward_logits(model, [(7 * b + 3 * i) % VOCAB_SIZE for i in range(length)], cache)
            caches.append(cache)
    return caches


@pytest.mark.parametrize("kind", ["native", "torch"])
@pytest.mark.parametrize("model_type", SUPPORTED_MODEL_TYPES)
def test_a_batched_pass_equals_each_sequence_alone(model_type, kind, models):
    model = models[model_type].model
    set_policy(model, "auto", AUTO)
    tokens = [[4, 9, 1, 30], [11], [2, 5, 8, 13, 21, 34, 55, 6, 3]]  # n_b 4, 1, 9: T = 14 tokens
    with dense(model, kind), torch.inference_mode():
        caches = filled_caches(model, [9, 3, 17])  # each at its own length
        alone = copy.deepcopy(caches)
        expected = "lean" if kind == "native" and model_type in LEAN else "layers"
        assert batch_pass_kind(model, tokens, caches) == expected
        got = batch_logits(model, tokens, caches)
        for b, ids in enumerate(tokens):
            want = forward_logits(model, ids, alone[b])
            torch.testing.assert_close(got[b], want, atol=ATOL, rtol=0, msg=f"{model_type} {kind} sequence {b}")
            assert caches[b].get_seq_length() == alone[b].get_seq_length()
            for mine, theirs in zip(caches[b].layers, alone[b].layers):
                torch.testing.assert_close(mine.keys, theirs.keys, atol=ATOL, rtol=0)


@pytest.mark.parametrize("model_type", SUPPORTED_MODEL_TYPES)
def test_batched_speculative_decoding_gives_each_sequence_its_greedy_tokens(model_type, models):
    model = models[model_type].model
    set_policy(model, "auto", AUTO)
    with dense(model, "native"):
        want = [plain_decode(model, p, NEW + 8) for p in PROMPTS]
        states = [prefill(model, p) for p in PROMPTS]
        for k in (0, 1, 3, 7):
            drafts = [OracleDraft(w, a, seed=k + b, vocab_size=VOCAB_SIZE, prompt_len=p.shape[1]) if k else NO_DRAFT
                      for b, (w, p, a) in enumerate(zip(want, PROMPTS, (0.3, 0.8, 1.0)))]
            tokens, steps = batch_speculative_decode(model, PROMPTS, drafts, k, NEW, prefilled=states)
            assert tokens == [w[:NEW] for w in want], k
            assert all(s.drafted == k and len(s.accepted) == 3 and all(0 <= j <= k for j in s.accepted)
                       for s in steps)
            if k:  # the a = 1 sequence accepts its whole first draft, the a = 0.3 one not: lengths part
                assert steps[0].accepted[2] == k and any(s.accepted[0] < k for s in steps)
            assert all(min(s.verify_s, s.draft_s, s.host_s) >= 0 for s in steps)


@pytest.mark.parametrize("model_type", ["olmoe", "gpt_oss"])
def test_batched_decoding_with_draft_models(model_type, models):
    """A draft model per sequence (the target with a perturbed head: partial acceptance, rollbacks)."""
    model = models[model_type].model
    set_policy(model, "dedup")
    near = copy.deepcopy(model)
    near.lm_head.weight.add_(0.05 * torch.randn(near.lm_head.weight.shape, generator=torch.Generator().manual_seed(0)))
    want = [plain_decode(model, p, NEW) for p in PROMPTS]
    drafts = []
    for p in PROMPTS:
        draft = ModelDraft(near)
        draft.prefill(p[0].tolist())
        drafts.append(draft)
    tokens, steps = batch_speculative_decode(model, PROMPTS, drafts, 3, NEW)
    assert tokens == want
    accepted = [j for s in steps for j in s.accepted]
    assert 0 < sum(accepted) < 3 * len(accepted)


def test_the_expert_kernel_is_picked_by_the_pass_size(models, monkeypatch):
    """AUTO runs the kernel of the pass's T tokens, not of one sequence's n."""
    model = models["olmoe"].model
    set_policy(model, "auto", {1: "slot", 6: "dedup"})
    seen = []
    module = moe_experts(model)[0]
    with dense(model, "native"), torch.inference_mode():
        caches = filled_caches(model, [4, 5, 6])
        monkeypatch.setattr(module, "forward", lambda x, ids, w, f=module.forward: (seen.append(
            (x.shape[0], pass_kernel(module, x.shape[0]))), f(x, ids, w))[1])
        batch_logits(model, [[1, 2], [3, 4], [5, 6]], caches)
    assert seen == [(6, "dedup")]


def test_one_sequence_is_the_single_pass_and_hooks_go_one_by_one(models):
    model = models["olmoe"].model
    set_policy(model, "slot")
    with dense(model, "native"), torch.inference_mode():
        caches = filled_caches(model, [5, 6])
        assert batch_pass_kind(model, [[1]], caches[:1]) == "single"
        handle = model.register_forward_pre_hook(lambda m, a: None)
        try:
            assert batch_pass_kind(model, [[1], [2]], caches) == "one by one (hooks on the model)"
            alone = copy.deepcopy(caches)
            got = batch_logits(model, [[1], [2, 3]], caches)
            for b, ids in enumerate([[1], [2, 3]]):
                torch.testing.assert_close(got[b], forward_logits(model, ids, alone[b]), atol=ATOL, rtol=0)
        finally:
            handle.remove()


def test_bad_arguments(models):
    model = models["olmoe"].model
    caches = filled_caches(model, [3, 3])
    cases = [
        (lambda: batch_logits(model, [], []), "tokens"),
        (lambda: batch_logits(model, [[1], [2]], caches[:1]), "caches"),
        (lambda: batch_logits(model, [[1], []], caches), r"tokens\[1\]"),
        (lambda: batch_logits(model, [[1], [-2]], caches), r"tokens\[1\]"),
        (lambda: batch_logits(model, [[1], [2]], [caches[0], caches[0]]), "a cache of its own"),
        (lambda: batch_speculative_decode(model, PROMPTS, [NO_DRAFT] * 3, -1, 4), "k must"),
        (lambda: batch_speculative_decode(model, PROMPTS, [NO_DRAFT] * 3, 0, True), "max_new"),
        (lambda: batch_speculative_decode(model, PROMPTS, [NO_DRAFT] * 2, 0, 4), "one draft per prompt"),
        (lambda: batch_speculative_decode(model, [torch.tensor([1, 2])], [NO_DRAFT], 0, 4), r"prompts\[0\]"),
        (lambda: BatchGreedy(model, caches).forward([[1]]), "caches"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message):
            call()

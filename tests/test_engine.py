"""The engine and speculative decoding on tiny random models of the five MoE classes.

Our kernels installed in the model must give the stock forward (fp32: to float rounding) and the same greedy
tokens; speculative decoding must give plain greedy decoding's tokens exactly, for every draft length and
acceptance rate; routing replay must put the replayed experts in every layer. Presets are built from their
real shapes (checked on the meta device, weights counted against the spec's byte accounting) and, with a
shrunk hidden size, run for real."""

from __future__ import annotations

import copy
import math
import shutil
from dataclasses import replace

import numpy as np
import pytest
import torch
from conftest import VOCAB_SIZE
from transformers import AutoModelForCausalLM

from moespec import MoespecError, kernels
from moespec.model import policies as engine
from moespec.model import speculative
from moespec.model.load import PRESET_VOCAB, find_routers, load_model, preset_config
from moespec.model.policies import moe_experts, set_policy, set_replay
from moespec.model.spec import PRESETS, SUPPORTED_MODEL_TYPES, ModelSpec
from moespec.model.speculative import (
    ModelDraft,
    OracleDraft,
    StepRecord,
    plain_decode,
    prefill,
    prefill_all,
    realized_acceptance,
    speculative_decode,
)
from moespec.routing.tracer import RouterTap

OURS = ("slot", "dedup", "auto")
AUTO = {1: "slot", 4: "dedup", 8: "slot"}  # a plan's choice; the passes below hit all three entries
ATOL = 2e-5  # fp32 logits of O(1): the kernels differ from eager only in summation order
PROMPT = torch.tensor([[5, 17, 3, 40, 22, 9, 31]])
NEW = 24  # tokens decoded in the speculative tests


def logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=ids).logits[0]


# -- loading -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("model_type", SUPPORTED_MODEL_TYPES)
def test_load_checkpoint(model_type, models, tiny_checkpoints):
    loaded = models[model_type]
    assert loaded.spec == ModelSpec.from_config(tiny_checkpoints[model_type])
    assert loaded.tokenizer is not None and loaded.source == str(tiny_checkpoints[model_type])
    assert not loaded.model.training and not any(p.requires_grad for p in loaded.model.parameters())
    assert len(moe_experts(loaded.model)) == loaded.spec.L


def test_load_checkpoint_bf16_without_tokenizer(tiny_checkpoints, tmp_path):
    folder = tmp_path / "bare"
    folder.mkdir()
    for f in tiny_checkpoints["mixtral"].iterdir():
        if f.name == "config.json" or f.suffix == ".safetensors":
            shutil.copy(f, folder)
    loaded = load_model(path=str(folder))
    assert loaded.tokenizer is None and loaded.dtype == "bf16"
    assert loaded.model.model.embed_tokens.weight.dtype == torch.bfloat16


@pytest.mark.parametrize("name", list(PRESETS))
def test_preset_config_holds_the_real_shapes(name):
    spec = PRESETS[name]
    assert preset_config(spec, vocab=None)[1] == spec  # read back: every field of the preset
    config, cut = preset_config(spec, layers=2)
    assert (cut.layers, cut.vocab, cut.N, cut.m, cut.hidden) == (2, PRESET_VOCAB, spec.N, spec.m, spec.hidden)
    with torch.device("meta"):  # shapes without memory
        model = AutoModelForCausalLM.from_config(config)
    gate_up, down, *_ = kernels.from_hf_experts(moe_experts(model)[0])
    assert gate_up.shape == (spec.N, 2 * spec.expert_width, spec.hidden)
    assert down.shape == (spec.N, spec.hidden, spec.expert_width)
    # every weight of the built model is one the spec's byte accounting counts (D reads one embedding row)
    weights = sum(p.numel() for p in model.parameters())
    assert weights == (cut.W("fp32") * cut.N + cut.dense_bytes("fp32")) // 4 - cut.hidden + cut.vocab * cut.hidden


def shrink(spec: ModelSpec) -> ModelSpec:
    """The preset with a 64-wide hidden state and small attention and expert widths; N, m, the layer layout,
    biases, sinks, windows and MLA kept."""
    mla = dict(kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8) if spec.mla else {}
    return replace(spec, name=f"small-{spec.name}", hidden=64, expert_width=32, heads=4,
                   kv_heads=4 if spec.kv_heads == spec.heads else 2, head_dim=16,
                   dense_width=96 if spec.dense_layers else 0, shared_width=32 if spec.shared_experts else 0, **mla)


@pytest.mark.parametrize("name", list(PRESETS))
def test_shrunk_preset_runs_and_kernels_match(name):
    small = shrink(PRESETS[name])
    loaded = load_model(preset=small, layers=2, vocab=VOCAB_SIZE, dtype="fp32", seed=1)
    assert loaded.spec.layers == 2 and loaded.spec.L == 2 - len(PRESETS[name].dense_layers[:1])
    assert loaded.tokenizer is None and "random weights" in loaded.source
    assert len(moe_experts(loaded.model)) == loaded.spec.L
    ids = torch.arange(3, 12)[None]
    set_policy(loaded.model, "eager")
    want = logits(loaded.model, ids)
    set_policy(loaded.model, "dedup")
    torch.testing.assert_close(logits(loaded.model, ids), want, atol=ATOL, rtol=0)
    again = load_model(preset=small, layers=2, vocab=VOCAB_SIZE, dtype="fp32", seed=1)
    assert torch.equal(again.model.lm_head.weight, loaded.model.lm_head.weight)  # seeded


# -- kernel policies -----------------------------------------------------------------------------------
@pytest.mark.parametrize("model_type", SUPPORTED_MODEL_TYPES)
def test_policies_match_eager(model_type, models):
    model = models[model_type].model
    for n in (1, 5, 12):  # auto: slot, dedup, slot
        ids = torch.arange(3, 3 + n)[None]
        set_policy(model, "eager")
        want = logits(model, ids)
        for policy in (*OURS, "batched_mm", "grouped_mm"):
            set_policy(model, policy, AUTO if policy == "auto" else None)
            torch.testing.assert_close(logits(model, ids), want, atol=ATOL, rtol=0, msg=f"{policy} n={n}")


@pytest.mark.parametrize("model_type", SUPPORTED_MODEL_TYPES)
def test_greedy_tokens_identical_across_policies(model_type, models):
    model = models[model_type].model
    set_policy(model, "eager")
    want = plain_decode(model, PROMPT, 12)
    for policy in OURS:
        set_policy(model, policy, AUTO)
        assert plain_decode(model, PROMPT, 12) == want, policy


def test_auto_picks_the_kernel_of_the_pass_size(models, monkeypatch):
    model = models["olmoe"].model
    seen = []

    def spy(kernel, *args, **kwargs):
        seen.append(kernel)
        return kernels.expert_op(kernel, *args, **kwargs)

    monkeypatch.setattr(engine, "expert_op", spy)
    cases = {1: "slot", 3: "slot", 4: "dedup", 7: "dedup", 8: "slot", 30: "slot"}
    for table, expect in ((AUTO, cases), ({"2": "dedup", "6": "slot"}, {1: "dedup", 2: "dedup", 6: "slot"})):
        set_policy(model, "auto", table)  # string keys, as a plan read from JSON has them
        for n, kernel in expect.items():
            seen.clear()
            logits(model, torch.arange(3, 3 + n)[None])
            assert seen == [kernel] * 2, (n, seen)  # both MoE layers


def test_weights_converted_once_and_shared(tiny_checkpoints, monkeypatch):
    calls = []
    monkeypatch.setattr(engine, "from_hf_experts", lambda m: calls.append(m) or kernels.from_hf_experts(m))
    for model_type in ("olmoe", "gpt_oss"):
        model = load_model(path=str(tiny_checkpoints[model_type]), dtype="fp32").model
        set_policy(model, "slot")
        for _ in range(3):
            logits(model, PROMPT)
        first = moe_experts(model)[0]
        shared = first._moespec.weights[0].data_ptr() == first.gate_up_proj.data_ptr()
        assert shared == (model_type == "olmoe")  # canonical layout shares storage; gpt-oss is converted
    assert len(calls) == 4  # two modules per model, once each


# -- routing replay ------------------------------------------------------------------------------------
def traced_ids(model, spec, ids: torch.Tensor) -> np.ndarray:
    tap = RouterTap(find_routers(model, spec), spec.m)
    try:
        logits(model, ids)
        return tap.take()[0]
    finally:
        tap.close()


@pytest.mark.parametrize("model_type", SUPPORTED_MODEL_TYPES)
def test_replay_forces_the_experts(model_type, models):
    loaded = models[model_type]
    model, spec = loaded.model, loaded.spec
    ids = torch.arange(3, 13)[None]
    set_policy(model, "eager")
    own = logits(model, ids)
    # the model's own routing replayed reproduces its forward (weights paired by rank, DeepSeek's unsorted too)
    set_replay(model, traced_ids(model, spec, ids))
    torch.testing.assert_close(logits(model, ids), own, atol=ATOL, rtol=0)
    # other experts: every layer receives them, and computes the expert operation on them
    rng = np.random.default_rng(0)
    forced = np.stack([[rng.choice(spec.N, spec.m, replace=False) for _ in range(spec.L)] for _ in range(10)])
    set_replay(model, forced)
    calls = []
    hooks = [e.register_forward_hook(lambda m, args, out: calls.append((m, args, out))) for e in moe_experts(model)]
    try:
        for policy in ("eager", "grouped_mm", *OURS):
            set_policy(model, policy, AUTO)
            calls.clear()
            replayed = logits(model, ids)
            assert not torch.allclose(replayed, own, atol=1e-3)
            assert len(calls) == spec.L
            for layer, (module, (x, top, weights), out) in enumerate(calls):
                assert top.tolist() == forced[:, layer].tolist()
                assert torch.equal(weights, weights.sort(-1, descending=True).values)
                gate_up, down, gub, db, act = kernels.from_hf_experts(module)
                want = kernels.reference_float64(x, top, weights, gate_up, down, gub, db, act)
                torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=1e-5)
            if policy == "eager":
                first = replayed
            torch.testing.assert_close(replayed, first, atol=ATOL, rtol=0, msg=policy)
    finally:
        for h in hooks:
            h.remove()
    with pytest.raises(MoespecError, match="replay holds 10 tokens but the pass has 4"):
        logits(model, ids[:, :4])
    set_replay(model, None)
    set_policy(model, "eager")
    torch.testing.assert_close(logits(model, ids), own, atol=0, rtol=0)


def test_replay_bad_ids(models):
    model, spec = models["olmoe"].model, models["olmoe"].spec
    good = np.zeros((4, spec.L, spec.m), dtype=np.int64)
    for bad, needle in ((good[:, :1], "replay ids must be integers"), (good.astype(float), "must be integers"),
                        (good + spec.N, r"must lie in \[0, 8\)")):
        with pytest.raises(MoespecError, match=needle):
            set_replay(model, bad)


# -- speculative decoding ------------------------------------------------------------------------------
@pytest.mark.parametrize("model_type", SUPPORTED_MODEL_TYPES)
def test_speculative_oracle_gives_plain_tokens(model_type, models):
    model = models[model_type].model
    set_policy(model, "auto", AUTO)
    want = plain_decode(model, PROMPT, NEW + 8)  # covers every position a step of k <= 8 may draft
    for k in (0, 1, 3, 8):
        for a in (0.2, 0.9, 1.0):
            draft = OracleDraft(want, a, seed=k, vocab_size=VOCAB_SIZE, prompt_len=PROMPT.shape[1])
            tokens, records = speculative_decode(model, PROMPT, draft, k, NEW)
            assert tokens == want[:NEW], (k, a)
            assert all(r.drafted == k and 0 <= r.accepted <= k for r in records)
            assert sum(r.accepted + 1 for r in records) + 1 >= NEW  # every step yields accepted + 1 tokens
            if a == 1.0:
                assert all(r.accepted == k for r in records)
                assert len(records) == math.ceil((NEW - 1) / (k + 1))
            assert all(min(r.verify_s, r.draft_s, r.host_s) >= 0 for r in records)
            assert all(math.isclose(r.step_s, r.verify_s + r.draft_s + r.host_s, abs_tol=1e-9) for r in records)


@pytest.mark.parametrize("model_type", SUPPORTED_MODEL_TYPES)
def test_prompts_sharing_a_prefix_prefill_it_once_and_decode_as_alone(model_type, models, monkeypatch):
    """prefill_all feeds the contexts' common prefix once (one forward of it, then each context's own tokens): each
    state's first token and cache equal the context's own prefill up to rounding, and decoding from it gives the
    same tokens, speculative and plain; contexts of no common prefix, or one context, are prefilled alone."""
    model = models[model_type].model
    set_policy(model, "auto", AUTO)
    shared = [5, 17, 3, 40, 22, 9, 31, 8, 12, 27]
    contexts = [shared + [11, 4], shared + [33, 4], shared + [7]]
    fed = []
    real = speculative.forward_logits
    monkeypatch.setattr(speculative, "forward_logits", lambda m, t, c, keep=0: fed.append(len(t)) or real(m, t, c, keep))
    states = prefill_all(model, contexts)
    assert fed == [len(shared), 2, 2, 1]  # the prefix once, then each context's own tokens
    monkeypatch.setattr(speculative, "forward_logits", real)
    for context, state in zip(contexts, states):
        ids = torch.tensor([context])
        alone = prefill(model, ids)
        assert (state.first, state.length) == (alone.first, alone.length) and alone.length == len(context)
        for got, want in zip(state.cache.layers, alone.cache.layers):
            torch.testing.assert_close(got.keys, want.keys, atol=ATOL, rtol=1e-4)
        want_tokens = plain_decode(model, ids, NEW + 4)
        assert plain_decode(model, ids, NEW + 4, prefilled=state) == want_tokens
        draft = OracleDraft(want_tokens, 0.7, seed=1, vocab_size=VOCAB_SIZE, prompt_len=len(context))
        assert speculative_decode(model, ids, draft, 3, NEW, prefilled=state)[0] == want_tokens[:NEW]
    fed.clear()
    monkeypatch.setattr(speculative, "forward_logits", lambda m, t, c, keep=0: fed.append(len(t)) or real(m, t, c, keep))
    prefill_all(model, [[5, 6, 7], [8, 6, 7]])
    prefill_all(model, [[5, 6, 7]])
    prefill_all(model, [[5, 6], [5, 6]])  # equal contexts: each keeps its last token
    assert fed == [3, 3, 3, 1, 1, 1]


def test_prefill_all_refuses_an_empty_context(models):
    with pytest.raises(ValueError, match="contexts"):
        prefill_all(models["olmoe"].model, [[5, 6], []])
    with pytest.raises(ValueError, match="contexts"):
        prefill_all(models["olmoe"].model, [])


def test_oracle_decides_each_position_once_for_every_k_and_a():
    """Common random numbers: at one seed a position is proposed right or wrong whatever k asks for it and
    whichever step reaches it, and a position right at a is right at every larger a; a wrong proposal is never the
    true token, and about a of the positions are right."""
    truth = list(range(5, 2005))

    def right(a, k):
        draft, seen = OracleDraft(truth, a, seed=7, vocab_size=97, prompt_len=3), {}
        for start in range(0, len(truth) - k, max(1, k - 1)):  # overlapping steps: positions asked again
            for p, token in enumerate(draft.propose([0] * (3 + start), k), start):
                assert seen.setdefault(p, token == truth[p]) == (token == truth[p]), (a, k, p)
        return seen

    low, high = right(0.4, 3), right(0.8, 5)
    common = low.keys() & high.keys()
    assert all(high[p] for p in common if low[p])  # monotone in a
    assert right(0.4, 1) == {p: low[p] for p in right(0.4, 1)}  # the same sequence at every k
    assert abs(np.mean(list(low.values())) - 0.4) < 0.05 and abs(np.mean(list(high.values())) - 0.8) < 0.05
    past = OracleDraft([1, 2], 1.0, seed=0, vocab_size=9, prompt_len=1).propose([0, 1], 4)
    assert past[:1] == [2] and all(0 <= t < 9 for t in past)  # past the continuation: random tokens


@pytest.mark.parametrize("k", [1, 4])
def test_realized_acceptance_follows_a(k, models):
    """Acceptance is geometric at rate a: E[accepted] = a (1 - a^k) / (1 - a) of k drafted (= a at k = 1).
    Fixed seeds make the run deterministic; the tolerance is about four standard deviations of the mean."""
    model, a, new = models["mixtral"].model, 0.6, 240
    set_policy(model, "slot")
    want = plain_decode(model, PROMPT, new + k)
    draft = OracleDraft(want, a, seed=11, vocab_size=VOCAB_SIZE, prompt_len=PROMPT.shape[1])
    tokens, records = speculative_decode(model, PROMPT, draft, k, new)
    assert tokens == want[:new]
    expected = a * (1 - a**k) / (1 - a) / k
    accepted = np.array([r.accepted for r in records], dtype=float)
    sd = accepted.std() / k / math.sqrt(len(records))
    assert abs(realized_acceptance(records) - expected) < 4 * sd and sd < 0.06


def test_realized_acceptance_nan_without_drafts():
    assert math.isnan(realized_acceptance([]))
    assert math.isnan(realized_acceptance([StepRecord(0, 0, 1.0, 1.0, 0.0, 0.0)]))


class CheckedDraft(ModelDraft):
    """A ModelDraft whose every proposal is checked against the draft model decoding from scratch."""

    def propose(self, tokens_so_far, k):
        out = super().propose(tokens_so_far, k)
        assert out == plain_decode(self.model, torch.tensor([tokens_so_far]), k)
        return out


@pytest.mark.parametrize("model_type", ["olmoe", "gpt_oss"])
def test_model_draft_gives_plain_tokens(model_type, models, tiny_checkpoints):
    model = models[model_type].model
    set_policy(model, "dedup")
    want = plain_decode(model, PROMPT, NEW)
    # a second tiny model: an unrelated one, and the target with a perturbed head (partial acceptance)
    other = load_model(path=str(tiny_checkpoints["mixtral"]), dtype="fp32").model
    near = copy.deepcopy(model)
    near.lm_head.weight.add_(0.05 * torch.randn(near.lm_head.weight.shape, generator=torch.Generator().manual_seed(0)))
    accepted = []
    for draft_model in (other, near):
        tokens, records = speculative_decode(model, PROMPT, CheckedDraft(draft_model), 3, NEW)
        assert tokens == want
        accepted.append(realized_acceptance(records))
    assert 0 < accepted[1] < 1  # rejections happened, so the draft's cache was cropped and refilled


# -- bad inputs ----------------------------------------------------------------------------------------
def test_bad_inputs(models, tiny_checkpoints, tmp_path):
    path = str(tiny_checkpoints["olmoe"])
    model = models["olmoe"].model
    cases = [
        (lambda: load_model(), "exactly one of path"),
        (lambda: load_model(path=path, preset="olmoe-1b-7b"), "exactly one of path"),
        (lambda: load_model(preset="llama-7b"), "unknown model 'llama-7b'"),
        (lambda: load_model(path=str(tmp_path / "nowhere")), "no such directory"),
        (lambda: load_model(path=path, layers=1), "layers applies to presets"),
        (lambda: load_model(path=path, dtype="fp8"), "dtype 'fp8'"),
        (lambda: preset_config(PRESETS["olmoe-1b-7b"], layers=0), r"layers must lie in 1\.\.16"),
        (lambda: preset_config(PRESETS["deepseek-v2-lite"], layers=1), "no MoE layer left"),
        (lambda: preset_config(replace(PRESETS["olmoe-1b-7b"], head_dim=64)), "head_dim=128"),
        (lambda: set_policy(model, "fast"), "unknown policy 'fast'"),
        (lambda: set_policy(model, "auto"), "policy 'auto' needs kernel_by_n"),
        (lambda: set_policy(model, "auto", {0: "slot"}), "kernel_by_n"),
        (lambda: set_policy(model, "auto", {2: "torch-slot"}), "kernel_by_n"),
        (lambda: plain_decode(model, PROMPT[0], 3), r"prompt_ids must be one sequence \[1, P >= 1\]"),
        (lambda: speculative_decode(model, PROMPT, ModelDraft(model), -1, 3), "need k >= 0"),
        (lambda: OracleDraft([1, 2], 1.5, 0, VOCAB_SIZE, 7), "0 <= a <= 1"),
    ]
    if not torch.cuda.is_available():
        cases.append((lambda: load_model(path=path, device="cuda"), "no CUDA device here"))
    for call, needle in cases:
        with pytest.raises(MoespecError, match=needle) as e:
            call()
        assert "\n" not in str(e.value), str(e.value)

"""The trained pair shipped with the project (moespec/data/pair, scripts/train_pair.py; issue 16): it loads through
moespec's loaders, its card records how it was made, its routing has learned locality (next-token reuse above
uniform at every layer, on English text written for this test), and its draft agrees with the target far above
chance on that text."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from cli_cases import run_script

from moespec.formats.trace import Trace
from moespec.model.load import find_routers, load_draft, load_model
from moespec.routing.reuse import reuse_stats, uniform_rho
from moespec.routing.tracer import RouterTap, trace_document

PAIR = Path(__file__).resolve().parents[1] / "moespec" / "data" / "pair"
# Our own English (not from any dataset): everyday prose of the kind the pair was trained on.
TEXT = (
    "The river runs through the middle of the old town, and in the spring it rises until the water almost reaches "
    "the bridge. People come down from the hills to watch it, and the children throw sticks from one side and run "
    "to the other to see them come out. In the summer the river is slow and brown, and the boats of the fishermen "
    "sit in the shade under the trees. The town was built in the twelfth century around a church and a market, and "
    "it grew when the railway came in 1860. The station is still there, although the line was closed after the "
    "war and the trains now stop at the new station on the other side of the valley. The church has a tall tower "
    "that can be seen from the road, and its bells are rung every Sunday morning. In the winter the snow covers "
    "the roofs and the market is held in the hall next to the church, where the farmers sell cheese, bread and "
    "apples from their farms."
)
pytestmark = pytest.mark.skipif(not (PAIR / "target" / "model.safetensors").is_file(), reason="no trained pair")


@pytest.fixture(scope="module")
def pair():
    lm = load_model(path=str(PAIR / "target"), dtype="fp32")
    return lm, load_draft(str(PAIR / "draft"), "fp32")


def test_the_card_records_command_data_and_loss(pair):
    card = json.loads((PAIR / "card.json").read_text())
    assert "train_pair.py" in card["command"] and card["data"]["train"].startswith("WikiText-2")
    for name in ("target", "draft"):
        curve = [point["loss"] for point in card["loss_curve"][name] if "loss" in point]
        assert len(curve) >= 10 and curve[-1] < curve[0] - 1.0  # it learned
        assert card["held_out_loss"][name] < np.log(card["settings"]["VOCAB"]) - 2
    lm, _ = pair
    assert (lm.spec.N, lm.spec.m, lm.spec.model_type) == (64, 8, "olmoe")  # OLMoE-1B-7B's routing shape


def test_learned_routing_reuses_more_than_uniform_at_every_layer(pair):
    lm, _ = pair
    ids = np.array(lm.tokenizer(TEXT)["input_ids"])
    tap = RouterTap(find_routers(lm.model, lm.spec), lm.spec.m)
    experts, _ = trace_document(lm.model, tap, ids, 64, "cpu")
    tap.close()
    trace = Trace.from_arrays(experts, [0, ids.size], lm.spec.N)
    rho = reuse_stats(trace, n_max=2, bootstrap=0).rho[:, 2]
    uniform = uniform_rho(2, lm.spec.N, lm.spec.m)[2]
    assert (rho > uniform + 0.03).all(), (rho, uniform)


def test_the_draft_agrees_with_the_target_far_above_chance(pair):
    lm, draft = pair
    ids = torch.tensor([lm.tokenizer(TEXT)["input_ids"]])
    with torch.no_grad():
        t = lm.model(input_ids=ids).logits.argmax(-1)
        d = draft(input_ids=ids).logits.argmax(-1)
    agreement = float((t == d).float().mean())
    assert agreement > 0.2 > 100 / lm.spec.vocab, agreement  # chance is 1 / 4096


def test_demo_replays_the_trained_routing(tmp_path, capsys):
    """`demo --routing trained`: the trained target's routing on the model's 16 layers (by relative depth), the
    calibrated process's reuse reported beside it."""
    from moespec.cli import main
    from moespec.formats.trace import load_trace

    assert main(["demo", "--json", "--routing", "trained", "--tokens", "6000", "--docs", "20", "--bench-reps", "0",
                 "--out", str(tmp_path)]) == 0
    out = json.loads(capsys.readouterr().out)
    trace = load_trace(tmp_path / "trace.npz")
    assert trace.num_layers == 16 and trace.meta["layers_from"]["num_layers"] == 4
    assert out["trace"]["routing"] == "trained" and "trained pair" in out["trace"]["source"]
    assert out["trace"]["synthetic_rho_mean"][2] == pytest.approx(0.363, abs=0.01)
    assert out["trace"]["rho_mean"][2] > 8 / 64  # learned locality, above uniform


def test_replay_accepts_what_greedy_speculative_decoding_accepts(pair):
    """With greedy drafts a step's acceptance is a function of the text: the replay on the agreement sequence
    accepts, step by step, what real speculative decoding with the pair accepted."""
    from moespec.measure.drafting import agreement, decode, replayed

    lm, draft = pair
    prompt = lm.tokenizer(TEXT)["input_ids"][:48]
    plain = decode(lm.model, draft, prompt, 0, 40)["tokens"]
    agree, confidence = agreement(draft, prompt, plain)
    assert len(agree) == len(confidence) == len(plain) - 1 and 0 < sum(agree) < len(agree)
    assert all(0 < c <= 1 for c in confidence)
    for k in (1, 3, 6):
        real = [accepted for _, accepted, _ in decode(lm.model, draft, prompt, k, 40)["steps"]]
        seen = []

        class Recording:
            def next_k(self):
                return k

            def update(self, drafted, accepted):
                seen.append(accepted)

        assert replayed(agree, [1.0] * 9, Recording(), 40) == (40, len(real))
        assert seen[:-1] == real[:-1] and len(seen) == len(real), k  # the last step may reach past the sequence


@pytest.mark.slow
def test_drafting_repeats_a_decoding_off_the_level_from_the_policys_own_state(pair):
    """compare keeps every decoding at the host's level: one whose reference read after it is off is decoded again,
    and a policy's repeat starts from the state it had before the prompt (its decodings run on a copy); each cell
    still holds one decoding per scored prompt, every one plain decoding's tokens."""
    from moespec.measure.drafting import CALIBRATION, _decode_cell, compare
    from moespec.measure.level import Level
    from moespec.model.adaptive import Online

    lm, draft = pair
    ids = lm.tokenizer(TEXT)["input_ids"]
    prompt = ids[:32]
    policies = {"online": Online([1.0, 1.05, 1.1])}  # drafting pays: the policy drafts and learns
    before = np.array(policies["online"].tested)
    out = _decode_cell(lm.model, draft, prompt, "online", policies, 12)
    assert (np.array(policies["online"].tested) == before).all() and out["policy"] is not policies["online"]
    assert np.sum(out["policy"].tested) > 0 and len(out["tokens"]) == 12

    reads = iter(([30.0] * 3 + [60.0]) * 1000)  # every other decoding is followed by a read of another level
    level = Level(pinned=30.0, wait_s=60.0, read=lambda: next(reads))
    prompts = [ids[i:i + 16] for i in range(0, 16 * (CALIBRATION + 2), 16)]
    found = compare(lm.model, draft, prompts, 10, 2, level=level)
    assert found["level"]["dropped"] > 0 and found["level"]["pinned_gbps"] == 30.0
    assert all(row["greedy_exact"] for row in found["cells"].values())
    assert all(row["steps"] >= 9 * 2 // 3 for row in found["cells"].values())  # two prompts' decodings, none twice
    assert found["cells"]["k=0"]["steps"] == 2 * 9
    assert found["best_held_out_k"] is not None and all(0 <= k <= 2 for k in found["best_held_out_k"])


@pytest.mark.slow
def test_each_prompt_of_each_cell_keeps_its_median_decoding(pair):
    """_median_of decodes every cell `repeats` times in interleaved rounds (reversed every other round) and keeps
    the decoding of median time; compare records its repeats and calibration prompts."""
    from moespec.measure.drafting import _median_of, compare
    from moespec.measure.level import Level

    order, times = [], iter([3.0, 1.0, 9.0, 2.0, 5.0, 4.0])
    decode_one = lambda cell: order.append(cell) or {"seconds": next(times), "cell": cell}  # noqa: E731
    got = _median_of(3, ["a", "b"], decode_one, Level(wait_s=0), flip=False)
    assert order == ["a", "b", "b", "a", "a", "b"]  # a: 3, 2, 5 -> 3; b: 1, 9, 4 -> 4
    assert got["a"]["seconds"] == 3.0 and got["b"]["seconds"] == 4.0

    lm, draft = pair
    ids = lm.tokenizer(TEXT)["input_ids"]
    found = compare(lm.model, draft, [ids[:16], ids[16:32], ids[32:48]], 8, 2, calibration=1, repeats=2)
    assert found["repeats"] == 2 and found["calibration_prompts"] == 1 and found["prompts"] == 2
    assert all(row["greedy_exact"] for row in found["cells"].values())
    with pytest.raises(Exception, match="repeats >= 1"):
        compare(lm.model, draft, [ids[:16], ids[16:32]], 8, 2, repeats=0)


def test_the_calibration_profile_pools_every_draft_length():
    """Position 1 is tested by the steps of every k >= 1, position 2 by those of k >= 2 that passed 1; k = 0 tests
    nothing. Ten k = 1 steps that passed and ten k = 2 steps that failed at once: a_1 = (10 + 1) / (20 + 2), a_2 only
    the prior's (nothing reached it)."""
    from moespec.measure.drafting import calibration_profile

    unit = lambda steps: {"steps": [[d, a, 0.01] for d, a in steps]}  # noqa: E731
    calibrated = {0: [unit([(0, 0)] * 30)], 1: [unit([(1, 1)] * 10)], 2: [unit([(2, 0)] * 6), unit([(2, 0)] * 4)]}
    assert calibration_profile(calibrated, 2) == [11 / 22, 0.5]
    calibrated[2].append(unit([(2, 2), (2, 1)]))  # both reach position 2; one passes it
    assert calibration_profile(calibrated, 2) == [13 / 24, 2 / 4]
    with pytest.raises(ValueError, match="calibrated: no decodings at k = \\[3\\]"):
        calibration_profile(calibrated, 3)


@pytest.mark.parametrize("args, needle", [(["--repeats", "0"], "--repeats must be >= 1"),
                                          (["--calibration", "0"], "--calibration must be >= 1"),
                                          (["--pin-wait", "-1"], "--pin-wait must be >= 0")])
def test_the_drafting_benchmark_refuses_bad_arguments_in_one_line(args, needle, capsys):
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "adaptive_draft.py"
    code, err = run_script(script, args, capsys)
    assert code == 2 and needle in err


def test_the_draft_proposes_token_by_token_with_its_confidences(pair):
    """propose_while drafts the tokens propose drafts, one at a time while `more` says so, each with its probability
    under the draft, and the online policy decoding through it gives plain decoding's tokens; a greedy engine that
    reports no probabilities is refused by name."""
    from moespec import MoespecError
    from moespec.measure.drafting import decode
    from moespec.model.adaptive import Online
    from moespec.model.speculative import GreedyDraft, ModelDraft

    lm, draft = pair
    prompt = lm.tokenizer(TEXT)["input_ids"][:48]
    want = ModelDraft(draft)
    want.prefill(prompt)
    tokens = want.propose(prompt, 5)
    got = ModelDraft(draft)
    got.prefill(prompt)
    asked = []
    out, confidences = got.propose_while(prompt, 5, lambda c: asked.append(list(c)) or len(c) < 3)
    assert out == tokens[:3] and len(confidences) == 3 and all(0 < c <= 1 for c in confidences)
    assert [len(c) for c in asked] == [1, 2, 3]
    assert got.propose_while(prompt, 0, lambda c: True) == ([], [])
    again, _ = got.propose_while(prompt + out[:1], 4, lambda c: True)  # the cache rolled back to the shared prefix
    assert again == tokens[1:5]

    class Plain:
        def forward(self, tokens, last_only=False):
            return [0]

        def rollback(self, tokens):
            pass

    assert got.confident and not GreedyDraft(Plain()).confident  # decode_steps then drafts next_k() tokens
    with pytest.raises(MoespecError, match="Plain reports no confidences"):
        GreedyDraft(Plain()).propose_while([1, 2], 2, lambda c: True)
    plain = decode(lm.model, draft, prompt, 0, 40)
    policy = Online([0.01 + 0.002 * k for k in range(9)], prior_profile=[0.7] * 8)
    online = decode(lm.model, draft, prompt, policy, 40)
    assert online["tokens"] == plain["tokens"]
    assert sum(policy.conf_tested) > policy.prior * len(policy.conf_tested)  # the confidences reached it

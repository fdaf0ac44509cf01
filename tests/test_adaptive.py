"""Draft-length policies (moespec.model.adaptive): transformers' heuristic schedule step by step, the online policy
following the acceptance it sees (growing k for a good draft, shrinking it for a bad one, exploring from k = 0),
and decode_steps driven by a policy giving plain decoding's tokens."""

from __future__ import annotations

import numpy as np
import pytest

from moespec import theory
from moespec.model.adaptive import Heuristic, Online
from moespec.model.speculative import OracleDraft, decode_steps

V = [10.0 + 1.5 * k for k in range(9)]  # verify grows 15% per drafted token


def test_heuristic_is_transformers_schedule():
    h = Heuristic(kmax=8)
    assert h.next_k() == 8  # transformers' 20, capped at kmax
    h.update(8, 3)
    assert h.next_k() == 7
    h.update(7, 7)
    assert h.next_k() == 8  # +2, capped
    for _ in range(10):
        h.update(h.next_k(), 0)
    assert h.next_k() == 1  # never below 1
    with pytest.raises(ValueError, match="accepted"):
        h.update(2, 3)


def feed(policy: Online, rate: float, steps: int, rng: np.random.Generator) -> list[int]:
    ks = []
    for _ in range(steps):
        k = policy.next_k()
        accepted = 0
        while accepted < k and rng.random() < rate:
            accepted += 1
        policy.update(k, accepted)
        ks.append(k)
    return ks


@pytest.mark.parametrize("rate", [0.3, 0.6, 0.8, 0.9])
def test_online_policy_settles_on_k_star_of_the_true_rate(rate):
    ks = feed(Online(V), rate, 400, np.random.default_rng(0))
    want = theory.best_draft_length(V, rate)
    settled = ks[200:]
    assert abs(int(np.median(settled)) - want) <= 1, (rate, want, np.bincount(settled))
    best = float(theory.speedup(V, rate, want))  # the throughput the choices give, against k*'s
    assert np.mean([float(theory.speedup(V, rate, k)) for k in settled]) >= 0.97 * best


def test_online_policy_follows_a_change_and_keeps_testing():
    rng = np.random.default_rng(1)
    policy = Online(V)
    feed(policy, 0.9, 300, rng)
    assert policy.next_k() >= theory.best_draft_length(V, 0.9) - 1
    late = feed(policy, 0.1, 600, rng)[400:]  # the text got hard: the draft is worthless now (DECAY forgets)
    assert np.median(late) == 0 and 1 in late  # plain decoding, a draft now and then while it is uncertain
    assert np.mean(late) < 0.5
    profile = policy.profile(0)
    assert profile[0] < 0.3 and len(profile) == 8


class Counting:
    """A Greedy target whose greedy token after x is x + 1 (mod 50): plain decoding is a known sequence."""

    def __init__(self):
        self.length = 0

    def forward(self, tokens, last_only=False):
        self.length += len(tokens)
        out = [(t + 1) % 50 for t in tokens]
        return out[-1:] if last_only else out

    def rollback(self, tokens):
        self.length -= tokens


def test_decode_steps_with_a_policy_gives_plain_tokens():
    prompt = [3, 4, 5]
    want = [(6 + i) % 50 for i in range(40)]
    continuation = [(7 + i) % 50 for i in range(60)]
    target = Counting()
    target.forward(prompt)
    policy = Online(V)
    out, records = decode_steps(target, prompt, 6, OracleDraft(continuation, 0.8, 0, 50, 3), policy, 40)
    assert out == want and target.length == len(prompt) + 39
    assert {r.drafted for r in records} != {records[0].drafted}  # the draft length changed along the way
    assert np.sum(policy.tested) > 0


def test_online_policy_keeps_runs_of_acceptance_apart():
    """Acceptance in runs: after a fully accepted step the next is easy (0.95), after a rejection hard (0.2). The
    policy drafts long after hits and short after misses."""
    rng = np.random.default_rng(2)
    policy, hard, ks = Online(V), False, {True: [], False: []}
    for _ in range(600):
        k = policy.next_k()
        rate = 0.2 if hard else 0.95
        accepted = 0
        while accepted < k and rng.random() < rate:
            accepted += 1
        policy.update(k, accepted)
        ks[hard].append(k)
        if k:
            hard = accepted < k
    assert policy.profile(1)[0] > 0.8 > 0.4 > policy.profile(0)[0]
    assert np.mean(ks[False][100:]) > np.mean(ks[True][100:]) + 2


def test_a_prior_profile_starts_at_the_plans_k_and_the_text_moves_it():
    plan = [0.9] * 8  # the calibration said: a good draft
    policy = Online(V, prior=10.0, prior_profile=plan)
    want = int(theory.best_draft_length_for(V, plan))
    first = [policy.next_k() for _ in range(50)]  # no evidence yet: draws near the plan's k_hat
    assert abs(int(np.median(first)) - want) <= 1 and want >= 5
    late = feed(policy, 0.2, 800, np.random.default_rng(2))[600:]  # this text defeats the draft
    assert np.median(late) <= 1
    with pytest.raises(ValueError, match="prior_profile"):
        Online(V, prior_profile=[0.5] * 3)
    with pytest.raises(ValueError, match="prior_profile"):
        Online(V, prior_profile=[1.0] * 8)


def test_replay_of_a_known_agreement_sequence():
    """By hand: k = 2 on 1 1 0 1 1 1 0 0 1 accepts 2, 2, 0 and emits 1 + 3 + 3 + 1 = 8 tokens in 3 V(2); a
    decoding of 6 tokens stops after the second step and counts 6;
    every cell of `replay` is over the best constant k, which reads 1."""
    from moespec.measure.drafting import replay, replayed

    agree = [1, 1, 0, 1, 1, 1, 0, 0, 1]
    assert replayed(agree, [1.0, 2.0, 3.0], 2, 8) == (8, 9.0)
    assert replayed(agree, [1.0, 2.0, 3.0], 2, 6) == (6, 6.0)
    assert replayed(agree, [1.0, 2.0, 3.0], 0, 4) == (4, 3.0)  # plain decoding: one token per V(0)
    cells = replay([agree * 5, agree[::-1] * 5], V, [0.6] * 8, 30)
    assert set(cells) == {f"k={k}" for k in range(9)} | {"heuristic", "online"}
    assert max(cells[f"k={k}"] for k in range(9)) == 1.0 and all(v > 0 for v in cells.values())


def test_online_policy_drafts_on_while_the_draft_is_sure():
    """more(): a step goes on while some horizon still pays at the best constant length's rate. A token the
    calibration found always right (c >= 0.99) keeps the step going to kmax; one found usually wrong stops it;
    a step at kmax stops."""
    policy = Online(V, prior_profile=[0.7] * 8)
    for _ in range(100):  # calibrate: the sure tokens agree, the unsure ones do not
        policy.next_k()
        policy.update(8, 8, [0.995] * 8)
        policy.next_k()
        policy.update(2, 1, [0.995, 0.05])  # a miss: the profile after a miss is the all-accepted steps'
    assert policy.confidence_rate(0.999) > 0.95 and policy.confidence_rate(0.05) < 0.1
    assert policy.next_k() >= 1
    assert all(policy.more([0.999] * j) for j in range(1, 8))
    assert not policy.more([0.999] * 8)  # kmax drafted
    assert not policy.more([0.05])  # S ~ 0.05: nothing after it pays
    assert not policy.more([0.999, 0.999, 0.05])


def test_online_policy_checks_confidences():
    policy = Online(V)
    with pytest.raises(ValueError, match="confidence"):
        policy.confidence_rate(1.5)
    with pytest.raises(ValueError, match="confidences"):
        policy.more([])
    with pytest.raises(ValueError, match="confidences"):
        policy.more([0.5] * 9)
    with pytest.raises(ValueError, match="confidences"):
        policy.update(3, 1, [0.5, 0.5])  # one per drafted token
    with pytest.raises(ValueError, match="confidence"):
        policy.update(2, 1, [0.5, -0.1])
    tested = np.array(policy.conf_tested)
    policy.update(3, 1, [0.5, 0.15, 0.95])  # the accepted token and the rejected one are tested, not the third
    assert np.isclose((np.array(policy.conf_tested) - tested * 0.995).sum(), 2.0)


class Sure:
    """A draft of the Counting target that proposes right while the position is below `right_until` (at
    confidence 0.999) and wrong after it (at 0.01); a GreedyDraft-like propose_while."""

    confident = True

    def __init__(self, right_until: int):
        self.right_until = right_until

    def propose(self, tokens_so_far, k):
        return self.propose_while(tokens_so_far, k, lambda c: True)[0]

    def propose_while(self, tokens_so_far, kmax, more):
        out, confidences, last = [], [], tokens_so_far[-1]
        while len(out) < kmax and (not out or more(confidences)):
            right = len(tokens_so_far) + len(out) < self.right_until
            last = (last + 1) % 50 if right else (last + 7) % 50
            out.append(last)
            confidences.append(0.999 if right else 0.01)
        return out, confidences


def test_decode_steps_stops_a_step_where_the_draft_is_unsure():
    """With a draft that reports confidences, the online policy drafts token by token (decode_steps): plain
    decoding's tokens, and once the unsure tokens are known to be wrong the steps stop at them."""
    prompt = [3, 4, 5]
    target = Counting()
    target.forward(prompt)
    policy = Online(V, prior_profile=[0.8] * 8)
    out, records = decode_steps(target, prompt, 6, Sure(right_until=30), policy, 60)
    assert out == [(6 + i) % 50 for i in range(60)] and target.length == len(prompt) + 59
    assert max(r.drafted for r in records) == 8  # the sure stretch ran to kmax
    late = [r for r in records if r.drafted][-5:]
    assert all(r.accepted == 0 and r.drafted == 1 for r in late)  # past 30: one unsure token, then stop
    assert sum(policy.conf_tested) > policy.prior * len(policy.conf_tested)


def test_replay_reads_the_confidences():
    """Where the draft's confidence tells which tokens agree, the online policy replayed with the confidences beats
    itself without them, and every constant k."""
    from moespec.measure.drafting import replay

    rng = np.random.default_rng(3)
    agree = [rng.random(120) < 0.6 for _ in range(6)]
    confidence = [[0.999 if x else 0.05 for x in a] for a in agree]
    agree = [[int(x) for x in a] for a in agree]
    blind = replay(agree, V, [0.6] * 8, 100)
    seeing = replay(agree, V, [0.6] * 8, 100, confidence)
    assert {c: v for c, v in seeing.items() if c != "online"} == {c: v for c, v in blind.items() if c != "online"}
    assert seeing["online"] > max(1.0, blind["online"])


STEEP = [10.0 + 5.0 * k for k in range(9)]  # a draft at a = 0.3 does not pay here: k* = 0


def test_online_policy_drafts_a_first_token_on_thin_evidence():
    """first(): where the posterior mean says k* = 0 on thin evidence (a plan's prior of two pseudo-steps), a step
    drafting token by token still drafts its first token (the profile one sd up pays); once the draft is shown
    wrong there, it does not; next_k() reads the mean alone throughout."""
    policy = Online(STEEP, prior_profile=[0.3] * 8)
    assert policy.next_k() == 0 and policy.first() == 1
    for _ in range(60):
        policy.update(1, 0, [0.5])  # the first token always rejected
    assert policy.next_k() == 0 and policy.first() == 0
    sure = Online(STEEP, prior_profile=[0.9] * 8)
    assert sure.next_k() >= 1 and sure.first() == 1


def test_decode_steps_leaves_a_start_at_k_0():
    """A policy whose mean profile says k = 0 at the start (the prior's a = 0.5 does not pay on these step times)
    and a draft that is in fact sure and right: the mean alone would decode plainly throughout (a step that drafts
    nothing tests nothing); drafting the first token on thin evidence finds the draft good and runs long steps,
    with plain decoding's tokens."""
    prompt = [3, 4, 5]
    target = Counting()
    target.forward(prompt)
    policy = Online(STEEP)
    assert policy.next_k() == 0
    out, records = decode_steps(target, prompt, 6, Sure(right_until=1000), policy, 60)
    assert out == [(6 + i) % 50 for i in range(60)]
    assert max(r.drafted for r in records) == 8 and len(records) < 20

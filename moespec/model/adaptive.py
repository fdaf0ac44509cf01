"""Draft-length policies for speculative decoding: how many tokens to draft at each step
(moespec.model.speculative.decode_steps takes one wherever it takes a fixed k).

Physics first. The best draft length k* maximizes G(k)/V(k) (moespec.theory.profile): the step times V(k) are the
engine's and known from a plan (a bench, a run), the acceptance profile a_1..a_kmax is the draft's on this text
and is not known until the draft runs. Engines today fix k (vLLM, llama.cpp) or steer it by a rule of thumb
(transformers' assisted generation: +2 after a step that accepted every draft, -1 otherwise). The online policy
instead estimates the profile while decoding and drafts k*(profile) each step:

- per position j, a Beta posterior over a_j from the steps that tested j (moespec.theory.profile.estimate_profile's
  counts), with a prior of PRIOR pseudo-steps centred on the estimate of position j - 1 (position 1's on
  PRIOR_RATE), or, given a plan's measured profile (`prior_profile`, e.g. from calibration prompts), on that
  profile's a_j, so decoding starts at the plan's k_hat and moves off it as the text proves otherwise; and an
  exponential forgetting factor (DECAY per step) so the estimate follows a text whose difficulty changes;
- so a position no step has tested (k was always shorter) takes the previous position's estimate, and the policy
  can grow k when the draft proves good (an untested position is not assumed perfect or useless);
- each step drafts k = best_draft_length_for(V, posterior mean profile) of the current state: exact theory on
  the profile the evidence supports, no rule of thumb. Exploration comes from forgetting, not from noise: a
  policy that settled on k = 0 tests nothing, but DECAY shrinks its evidence back to the prior, whose k is
  drafted again after ~70 steps (a prior whose own k is 0 would hold it there for good; with a draft that reports
  its confidence, OPTIMISM drafts a first token instead), and a position rarely tested leans on the one before
  it. (Thompson sampling, drawing the profile from the posterior each step, explored more and paid for it.)
- acceptance comes in runs (text the draft knows, then text it does not), so the counts are kept apart by the
  state the step started in: after a step whose drafts were all accepted (HIT) or after one that rejected one
  (MISSED). The profile that decides is the current state's: a Markov-modulated profile, of which the i.i.d. one is
  the case where both states agree; transformers' +2/-1 rule reacts to the same signal by a fixed step. A step
  that drafted nothing says nothing of the run it is in, so after it the state is UNKNOWN, whose profile pools
  every step's counts (else a state whose estimate fell below drafting would keep k = 0 and never leave);
- the step times are the plan's V(k), fixed. A machine that turns slower or faster moves every V(k) alike and
  leaves k* where it is; what the policy could learn from its own steps is each k's time apart, from the few
  steps it takes at that k, on a host whose bursts slow single steps by 10-40%: learning V(k) online chases that
  noise.

- the draft's own confidence decides where a step stops. A greedy draft's top-1 probability c of the token it
  proposes says more about that token than any count over positions (on the trained pair, agreement with the
  target rises from under half at c < 0.2 to always at c >= 0.99). So the policy
  calibrates c online (a Beta posterior of agreement per confidence bin, CONFIDENCE_EDGES, each prior centred on its
  bin's middle, forgetting at CONFIDENCE_DECAY) and, with a draft that reports c (`more`), drafts token by token: the
  first token if k* >= 1 (or if k* = 0 on thin evidence: OPTIMISM), then another while some horizon h still pays, S *
  (a_{j+1} + a_{j+1} a_{j+2} + ... to h terms) > r (V(j + h) - V(j)), where S is the probability that the j tokens
  drafted so far are all accepted (the product of their calibrated confidences), a the current state's profile for
  the positions not yet drafted, and r = max_k G(k)/V(k) the rate its best constant length reaches. That is the
  step's expected tokens less r times its time, maximized (Dinkelbach's form of maximizing G/V; at j = 0 it is
  exactly k* >= 1), so a step stops early where the draft is unsure and runs to kmax where it is sure. (llama.cpp
  stops its draft at a fixed probability, --draft-p-min; here the threshold follows from the calibration and V.)

Why each choice (posterior mean, the plan's V(k), confidence bins, OPTIMISM, plain floats), with the measurements
that decided it: results/adaptive-draft/HISTORY.md; the runs against every constant k and transformers' heuristic:
results/adaptive-draft/README.md.

Every policy has next_k() -> k in 0..kmax and update(drafted, accepted) after the step; the online policy also
has first() -> 0 or 1 and more(confidences) -> bool for a draft that reports confidences, and its update takes
the drafted tokens' confidences.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from moespec import theory

# Prior of the online policy: PRIOR pseudo-steps at acceptance PRIOR_RATE per position, worth about one prompt's
# first steps; DECAY forgets half the evidence in ~70 steps (0.99^69 = 0.5), a few paragraphs of text.
PRIOR, PRIOR_RATE, DECAY = 2.0, 0.5, 0.99
# The online policy's state: the last step rejected a draft, accepted them all, or drafted nothing
MISSED, HIT, UNKNOWN = 0, 1, 2
HEURISTIC_START = 20  # transformers' GenerationConfig.num_assistant_tokens default (capped at kmax here)
# Bins of the draft's top-1 probability: finest where the pair's agreement moves with it (37% below 0.2, 91% at
# 0.4-0.6, 100% at 0.99 and up); CONFIDENCE_DECAY forgets half in ~140 steps, each step testing ~2 tokens.
CONFIDENCE_EDGES = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 0.95, 0.99)
CONFIDENCE_DECAY = 0.995
# Where the posterior mean says k* = 0, a step that drafts token by token still drafts its first token if the
# profile OPTIMISM posterior standard deviations above the mean says k* >= 1 (Online.first): the evidence is thin
# (a step that drafts nothing tests nothing), and the token's confidence then decides whether the step goes on.
# One sd: 0.5, 1 and 2 replayed alike, the mean profile alone never drafted where a plan said k = 0
# (results/adaptive-draft/HISTORY.md).
OPTIMISM = 1.0


class DraftLength(Protocol):
    def next_k(self) -> int: ...

    def update(self, drafted: int, accepted: int) -> None: ...


def _check_step(drafted: int, accepted: int) -> None:
    if not 0 <= accepted <= drafted:
        raise ValueError(f"accepted: {accepted} outside 0..drafted {drafted}")


def _confidence_bin(confidence: float) -> int:
    if not 0.0 <= confidence <= 1.0:
        raise ValueError(f"confidence: a probability in [0, 1], got {confidence}")
    return bisect.bisect_right(CONFIDENCE_EDGES, confidence) - 1


@dataclass
class Heuristic:
    """transformers' "heuristic" schedule: +2 after a step whose drafts were all accepted, else -1 (at least 1),
    starting at its default of 20 and capped at kmax."""

    kmax: int
    k: int = field(init=False)

    def __post_init__(self) -> None:
        if self.kmax < 1:
            raise ValueError(f"kmax: must be >= 1, got {self.kmax}")
        self.k = min(HEURISTIC_START, self.kmax)

    def next_k(self) -> int:
        return self.k

    def update(self, drafted: int, accepted: int) -> None:
        _check_step(drafted, accepted)
        self.k = min(self.kmax, self.k + 2) if accepted == drafted else max(1, self.k - 1)


class Online:
    """The online policy (module docstring) for step times V(0..kmax).

    Its per-step work (next_k, first, more, update) runs inside the step's time, once per step and once per drafted
    token, on vectors of kmax <= ~16 numbers: it is plain Python floats, not numpy. Inside decoding each numpy call
    cost 6-8x its isolated time (the caches cold after the models' passes), enough to slow the policy's steps by
    6-8%; in floats its calls take 21-37 us (results/adaptive-draft/HISTORY.md)."""

    def __init__(self, V: Sequence[float], prior: float = PRIOR, prior_rate: float = PRIOR_RATE,
                 decay: float = DECAY, prior_profile: Sequence[float] | None = None) -> None:
        self.V = [float(v) for v in theory.check_step_times(V, min_len=2)]
        if not (prior > 0 and 0 < prior_rate < 1 and 0 < decay <= 1):
            raise ValueError(f"prior, prior_rate, decay: need prior > 0, 0 < prior_rate < 1, 0 < decay <= 1, got "
                             f"{prior}, {prior_rate}, {decay}")
        self.kmax = kmax = len(self.V) - 1
        self._dV = [[v - self.V[j] for v in self.V[j + 1:]] for j in range(kmax)]  # [j][h - 1]: V(j + h) - V(j)
        if prior_profile is not None:
            prior_profile = [float(a) for a in theory.check_profile(prior_profile)]
            if len(prior_profile) != kmax or not all(0 < a < 1 for a in prior_profile):
                raise ValueError(f"prior_profile: {kmax} acceptances in (0, 1) (one per draft position), got "
                                 f"{prior_profile}")
        self.prior_profile = prior_profile
        self.prior, self.prior_rate, self.decay = prior, prior_rate, decay
        # [state][position]: decayed steps that tested position j + 1, and that passed it
        self.tested = [[0.0] * kmax for _ in range(3)]
        self.passed = [[0.0] * kmax for _ in range(3)]
        self.state = MISSED
        edges = [*CONFIDENCE_EDGES, 1.0]
        self.conf_tested = [prior] * len(CONFIDENCE_EDGES)  # [bin] the prior: `prior` tokens at its middle
        self.conf_passed = [prior * (lo + hi) / 2 for lo, hi in zip(edges, edges[1:])]
        self._survival: list[float] | None = None  # next_k()'s 1, a_1, a_1 a_2, ... and best rate, for more()
        self._beta: tuple[list[float], list[float]] | None = None  # next_k()'s posterior, for first()
        self._rate = 0.0

    def _posterior(self, state: int | None = None) -> tuple[list[float], list[float]]:
        """Beta(alpha_j, beta_j) per position after a step of `state` (default the current one; UNKNOWN pools the
        counts of every state), each prior centred on the previous position's posterior mean."""
        state = self.state if state is None else state
        if state == UNKNOWN:
            tested, passed = [sum(col) for col in zip(*self.tested)], [sum(col) for col in zip(*self.passed)]
        else:
            tested, passed = self.tested[state], self.passed[state]
        alpha, beta, last = [], [], self.prior_rate
        for j, (t, p) in enumerate(zip(tested, passed)):
            centre = last if self.prior_profile is None else self.prior_profile[j]
            alpha.append(p + self.prior * centre)
            beta.append((t - p) + self.prior * (1 - centre))
            last = alpha[j] / (alpha[j] + beta[j])
        return alpha, beta

    def profile(self, state: int | None = None) -> list[float]:
        """The posterior mean of a_1..a_kmax after a step of `state` (MISSED, HIT or UNKNOWN; default the current
        one): a position tested rarely, or never, leans on the one before it instead of on a fixed guess, so a
        flat profile is not pulled down where k has seldom reached."""
        alpha, beta = self._posterior(state)
        return [a / (a + b) for a, b in zip(alpha, beta)]

    def next_k(self) -> int:
        """k* of the current state's posterior mean profile and the plan's step times: G(k) = 1 + a_1 + a_1 a_2 +
        ..., k = the first maximizer of G(k)/V(k) (theory.best_draft_length_for on floats)."""
        alpha, beta = self._beta = self._posterior()  # this step's, for first()
        self._survival, rates = self._rates([a / (a + b) for a, b in zip(alpha, beta)])  # and for more()
        self._rate = max(rates)
        return rates.index(self._rate)

    def _rates(self, profile: list[float]) -> tuple[list[float], list[float]]:
        """The survival 1, a_1, a_1 a_2, ... of a profile and its G(k)/V(k), k = 0..kmax."""
        survival, rates, G = [1.0], [1.0 / self.V[0]], 1.0
        for a, v in zip(profile, self.V[1:]):
            survival.append(survival[-1] * a)
            G += survival[-1]
            rates.append(G / v)
        return survival, rates

    def first(self) -> int:
        """Whether a step that drafts token by token (more) drafts its first token: 1 where next_k() >= 1, or
        where it is 0 but the profile OPTIMISM posterior standard deviations above the mean has k* >= 1; else 0.
        (Without it, a plan or a stretch of text that put the mean at k* = 0 would keep the policy there: nothing
        it then drafts could move the mean.)"""
        if self.next_k():
            return 1
        upper = []
        for a, b in zip(*self._beta):
            total = a + b
            upper.append(min(a / total + OPTIMISM * math.sqrt(a * b / (total * total * (total + 1))), 1.0))
        rates = self._rates(upper)[1]
        return int(max(rates[1:]) > rates[0])

    def confidence_rate(self, confidence: float) -> float:
        """The posterior mean agreement of a token the draft proposed at top-1 probability `confidence`."""
        b = _confidence_bin(confidence)
        return self.conf_passed[b] / self.conf_tested[b]

    def more(self, confidences: Sequence[float]) -> bool:
        """After drafting len(confidences) >= 1 tokens this step (their top-1 probabilities): whether to draft
        another (module docstring: some horizon h still pays at the rate r of the best constant length)."""
        j = len(confidences)
        if not 1 <= j <= self.kmax:
            raise ValueError(f"confidences: 1..kmax = {self.kmax} of them, got {j}")
        if j == self.kmax:
            return False
        if self._survival is None:  # more() before any next_k(): this state's
            self.next_k()
        survive = math.prod(self.confidence_rate(c) for c in confidences)
        run, base = 0.0, self._survival[j]  # run: a_{j+1} + a_{j+1} a_{j+2} + ... to h terms
        for s, dV in zip(self._survival[j + 1:], self._dV[j]):
            run += s / base
            if survive * run - self._rate * dV > 0:
                return True
        return False

    def update(self, drafted: int, accepted: int, confidences: Sequence[float] = ()) -> None:
        """One step's outcome: its acceptance counts, and with the drafted tokens' confidences (one per drafted
        token, or none) their calibration: the accepted ones agreed, the one after them did not."""
        _check_step(drafted, accepted)
        if len(confidences) not in (0, drafted):
            raise ValueError(f"confidences: one per drafted token ({drafted}) or none, got {len(confidences)}")
        if len(confidences):
            bins = [_confidence_bin(c) for c in confidences[:accepted + 1]]
            self.conf_tested = [t * CONFIDENCE_DECAY for t in self.conf_tested]
            self.conf_passed = [p * CONFIDENCE_DECAY for p in self.conf_passed]
            for i, b in enumerate(bins):
                self.conf_tested[b] += 1
                self.conf_passed[b] += i < accepted
        decay = self.decay
        self.tested = [[t * decay for t in row] for row in self.tested]
        self.passed = [[p * decay for p in row] for row in self.passed]
        top = min(drafted, self.kmax, accepted + 1)  # positions 1..accepted + 1 were tested (up to the draft's end)
        row_t, row_p = self.tested[self.state], self.passed[self.state]
        for j in range(top):
            row_t[j] += 1
        for j in range(min(accepted, self.kmax)):
            row_p[j] += 1
        self.state = UNKNOWN if not drafted else HIT if accepted == drafted else MISSED
        self._survival = None

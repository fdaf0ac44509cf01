"""Draft-length policies for speculative decoding: how many tokens to draft at each step
(moespec.model.speculative.decode_steps takes one wherever it takes a fixed k).

Physics first. The best draft length k* maximizes G(k)/V(k) (moespec.theory.profile): the step times V(k) are the
engine's and known from a plan (a bench, a run), the acceptance profile a_1..a_kmax is the draft's on this text
and is not known until the draft runs. Engines today fix k (vLLM, llama.cpp) or steer it by a rule of thumb
(transformers' assisted generation: +2 after a step that accepted every draft, -1 otherwise). The online policy
instead estimates the profile while decoding and drafts k*(profile) each step:

- per position j, a Beta posterior over a_j from the steps that tested j (moespec.theory.profile.estimate_profile's
  counts), with a prior of PRIOR pseudo-steps centred on the estimate of position j - 1 (position 1's on
  PRIOR_RATE), and an exponential forgetting factor (DECAY per step) so the estimate follows a text whose
  difficulty changes;
- so a position no step has tested (k was always shorter) takes the previous position's estimate, and the policy
  can grow k when the draft proves good (an untested position is not assumed perfect or useless);
- k = best_draft_length_for(V, posterior means): exact theory on the current estimate, no rule of thumb;
- after EXPLORE steps in a row at k = 0 it drafts one token once, so a draft that looked useless can prove itself
  (at k = 0 nothing is tested, and the estimate would never move again).

Every policy has next_k() -> k in 0..kmax and update(drafted, accepted) after the step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from moespec import theory

# Prior of the online policy: PRIOR pseudo-steps at acceptance PRIOR_RATE per position, worth about one prompt's
# first steps; DECAY forgets half the evidence in ~70 steps (0.99^69 = 0.5), a few paragraphs of text.
PRIOR, PRIOR_RATE, DECAY = 2.0, 0.5, 0.99
EXPLORE = 16  # steps at k = 0 before one exploratory draft of 1 token
HEURISTIC_START = 20  # transformers' GenerationConfig.num_assistant_tokens default (capped at kmax here)


class DraftLength(Protocol):
    def next_k(self) -> int: ...

    def update(self, drafted: int, accepted: int) -> None: ...


def _check_step(drafted: int, accepted: int) -> None:
    if not 0 <= accepted <= drafted:
        raise ValueError(f"accepted: {accepted} outside 0..drafted {drafted}")


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
    """The online policy (module docstring) for step times V(0..kmax)."""

    def __init__(self, V: Sequence[float], prior: float = PRIOR, prior_rate: float = PRIOR_RATE,
                 decay: float = DECAY) -> None:
        self.V = theory.check_step_times(V, min_len=2)
        if not (prior >= 0 and 0 <= prior_rate <= 1 and 0 < decay <= 1):
            raise ValueError(f"prior, prior_rate, decay: need prior >= 0, 0 <= prior_rate <= 1, 0 < decay <= 1, got "
                             f"{prior}, {prior_rate}, {decay}")
        self.kmax = len(self.V) - 1
        self.prior, self.prior_rate, self.decay = prior, prior_rate, decay
        self.tested = [0.0] * self.kmax
        self.passed = [0.0] * self.kmax
        self.idle = 0  # steps in a row at k = 0

    def profile(self) -> list[float]:
        """The posterior mean of a_1..a_kmax, each position's prior centred on the previous position's estimate
        (the first's on prior_rate): a position tested rarely, or never, leans on the one before it instead of on a
        fixed guess, so a flat profile is not pulled down where k has seldom reached."""
        out, last = [], self.prior_rate
        for t, p in zip(self.tested, self.passed):
            last = (p + self.prior * last) / (t + self.prior)
            out.append(last)
        return out

    def next_k(self) -> int:
        k = int(theory.best_draft_length_for([float(v) for v in self.V], self.profile()))
        self.idle = self.idle + 1 if k == 0 else 0
        if self.idle > EXPLORE:
            self.idle = 0
            return 1
        return k

    def update(self, drafted: int, accepted: int) -> None:
        _check_step(drafted, accepted)
        self.tested = [t * self.decay for t in self.tested]
        self.passed = [p * self.decay for p in self.passed]
        for j in range(1, min(drafted, self.kmax) + 1):
            if accepted >= j - 1:
                self.tested[j - 1] += 1
                self.passed[j - 1] += accepted >= j

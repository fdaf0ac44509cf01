"""moespec.theory: the exact theory of Section 3 on any positive step-time vector V = (V(0), ..., V(kmax)).

- core: G_a (B.1), T_a, k*(a), speedup condition (8), speedup (9), a0 (B.4), (B.3), alpha_{k,i} and step
  points (B.31), convex criterion (10) and a_1 (B.36), the staircase on a grid and as intervals.
- dedup: step time (5), saving (6)-(7), the deduplicating engine (11)-(16) with the reuse threshold.
- bounds: error bounds (17)-(21) of Table 2.
- profile: non-geometric acceptance (a per-position profile a_1..a_kmax): G(k), k*, (8), (9), the estimate.
"""

from moespec.theory.bounds import (
    EPS_LIMIT,
    delta_from_eps,
    kernel_margin,
    saving_bound,
    separated,
    speedup_band,
    throughput_floor,
    throughput_loss_bound,
    verify_time_bound,
)
from moespec.theory.core import (
    PAPER_ACCEPTANCES,
    Bracket,
    Step,
    beats_plain,
    best_draft_length,
    check_acceptance,
    check_step_times,
    convex_at_least,
    convex_increments,
    crossing_acceptance,
    first_draft_threshold,
    first_step_point_convex,
    geometric_sum,
    speculation_helps,
    speedup,
    staircase,
    staircase_intervals,
    step_points,
    throughput,
)
from moespec.theory.dedup import (
    DedupEngine,
    byte_step_times,
    crossover,
    dedup_faster,
    mean_drafted_reuse,
    requested_bytes,
    reuse_threshold_bytes,
    saving,
    union_bytes,
    verify_time,
)
from moespec.theory.profile import (
    best_draft_length_for,
    check_profile,
    estimate_profile,
    expected_tokens,
    profile_beats_plain,
    profile_speedup,
    profile_throughput,
)

__all__ = [name for name in dir() if not name.startswith("_") and name not in {"bounds", "core", "dedup", "profile"}]

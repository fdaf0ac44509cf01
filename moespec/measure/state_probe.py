"""The state of the host's loop now against its device profile's: the profile's self-check passes timed again.

The structural model (moespec.kernels.structure) takes a cold group's stream at the ceiling sampled beside each call,
so a host whose streaming read moved is predicted at its new rate; every other term (the loop's excess x, the hot
rate, the per-row time, a cold pass's start, the fixed seconds of a pass, a group, a node and a token) stays at the
profile's. On a shared host the loop moves too, and not with the stream: on a 2-core Xeon VM ggml's q4_0 passes of
the self-check's shape ran 1.5x longer in one hour than in another at ceilings 10% apart.

The probe times the self-check's passes (moespec.measure.profile_check: both kernels of the format's pair on chosen
ids of a shape no model has; their rates come from no model) again as the profile timed them (each call after a
flush, the ceiling sampled after it, the weights' placement measured), and finds for each pass the k at which the
profile's rates with their loop scaled by k (Rates.loop_scaled) predict its time now, at its ceiling now, as many
times the time they predict for the profile's own take as that take measured:

    pass_time(loop_scaled(k), C_now) = pass_time(rates, C_profile) t_now / t_profile

(the model's own error on a pass cancels in the ratio: the probe follows the host from the profile's take on, and
leaves what the profile's rates miss of its own check passes to its stated error). k is the median over the passes
whose loop is at least MIN_LOOP_SHARE of their predicted time (on passes set by the stream alone k is not seen); 1
where no pass is.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from moespec import ArgumentError, MoespecError
from moespec.arguments import show
from moespec.defaults import KERNELS
from moespec.kernels.structure import kind_rates, pass_time
from moespec.measure.contention import Cores
from moespec.measure.device_profile import Weights, pair_of
from moespec.measure.placement import expert_placement
from moespec.measure.profile_check import CHECK_EXPERTS, CHECK_SHAPE, check_passes
from moespec.measure.timing import Timer
from moespec.model.weights import expert_matrix_bytes, expert_rows

PROBE_REPS = 3  # rounds over the passes: each pass's median of three calls (a call spreads by a few percent)
MIN_LOOP_SHARE = 0.25  # a pass whose loop is under this share of its predicted time does not tell k
K_RANGE = (0.25, 4.0)  # a loop 4x slower or faster than the profile's is another host, not another state
BISECTIONS = 60  # halvings of K_RANGE in log: k to ~1e-17, far inside a timing's spread


def _probe_rows(profile: Mapping[str, Any], dtype: str) -> dict[tuple[str, int, int], Mapping[str, Any]]:
    """The profile's recorded check passes of `dtype`, keyed (kind, n, U); one line where it has none."""
    check = (profile.get("self_check_by_dtype") or {}).get(dtype)
    if not check or not check.get("passes"):
        raise MoespecError(f"the profile has no self-check passes at {dtype} to probe the host's state with")
    return {(r["kernel"], r["n"], r["U"]): r for r in check["passes"]}


def time_probe(profile: Mapping[str, Any], dtype: str, timer: Timer, reps: int = PROBE_REPS,
               threads: int | None = None) -> list[dict[str, Any]]:
    """The self-check's passes of `dtype` timed now on this machine (module docstring): per pass kind, n, U, the
    median seconds and ceiling (GB/s) over `reps` rounds, and the check weights' placement."""
    if isinstance(reps, bool) or not isinstance(reps, int) or reps < 1:
        raise ArgumentError(f"reps must be a whole number >= 1, got {show(reps)}")
    recorded = _probe_rows(profile, dtype)
    pair = pair_of(dtype)
    w = Weights.draw(*CHECK_SHAPE, CHECK_EXPERTS, dtype, timer.kind)
    sample = timer.sampler()
    calls = [(kind, n, u, w.call(pair[kind], ids, threads), w.reads(ids)) for n, u, ids in check_passes()
             for kind in KERNELS if (kind, n, u) in recorded]
    for *_, fn, _ in calls:
        fn()  # code and buffers ready
    cores = Cores(threads, fit=False)
    seconds: dict[tuple[str, int, int], list[float]] = {key[:3]: [] for key in calls}
    ceilings: dict[tuple[str, int, int], list[float]] = {key[:3]: [] for key in calls}
    try:
        for _ in range(reps):
            for kind, n, u, fn, reads in calls:
                seconds[kind, n, u].append(cores.cold_call(timer, fn, reads))
                ceilings[kind, n, u].append(sample())
    finally:
        cores.release()
    placed = expert_placement([w.gate_up, w.down], timer, sample)
    return [{"kernel": kind, "n": n, "U": u, "measured_s": float(np.median(seconds[kind, n, u])),
             "ceiling_gbps": float(np.median(ceilings[kind, n, u])), "placement": placed}
            for kind, n, u in seconds]


def _solve(fn: Callable[[float], float], target: float) -> float:
    """The k in K_RANGE at which the non-decreasing fn(k) meets target (the range's end where it does not)."""
    lo, hi = K_RANGE
    if fn(lo) >= target:
        return lo
    if fn(hi) <= target:
        return hi
    for _ in range(BISECTIONS):
        mid = (lo * hi) ** 0.5
        lo, hi = (mid, hi) if fn(mid) < target else (lo, mid)
    return (lo * hi) ** 0.5


def loop_factor(profile: Mapping[str, Any], dtype: str, probe: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """k (module docstring) from time_probe's passes against the profile's recorded ones: {k, passes: [{kernel, n, U,
    k, loop_share}], used: the passes that told k}."""
    recorded = _probe_rows(profile, dtype)
    rates = kind_rates(profile["dtypes"][dtype], profile["ceiling_gbps"])
    b, rows, cache = expert_matrix_bytes(*CHECK_SHAPE, dtype), expert_rows(*CHECK_SHAPE), profile["cache_bytes"]
    then_placed = profile["self_check_by_dtype"][dtype].get("placement")
    ids_of = {(n, u): ids for n, u, ids in check_passes()}
    out = []
    for now in probe:
        key = (now["kernel"], now["n"], now["U"])
        if key not in recorded or not (now["measured_s"] > 0 and now["ceiling_gbps"] > 0):
            raise ArgumentError(f"probe: pass {key} is not one of the profile's self-check passes with a positive "
                                f"time and ceiling")
        then, kind, ids = recorded[key], key[0], ids_of[key[1:]]

        def at(k: float, ceiling: float, placed: Sequence[float] | None) -> float:
            return pass_time(rates[kind].loop_scaled(k), kind, ids, b, rows, ceiling, cache, placed)

        predicted = at(1.0, then["ceiling_gbps"], then_placed)
        target = predicted * now["measured_s"] / then["measured_s"]
        stream_only = pass_time(rates[kind].loop_scaled(1e-9), kind, ids, b, rows, now["ceiling_gbps"], cache,
                                now.get("placement"))
        share = 1.0 - stream_only / at(1.0, now["ceiling_gbps"], now.get("placement"))
        k = _solve(lambda k: at(k, now["ceiling_gbps"], now.get("placement")), target)
        out.append({"kernel": kind, "n": key[1], "U": key[2], "k": k, "loop_share": share})
    used = [p for p in out if p["loop_share"] >= MIN_LOOP_SHARE]
    return {"k": float(statistics.median(p["k"] for p in used)) if used else 1.0, "passes": out, "used": len(used)}

"""A plan from measured verify times alone: the basis `moespec plan` takes where the bench cannot carry one.

Why. A bench whose expert operation is too small to time (moespec.formats.benchfile.too_small: our kernels far
below the streaming-read ceiling, fixed per-call costs setting the time, or fits whose eps is past the 1/2 the
bands (21) need) gives expert-op times that are noise; (22) would add that noise to the one-token pass and decide
kernels and draft lengths by it. What such a model still has is the engine's own measurement: the verify time of
each kernel at every n with its 95% interval (`moespec run --no-throughput`). So, given those runs, the plan is
built on them ("basis": "runs"):

    tau_p(n) = tau_meas_p(n),   bound_p(n) = the half-width of its 95% interval,

per kernel p in {slot, dedup}, the prediction and the calibrated version alike (the measured times are what a
calibration arrives at); the saving S(n) = tau_slot(n) - tau_dedup(n) with the runs' 95% bootstrap interval
(moespec.measure.rounds.bootstrap_saving) as its band in place of (18); a kernel is decided where that interval
excludes 0 and the saving is at least SAVING_MARGIN of the pass (measured_choice), and AUTO runs dedup only there
(per-slot, the kernel of one token, elsewhere), so two runs of a model whose kernels do not differ measurably
give the same policy. Step times V(k) = tau(k+1) + h(k), k_hat*(a) and the
speedup bands (21) follow from these times and bounds as in every version (moespec.predict.verify.steps). The plan
says it is of this basis, and why, first (its verdict).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from moespec import MoespecError
from moespec.defaults import KERNELS
from moespec.formats.files import is_interval
from moespec.formats.runsfile import Runs
from moespec.predict.verify import VerifyTimes

# A measured saving under this share of the per-slot pass is called no difference, whatever its interval: the
# interval is one run's (bootstrap over its rounds), while two runs of a tiny model, minutes apart on a shared host,
# moved a 2-4% saving in and out of it; a kernel choice worth less than that is no choice to deploy.
SAVING_MARGIN = 0.05
BASIS_RUNS = "runs"  # plan.json `basis` of a plan built on measured verify times (BASIS_BENCH: (22) on a bench)
BASIS_BENCH = "bench"


def has_both_kernels(runs: Runs | None) -> bool:
    """Whether runs hold verify times of both kernels (moespec's engine; llama.cpp's runs hold dedup alone)."""
    return runs is not None and all(k in (runs.get("verify_time_s") or {}) for k in KERNELS)


def measured_times(runs: Runs, ns: range) -> VerifyTimes:
    """tau_p(n) of each kernel from the runs, with the half-width of its 95% interval as its bound (0 where the
    runs record no interval)."""
    if not has_both_kernels(runs):
        raise MoespecError(f"{runs.where}: a plan on measured times needs the verify times of slot and dedup "
                           f"(`moespec run --no-throughput` on moespec's engine)")
    tau = {p: runs.series(f"verify_time_s.{p}", ns, positive=True) for p in KERNELS}
    return VerifyTimes(tau, {p: half_widths(runs, p, tau[p], ns) for p in KERNELS})


def half_widths(runs: Mapping[str, Any], kernel: str, tau: np.ndarray, ns: range) -> np.ndarray:
    """The half-width of each median's 95% interval (verify_time_ci_s) about the time tau[n - 1] of `kernel`, 0
    where the runs record no interval at n."""
    ci = (runs.get("verify_time_ci_s") or {}).get(kernel) or {}
    return np.array([max(tau[n - 1] - ci[str(n)][0], ci[str(n)][1] - tau[n - 1], 0.0)
                     if is_interval(ci.get(str(n))) else 0.0 for n in ns])


def saving_intervals(runs: Runs, times: VerifyTimes, ns: range) -> dict[int, tuple[float, float]]:
    """(lo, hi) of S(n) for n >= 2: the runs' bootstrap interval (saving_s), else the kernels' bounds added."""
    saving = runs.get("saving_s") or {}
    out = {}
    for n in ns[1:]:
        s = saving.get(str(n))
        if isinstance(s, Mapping) and is_interval([s.get("lo"), s.get("hi")]):
            out[n] = (float(s["lo"]), float(s["hi"]))
        else:
            mid = float(times.tau["slot"][n - 1] - times.tau["dedup"][n - 1])
            half = float(times.bound["slot"][n - 1] + times.bound["dedup"][n - 1])
            out[n] = (mid - half, mid + half)
    return out


def measured_choice(saving: float, lo: float, hi: float, tau_slot: float) -> str | None:
    """The kernel a measured saving S = tau_slot - tau_dedup decides: "dedup" or "slot" where its 95% interval
    [lo, hi] excludes 0 and |S| is at least SAVING_MARGIN of the per-slot pass, else None (no difference)."""
    if abs(saving) < SAVING_MARGIN * tau_slot:
        return None
    return "dedup" if lo > 0 else "slot" if hi < 0 else None


def measured_policy(times: VerifyTimes, intervals: Mapping[int, tuple[float, float]]) -> dict[int, str]:
    """AUTO on measured times: dedup at each n whose saving measured_choice decides for it, per-slot elsewhere."""
    slot, dedup = times.tau["slot"], times.tau["dedup"]
    return {n: "dedup" if n in intervals and measured_choice(float(slot[n - 1] - dedup[n - 1]), *intervals[n],
                                                             float(slot[n - 1])) == "dedup" else "slot"
            for n in range(1, len(slot) + 1)}


def saving_row(n: int, times: VerifyTimes, interval: tuple[float, float], u: float) -> dict[str, Any]:
    """plan.json's saving.{n} on the runs basis: the measured S(n), its interval as the band, decided where
    measured_choice decides; no bench bandwidth ratio r(n) or margin (19) (the bench cannot give one)."""
    s = float(times.tau["slot"][n - 1] - times.tau["dedup"][n - 1])
    lo, hi = interval
    decided = measured_choice(s, lo, hi, float(times.tau["slot"][n - 1])) is not None
    return {"predicted_s": s, "measured_s": s, "band_s": max(s - lo, hi - s, 0.0), "lo_s": lo, "hi_s": hi,
            "u": u, "r": None, "margin": None, "decided": decided,
            "byte_model": "dedup" if u < 1 else "slot", "two_bandwidth": None}

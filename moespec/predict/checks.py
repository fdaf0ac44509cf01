"""Input checks in words: where the measurements behind a verdict (moespec.predict.verdict) cannot carry it, one
line naming the file, what is wrong and the setting to change.

  bench     its expert operation too small to time (moespec.formats.benchfile.too_small: our kernels far below the
            streaming-read ceiling, or the fits' eps past the 1/2 the bands (21) need), or its timings noisy
            (noise_verdict): rerun with --fresh (a rerun without it resumes an interrupted run's rounds), more
            --reps, on a quieter machine, or other --layers (rerun_bench);
  contention   a bench or run timed while another process wanted a core (moespec.measure.contention.describe:
            the count, and past CONTENDED_SHARE of the calls that the times are not the quiet machine's);
  profile   a device profile (device.json) taken while the host changed state: its ceiling sampled before or after
            the timing more than NOISY_IQR off the median of the calls' samples (pinned to a level, more than
            OFF_LEVEL_SHARE of its calls kept off the level, or the calls' median ceiling off the pinned level by
            more than the level's band, instead: the samples around it are not pinned), or its
            self-check (the model on passes no rate came from) missing by more than PROFILE_ERROR_LIMIT in median:
            re-take it on a quieter machine;
  runs      the verify time flat in n (no growth from n = 1 to the largest n beyond their 95% intervals, or
            FLAT_SHARE without intervals): the expert operation adds nothing measurable to the pass; verify times
            outside BYTES_RANGE x the bytes a pass reads (the plan's pass_bytes, the one-bandwidth byte model (16))
            over the streaming-read ceiling: a pass that reads other bytes than planned, fixed costs that swamp the
            bytes, or a disturbed machine.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import Any

from moespec.defaults import KERNELS
from moespec.formats.benchfile import fixed_costs_set_time, noise_verdict, too_small
from moespec.formats.devicefile import DeviceProfile
from moespec.formats.files import is_interval, is_number
from moespec.measure.contention import describe
from moespec.measure.fits import NOISY_IQR
from moespec.measure.level import pinned_of

BYTES_RANGE = (0.1, 10.0)  # a verify time outside these multiples of bytes / ceiling is not the bytes' time
# A profile's self-check missing by more than this in median: of 87 stored runs on four CPUs (results/structure-model)
# the 18 whose check missed by more held 31% of their held-out model-kernels within 10% / 20%, the others 79%; its
# largest miss tells the states apart less (over 25%: 52% against 75%), and a few passes of re-reads of cached
# experts miss by 40-90% on hosts whose every profile is steady
PROFILE_ERROR_LIMIT = 0.1
OFF_LEVEL_SHARE = 0.1  # a pinned profile with more of its calls kept off the level (the wait ran out) mixes states
FLAT_SHARE = 0.05  # without intervals, growth from n = 1 to the largest n under 5% (run's --target) is flat
RERUN_RUN = "rerun `moespec run --fresh` with more --reps on a quieter machine"
TOO_SMALL_ADVICE = ("a plan takes its times from the verify-only runs of both kernels instead (`moespec run "
                    "--no-throughput`, then `moespec plan --runs`) and refuses without them; to predict from a bench, "
                    "bench a model with larger experts, or if the machine was busy rerun `moespec bench --fresh` "
                    "with more --reps on a quieter one")


def rerun_bench(bench: Mapping[str, Any] | None = None) -> str:
    """The settings that give a bench to trust: --fresh (named with why: a rerun without it resumes the rounds an
    interrupted run left, which the bench's resumed_rounds counts), --reps, a quieter machine, other --layers."""
    resumed = (bench or {}).get("resumed_rounds")
    why = (f"{resumed} of its rounds were resumed from an earlier run's checkpoint"
           if isinstance(resumed, int) and not isinstance(resumed, bool) and resumed > 0 else
           "without it a rerun resumes an interrupted run's rounds")
    return f"rerun `moespec bench --fresh` ({why}) with more --reps on a quieter machine, or time other --layers"


def too_small_line(bench: Mapping[str, Any], where: str) -> str | None:
    """One line when the bench's expert operation is too small to time (too_small), with what to change: a model
    with larger experts where our kernels stay far below the ceiling, else (only the fits' eps past 1/2: more likely
    a disturbed machine) a fresh bench; None when it is not flagged."""
    small = too_small(bench)
    if not small["flag"]:
        return None
    share, fixed = small["share_of_ceiling"], small["fixed_share"]
    advice = TOO_SMALL_ADVICE if fixed_costs_set_time(share, fixed) else \
        "re-take the device profile (`moespec profile`) on a quieter machine, or bench the model" \
        if bench.get("predicted") else \
        f"a plan takes its times from verify-only runs (--runs) or refuses: {rerun_bench(bench)}"
    return f"{where}: {small['reason']}; {advice}"


def bench_checks(bench: Mapping[str, Any], where: str) -> list[str]:
    """A bench whose expert operation is too small to time (too_small), timed beside another process, or whose
    timings are noisy (noise_verdict), each line naming what to change; else, where it resumed rounds of an earlier
    run, that --fresh times them now."""
    small = too_small_line(bench, where)
    out = [small] if small else []
    if contended := describe(record_at(bench, "contention") or None, "timed calls"):
        out.append(f"{where}: {contended}")
    noisy, drifted = noise_verdict(bench)
    if noisy:
        record = bench["noisy"]
        widest = f" (widest {record['worst']:.0%})" if is_number(record.get("worst")) else ""
        out.append(f"{where}: noisy bench: {record['count']} of {record['total']} timings have an IQR above "
                   f"{record['threshold']:.0%} of their median{widest}{'; the ceiling drifted' if drifted else ''}; "
                   f"{rerun_bench(bench)}")
    resumed = bench.get("resumed_rounds")
    if not out and isinstance(resumed, int) and not isinstance(resumed, bool) and resumed > 0:
        out.append(f"{where}: {resumed} of its rounds were resumed from an earlier run's checkpoint, timed on the "
                   f"machine as it was then; `moespec bench --fresh` times them all now")
    return out


def profile_checks(profile: DeviceProfile, where: str, dtype: str | None = None) -> list[str]:
    """A validated device profile's warnings (the module docstring), of `dtype`'s self-check where given (else
    every dtype's): one line each, naming the file and the setting to change."""
    out, ceiling = [], profile["ceiling_gbps"]
    level = record_at(profile, "level")
    if (pinned := pinned_of(level)) is not None and is_number(level.get("calls")):
        off = level.get("kept_off", 0) / max(level["calls"], 1)
        if off > OFF_LEVEL_SHARE:
            out.append(f"{where}: {off:.0%} of its calls were kept off the pinned level of {pinned:.1f} GB/s (the "
                       f"wait ran out): its rates mix two states of this host")
        band = level.get("band")
        if is_number(band) and abs(ceiling / pinned - 1) > band:
            out.append(f"{where}: its calls' streaming read ({ceiling:.1f} GB/s in median) is off its pinned level of "
                       f"{pinned:.1f} GB/s by more than the level's band ({band:.0%}): the level's reference read "
                       f"met another state of this host than its calls")
    else:
        around = profile.get("ceiling_before_after_gbps")  # optional: a list of two positive GB/s
        around = around if isinstance(around, list) and all(is_number(v) and v > 0 for v in around) else []
        moved = [f"{side} {v:.1f}" for side, v in zip(("before", "after"), around) if abs(v / ceiling - 1) > NOISY_IQR]
        if moved:
            out.append(f"{where}: the streaming read moved while the profile ran ({ceiling:.1f} GB/s during its calls, "
                       f"{' and '.join(moved)} GB/s): its rates mix two states of this host")
    by_dtype = profile.get("self_check_by_dtype") or {}
    names = [dtype] if dtype else list(by_dtype) or [None]
    worst, name = max((error, name) for name in names for error in profile.self_check(name, "median").values())
    if worst > PROFILE_ERROR_LIMIT:
        out.append(f"{where}: its self-check misses by {worst:.0%} in median{f' at {name}' if name in by_dtype else ''}"
                   f" (over {PROFILE_ERROR_LIMIT:.0%}): the host was busy or changing state while it ran, or the "
                   f"model misses this device's kernels (a take on a steady host that misses again); `bench "
                   f"--predict` adds that error to its eps, and a plan refuses eps past 1/2")
    if out:
        out[-1] += "; re-take it with `moespec profile` on a quieter machine"
    return out


def record_at(doc: Any, *keys: str) -> Mapping[str, Any]:
    """doc[k1][k2]... where every step is an object, else {}: an optional record, read where present and valid."""
    for key in keys:
        doc = doc.get(key) if isinstance(doc, Mapping) else None
    return doc if isinstance(doc, Mapping) else {}


def _ceiling(runs: Mapping[str, Any], plan: Mapping[str, Any] | None) -> float | None:
    """The streaming-read ceiling (GB/s) of the runs (median of theirs), else of the plan's bench."""
    values = [v for v in record_at(runs, "ceiling_gbps").values() if is_number(v) and v > 0]
    if values:
        return float(statistics.median(values))
    bench = record_at(plan, "inputs_ceiling_gbps").get("bench")
    return float(bench) if is_number(bench) and bench > 0 else None


def runs_checks(runs: Mapping[str, Any], where: str, plan: Mapping[str, Any] | None = None) -> list[str]:
    """Runs timed beside another process, or whose verify time is flat in n, or far from the bytes a pass reads
    over the ceiling (the plan's pass_bytes; module docstring)."""
    parts = (("verify", "verify passes"), ("throughput", "throughput prompts"))
    contended = [f"{where}: {line}" for part, what in parts
                 if (line := describe(record_at(runs, "contention", part) or None, what))]
    kernel = next((p for p in KERNELS if record_at(runs, "verify_time_s", p)), None)
    if kernel is None:
        return contended
    times = {int(n): t for n, t in record_at(runs, "verify_time_s", kernel).items()
             if n.isdigit() and is_number(t) and t > 0}
    out = list(contended)
    top = max(times, default=1)
    if 1 in times and top > 1:
        ci = record_at(runs, "verify_time_ci_s", kernel)
        first, last = ci.get("1"), ci.get(str(top))
        spans = is_interval(first) and is_interval(last)
        flat = last[0] <= first[1] if spans else times[top] < times[1] * (1 + FLAT_SHARE)
        if flat:
            out.append(f"{where}: the {kernel} verify time is flat in n ({times[1] * 1e3:.3g} ms at n = 1, "
                       f"{times[top] * 1e3:.3g} ms at n = {top}, within the noise): the expert operation adds "
                       f"nothing measurable to the pass on this model and machine, so no kernel choice shows; run a "
                       f"model with larger experts (--preset, --layers), or {RERUN_RUN}")
    pass_bytes = record_at(plan, "pass_bytes", kernel)
    ceiling = _ceiling(runs, plan)
    ratios = [t / (pass_bytes[str(n)] / (ceiling * 1e9)) for n, t in times.items()
              if ceiling and is_number(pass_bytes.get(str(n))) and pass_bytes[str(n)] > 0]
    if ratios and not BYTES_RANGE[0] <= min(ratios) <= max(ratios) <= BYTES_RANGE[1]:
        low = min(ratios) < BYTES_RANGE[0]
        why = ("faster than its bytes can stream: the pass did not read what the plan's byte model says (other "
               "--moe-layers, --depth or dtype than the plan's, or weights held in cache: a model too small to time) "
               "or the ceiling was taken on a disturbed machine" if low else
               "fixed per-pass costs, not bytes, set them (the expert operation of this model is too small to time "
               "on this machine) or the machine was disturbed")
        out.append(f"{where}: the {kernel} verify times are {min(ratios):.2g}x-{max(ratios):.2g}x the bytes a pass "
                   f"reads over the {ceiling:.1f} GB/s ceiling (expected {BYTES_RANGE[0]:g}x-{BYTES_RANGE[1]:g}x): "
                   f"{why}; {RERUN_RUN}, or with a larger model")
    return out

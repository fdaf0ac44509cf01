"""The bench's rounds (moespec.measure.bench): one round of one layer times every pass size, each pass by every
kernel after a cache flush (its experts read once before it: memory in place, Cores.cold_call), in orders rotated
per round; the checkpoint's key and check of a finished round; and the rounds gathered per (layer, n) into the
records `analyze` reads (moespec.measure.fits).

Shapes: `inputs` [pass size][pass] of Inputs; a round [pass size] of {"times": [pass][kernel] seconds,
"ceiling_gbps": [samples], "contention": record, and with call samples "call_ceilings_gbps": [pass][kernel] GB/s};
`requested` [pass size][pass][kernel] the expert bytes a call requests (moespec.theory.requested_bytes).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from moespec.formats.checkpoint import is_count, require
from moespec.formats.files import check_contention_record, is_number
from moespec.kernels import pages
from moespec.measure.contention import Cores, merge
from moespec.measure.layer import Inputs, LayerWeights
from moespec.measure.level import Level
from moespec.measure.passes import Pass
from moespec.measure.timing import Timer, median_iqr

Timings = list[dict[str, list[float]]]  # per pass: kernel -> seconds of each round
# The checkpoint's units: one round of one layer over every pass size (a bench of units per (layer, n), from before
# the rounds, is refused by this key rather than resumed).
LAYOUT = "rounds over n"
# A timed call over OUTLIER_RATIO x its pass's expected time met a disturbance the bandwidth level and the contention
# record let through: a core taken for part of the call, from inside a virtual machine or between the reads (up to
# 6x on a 2-core host, where one window's median of 3 rounds read 3x the others' and turned the sign of the saving at
# n = 3). The expected time is the line, robust to such passes, of the passes' medians against the bytes they
# request at that pass size and kernel (expected_times): a pass's fixed and per-token costs are on it, not outliers.
# The call is timed again, RETIME_TRIES times at most until it is under that; the last time is kept, so a pass that
# is slow every time stays slow.
OUTLIER_RATIO, RETIME_TRIES = 1.5, 3


def warm_up(inputs: list[list[Inputs]], kernels: list[str], layer: LayerWeights) -> None:
    """Each kernel once on the first pass of every group: the timed calls find its code and buffers ready."""
    for group in inputs:
        for kernel in kernels:
            layer.run(kernel, *group[0])


def time_round(inputs: list[list[Inputs]], kernels: list[str], layer: LayerWeights, rep: int, reps: int,
               timer: Timer, advance: Callable[[int], None], level: Level, cores: Cores,
               sample: Callable[[], float] | None = None) -> list[dict[str, Any]]:
    """Round `rep` of `reps` over groups of passes (one group per pass size), started rep/reps of the way through
    the groups (moespec.measure.bench's docstring); in each pass every kernel runs after a cache flush, in an order
    rotated per round, so drift, bursts and order effects hit every n and kernel alike. Each group starts at the
    bench's bandwidth level and is timed again where the reference read after it is off the level, where one is
    pinned (moespec.measure.level; on a CPU); one ceiling sample (GB/s) follows each group, so a kernel's share of
    the ceiling is taken against the machine of its own rounds; every call runs on the threads `cores` fits to the
    free cores. With `sample` (a ceiling measurement, Timer.sampler) one more sample follows every timed call, the
    state that call met. Returns per group {"times": [[seconds per kernel, in `kernels` order] per pass],
    "ceiling_gbps", "contention"} and with `sample` "call_ceilings_gbps" shaped as "times"."""
    order = kernels[rep % len(kernels):] + kernels[:rep % len(kernels)]
    out: list[dict[str, Any]] = [{} for _ in inputs]
    start = rep * len(inputs) // reps
    for i in [(start + j) % len(inputs) for j in range(len(inputs))]:
        def one_group(group: list[Inputs] = inputs[i]) -> list[list[tuple[float, float | None]]]:
            return [[timed_call(layer, kernel, inp, timer, cores, sample) for kernel in order] for inp in group]

        got = level.measured(one_group)
        out[i] = {"times": [[row[order.index(k)][0] for k in kernels] for row in got],
                  "ceiling_gbps": timer.ceiling(repeats=1), "contention": cores.take()}
        if sample:
            out[i]["call_ceilings_gbps"] = [[row[order.index(k)][1] for k in kernels] for row in got]
        advance(len(inputs[i]))
    return out


def timed_call(layer: LayerWeights, kernel: str, inp: Inputs, timer: Timer, cores: Cores,
               sample: Callable[[], float] | None) -> tuple[float, float | None]:
    """One timed call after a cache flush, its experts read once before it (Cores.cold_call), on the threads `cores`
    fits: (seconds, the ceiling sampled right after it, or None without `sample`)."""
    t = cores.cold_call(timer, partial(layer.run, kernel, *inp), pages.expert_slices(layer.tensors, inp[1]))
    return t, sample() if sample else None


def expected_times(rounds: list[list[dict[str, Any]]], requested: list[list[list[float]]], i: int,
                   c: int) -> np.ndarray:
    """Each pass's expected seconds at pass size i by kernel c: the Theil-Sen line (the median of the pairwise
    slopes, not below 0, and the median intercept) of the passes' medians over the rounds against the bytes they
    request, which a few passes disturbed in most rounds do not move; not below the smallest median."""
    x = np.array([sizes[c] for sizes in requested[i]], dtype=float)
    y = np.array([np.median([r[i]["times"][j][c] for r in rounds]) for j in range(len(x))])
    slopes = [(y[b] - y[a]) / (x[b] - x[a]) for a in range(len(x)) for b in range(a + 1, len(x)) if x[b] != x[a]]
    slope = max(float(np.median(slopes)), 0.0) if slopes else 0.0
    return np.maximum(float(np.median(y - slope * x)) + slope * x, y.min())


def retime_outliers(rounds: list[list[dict[str, Any]]], inputs: list[list[Inputs]], kernels: list[str],
                    layer: LayerWeights, requested: list[list[list[float]]], timer: Timer, level: Level, cores: Cores,
                    sample: Callable[[], float] | None = None) -> list[dict[str, Any]]:
    """Time again each call of a layer's finished rounds (time_round) over OUTLIER_RATIO x its pass's expected time
    (expected_times), at the bench's level, until it is under that or RETIME_TRIES times. Returns one record per such
    call, {round, group, pass, kernel, first_s, seconds, ceiling_gbps (None without `sample`)}, which apply_retimes
    puts in the rounds."""
    out = []
    for i in range(len(requested)):
        for c, kernel in enumerate(kernels):
            limits = OUTLIER_RATIO * expected_times(rounds, requested, i, c)
            for rep, j in [(rep, j) for rep in range(len(rounds)) for j in range(len(limits))]:
                first = rounds[rep][i]["times"][j][c]
                if first <= limits[j]:
                    continue
                for _ in range(RETIME_TRIES):
                    seconds, ceiling = level.measured(partial(timed_call, layer, kernel, inputs[i][j], timer, cores,
                                                              sample))
                    if seconds <= limits[j]:
                        break
                out.append({"round": rep, "group": i, "pass": j, "kernel": kernel, "first_s": first,
                            "seconds": seconds, "ceiling_gbps": ceiling})
    return out


def apply_retimes(rounds: list[list[dict[str, Any]]], retimes: list[dict[str, Any]],
                  kernels: list[str]) -> list[list[dict[str, Any]]]:
    """The rounds with each retimed call's time (and its ceiling sample, where the rounds have them) in place of
    the first."""
    out = copy.deepcopy(rounds)
    for f in retimes:
        group, c = out[f["round"]][f["group"]], kernels.index(f["kernel"])
        group["times"][f["pass"]][c] = f["seconds"]
        if "call_ceilings_gbps" in group and f["ceiling_gbps"] is not None:
            group["call_ceilings_gbps"][f["pass"]][c] = f["ceiling_gbps"]
    return out


def retime_key(layer: int, kernels: list[str]) -> str:
    """The checkpoint's key of a layer's retimed calls (retime_outliers), saved once its rounds are done."""
    return f"layer {layer} retimed kernels {','.join(kernels)}"


def retime_check(group_sizes: list[int], reps: int, kernels: list[str]) -> Callable[[Any, str], None]:
    """The check of a resumed layer's retimed calls: each names a round, group, pass and kernel of the layer's
    rounds, and positive times."""
    def check(unit: Any, where: str) -> None:
        require(isinstance(unit, list), where, "the retimed calls must be a list")
        for f in unit:
            require(isinstance(f, dict) and is_count(f.get("round")) and f["round"] < reps
                    and is_count(f.get("group")) and f["group"] < len(group_sizes)
                    and is_count(f.get("pass")) and f["pass"] < group_sizes[f["group"]]
                    and f.get("kernel") in kernels
                    and all(is_number(f.get(k)) and f[k] > 0 for k in ("first_s", "seconds"))
                    and (f.get("ceiling_gbps") is None or (is_number(f["ceiling_gbps"]) and f["ceiling_gbps"] > 0)),
                    where, f"a retimed call must name a round, group, pass and kernel of the layer's rounds and "
                           f"positive times, got {f!r}")
    return check


def round_key(layer: int, rep: int, kernels: list[str]) -> str:
    """A finished round's key in the checkpoint."""
    return f"layer {layer} round {rep} kernels {','.join(kernels)}"


def round_check(group_sizes: list[int], kernels: list[str]) -> Callable[[Any, str], None]:
    """The check of a resumed round of one layer (time_round): one group per pass size, `group_sizes[i]` passes
    in group i, each timed by every kernel once, with its ceiling samples and contention record."""
    def check(unit: Any, where: str) -> None:
        require(isinstance(unit, list) and len(unit) == len(group_sizes), where,
                f"a round must hold {len(group_sizes)} groups, one per pass size")
        for i, (group, size) in enumerate(zip(unit, group_sizes)):
            times, ceilings = (group.get(k) if isinstance(group, dict) else None for k in ("times", "ceiling_gbps"))
            require(isinstance(times, list) and len(times) == size and
                    all(isinstance(row, list) and len(row) == len(kernels) and
                        all(is_number(t) and t > 0 for t in row) for row in times), where,
                    f"group {i} must time its {size} passes with each of {', '.join(kernels)}")
            require(isinstance(ceilings, list) and all(is_number(c) and c > 0 for c in ceilings), where,
                    f"group {i}: ceiling_gbps must list positive bandwidths")
            if "call_ceilings_gbps" in group:  # bench --call-ceilings: a sample after every call
                calls = group["call_ceilings_gbps"]
                require(isinstance(calls, list) and len(calls) == size and
                        all(isinstance(row, list) and len(row) == len(kernels) and
                            all(is_number(c) and c > 0 for c in row) for row in calls), where,
                        f"group {i}: call_ceilings_gbps must hold a positive bandwidth per pass and kernel")
            check_contention_record(group.get("contention"), where, f"group {i} contention")
    return check


def unit_record(layer: int, n: int, kernels: list[str], passes: list[Pass], samples: Timings,
                ceilings: list[float], call_ceilings: Timings | None = None) -> dict[str, Any]:
    """One (layer, n) as `analyze` reads it: per pass its source, U, a window's start, median/IQR per kernel over
    the rounds and each round's time (round_s, in the order of `ceilings`) and, where sampled, the ceiling after
    each of those calls (round_ceiling_gbps); the ceiling samples taken after it in each round."""
    rows = []
    for j, (p, times) in enumerate(zip(passes, samples)):
        stats = {kernel: median_iqr(t) for kernel, t in times.items()}
        rows.append({"source": p.source, "U": p.U, **({} if p.start is None else {"start": p.start}),
                     "median_s": {k: s[0] for k, s in stats.items()}, "iqr_s": {k: s[1] for k, s in stats.items()},
                     "round_s": {k: list(t) for k, t in times.items()},
                     **({"round_ceiling_gbps": call_ceilings[j]} if call_ceilings else {})})
    return {"layer": layer, "n": n, "kernels": kernels, "passes": rows, "ceiling_gbps": ceilings}


def unit_records(layer: int, ns: list[int], kernels: list[str], plan: dict[tuple[int, int], list[Pass]],
                 rounds: list[list[dict[str, Any]]]) -> dict[tuple[int, int], dict[str, Any]]:
    """A layer's rounds (from time_round, groups in `ns` order) gathered per (layer, n) (unit_record)."""
    out = {}
    for i, n in enumerate(ns):
        samples: Timings = [{k: [r[i]["times"][j][c] for r in rounds] for c, k in enumerate(kernels)}
                            for j in range(len(plan[layer, n]))]
        calls: Timings | None = [{k: [r[i]["call_ceilings_gbps"][j][c] for r in rounds] for c, k in enumerate(kernels)}
                                 for j in range(len(plan[layer, n]))] \
            if all("call_ceilings_gbps" in r[i] for r in rounds) else None
        out[layer, n] = unit_record(layer, n, kernels, plan[layer, n], samples,
                                    [c for r in rounds for c in r[i]["ceiling_gbps"]], calls)
        out[layer, n]["contention"] = merge([r[i]["contention"] for r in rounds if "contention" in r[i]])
    return out

"""The cache a per-slot re-read finds, measured for `moespec profile` (moespec.measure.device_profile).

A per-slot pass reads an expert once per slot that names it. moespec.kernels.structure credits a re-read with the share
min(1, cache / D) of its expert found in the cache, D the distinct expert bytes read since that expert's previous read
(its own included). The last-level cache's size (sysfs) is an upper bound on `cache`: on a host whose other tenants
share that cache, and under its replacement policy, a re-read finds less. The probe measures the capacity the rule
should use: cold per-slot passes over a cycle of K distinct synthetic experts, one slot a token (ids t mod K), so that
every slot past the first K re-reads its expert at D = K b exactly; K is chosen for D to span PROBE_SHARES of the
nominal cache. The effective capacity is the c at which the model's pass times (the profile's own rates, each pass
at the ceiling sampled after its calls) fit the measured medians best: least squares of log time over a grid of
CAPACITY_STEPS capacities up to the nominal size. Where the profile's rates make a cached read cost about what a
cold one does (a fast state of memory, or a hot rate measured slow), the passes cannot tell one c from another and
they would not move a prediction in that state either: under MIN_CONTRAST between the grid's ends the nominal size
stands. Synthetic shape only (PROBE_SHAPE), no model's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from moespec import ArgumentError
from moespec.arguments import show
from moespec.kernels.structure import Rates, pass_time

# (d, f): 8.1 MB an expert in bf16, 4.3 MB in q8_0, no model's; near the models' experts in size, as a re-read of a
# small one is held back by the kernel's work per group (experts of 1.7 MB re-read at the cold rate from 32 MiB on a
# VM where experts of 8 MB re-read ~20% faster up to 62 MiB)
PROBE_SHAPE = (1408, 960)
PROBE_SHARES = (1 / 16, 1 / 8, 1 / 4, 3 / 8, 1 / 2, 3 / 4, 1, 3 / 2)  # re-read distances D over the nominal cache
PROBE_CYCLES = 3  # each expert read PROBE_CYCLES times: once cold, then re-read at D = K b
CAPACITY_STEPS = 64  # the capacity grid: nominal / 64, 2 nominal / 64, .., nominal (0.5 MiB steps of a 32 MiB L3)
# The least relative difference the model's time of some probe pass must show between the grid's smallest capacity
# and the nominal one for the passes to tell capacities apart (a probe pass's timing spreads by a few percent)
MIN_CONTRAST = 0.05


def _whole(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ArgumentError(f"{name} must be a whole number >= 1, got {show(value)}")


def probe_cycles(expert_bytes: int, nominal_bytes: int) -> list[int]:
    """The distinct cycle lengths K (>= 2) whose re-read distance K b comes nearest each of PROBE_SHARES of the
    nominal cache."""
    _whole("expert_bytes", expert_bytes)
    _whole("nominal_bytes", nominal_bytes)
    return sorted({max(2, round(share * nominal_bytes / expert_bytes)) for share in PROBE_SHARES})


def probe_ids(k: int) -> np.ndarray:
    """ids [K PROBE_CYCLES, 1]: one slot a token, experts 0..K-1 in turn, PROBE_CYCLES times."""
    _whole("k", k)
    return (np.arange(k * PROBE_CYCLES, dtype=np.int64) % k)[:, None]


def fit_capacity(rates: Rates, kind: str, passes: Sequence[tuple[np.ndarray, float, float]], expert_bytes: int,
                 expert_rows: int, nominal_bytes: int) -> tuple[int, list[float], bool]:
    """(c, predicted seconds of each pass at c, whether the passes identify c): the capacity on the grid of
    CAPACITY_STEPS multiples of nominal_bytes / CAPACITY_STEPS whose predicted times (pass_time, kernel `kind`) fit the
    measured ones best in log; `passes` are (ids, measured median seconds, ceiling GB/s). The smallest such c on ties;
    nominal_bytes, not identified, where the model's times at the grid's ends differ by less than MIN_CONTRAST at
    every pass."""
    if not passes or any(not (s > 0 and c > 0) for _, s, c in passes):
        raise ArgumentError("passes must be (ids, seconds > 0, ceiling > 0) and not empty")
    _whole("nominal_bytes", nominal_bytes)
    grid = sorted({max(1, int(nominal_bytes) * i // CAPACITY_STEPS) for i in range(1, CAPACITY_STEPS + 1)})
    measured = np.log([s for _, s, _ in passes])

    def at(c: int) -> list[float]:
        return [pass_time(rates, kind, ids, expert_bytes, expert_rows, ceiling, c) for ids, _, ceiling in passes]

    if max(lo / hi - 1 for lo, hi in zip(at(grid[0]), at(grid[-1]))) < MIN_CONTRAST:
        return grid[-1], at(grid[-1]), False
    best: tuple[float, int, list[float]] | None = None
    for c in grid:
        predicted = at(c)
        loss = float(np.sum((np.log(predicted) - measured) ** 2))
        if best is None or loss < best[0]:
            best = (loss, c, predicted)
    return best[1], best[2], True


def measured_capacity(rates: Rates, kernel: str, shape: tuple[int, int],
                      timed: Sequence[tuple[np.ndarray, Sequence[float], Sequence[float]]], expert_bytes: int,
                      expert_rows: int, nominal_bytes: int) -> tuple[int, dict[str, Any]]:
    """(c, record) from the probe's timed passes of `kernel` (a per-slot kernel) on experts of `shape` (d, f),
    (ids, seconds, ceilings GB/s) per cycle, medians taken here: fit_capacity's c and device.json's `cache_probe`."""
    passes = [(ids, float(np.median(seconds)), float(np.median(ceilings))) for ids, seconds, ceilings in timed]
    capacity, predicted, identified = fit_capacity(rates, "slot", passes, expert_bytes, expert_rows, nominal_bytes)
    return capacity, {"kernel": kernel, "shape": list(shape), "expert_bytes": int(expert_bytes),
                      "identified": identified,
                      "distances_bytes": [int(ids.max() + 1) * int(expert_bytes) for ids, _, _ in passes],
                      "measured_s": [s for _, s, _ in passes], "ceiling_gbps": [c for _, _, c in passes],
                      "predicted_s": predicted}

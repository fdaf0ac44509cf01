"""The device profile's self-check (moespec.measure.profile_check): its passes, each format's error and the worst
format's, and a recorded profile's check taken again from its recorded passes, exact."""

from __future__ import annotations

import numpy as np
import pytest

from moespec.kernels.structure import kind_rates, pass_time
from moespec.measure import profile_check
from moespec.model.weights import expert_matrix_bytes, expert_rows

ENTRY = {"G": [1, 2, 4, 8, 16], "hot_s_per_byte": [1e-11, 1e-11, 1e-11, 2e-11, 4e-11],
         "cold_excess_s_per_byte": [5e-12, 1e-11, 2e-11, 3e-11, 4e-11], "group_s": 1e-6, "pass_s": 1e-4,
         "token_s": 2e-6, "row_s": [0.0, 1e-9, 2e-9, 3e-9, 4e-9]}
CEILING, CACHE = 40.0, 32 << 20


def test_check_passes_are_seeded_and_hold_the_stated_union() -> None:
    """The same passes on every call; each [n, CHECK_SLOTS], slots of a token distinct, ids in range, U distinct
    experts in all, at the smallest, a middle and the largest U of each n."""
    first, again = profile_check.check_passes(), profile_check.check_passes()
    assert [(n, u) for n, u, _ in first] == [(n, u) for n, u, _ in again]
    assert all(np.array_equal(a, b) for (_, _, a), (_, _, b) in zip(first, again))
    slots, experts = profile_check.CHECK_SLOTS, profile_check.CHECK_EXPERTS
    for n, u, ids in first:
        assert ids.shape == (n, slots) and ids.min() >= 0 and ids.max() < experts
        assert all(len(set(row)) == slots for row in ids.tolist()) and len(np.unique(ids)) == u
    for n in profile_check.CHECK_N:
        us = [u for m, u, _ in first if m == n]
        assert min(us) == slots and max(us) == min(n * slots, experts)


def recorded_doc(errors: dict[str, dict[str, float]], placed: list[float] | None = None) -> dict:
    """A profile document whose check passes of each format (key) were measured at the model's time over (1 + the
    kernel's error): each pass at its own ceiling, the check weights at placement `placed`."""
    rates, rows = kind_rates(ENTRY, CEILING), expert_rows(*profile_check.CHECK_SHAPE)
    by_dtype = {}
    for dtype, error in errors.items():
        b, passes = expert_matrix_bytes(*profile_check.CHECK_SHAPE, dtype), []
        for i, (n, u, ids) in enumerate(profile_check.check_passes()):
            for kind in ("slot", "dedup"):
                ceiling = CEILING * (1 + 0.01 * i)
                t = pass_time(rates[kind], kind, ids, b, rows, ceiling, CACHE, placed)
                passes.append({"kernel": kind, "n": n, "U": u, "ceiling_gbps": ceiling,
                               "measured_s": t / (1 + error[kind]), "predicted_s": 0.0})
        by_dtype[dtype] = {"passes": passes, "placement": placed}
    return {"ceiling_gbps": CEILING, "cache_bytes": CACHE, "dtypes": dict.fromkeys(errors, ENTRY),
            "self_check_by_dtype": by_dtype, "self_check": {}}


def test_recheck_recomputes_each_formats_error_and_the_worst() -> None:
    """Passes measured at the model's time over 1.05 (slot) and 0.9 (dedup) read 5% and 10% off at every pass;
    the profile's self_check is the worse format's per kernel; the other fields stay."""
    doc = recorded_doc({"bf16": {"slot": 0.05, "dedup": -0.1}, "fp32": {"slot": 0.02, "dedup": 0.2}})
    checked = profile_check.recheck(doc)
    passes = len(profile_check.check_passes())
    bf16 = checked["self_check_by_dtype"]["bf16"]
    assert bf16["slot"] == pytest.approx({"median": 0.05, "max": 0.05, "passes": passes}, rel=1e-9)
    assert bf16["dedup"] == pytest.approx({"median": 0.1, "max": 0.1, "passes": passes}, rel=1e-9)
    assert checked["self_check"]["slot"]["median"] == pytest.approx(0.05, rel=1e-9)
    assert checked["self_check"]["dedup"]["max"] == pytest.approx(0.2, rel=1e-9)
    assert all(p["predicted_s"] > 0 for p in bf16["passes"]) and checked["dtypes"] == doc["dtypes"]
    assert doc["self_check"] == {}  # the recorded document is not changed


def test_recheck_predicts_with_the_recorded_placement() -> None:
    """Check weights whose memory read at 0.6-1.4x the ceiling buffer's: their passes, recorded at the model's time
    with that placement, read exact again; taken without it they would not."""
    placed = [0.6 + 0.8 * e / (profile_check.CHECK_EXPERTS - 1) for e in range(profile_check.CHECK_EXPERTS)]
    doc = recorded_doc({"bf16": {"slot": 0.0, "dedup": 0.0}}, placed)
    checked = profile_check.recheck(doc)["self_check_by_dtype"]["bf16"]
    assert checked["placement"] == placed
    assert all(checked[kind]["max"] == pytest.approx(0.0, abs=1e-12) for kind in ("slot", "dedup"))
    doc["self_check_by_dtype"]["bf16"]["placement"] = None
    assert profile_check.recheck(doc)["self_check"]["dedup"]["max"] > 0.01


def test_worst_of_the_formats() -> None:
    checks = {"bf16": {"slot": {"median": 0.01, "max": 0.3, "passes": 9}, "dedup": {"median": 0.2, "max": 0.25,
                                                                                  "passes": 9}},
              "q8_0": {"slot": {"median": 0.04, "max": 0.05, "passes": 9}, "dedup": {"median": 0.1, "max": 0.4,
                                                                                  "passes": 9}}}
    assert profile_check.worst(checks) == {"slot": {"median": 0.04, "max": 0.3, "passes": 9},
                                           "dedup": {"median": 0.2, "max": 0.4, "passes": 9}}

"""The loop's state probe (moespec.measure.state_probe): the factor k recovered exactly from synthetic takes of the
self-check's passes, the passes that cannot tell it left out, refusals, and the probe timed on this machine."""

from __future__ import annotations

import numpy as np
import pytest

from moespec import ArgumentError, MoespecError
from moespec.kernels.structure import kind_rates, pass_time
from moespec.measure import state_probe
from moespec.measure.profile_check import CHECK_SHAPE, check_passes
from moespec.measure.timing import CpuTimer
from moespec.model.weights import expert_matrix_bytes, expert_rows

# a loop that sets a good share of each check pass: x over half the stream's time per byte at 40 GB/s, 1 ms a call
LOOPY = {"G": [1, 2, 4, 8, 16], "hot_s_per_byte": [1e-11, 1e-11, 2e-11, 3e-11, 5e-11],
         "cold_excess_s_per_byte": [3e-11, 3e-11, 4e-11, 5e-11, 6e-11], "group_s": 2e-6, "pass_s": 1e-3,
         "token_s": 2e-6, "row_s": [1e-9] * 5}
STREAMY = {"G": [1, 2, 4, 8, 16], "hot_s_per_byte": [1e-12] * 5, "cold_excess_s_per_byte": [0.0] * 5,
           "group_s": 0.0, "pass_s": 0.0}  # every pass its stream alone
CEILING, CACHE = 40.0, 64 << 20


def model_errors() -> list[float]:
    """The model's own error on each check pass (the time it predicts over the measured one, less 1): -20% to +60%,
    as a self-check's passes read on a real host; the same on every take of a pass."""
    return [-0.2 + 0.8 * i / (2 * len(check_passes()) - 1) for i in range(2 * len(check_passes()))]


def takes(entry: dict, k: float, ceiling: float, shape: tuple[int, int] = CHECK_SHAPE) -> list[dict]:
    """Each check pass of both kernels measured at the model's time with the loop times k at `ceiling`, over (1 + the
    pass's model error)."""
    rates, out = kind_rates(entry, CEILING), []
    b, rows = expert_matrix_bytes(*shape, "bf16"), expert_rows(*shape)
    errors = iter(model_errors())
    for n, u, ids in check_passes():
        for kind in ("slot", "dedup"):
            t = pass_time(rates[kind].loop_scaled(k), kind, ids, b, rows, ceiling, CACHE)
            out.append({"kernel": kind, "n": n, "U": u, "ceiling_gbps": ceiling, "measured_s": t / (1 + next(errors)),
                        "placement": None})
    return out


def profile(entry: dict = LOOPY, shape: tuple[int, int] = CHECK_SHAPE) -> dict:
    """A profile document whose check passes were taken at the ceiling of the profile with its own loop (k = 1)."""
    passes = [p | {"predicted_s": 0.0} for p in takes(entry, 1.0, CEILING, shape)]
    return {"ceiling_gbps": CEILING, "cache_bytes": CACHE, "dtypes": {"bf16": entry},
            "self_check_by_dtype": {"bf16": {"passes": passes, "placement": None}}}


@pytest.mark.parametrize("k, ceiling", [(1.0, 40.0), (1.4, 30.0), (0.7, 45.0), (2.5, 40.0)])
def test_the_loop_factor_of_a_known_state(k: float, ceiling: float) -> None:
    """Takes now at a loop k times the profile's and another ceiling, each pass off the model by its own error as in
    the profile's take: k back from every pass (the model's error cancels in the ratio), every pass told it."""
    found = state_probe.loop_factor(profile(), "bf16", takes(LOOPY, k, ceiling))
    assert found["k"] == pytest.approx(k, rel=1e-6) and found["used"] == len(found["passes"]) == 18
    assert all(p["k"] == pytest.approx(k, rel=1e-6) and p["loop_share"] >= state_probe.MIN_LOOP_SHARE
               for p in found["passes"])


def test_passes_set_by_the_stream_tell_no_loop() -> None:
    """Rates with no loop at all: every pass is its stream, none tells k, and k is 1 (the profile's loop)."""
    found = state_probe.loop_factor(profile(STREAMY), "bf16", takes(STREAMY, 1.0, 30.0))
    assert found["used"] == 0 and found["k"] == 1.0
    assert all(p["loop_share"] < state_probe.MIN_LOOP_SHARE for p in found["passes"])


def test_a_state_past_the_range_reads_as_its_end() -> None:
    """A take 10x slower than any loop of the profile's: k held at the range's end, not extrapolated."""
    slow = [p | {"measured_s": 10 * p["measured_s"]} for p in takes(LOOPY, 4.0, CEILING)]
    assert state_probe.loop_factor(profile(), "bf16", slow)["k"] == state_probe.K_RANGE[1]
    fast = [p | {"measured_s": p["measured_s"] / 10} for p in takes(LOOPY, 0.25, CEILING)]
    assert state_probe.loop_factor(profile(), "bf16", fast)["k"] == state_probe.K_RANGE[0]


def test_refusals() -> None:
    doc = profile()
    stray = takes(LOOPY, 1.0, CEILING)
    stray[0] = stray[0] | {"U": 31}
    with pytest.raises(ArgumentError, match="probe: pass"):
        state_probe.loop_factor(doc, "bf16", stray)
    with pytest.raises(ArgumentError, match="probe: pass"):
        state_probe.loop_factor(doc, "bf16", [stray[1] | {"measured_s": 0.0}])
    with pytest.raises(MoespecError, match="no self-check passes at q8_0"):
        state_probe.loop_factor(doc, "q8_0", stray)
    with pytest.raises(ArgumentError, match="reps"):
        state_probe.time_probe(doc, "bf16", CpuTimer(), reps=0)


def test_the_probe_timed_here(monkeypatch) -> None:
    """The probe on this machine, the check shape made tiny: every recorded pass of both kernels timed (positive
    seconds and ceilings, the weights' placement or None), and a factor in range from them."""
    shape = (64, 128)
    monkeypatch.setattr(state_probe, "CHECK_SHAPE", shape)
    doc = profile(shape=shape)
    probe = state_probe.time_probe(doc, "bf16", CpuTimer(), reps=1)
    assert sorted((p["kernel"], p["n"], p["U"]) for p in probe) == sorted(
        (p["kernel"], p["n"], p["U"]) for p in doc["self_check_by_dtype"]["bf16"]["passes"])
    assert all(p["measured_s"] > 0 and p["ceiling_gbps"] > 0 for p in probe)
    assert all(p["placement"] is None or len(p["placement"]) == 32 for p in probe)
    found = state_probe.loop_factor(doc, "bf16", probe)
    assert state_probe.K_RANGE[0] <= found["k"] <= state_probe.K_RANGE[1] and np.isfinite(found["k"])

"""moespec.measure.cache_probe: the probe's passes re-read at known distances, and the capacity fit recovers the
cache a model's pass times were made with (exact on the grid), within the last-level cache's size."""

from __future__ import annotations

import numpy as np
import pytest

from moespec import ArgumentError
from moespec.kernels.structure import Rates, hit_share, pass_time
from moespec.measure import cache_probe

RATES = Rates((1, 2), (2e-11, 2e-11), (1e-11, 1e-11), 5e-7, 1e-4)  # a hot byte 3x faster than a cold one at 50 GB/s
B, ROWS, NOMINAL = 1 << 20, 1216, 32 << 20


def test_probe_passes_re_read_at_their_distance() -> None:
    cycles = cache_probe.probe_cycles(B, NOMINAL)
    assert cycles == sorted(set(cycles)) and cycles[0] >= 2
    assert [k * B for k in cycles] == [round(s * NOMINAL) for s in cache_probe.PROBE_SHARES]  # 1 MiB experts: exact
    assert cache_probe.probe_cycles(B, 256 << 20)[-1] == 384  # the distances follow the nominal cache
    ids = cache_probe.probe_ids(5)
    assert ids.shape == (5 * cache_probe.PROBE_CYCLES, 1) and ids[:, 0].tolist()[:7] == [0, 1, 2, 3, 4, 0, 1]
    shares = hit_share([(int(e), 1) for e in ids[:, 0]], B, 8 * B)  # D = 5 B for every re-read
    assert shares[:5] == [0.0] * 5 and shares[5:] == [1.0] * 10
    assert hit_share([(int(e), 1) for e in cache_probe.probe_ids(16)[:, 0]], B, 8 * B)[16:] == [0.5] * 32
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ArgumentError, match="must be a whole number"):
            cache_probe.probe_cycles(bad, NOMINAL)
        with pytest.raises(ArgumentError, match="nominal_bytes must be a whole number"):
            cache_probe.probe_cycles(B, bad)
        with pytest.raises(ArgumentError, match="must be a whole number"):
            cache_probe.probe_ids(bad)


@pytest.mark.parametrize("capacity", [3 << 19, 6 << 20, 13 << 20, 32 << 20])
def test_fit_recovers_the_capacity(capacity: int) -> None:
    passes = [(cache_probe.probe_ids(k), pass_time(RATES, "slot", cache_probe.probe_ids(k), B, ROWS, 50.0, capacity),
               50.0) for k in cache_probe.probe_cycles(B, NOMINAL)]
    fitted, predicted, identified = cache_probe.fit_capacity(RATES, "slot", passes, B, ROWS, NOMINAL)
    assert fitted == capacity and identified and np.allclose(predicted, [s for _, s, _ in passes], rtol=1e-12)


def test_fit_stays_within_the_nominal_cache_and_records_the_probe() -> None:
    """Passes faster than any capacity explains fit the nominal size, the grid's top; rates whose cached and cold
    bytes cost alike cannot tell capacities apart: the nominal size stands (one not a multiple of 64 too); the record
    holds what was timed."""
    cycles = cache_probe.probe_cycles(B, NOMINAL)
    timed = [(cache_probe.probe_ids(k), [1e-6, 2e-6, 3e-6], [40.0, 50.0, 60.0]) for k in cycles]
    capacity, record = cache_probe.measured_capacity(RATES, "slot", (896, 320), timed, B, ROWS, NOMINAL)
    assert capacity == NOMINAL and record["distances_bytes"] == [k * B for k in cycles]
    assert record["measured_s"] == [2e-6] * len(cycles) and record["ceiling_gbps"] == [50.0] * len(cycles)
    assert record["shape"] == [896, 320] and len(record["predicted_s"]) == len(cycles)
    flat = Rates((1, 2), (2e-11, 2e-11), (0.0, 0.0), 5e-7, 1e-4)  # at 50 GB/s a cold byte costs a hot one's
    timed = [(ids, [s], [50.0]) for ids, s in
             ((cache_probe.probe_ids(k), pass_time(RATES, "slot", cache_probe.probe_ids(k), B, ROWS, 50.0, 4 << 20))
              for k in cycles)]
    assert cache_probe.measured_capacity(flat, "slot", (896, 320), timed, B, ROWS, NOMINAL + 1)[:2] == (
        NOMINAL + 1, {**cache_probe.measured_capacity(flat, "slot", (896, 320), timed, B, ROWS, NOMINAL + 1)[1],
                      "identified": False})
    assert cache_probe.measured_capacity(RATES, "slot", (896, 320), timed, B, ROWS, NOMINAL)[0] == 4 << 20
    with pytest.raises(ArgumentError, match="passes must be"):
        cache_probe.fit_capacity(RATES, "slot", [], B, ROWS, NOMINAL)
    with pytest.raises(ArgumentError, match="nominal_bytes"):
        cache_probe.fit_capacity(RATES, "slot", [(cache_probe.probe_ids(2), 1e-3, 50.0)], B, ROWS, 0)

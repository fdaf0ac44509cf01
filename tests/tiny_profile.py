"""The device profile on tiny shapes (moespec.measure.device_profile): what the profile's tests patch so that every
stage runs in seconds."""

from __future__ import annotations

import pytest

from moespec.measure import cache_probe, device_profile, placement, profile_check

TINY = {"RATE_SHAPES": ((256, 128), (128, 192)), "GGUF_RATE_SHAPES": ((256, 128), (128, 192), (96, 96)),
        "HOT_SHAPES": ((128, 64),), "ROW_SHAPES": ((32, 96), (96, 32)), "G_VALUES": (1, 2, 3),
        "COLD_BYTES": (1 << 20, 4 << 20), "HOT_BYTES": 96 << 10, "HOT_CACHE_SHARE": 1 / 64, "CHECK_N": (2,),
        "CHECK_EXPERTS": 8, "CHECK_SHAPE": (192, 64),
        "STREAM_CHUNKS": (64 << 10,), "THREAD_SCALING_G": (1,), "PROBE_SHAPE": (128, 64)}  # multiples of 32 (GGUF)


def make_tiny(monkeypatch: pytest.MonkeyPatch) -> None:
    """TINY's shapes, and cache probe distances of a few of its experts."""
    for name, value in TINY.items():
        monkeypatch.setattr(profile_check if name.startswith("CHECK") else device_profile, name, value)
    monkeypatch.setattr(cache_probe, "PROBE_SHARES", (1 / 256, 1 / 64))  # re-reads at a few tiny experts
    monkeypatch.setattr(placement, "BLOCK_BYTES", 256 << 10)  # the tiny weights' placement in blocks of 256 KiB,
    monkeypatch.setattr(placement, "REPS", 2)  # each read twice: a median of two, not of the real five

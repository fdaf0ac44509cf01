"""`moespec profile` (moespec.measure.device_profile): never on a model's expert shapes, a smoke run of the real
microbenchmarks on tiny shapes that writes a device.json its loader and the structural model accept, and its
refusals (issue 35)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_cases import one_line, refused

from moespec.defaults import PAIR_DIR
from moespec.formats.devicefile import load_profile
from moespec.measure import device_profile
from moespec.model.spec import PRESETS
from moespec.predict.structure import Rates


def test_no_profiled_shape_is_a_models() -> None:
    pair = json.loads((PAIR_DIR / "target" / "config.json").read_text())
    models = {(s.hidden, s.expert_width) for s in PRESETS.values()} | {(pair["hidden_size"],
                                                                         pair["intermediate_size"])}
    models |= {(1536, 512), (3072, 1536)}  # the validation's held-out shapes (benchmarks/structure_model.py)
    profiled = {*device_profile.RATE_SHAPES, *device_profile.HOT_SHAPES, device_profile.OVERHEAD_SHAPE,
                device_profile.CHECK_SHAPE}
    assert not profiled & models


def test_smoke_run_on_tiny_shapes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every stage of the profile on tiny shapes and a few G, 2 rounds: the file validates and the rates load."""
    for name, value in {"RATE_SHAPES": ((256, 128), (128, 192)), "HOT_SHAPES": ((128, 64),), "G_VALUES": (1, 2, 3),
                        "COLD_BYTES": 1 << 20, "CHECK_N": (2,), "CHECK_EXPERTS": 8, "CHECK_SHAPE": (192, 64),
                        "STREAM_CHUNKS": (64 << 10,), "THREAD_SCALING_G": (1,)}.items():
        monkeypatch.setattr(device_profile, name, value)
    profile = device_profile.run_profile(device_profile.ProfileConfig(out=str(tmp_path / "device.json"), reps=2))
    loaded = load_profile(tmp_path / "device.json")
    assert loaded == dict(profile) and loaded.dtypes == ["bf16"] and loaded["dtypes"]["bf16"]["G"] == [1, 2, 3]
    rates = Rates.from_profile(loaded["dtypes"]["bf16"])
    assert rates.per_byte(2, loaded.ceiling_gbps) > 0 and set(loaded.self_check()) == {"slot", "dedup"}
    assert loaded["provenance"]["command"] and loaded["threads"] >= 1


@pytest.mark.parametrize("argv, words", [
    (["--device", "cuda"], ["--device"]), (["--dtypes", "q8_0"], ["--dtypes"]), (["--reps", "1"], ["--reps"])])
def test_refusals(tmp_path: Path, capsys, argv: list[str], words: list[str]) -> None:
    one_line(refused(["profile", "--out", tmp_path / "d.json", *argv], capsys, tmp_path), *words)

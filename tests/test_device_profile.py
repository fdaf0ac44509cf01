"""`moespec profile` (moespec.measure.device_profile): never on a model's expert shapes, a smoke run of the real
microbenchmarks on tiny shapes that writes a device.json its loader and the structural model accept (our kernels at
bf16, ggml's pair at q8_0), the fit of the fixed costs (exact), and its refusals (issue 35)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from cli_cases import one_line, refused

from moespec.defaults import PAIR_DIR
from moespec.formats.devicefile import load_profile
from moespec.kernels import KERNELS
from moespec.measure import device_profile
from moespec.model.spec import PRESETS
from moespec.kernels.structure import Rates


def test_no_profiled_shape_is_a_models() -> None:
    pair = json.loads((PAIR_DIR / "target" / "config.json").read_text())
    models = {(s.hidden, s.expert_width) for s in PRESETS.values()} | {(pair["hidden_size"],
                                                                         pair["intermediate_size"])}
    models |= {(1536, 512), (3072, 1536)}  # the validation's held-out shapes (benchmarks/structure_model.py)
    profiled = {*device_profile.RATE_SHAPES, *device_profile.HOT_SHAPES, device_profile.OVERHEAD_SHAPE,
                device_profile.CHECK_SHAPE}
    assert not profiled & models


TINY = {"RATE_SHAPES": ((256, 128), (128, 192)), "HOT_SHAPES": ((128, 64),), "G_VALUES": (1, 2, 3),
        "COLD_BYTES": 1 << 20, "CHECK_N": (2,), "CHECK_EXPERTS": 8, "CHECK_SHAPE": (192, 64),
        "STREAM_CHUNKS": (64 << 10,), "THREAD_SCALING_G": (1,)}  # every one a multiple of a GGUF block (32)


def test_smoke_run_on_tiny_shapes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every stage of the profile on tiny shapes and a few G, 2 rounds: the file validates and the rates load."""
    for name, value in TINY.items():
        monkeypatch.setattr(device_profile, name, value)
    profile = device_profile.run_profile(device_profile.ProfileConfig(out=str(tmp_path / "device.json"), reps=2))
    loaded = load_profile(tmp_path / "device.json")
    assert loaded == dict(profile) and loaded.dtypes == ["bf16"] and loaded["dtypes"]["bf16"]["G"] == [1, 2, 3]
    rates = Rates.from_profile(loaded["dtypes"]["bf16"])
    assert rates.per_byte(2, loaded.ceiling_gbps) > 0 and set(loaded.self_check()) == {"slot", "dedup"}
    assert loaded["provenance"]["command"] and loaded["threads"] >= 1
    assert loaded["dtypes"]["bf16"]["node_s"] == 0  # our kernels run a pass as one call


@pytest.mark.skipif("ggml-mul_mat_id" not in KERNELS, reason="ggml-python is not installed")
def test_smoke_run_of_ggml_pair(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--dtypes q8_0 times ggml's pair through its own entry point: the entry has its rates, a node's fixed cost and
    its own self-check."""
    for name, value in TINY.items():
        monkeypatch.setattr(device_profile, name, value)
    config = device_profile.ProfileConfig(out=str(tmp_path / "device.json"), dtypes=("q8_0",), reps=2)
    device_profile.run_profile(config)
    loaded = load_profile(tmp_path / "device.json")
    entry = loaded["dtypes"]["q8_0"]
    assert loaded.dtypes == ["q8_0"] and entry["G"] == [1, 2, 3] and entry["node_s"] >= 0
    assert set(loaded["self_check_by_dtype"]["q8_0"]) >= {"slot", "dedup"}
    assert loaded.self_check("q8_0") == {k: loaded["self_check_by_dtype"]["q8_0"][k]["max"] for k in ("slot", "dedup")}
    assert device_profile.Weights.bytes_of(64, 32, "q8_0") == 3 * 64 * 32 // 32 * 34  # 34 bytes per 32 weights
    assert device_profile.Weights.bytes_of(64, 32, "q4_0") == 3 * 64 * 32 // 32 * 18


def test_fixed_costs_fit_exact() -> None:
    """_fixed recovers a call's, a group's and a node's fixed seconds from overhead passes built from them, the
    groups' bytes taken out at each call's own ceiling; our kernels' passes (one node each) give node_s 0."""
    pass_s, group_s, node_s, b, per_byte = 80e-6, 0.5e-6, 6e-6, 1e4, 1e-11
    for dtype, nodes_seen in (("q8_0", True), ("bf16", False)):
        by_key, info = {}, {}
        for kind, tokens, m in device_profile._overhead_passes(dtype):
            groups, nodes = tokens * m, tokens if kind == "slot" and nodes_seen else 1  # ggml-per-slot: a node a token
            ceilings = [40.0, 80.0]
            seconds = [pass_s + group_s * groups + node_s * (nodes - 1) + groups * b * per_byte * 80 / c
                       for c in ceilings]
            key = ("overhead", kind, tokens, m, "cold")
            by_key[key] = device_profile.Item(key, lambda: None, seconds=seconds, ceilings=ceilings)
            info[key] = (b, (groups, nodes))
        fitted = device_profile._fixed(by_key, info, "cold", lambda c: per_byte * 80 / c)
        assert np.allclose(fitted, (pass_s, group_s, node_s if nodes_seen else 0.0), rtol=1e-9, atol=1e-15)


@pytest.mark.parametrize("argv, words", [
    (["--device", "cuda"], ["--device"]), (["--dtypes", "q5_0"], ["--dtypes"]), (["--reps", "1"], ["--reps"])])
def test_refusals(tmp_path: Path, capsys, argv: list[str], words: list[str]) -> None:
    one_line(refused(["profile", "--out", tmp_path / "d.json", *argv], capsys, tmp_path), *words)

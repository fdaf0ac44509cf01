"""`moespec profile` (moespec.measure.device_profile): never on a model's expert shapes, a smoke run of the real
microbenchmarks on tiny shapes that writes a device.json its loader and the structural model accept (our kernels at
bf16, ggml's pair at q8_0), the fit of the fixed costs (exact), and its refusals (issue 35)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

import numpy as np
import pytest
import torch
from cli_cases import one_line, refused
from tiny_profile import make_tiny

from moespec import ArgumentError, MoespecError, cli
from moespec.defaults import PAIR_DIR
from moespec.formats.devicefile import load_profile
from moespec.kernels import KERNELS
from moespec.measure import device_profile, level, profile_check, profile_fit
from moespec.measure.contention import Cores
from moespec.model.spec import PRESETS
from moespec.kernels.structure import Rates, kind_rates


def test_no_profiled_shape_is_a_models() -> None:
    pair = json.loads((PAIR_DIR / "target" / "config.json").read_text())
    models = {(s.hidden, s.expert_width) for s in PRESETS.values()} | {(pair["hidden_size"],
                                                                         pair["intermediate_size"])}
    models |= {(1536, 512), (3072, 1536)}  # the validation's held-out shapes (benchmarks/structure_model.py)
    profiled = {*device_profile.RATE_SHAPES, *device_profile.GGUF_RATE_SHAPES, *device_profile.HOT_SHAPES,
                *device_profile.ROW_SHAPES, device_profile.OVERHEAD_SHAPE, profile_check.CHECK_SHAPE,
                device_profile.PROBE_SHAPE}
    assert not profiled & models


@pytest.fixture
def tiny(monkeypatch: pytest.MonkeyPatch) -> None:
    """TINY's shapes, and cache probe distances of a few of its experts."""
    make_tiny(monkeypatch)


def test_smoke_run_on_tiny_shapes(tmp_path: Path, tiny: None) -> None:
    """Every stage of the profile on tiny shapes and a few G, 2 rounds: the file validates and the rates load; the
    cache a re-read finds is measured, at most the last-level cache."""
    profile = device_profile.run_profile(device_profile.ProfileConfig(out=str(tmp_path / "device.json"), reps=2))
    loaded = load_profile(tmp_path / "device.json")
    assert loaded == dict(profile) and loaded.dtypes == ["bf16"] and loaded["dtypes"]["bf16"]["G"] == [1, 2, 3]
    rates = Rates.from_profile(loaded["dtypes"]["bf16"])
    assert rates.per_byte(2, loaded.ceiling_gbps) > 0 and set(loaded.self_check()) == {"slot", "dedup"}
    assert loaded["provenance"]["command"] and loaded["threads"] >= 1
    assert loaded["dtypes"]["bf16"]["node_s"] == 0  # one call
    watched = loaded["protocol"]["contention"]  # the cold calls, each timed as the bench times one; not the hot ones
    assert 0 < watched["calls"] < loaded["level"]["calls"] and watched["fitted"] is False
    placed = loaded["self_check_by_dtype"]["bf16"]["placement"]  # the check weights' memory (the CPU's)
    assert len(placed) == profile_check.CHECK_EXPERTS and min(placed) > 0
    assert len(loaded["dtypes"]["bf16"]["row_s"]) == 3 and loaded["shapes"]["rows"] == [[32, 96], [96, 32]]
    assert loaded["shapes"]["rates"] == {"bf16": [[256, 128], [128, 192]]}
    probe = loaded["cache_probe"]
    assert 0 < loaded["cache_bytes"] <= loaded["cache_nominal_bytes"] and probe["kernel"] == "slot"
    assert probe["shape"] == [128, 64] and len(probe["distances_bytes"]) == len(probe["measured_s"]) == 2


@pytest.mark.skipif("ggml-mul_mat_id" not in KERNELS, reason="ggml-python is not installed")
def test_smoke_run_of_ggml_pair(tmp_path: Path, tiny: None) -> None:
    """--dtypes q8_0 times ggml's pair through its own entry point: the entry has its rates, a node's fixed cost and
    its own self-check; ggml's per-slot kernel runs the cache probe."""
    config = device_profile.ProfileConfig(out=str(tmp_path / "device.json"), dtypes=("q8_0",), reps=2)
    device_profile.run_profile(config)
    loaded = load_profile(tmp_path / "device.json")
    entry = loaded["dtypes"]["q8_0"]
    assert loaded.dtypes == ["q8_0"] and entry["G"] == [1, 2, 3] and entry["node_s"] >= 0
    assert len(entry["row_s"]) == 3 and min(entry["row_s"]) >= 0  # ggml's per-row time, on its own rate shapes
    assert loaded["shapes"]["rates"] == {"q8_0": [[256, 128], [128, 192], [96, 96]]}
    assert loaded["cache_probe"]["kernel"] == "ggml-per-slot"
    assert set(loaded["self_check_by_dtype"]["q8_0"]) >= {"slot", "dedup"}
    assert loaded.self_check("q8_0") == {k: loaded["self_check_by_dtype"]["q8_0"][k]["max"] for k in ("slot", "dedup")}
    assert device_profile.Weights.bytes_of(64, 32, "q8_0") == 3 * 64 * 32 // 32 * 34  # 34 bytes per 32 weights
    assert device_profile.Weights.bytes_of(64, 32, "q4_0") == 3 * 64 * 32 // 32 * 18


def test_every_cold_call_reads_the_experts_it_reads(tiny: None) -> None:
    """A cold item's `reads` (read once before its flush) are the expert bytes its call reads, each once: E experts of
    a rate pass, the distinct experts of a check or probe pass."""
    items, info, _ = device_profile._items("bf16", None, 64 << 20)
    for item in items:
        if item.key[0] in ("cold", "check", "cache"):
            b, _, third = info[item.key]
            experts = third if item.key[0] == "cold" else len(np.unique(third))
            assert sum(t.numel() * t.element_size() for t in item.reads) == b * experts


def test_fixed_costs_fit_exact() -> None:
    """fixed_costs recovers a call's, a group's and a node's (ggml's) or a token's (ours) fixed seconds from overhead
    passes built from them, the groups' bytes (at each call's own ceiling) and rows taken out; our kernels' passes (one
    node each) give node_s 0, ggml's token_s 0."""
    pass_s, group_s, node_s, token_s, b, rows = 80e-6, 0.5e-6, 6e-6, 2e-6, 1e4, 192
    rates = Rates((1, 2), (1e-11, 2e-11), (5e-12, 1e-11), 0.0, 0.0, row_s=(9e-9, 2e-8))
    for dtype, nodes_seen in (("q8_0", True), ("bf16", False)):
        by_key, info = {}, {}
        for kind, tokens, m in device_profile._overhead_passes(dtype):
            groups, nodes = tokens * m, tokens if kind == "slot" and nodes_seen else 1  # ggml-per-slot: a node a token
            ceilings = [40.0, 80.0]
            per_token = 0.0 if nodes_seen else token_s  # ggml's per-token work is its nodes'
            seconds = [pass_s + group_s * groups + node_s * (nodes - 1) + per_token * tokens
                       + groups * (b * (1 / (c * 1e9) + 5e-12) + rows * 9e-9) for c in ceilings]
            key = ("overhead", kind, tokens, m, "cold")
            by_key[key] = profile_fit.Item(key, lambda: None, seconds=seconds, ceilings=ceilings)
            info[key] = (b, rows, (groups, nodes))
        fitted = profile_fit.fixed_costs(by_key, info, "cold", rates)
        truth = (pass_s, group_s, node_s, 0.0) if nodes_seen else (pass_s, group_s, 0.0, token_s)
        assert np.allclose(fitted, truth, rtol=1e-9, atol=1e-15)


def test_nonneg_fit_exact() -> None:
    """Least squares with every coefficient >= 0: the exact solution where it is feasible; else the best fit on a
    subset of the columns, the others at 0; all 0 where every fit would go negative."""
    u = np.array([1e-3, 2e-3, 4e-3])
    design = np.column_stack([np.ones(3), u])
    assert np.allclose(profile_fit.nonneg_fit(design, 7e-12 + 9e-9 * u), (7e-12, 9e-9), rtol=1e-9)
    falling = 3e-11 - 1e-9 * u  # r would be negative: x alone, their mean
    assert np.allclose(profile_fit.nonneg_fit(design, falling), (falling.mean(), 0.0), rtol=1e-9)
    through_origin = -1e-11 + 9e-9 * u  # x would be negative: r alone, through the origin
    assert np.allclose(profile_fit.nonneg_fit(design, through_origin), (0.0, u @ through_origin / (u @ u)), rtol=1e-9)
    assert np.array_equal(profile_fit.nonneg_fit(design, -u), np.zeros(2))


def test_stream_fit_exact() -> None:
    """y = x + s / C + r u + F v over calls that met two host states gives back x, s, r and F (v: 1 / a pass's
    bytes, passes of two sizes); one state, or s outside [0, 1], fixes s at 1 or its bound and fits the rest; passes
    of one size leave F at 0; a per-row time needs two row lengths."""
    ceilings, shapes_u, sizes = (30.0, 40.0, 55.0), (1e-3, 2e-3, 4e-3), (48e6, 192e6)
    calls = lambda x, s, r, u, v=0.0, ramp=0.0: [(x + s / (c * 1e9) + r * u + ramp * v, 1 / (c * 1e9))  # noqa: E731
                                                 for c in ceilings]
    one_size = lambda x, s, r: [(u, 1 / 48e6, calls(x, s, r, u)) for u in shapes_u]  # noqa: E731
    assert profile_fit.stream_fit(one_size(8e-12, 0.4, 9e-9), per_row=True) == pytest.approx(
        (8e-12, 0.4, 9e-9, 0.0), rel=1e-6)
    assert profile_fit.stream_fit(one_size(3e-12, 0.8, 0.0), per_row=False) == pytest.approx(
        (3e-12, 0.8, 0.0, 0.0), rel=1e-6)
    two_sizes = [(u, 1 / n, calls(3e-12, 0.8, 9e-9, u, 1 / n, 1.5e-4)) for u in shapes_u for n in sizes]
    assert profile_fit.stream_fit(two_sizes, per_row=True) == pytest.approx((3e-12, 0.8, 9e-9, 1.5e-4), rel=1e-6)
    ours = [(1e-3, 1 / n, calls(3e-12, 1.0, 0.0, 1e-3, 1 / n, 1e-4)) for n in sizes]
    assert profile_fit.stream_fit(ours, per_row=False) == pytest.approx((3e-12, 1.0, 0.0, 1e-4), rel=1e-6)
    one_state = [(u, 1 / 48e6, [(2e-11 + 1 / 50e9 * s, 1 / 50e9) for s in (0.9, 1.0, 1.1)]) for u in shapes_u]
    x, share, r, ramp = profile_fit.stream_fit(one_state, per_row=False)
    assert share == 1.0 and x == pytest.approx(2e-11) and r == 0.0 and ramp == 0.0
    assert profile_fit.stream_fit(one_size(1e-12, 1.6, 0.0), per_row=False)[1] == 1.0
    assert profile_fit.stream_fit(one_size(3e-11, -0.5, 0.0), per_row=False)[1] == 0.0
    with pytest.raises(ArgumentError, match="two or more row lengths"):
        profile_fit.stream_fit([(1e-3, 1 / n, calls(1e-11, 1.0, 0.0, 1e-3)) for n in sizes], per_row=True)


def test_hot_rate_is_the_slope_where_the_passes_differ_in_size() -> None:
    """kappa: the slope of time against bytes (a hot pass's start, its intercept, dropped) where the passes' bytes
    span RAMP_SPREAD; the median of one size's passes."""
    points = [(1 / 2000, 1 / n, 1e-11 + 5e-5 / n) for n in (8e6, 8e6, 32e6)]
    assert profile_fit.hot_rate(points, per_row=False) == pytest.approx((1e-11, 0.0), rel=1e-9)
    one_size = [(1 / 2000, 1 / n, y) for n, y in ((8e6, 3e-11), (9e6, 2e-11), (8.5e6, 4e-11))]
    assert profile_fit.hot_rate(one_size, per_row=False) == pytest.approx((3e-11, 0.0))


def test_hot_rate_tells_the_per_row_time_by_row_length() -> None:
    """Hot passes of long and short rows at two sizes, timed as kappa + r (rows per byte) + start / bytes: the fit
    gives back kappa and r exactly; one row length cannot tell r and is refused."""
    kappa, r, start = 2e-11, 4e-8, 3e-5
    points = [(u, 1 / n, kappa + r * u + start / n) for u in (1 / 1600, 1 / 384, 1 / 164) for n in (4e6, 8e6)]
    assert profile_fit.hot_rate(points, per_row=True) == pytest.approx((kappa, r), rel=1e-9)
    one_size = [(u, 1 / 8e6, kappa + r * u) for u in (1 / 1600, 1 / 164)]
    assert profile_fit.hot_rate(one_size, per_row=True) == pytest.approx((kappa, r), rel=1e-9)
    with pytest.raises(ArgumentError, match="two or more row lengths"):
        profile_fit.hot_rate([(1 / 1600, 1 / n, kappa) for n in (4e6, 8e6)], per_row=True)


def test_fit_rates_recovers_stream_share(monkeypatch: pytest.MonkeyPatch) -> None:
    """Our kernels' cold calls timed as the model says with s = 0.6 and a cold pass's start F, at ceilings of two
    host states and two pass sizes, hot passes of two sizes with a start of their own, and the overhead passes: the
    fit gives back s, x, F and kappa."""
    x, share, kappa, pass_s, group_s = {1: 2e-11, 2: 3e-11}, {1: 0.6, 2: 0.5}, {1: 1e-11, 2: 1.5e-11}, 1e-4, 5e-7
    ramp, hot_start = {1: 1e-4, 2: 2e-4}, 4e-5
    by_key, info = {}, {}
    for d, f in device_profile.RATE_SHAPES:
        b = device_profile.Weights.bytes_of(d, f, "bf16")
        for g, e in itertools.product((1, 2), (4, 16)):
            ceilings = [32.0, 36.0, 52.0, 55.0]
            seconds = [pass_s + ramp[g] + e * (group_s + b * max(share[g] / (c * 1e9) + x[g], 1 / (c * 1e9),
                                                                 kappa[g])) for c in ceilings]
            key = ("cold", "dedup", d, f, g, e)
            by_key[key] = profile_fit.Item(key, lambda: None, seconds=seconds, ceilings=ceilings)
            info[key] = (b, 2 * f + d, e)
    for d, f in device_profile.HOT_SHAPES:
        b = device_profile.Weights.bytes_of(d, f, "bf16")
        for g, e in itertools.product((1, 2), (2, 8)):
            key = ("hot", "dedup", d, f, g, e)
            by_key[key] = profile_fit.Item(key, lambda: None, cold=False,
                                           seconds=[pass_s + hot_start + e * (group_s + b * kappa[g])] * 3)
            info[key] = (b, 2 * f + d, e)
    b = device_profile.Weights.bytes_of(64, 64, "bf16")
    for kind, tokens, m in device_profile._overhead_passes("bf16"):
        groups = tokens * m
        for state, c in (("cold", 40.0), ("hot", None)):
            per = max(share[1] / (c * 1e9) + x[1], 1 / (c * 1e9), kappa[1]) if c else kappa[1]
            key = ("overhead", kind, tokens, m, state)
            by_key[key] = profile_fit.Item(key, lambda: None, cold=c is not None,
                                              seconds=[pass_s + groups * (group_s + b * per)],
                                              ceilings=[c] if c else None)
            info[key] = (b, 192, (groups, 1))
    rates = profile_fit.fit_rates(by_key, info, (1, 2), rows=None)
    assert rates.stream_share == pytest.approx((share[1], share[2]), rel=1e-3)
    assert rates.cold_excess_s_per_byte == pytest.approx((x[1], x[2]), rel=1e-3)
    assert rates.ramp_s == pytest.approx((ramp[1], ramp[2]), rel=1e-3)
    assert rates.ramp_bytes == min(b * e for b, _, e in info.values() if isinstance(e, int) and e in (4, 16))
    assert rates.hot_s_per_byte == pytest.approx((kappa[1], kappa[2]), rel=1e-3)


def test_expert_counts_per_size() -> None:
    """Each fill's nearest expert count, at least `least`, distinct and ascending: on a CPU whose process keeps 32
    MiB of cache both hot sizes are HOT_EXPERTS experts of ~4 MB (one size, kappa their median), on one keeping 256
    MiB the larger fills 32 MiB."""
    b = device_profile.Weights.bytes_of(*device_profile.HOT_SHAPES[0], "bf16")
    small = device_profile.sizes_for("cpu", 32 << 20).hot_bytes
    assert device_profile.expert_counts(small, b, device_profile.HOT_EXPERTS) == [device_profile.HOT_EXPERTS]
    large = device_profile.sizes_for("cpu", 256 << 20).hot_bytes
    assert device_profile.expert_counts(large, b, device_profile.HOT_EXPERTS) == [2, round((32 << 20) / b)]
    assert device_profile.expert_counts((48 << 20, 192 << 20), 200 << 20, 1) == [1]  # an expert past both sizes


def recorder(by_key: dict, info: dict) -> Callable[..., None]:
    """add(key, b, rows, groups, seconds, ceilings=None): one timed call into by_key (cold where it has ceilings) and
    its bytes, rows and groups into info."""
    def add(key, b, rows, groups, seconds, ceilings=None):
        by_key[key] = profile_fit.Item(key, lambda: None, cold=ceilings is not None, seconds=seconds,
                                          ceilings=ceilings)
        info[key] = (b, rows, groups)
    return add


def test_fit_rates_recovers_per_row_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rate, hot and overhead passes timed as the model says (ggml's: with a per-row time) give back its x_G, r_G,
    kappa_G and fixed costs (to the fixed point of the alternating fit)."""
    x, r, kappa = {1: 1e-11, 2: 3e-11}, {1: 9e-9, 2: 2.4e-8}, {1: 2e-11, 2: 4e-11}
    pass_s, group_s, node_s, hot_pass, hot_group = 1.2e-4, 1e-7, 3e-5, 5e-5, 5e-8
    by_key, info = {}, {}
    add = recorder(by_key, info)

    for d, f in ((384, 384), (1600, 1600), (3840, 640), (4224, 12800)):
        b, rows, e = device_profile.Weights.bytes_of(d, f, "q8_0"), 2 * f + d, 3
        for g in (1, 2):
            ceilings = [45.0, 90.0]
            add(("cold", "dedup", d, f, g), b, rows, e,
                [pass_s + e * (group_s + rows * r[g] + b * (1 / (c * 1e9) + x[g])) for c in ceilings], ceilings)
    for d, f in device_profile.HOT_SHAPES:
        b, rows = device_profile.Weights.bytes_of(d, f, "q8_0"), 2 * f + d
        for g in (1, 2):
            add(("hot", "dedup", d, f, g), b, rows, 2, [hot_pass + 2 * (hot_group + rows * r[g] + b * kappa[g])] * 3)
    b, rows = device_profile.Weights.bytes_of(64, 64, "q8_0"), 192
    for kind, tokens, m in device_profile._overhead_passes("q8_0"):
        groups, nodes = tokens * m, tokens if kind == "slot" else 1
        add(("overhead", kind, tokens, m, "cold"), b, rows, (groups, nodes),
            [pass_s + node_s * (nodes - 1) + groups * (group_s + rows * r[1] + b * (1 / 60e9 + x[1]))], [60.0])
        add(("overhead", kind, tokens, m, "hot"), b, rows, (groups, nodes),
            [hot_pass + node_s * (nodes - 1) + groups * (hot_group + rows * r[1] + b * kappa[1])])
    rates = profile_fit.fit_rates(by_key, info, (1, 2), rows="cold")
    assert rates.cold_excess_s_per_byte == pytest.approx((x[1], x[2]), rel=1e-3)
    assert rates.row_s == pytest.approx((r[1], r[2]), rel=1e-3)
    assert rates.hot_s_per_byte == pytest.approx((kappa[1], kappa[2]), rel=1e-3)
    assert (rates.pass_s, rates.group_s, rates.node_s) == pytest.approx((pass_s, group_s, node_s), rel=1e-3)
    assert rates.hot_group_s == pytest.approx(hot_group, rel=1e-3)
    ours = profile_fit.fit_rates(by_key, info, (1, 2), rows=None)  # one rate per G, no rows
    assert ours.row_s == () and ours.cold_excess_s_per_byte[0] > x[1]


def test_fixed_costs_refit_without_a_term_that_comes_out_negative() -> None:
    """Overhead passes whose time falls with their tokens (pass + groups x group - 3 us x tokens): the token term is
    left out and the others refit without it (a clipped term would have left pass_s fitted beside -3 us a token)."""
    rates = Rates((1,), (1e-12,), (0.0,), 0.0, 0.0)
    by_key, info, design, times = {}, {}, [], []
    for kind, tokens, m in device_profile._overhead_passes("bf16"):
        key, groups = ("overhead", kind, tokens, m, "cold"), tokens * m
        times.append(2e-4 + groups * 1e-6 - 3e-6 * tokens)
        design.append([1.0, groups])
        by_key[key] = profile_fit.Item(key, lambda: None, seconds=[times[-1]], ceilings=[1e9])
        info[key] = (1.0, 1, (groups, 1))
    pass_s, group_s, node_s, token_s = profile_fit.fixed_costs(by_key, info, "cold", rates)
    expected = np.linalg.lstsq(np.array(design), np.array(times), rcond=None)[0]
    assert (token_s, node_s) == (0.0, 0.0) and (pass_s, group_s) == pytest.approx(tuple(expected), rel=1e-6)
    assert pass_s < 2e-4 + 8 * 3e-6  # not the intercept beside the negative token term


def test_fit_rates_recovers_our_per_row_time_from_the_hot_passes() -> None:
    """Our kernels on the CPU (rows "hot"): cold rate passes, hot passes of long (HOT_SHAPES) and short rows
    (ROW_SHAPES) at two sizes and the overhead passes, timed as the model says with a per-row time: the fit gives back
    r_G from the hot passes, and x_G, kappa_G and the fixed costs; the per-row time is taken off the cold passes, so
    x_G is the rate the stream alone sets."""
    x, r, kappa = {1: 1e-11, 2: 3e-11}, {1: 1e-9, 2: 9e-9}, {1: 2e-11, 2: 3e-11}
    pass_s, group_s, token_s, hot_pass, hot_group = 1.2e-4, 6e-7, 1.5e-6, 5e-5, 3e-7
    by_key, info = {}, {}
    add = recorder(by_key, info)

    for (d, f), g in itertools.product(device_profile.RATE_SHAPES, (1, 2)):
        b, rows, e = device_profile.Weights.bytes_of(d, f, "bf16"), 2 * f + d, 5
        ceilings = [30.0, 60.0]
        add(("cold", "dedup", d, f, g, e), b, rows, e, [pass_s + g * token_s + e * (
            group_s + rows * r[g] + b * max(1 / (c * 1e9) + x[g], kappa[g])) for c in ceilings], ceilings)
    for (d, f), g in itertools.product(device_profile.hot_shapes("bf16", "cpu"), (1, 2)):
        b, rows = device_profile.Weights.bytes_of(d, f, "bf16"), 2 * f + d
        for e in device_profile.expert_counts((8 << 20, 4 << 20), b, 2):
            add(("hot", "dedup", d, f, g, e), b, rows, e,
                [hot_pass + g * token_s + e * (hot_group + rows * r[g] + b * kappa[g])] * 3)
    b, rows = device_profile.Weights.bytes_of(64, 64, "bf16"), 192
    for kind, tokens, m in device_profile._overhead_passes("bf16"):
        groups = tokens * m
        add(("overhead", kind, tokens, m, "cold"), b, rows, (groups, 1), [pass_s + tokens * token_s + groups * (
            group_s + rows * r[1] + b * max(1 / 50e9 + x[1], kappa[1]))], [50.0])
        add(("overhead", kind, tokens, m, "hot"), b, rows, (groups, 1),
            [hot_pass + tokens * token_s + groups * (hot_group + rows * r[1] + b * kappa[1])])
    rates = profile_fit.fit_rates(by_key, info, (1, 2), rows="hot")
    assert rates.row_s == pytest.approx((r[1], r[2]), rel=1e-3)
    assert rates.hot_s_per_byte == pytest.approx((kappa[1], kappa[2]), rel=1e-3)
    assert rates.cold_excess_s_per_byte == pytest.approx((x[1], x[2]), rel=1e-3)
    assert (rates.pass_s, rates.group_s, rates.token_s, rates.hot_group_s) == pytest.approx(
        (pass_s, group_s, token_s, hot_group), rel=1e-3)
    with pytest.raises(ArgumentError, match="rows must be"):
        profile_fit.fit_rates(by_key, info, (1, 2), rows="warm")


@pytest.mark.parametrize("argv, words", [
    (["--device", "tpu"], ["--device"]), (["--dtypes", "q5_0"], ["--dtypes"]), (["--reps", "1"], ["--reps"]),
    (["--pin-gbps", "0"], ["--pin-gbps"]), (["--pin-wait", "-1"], ["--pin-wait"])])
def test_refusals(tmp_path: Path, capsys, argv: list[str], words: list[str]) -> None:
    one_line(refused(["profile", "--out", tmp_path / "d.json", *argv], capsys, tmp_path), *words)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is here: --device cuda would profile it")
def test_cuda_refused_without_a_gpu(tmp_path: Path, capsys) -> None:
    """--device cuda where torch sees no GPU: one line naming the flag and why, before any work."""
    one_line(refused(["profile", "--out", tmp_path / "d.json", "--device", "cuda"], capsys, tmp_path),
             "--device cuda", "no CUDA device")
    assert not (tmp_path / "d.json").exists()


def test_cli_prints_the_measured_cache(tmp_path: Path, tiny: None, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    """`moespec profile` end to end on tiny shapes, pinned (--pin-wait; the reference read stands at 20 GB/s): exit
    0, the file loads with its level and the stream's whole share, and its console names the level and the cache a
    re-read finds beside the last-level cache."""
    monkeypatch.setattr(level, "StreamRead", lambda nbytes: lambda: 20.0)
    assert cli.main(["profile", "--out", str(tmp_path / "d.json"), "--reps", "2", "--pin-wait", "5"]) == 0
    loaded = load_profile(tmp_path / "d.json")
    out = " ".join(capsys.readouterr().out.split())
    assert "cache a per-slot re-read finds" in out and f"{loaded['cache_nominal_bytes'] / 2**20:.0f} MiB" in out
    assert loaded["level"]["pinned_gbps"] == 20.0 and loaded["level"]["dropped"] == 0
    assert loaded["dtypes"]["bf16"]["stream_share"] == [1.0] * 3  # pinned: one state, s not fitted on the noise
    assert "level: rounds kept at 20.0 GB/s" in out


def test_pinned_rounds_take_every_call_at_the_level() -> None:
    """Pinned, a call whose reference read after it is off the level runs again (after the host settles back) and
    only the kept call's time and ceiling sample count, a hot call's without a sample; unpinned, no reference read
    is taken at all."""
    def fake_timer(times: list[float], ceilings: list[float]) -> SimpleNamespace:
        t, c = iter(times), iter(ceilings)
        return SimpleNamespace(flush=lambda: None, warm=lambda fn: fn(), time=lambda fn: fn() or next(t),
                               sampler=lambda: lambda: next(c))

    def two_items() -> list[profile_fit.Item]:
        return [profile_fit.Item(("cold",), lambda: None), profile_fit.Item(("hot",), lambda: None, cold=False)]

    # the cold call: settled at 30, read 50 after (off: dropped), a settled window at 30, read 30 after; the hot one
    reads = iter([30.0, 50.0, *[30.0] * level.SETTLE_READS, 30.0, 30.0, 30.0])
    pinned = level.Level(30.0, wait_s=10, read=lambda: next(reads))
    items = two_items()
    timer = fake_timer([1.0, 2.0, 3.0], [40.0, 41.0])
    device_profile._time_rounds(items, 1, timer, pinned, lambda text: None, timer.sampler(), Cores(fit=False))
    assert (items[0].seconds, items[0].ceilings, items[1].seconds, items[1].ceilings) == ([2.0], [41.0], [3.0], [])
    assert pinned.dropped == 1 and next(reads, None) is None
    items = two_items()
    unpinned = level.Level(wait_s=0, read=lambda: pytest.fail("no reference read where nothing is pinned"))
    timer = fake_timer([1.0, 2.0, 3.0, 4.0], [40.0, 41.0])
    device_profile._time_rounds(items, 2, timer, unpinned, lambda text: None, timer.sampler(), Cores(fit=False))
    assert [i.seconds for i in items] == [[1.0, 4.0], [2.0, 3.0]] and items[0].ceilings == [40.0, 41.0]


def test_fit_rates_apart_gives_each_kind_its_own() -> None:
    """Where the per-slot kernel is a program of its own (`apart`: the Triton kernels), each kind's rates and fixed
    costs come from its own rate and overhead passes: both recovered exactly from passes timed as the model says."""
    truth = {"dedup": {"x": 4e-12, "kappa": 1e-13, "pass_s": 2.0e-5, "group_s": 1e-7},
             "slot": {"x": 9e-12, "kappa": 2e-13, "pass_s": 1.2e-5, "group_s": 3e-7}}
    by_key, info = {}, {}

    def add(key, b, e, seconds, ceilings=None):
        by_key[key] = profile_fit.Item(key, lambda: None, cold=ceilings is not None, seconds=seconds,
                                       ceilings=ceilings)
        info[key] = (b, 100, e)

    for kind, t in truth.items():
        def per(c):  # seconds per byte: cold at c GB/s, hot (None)
            return 1 / (c * 1e9) + t["x"] if c else t["kappa"]
        for d, f in ((2560, 640), (1024, 1920)):
            b, e = device_profile.Weights.bytes_of(d, f, "bf16"), 6
            for state, c in (("cold", 4000.0), ("hot", None)):
                add((state, kind, d, f, 1), b, e, [t["pass_s"] * (c is not None) + e * (t["group_s"] * (c is not None)
                                                                                     + b * per(c))] * 3,
                    [c] * 3 if c else None)
        b = device_profile.Weights.bytes_of(64, 64, "bf16")
        for m in (1, 2, 4, 8):
            for state, c in (("cold", 4000.0), ("hot", None)):
                cold = c is not None
                add(("overhead", kind, 8, m, state), b, (8 * m, 1),
                    [t["pass_s"] * cold + 8 * m * (t["group_s"] * cold + b * per(c))], [c] if c else None)
    for kind, t in truth.items():
        rates = profile_fit.fit_rates(by_key, info, (1,), rows=None, kind=kind, apart=True)
        assert (rates.pass_s, rates.group_s) == pytest.approx((t["pass_s"], t["group_s"]), rel=1e-6)
        assert rates.cold_excess_s_per_byte[0] == pytest.approx(t["x"], rel=1e-6)
        assert rates.hot_s_per_byte[0] == pytest.approx(t["kappa"], rel=1e-6)
    mixed = profile_fit.fit_rates(by_key, info, (1,), rows=None, kind="slot")  # both kinds' fixed costs at once
    assert mixed.pass_s != pytest.approx(truth["slot"]["pass_s"], rel=1e-3)


def test_cuda_sizes_and_a_profile_with_the_slot_kernel_apart(tmp_path: Path, tiny: None,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A GPU's sizes follow its L2 (G up to the Triton kernels' 16 tokens, no cache probe); the profile with the
    per-slot kernel apart and no probe (here on the CPU's native kernels) writes the slot's own rates, which the
    loader validates and the model reads for the slot kind only, and the last-level cache's size as the cache."""
    cuda = device_profile.sizes_for("cuda", 60 << 20)
    assert cuda.apart and max(cuda.g_values) == 16 and cuda.cold_bytes == (240 << 20,) \
        and cuda.hot_bytes == (24 << 20,) and cuda.device == "cuda" and not cuda.probe
    cpu = device_profile.sizes_for("cpu", 256 << 20)
    assert not cpu.apart and cpu.probe and cpu.cold_bytes == device_profile.COLD_BYTES
    assert cpu.hot_bytes == (device_profile.HOT_BYTES, int(device_profile.HOT_CACHE_SHARE * (256 << 20)))
    monkeypatch.setattr(device_profile, "sizes_for", lambda kind, l2=0: device_profile.Sizes(
        (1, 2), (1 << 20,), (1 << 18,), True, False, "cpu"))
    device_profile.run_profile(device_profile.ProfileConfig(out=str(tmp_path / "device.json"), reps=2))
    loaded = load_profile(tmp_path / "device.json")
    entry = loaded["dtypes"]["bf16"]
    assert entry["G"] == [1, 2] and entry["slot"]["G"] == [1] and loaded["sizes"]["slot_apart"]
    assert loaded["cache_probe"] is None and loaded["cache_bytes"] == loaded["cache_nominal_bytes"]  # no probe
    rates = kind_rates(entry, loaded["ceiling_gbps"])  # each kind's own entry, its hot rates capped at the ceiling
    for kind, own in (("slot", entry["slot"]), ("dedup", entry)):
        assert rates[kind].cold_excess_s_per_byte == tuple(own["cold_excess_s_per_byte"])
        assert all(k <= h for k, h in zip(rates[kind].hot_s_per_byte, own["hot_s_per_byte"]))
    bad = json.loads((tmp_path / "device.json").read_text())
    bad["dtypes"]["bf16"]["slot"]["G"] = [2]
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(MoespecError, match=r"bad.json: dtypes.bf16.slot.G"):
        load_profile(tmp_path / "bad.json")

"""Synthetic routing: the calibrated process hits its targets (and is stationary from the first token), its exact
reuse formula, the popularity sampler, seeding and metadata, and the `synth` command's errors."""

from __future__ import annotations

import numpy as np
import pytest

from moespec import MoespecError
from moespec.cli import main
from moespec.formats.trace import load_trace
from moespec.routing.reuse import reuse_stats, uniform_rho
from moespec.routing.synth import (
    PROFILES,
    KeepPool,
    alias_table,
    document_lengths,
    popularity,
    successive_sample,
    synthesize,
)

TOLERANCE = 0.01  # the bar for hitting the layer-mean targets


@pytest.mark.parametrize("model", list(PROFILES["paper-wikitext"]))
def test_calibrated_hits_paper_targets(model):
    rho2, rho9 = PROFILES["paper-wikitext"][model]
    trace = synthesize(model, "calibrated", 12_000, 24, seed=7)
    s = reuse_stats(trace, 9, bootstrap=0)
    assert abs(s.rho_mean[2] - rho2) < TOLERANCE and abs(s.rho_mean[9] - rho9) < TOLERANCE
    assert np.allclose(s.rho_mean[1:], trace.meta["expected_rho"][1:], atol=TOLERANCE)


def test_calibrated_is_stationary_from_the_first_token():
    """Documents of 9 tokens: every window starts within 8 tokens of a document start, so a process that was not
    stationary from its first token would miss the targets."""
    trace = synthesize("gpt-oss-20b", "calibrated", 9 * 1500, 1500, seed=8)
    s = reuse_stats(trace, 9, bootstrap=0)
    assert s.windows[9] == 1500
    assert abs(s.rho_mean[2] - 0.492) < TOLERANCE and abs(s.rho_mean[9] - 0.856) < TOLERANCE


def test_calibration_is_exact_and_checks_feasibility():
    for (n_exp, m), (rho2, rho9) in zip([(64, 8), (128, 8), (32, 4)], PROFILES["paper-wikitext"].values()):
        p = KeepPool.calibrate(m, n_exp, rho2, rho9)
        assert 2 * m <= p.pool < n_exp and 0 <= p.larger_share <= 1
        rho = p.rho(9)
        assert abs(rho[2] - rho2) < 1e-12 and abs(rho[9] - rho9) < 1e-12 and rho[1] == 0
        assert np.all(np.diff(rho[1:]) > 0)
    for targets in ((0.3, 0.9999), (0.5, 0.52), (0.5, 0.4), (1.0, 1.0)):
        with pytest.raises(MoespecError):
            KeepPool.calibrate(8, 64, *targets)


def test_keep_pool_with_the_whole_pool_is_uniform():
    """s = N and kappa = m/N: each expert enters with m/N, stays with m/N: independent uniform membership."""
    assert np.allclose(KeepPool(m=8, keep=8 / 64, pool=64, larger_share=0.0).rho(9), uniform_rho(9, 64, 8))


def test_alias_table_is_exact():
    rng = np.random.default_rng(1)
    w = rng.random(37) ** 4
    keep, alias = alias_table(w)
    implied = keep.copy()
    np.add.at(implied, alias, 1 - keep)
    assert np.allclose(implied / w.size, w / w.sum(), atol=1e-12)


def test_successive_sampling_distinct_and_weighted():
    rng = np.random.default_rng(2)
    sets = successive_sample(rng, 9, None, 5000, 8)
    assert all(len(set(row)) == 8 for row in sets.tolist())
    w = np.array([8.0, 4, 2, 1, 1])
    single = successive_sample(rng, 5, w, 200_000, 1).ravel()
    assert np.allclose(np.bincount(single, minlength=5) / single.size, w / w.sum(), atol=0.005)
    pairs = successive_sample(rng, 5, w, 200_000, 2)
    first_is_0 = (pairs[:, 0] == 0).mean()
    second_is_1_after_0 = (pairs[pairs[:, 0] == 0, 1] == 1).mean()  # 4 / (4 + 2 + 1 + 1)
    assert abs(first_is_0 - 0.5) < 0.005 and abs(second_is_1_after_0 - 0.5) < 0.01


def test_popularity_tables():
    rng = np.random.default_rng(3)
    olmoe = popularity("olmoe-1b-7b", 64, 16, rng)
    assert olmoe.shape == (16, 64) and np.array_equal(olmoe[0], olmoe[3]) and np.array_equal(olmoe[4], olmoe[11])
    assert olmoe[0].max() / np.median(olmoe[0]) > 5  # far from uniform, as measured
    qwen = popularity("qwen3-30b-a3b", 128, 48, rng)
    assert qwen.shape == (48, 128) and np.all(qwen > 0) and not np.array_equal(qwen[0], qwen[1])
    trace = synthesize("olmoe-1b-7b", "popularity", 4000, 8, seed=4)
    assert reuse_stats(trace, 2, bootstrap=0).rho_mean[2] > 8 / 64 + 0.02  # popularity alone raises reuse
    assert "measured selection shares" in trace.meta["params"]["popularity"]


def test_seeded_and_metadata():
    a = synthesize("olmoe-1b-7b", "calibrated", 500, 5, seed=11)
    b = synthesize("olmoe-1b-7b", "calibrated", 500, 5, seed=11)
    c = synthesize("olmoe-1b-7b", "calibrated", 500, 5, seed=12)
    assert np.array_equal(a.experts, b.experts) and not np.array_equal(a.experts, c.experts)
    meta = a.meta
    assert meta["synthetic"] is True and meta["process"] == "calibrated" and meta["seed"] == 11
    assert meta["calibrated_to"]["profile"] == "paper-wikitext" and meta["calibrated_to"]["rho"] == {"2": 0.363,
                                                                                                      "9": 0.762}
    assert meta["params"]["keep"] == 0.363 and meta["spec"]["num_experts"] == 64
    assert (a.num_experts, a.num_layers, a.m, a.num_documents) == (64, 16, 8, 5)
    custom = synthesize("deepseek-v2-lite", "calibrated", 300, 3, seed=1, targets=(0.4, 0.8))
    assert custom.num_layers == 26 and custom.meta["calibrated_to"]["profile"] == "custom"
    assert synthesize("mixtral-8x7b", "uniform", 50, 1).meta["expected_rho"][2] == pytest.approx(2 / 8)


def test_document_lengths():
    assert document_lengths(10, 3).tolist() == [4, 3, 3]
    for tokens, docs in ((5, 6), (0, 1), (3, 0)):
        with pytest.raises(MoespecError):
            document_lengths(tokens, docs)


def test_cli_synth(tmp_path, capsys):
    out = tmp_path / "t.npz"
    assert main(["synth", "--model", "mixtral-8x7b", "--process", "popularity", "--tokens", "300", "--docs", "3",
                 "--out", str(out)]) == 0
    assert load_trace(out).meta["process"] == "popularity"
    capsys.readouterr()
    for argv in (["--model", "nope"], ["--model", "deepseek-v2-lite"], ["--rho2", "0.4"],
                 ["--process", "uniform", "--rho2", "0.4", "--rho9", "0.8"], ["--rho2", "0.3", "--rho9", "0.9999"],
                 ["--profile", "other"], ["--tokens", "2", "--docs", "3"]):
        assert main(["synth", *argv, "--out", str(tmp_path / "x.npz")]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("moespec synth: error:") and "\n" not in err
    assert not (tmp_path / "x.npz").exists()


def test_per_layer_calibration_fits_each_layer_of_a_trace(tmp_path):
    """Each layer its own parameters: a trace whose layers differ in reuse, fitted layer by layer, reproduces every
    layer's rho(2) and rho(9) (the one-parameter process gives all layers the same)."""
    from moespec.model.spec import resolve
    from moespec.routing.synth import layer_targets

    spec = resolve("olmoe-1b-7b")
    wanted = [(0.25 + 0.2 * l / 15, 0.72 + 0.15 * l / 15) for l in range(16)]  # layers from low to high reuse
    source = synthesize("olmoe-1b-7b", "calibrated", 40_000, 80, seed=1, targets=wanted, fitted_to="hand-made")
    fitted = layer_targets(source, spec)
    assert len(fitted) == 16 and fitted[0][0] < fitted[-1][0]
    for (r2, r9), (w2, w9) in zip(fitted, wanted):
        assert abs(r2 - w2) < 0.02 and abs(r9 - w9) < 0.03
    out = tmp_path / "fit.npz"
    source.save(tmp_path / "src.npz")
    assert main(["synth", "--fit", str(tmp_path / "src.npz"), "--tokens", "20000", "--docs", "40",
                     "--out", str(out)]) == 0
    again = reuse_stats(load_trace(out), n_max=9, bootstrap=0).rho
    for layer, (w2, w9) in enumerate(fitted):
        assert abs(again[layer, 2] - w2) < 0.03 and abs(again[layer, 9] - w9) < 0.04, layer
    assert load_trace(out).meta["calibrated_to"]["what"] == "per-layer reuse"

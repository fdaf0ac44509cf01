"""Reuse statistics: the App. D.2 estimator against brute force, exact values on periodic traces (identity (2), the
App. B.2 patterns), bootstrap intervals on stationary synthetic traces, byte quantities, and the `reuse` command."""

from __future__ import annotations

import json
from fractions import Fraction
from unittest import mock

import numpy as np
import pytest
from cli_cases import refused
from hypothesis import given, settings
from hypothesis import strategies as st

from moespec import MoespecError
from moespec.cli import main
from moespec.formats.trace import Trace
from moespec.routing.reuse import reuse_stats, trace_expert_bytes, uniform_rho
from moespec.routing.synth import synthesize

EXACT = 1e-12


def periodic_trace(pattern: list[list[list[int]]], n_exp: int, repeats: int = 4) -> Trace:
    """One document per phase, each `repeats` periods long: windows then see every phase equally often, so the
    estimates are the exact expectations of the periodic process started at a uniform random phase.
    pattern[t][l] = the expert set of layer l at step t of the period."""
    period = len(pattern)
    docs = [[pattern[(phase + t) % period] for t in range(period * repeats)] for phase in range(period)]
    experts = np.array([step for doc in docs for step in doc])
    return Trace.from_arrays(experts, np.arange(period + 1) * period * repeats, n_exp)


def single_layer(pattern: str) -> list[list[list[int]]]:
    return [[[int(c)]] for c in pattern]


def brute_force(trace: Trace, n_max: int) -> tuple[np.ndarray, np.ndarray]:
    """rho, union [L, n_max+1] straight from the definitions, with Python sets."""
    rho = np.zeros((trace.num_layers, n_max + 1))
    union = np.zeros((trace.num_layers, n_max + 1))
    for layer in range(trace.num_layers):
        for n in range(1, n_max + 1):
            repeats, unions, count = 0, 0, 0
            for a, b in trace.documents():
                for t in range(a, b - n + 1):
                    sets = [set(trace.experts[t + j, layer].tolist()) for j in range(n)]
                    earlier = set().union(*sets[:-1])
                    repeats += len(sets[-1] & earlier)
                    unions += len(earlier | sets[-1])
                    count += 1
            rho[layer, n] = repeats / (trace.m * count) if count else np.nan
            union[layer, n] = unions / count if count else np.nan
    return rho, union


# ---- exact values ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("pattern,rho,rho_bar", [
    ("01", {2: 0, 3: 1}, {1: Fraction(0), 2: Fraction(1, 2)}),
    ("00012", {2: Fraction(2, 5), 3: Fraction(2, 5)}, {1: Fraction(2, 5), 2: Fraction(2, 5)}),
    ("00102", {2: Fraction(1, 5), 3: Fraction(3, 5)}, {1: Fraction(1, 5), 2: Fraction(2, 5)}),
])
def test_appendix_b2_patterns(pattern, rho, rho_bar):
    """N=3, m=1, L=1, w=1: the three periodic patterns of App. B.2 at a uniform random phase."""
    s = reuse_stats(periodic_trace(single_layer(pattern), 3), n_max=3, bootstrap=0)
    for n, value in rho.items():
        assert abs(s.rho[0][n] - float(value)) < EXACT
    for k, value in rho_bar.items():
        assert abs(s.rho_bar[k] - float(value)) < EXACT
    assert s.rho[0][1] == 0


@settings(max_examples=25, deadline=None)
@given(st.data())
def test_identity_2_and_gap_3_exact_on_periodic_traces(data):
    """U(n) = m Σ_{j<=n} (1 - rho(j)) (2) and E_slot - E_dedup = gap (3) hold exactly at a uniform random phase."""
    n_exp, m, layers = data.draw(st.integers(3, 9)), None, data.draw(st.integers(1, 3))
    m = data.draw(st.integers(1, n_exp - 1))
    period = data.draw(st.integers(1, 7))
    pattern = [[sorted(data.draw(st.permutations(range(n_exp)))[:m]) for _ in range(layers)] for _ in range(period)]
    w = data.draw(st.lists(st.integers(1, 5), min_size=layers, max_size=layers))
    s = reuse_stats(periodic_trace(pattern, n_exp, repeats=3), n_max=period * 3, bootstrap=0, expert_bytes=w)
    n = np.arange(s.n_max + 1)
    identity = m * np.cumsum(1 - s.rho, axis=1) - m * (1 - s.rho[:, :1])  # m Σ_{j=1..n} (1 - rho(j))
    assert np.allclose(s.union[:, 1:], identity[:, 1:], atol=EXACT, rtol=0)
    assert np.allclose(s.E_slot - s.E_dedup, s.gap, atol=1e-9, rtol=0)
    assert np.allclose(s.E_slot, m * n * sum(w))
    assert np.allclose(s.u[1:], s.E_dedup[1:] / s.E_slot[1:])


@settings(max_examples=30, deadline=None)
@given(st.data())
def test_estimator_matches_brute_force(data):
    """Random traces with documents of every length, some shorter than the window, in token chunks of every size:
    chunk boundaries, bitset words and document edges all exercised."""
    n_exp = data.draw(st.sampled_from([2, 5, 64, 70, 130]))
    m = data.draw(st.integers(1, min(n_exp - 1, 6)))
    layers = data.draw(st.integers(1, 3))
    lengths = data.draw(st.lists(st.integers(1, 14), min_size=1, max_size=6))
    n_max = data.draw(st.integers(1, 6))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31)))
    few = rng.integers(2, n_exp + 1)  # draw from a few experts, so repeats are common
    experts = np.stack([rng.permutation(n_exp)[:m] if few <= m else rng.permutation(few)[:m]
                        for _ in range(sum(lengths) * layers)]).reshape(sum(lengths), layers, m)
    trace = Trace.from_arrays(experts, np.cumsum([0, *lengths]), n_exp)
    if max(lengths) < n_max:
        with pytest.raises(MoespecError, match="no window"):
            reuse_stats(trace, n_max)
        return
    chunk = data.draw(st.sampled_from([1, 2, 5, 2048]))  # token chunks of the bitset pass
    with mock.patch("moespec.routing.reuse._CHUNK_TOKENS", chunk):
        s = reuse_stats(trace, n_max, bootstrap=0)
    rho, union = brute_force(trace, n_max)
    assert np.allclose(s.rho, rho, atol=EXACT, equal_nan=True)
    assert np.allclose(s.union, union, atol=EXACT, equal_nan=True)
    assert s.windows[n_max] == sum(max(0, n - n_max + 1) for n in lengths)


def test_windows_never_cross_documents():
    """Document A always routes to expert 0, document B to 1: every window repeats fully, none crosses."""
    experts = np.array([0] * 5 + [1] * 5)[:, None, None]
    s = reuse_stats(Trace.from_arrays(experts, [0, 5, 10], 3), n_max=5, bootstrap=50)
    assert np.allclose(s.rho[0, 2:], 1.0) and np.allclose(s.union[0, 1:], 1.0)


# ---- stationary synthetic traces --------------------------------------------------------------------------------
def test_uniform_routing_matches_formula_within_interval():
    """Independent uniform routing: 1 - rho(n) = q^(n-1), q = 1 - m/N, inside the bootstrap interval."""
    trace = synthesize("gpt-oss-20b", "uniform", 12_000, 40, seed=3)
    s = reuse_stats(trace, 9, bootstrap=500, seed=1)
    lo, hi = s.ci["rho_mean"]
    expected = uniform_rho(9, 32, 4)
    assert np.all((lo[2:] <= expected[2:]) & (expected[2:] <= hi[2:])), (lo, expected, hi)
    assert abs(s.rho_mean[2] - 4 / 32) < 0.01


def test_identity_2_within_interval_on_stationary_trace():
    """On a long stationary trace the union estimate and m Σ (1 - rho(j)) agree within the union's interval."""
    trace = synthesize("olmoe-1b-7b", "calibrated", 20_000, 40, seed=4)
    s = reuse_stats(trace, 9, bootstrap=500, seed=2)
    from_rho = trace.m * np.cumsum(1 - s.rho_mean[1:])
    lo, hi = s.ci["union_mean"]
    assert np.all((lo[1:] <= from_rho) & (from_rho <= hi[1:]))
    rho_lo, rho_hi = s.ci["rho"]
    assert np.all(rho_lo[:, 2:] <= s.rho[:, 2:]) and np.all(s.rho[:, 2:] <= rho_hi[:, 2:])


def test_bootstrap_is_seeded_and_intervals_cover_estimates():
    trace = synthesize("olmoe-1b-7b", "popularity", 3000, 12, seed=5)
    a, b = reuse_stats(trace, 4, bootstrap=300, seed=9), reuse_stats(trace, 4, bootstrap=300, seed=9)
    c = reuse_stats(trace, 4, bootstrap=300, seed=10)
    for name in ("rho_mean", "union", "u", "rho_bar", "E_dedup", "gap"):
        assert np.array_equal(a.ci[name][0], b.ci[name][0])
        lo, hi = a.ci[name]
        value = getattr(a, name) if name != "union" else a.union
        assert np.all(lo[..., 1:] <= value[..., 1:] + 1e-12) and np.all(value[..., 1:] <= hi[..., 1:] + 1e-12)
    assert not np.array_equal(a.ci["rho_mean"][0], c.ci["rho_mean"][0])
    assert reuse_stats(trace, 4, bootstrap=0).ci == {}


def test_bad_arguments():
    trace = synthesize("olmoe-1b-7b", "uniform", 100, 2, seed=0)
    for kwargs in ({"n_max": 0}, {"bootstrap": -1}, {"level": 1.0}, {"expert_bytes": [1.0] * 3}):
        with pytest.raises(MoespecError):
            reuse_stats(trace, **({"n_max": 3} | kwargs))


def test_expert_bytes_from_the_trace_model():
    trace = synthesize("olmoe-1b-7b", "uniform", 200, 2, seed=0)
    w, units = trace_expert_bytes(trace, "bf16")
    assert units.startswith("bytes") and w.shape == (16,)
    assert w[0] == 3 * 2048 * 1024 * 2  # gate, up, down of hidden 2048 x width 1024 in bf16
    anonymous = Trace.from_arrays(trace.experts, trace.doc_starts, trace.num_experts)
    w, units = trace_expert_bytes(anonymous)
    assert w is None and units.startswith("relative units")
    for meta in ({"spec": {"name": "broken"}}, {"spec": trace.meta["spec"] | {"dense_layers": 3}}, {"model": 7},
                 {"model": "qwen3-30b-a3b"}):  # malformed stored specs, a non-name, a model of another shape
        other = Trace.from_arrays(trace.experts, trace.doc_starts, trace.num_experts, meta=meta)
        assert trace_expert_bytes(other)[0] is None
    s = reuse_stats(trace, 3, bootstrap=0, expert_bytes=trace_expert_bytes(trace, "q8_0")[0])
    assert s.E_slot[2] == 2 * 8 * s.expert_bytes.sum()


# ---- the command ------------------------------------------------------------------------------------------------
def test_cli_synth_then_reuse_json_and_plot(tmp_path, capsys):
    out = tmp_path / "t.npz"
    assert main(["synth", "--model", "qwen3-30b-a3b", "--process", "calibrated", "--tokens", "3000", "--docs", "6",
                 "--seed", "1", "--out", str(out)]) == 0
    assert "calibrated to paper-wikitext" in capsys.readouterr().out
    plot = tmp_path / "fig1.png"
    assert main(["reuse", str(out), "--bootstrap", "200", "--json", "--plot", str(plot)]) == 0
    doc = json.loads(capsys.readouterr().out)
    for key in ("rho_mean", "union_mean", "rho", "union", "intervals", "u", "E_slot", "E_dedup", "gap", "rho_bar",
                "provenance", "units", "uniform_rho"):
        assert key in doc
    assert len(doc["rho_mean"]) == 10 and doc["rho_mean"][0] is None and doc["rho_mean"][1] == 0
    assert len(doc["rho"]) == 48 and len(doc["intervals"]["rho_mean"]["lo"]) == 10
    assert doc["units"].startswith("bytes (qwen3-30b-a3b")
    assert abs(doc["rho_mean"][2] - 0.48) < 0.03 and doc["meta"]["synthetic"] is True
    assert plot.read_bytes()[:4] == b"\x89PNG"


def test_cli_table_and_bad_input(tmp_path, capsys):
    out = tmp_path / "t.npz"
    assert main(["synth", "--process", "uniform", "--tokens", "400", "--docs", "4", "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["reuse", str(out), "--n-max", "4", "--bootstrap", "50"]) == 0
    table = capsys.readouterr().out
    assert "rho(n)" in table and "uniform" in table
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a trace")
    for argv in (["reuse", str(bad)], ["reuse", str(tmp_path / "missing.npz")], ["reuse", str(out), "--n-max", "500"],
                 ["reuse", str(out), "--plot", str(tmp_path / "fig.txt")], ["reuse", str(out), "--format", "q3"]):
        assert refused(argv, capsys).startswith("moespec reuse: error:")

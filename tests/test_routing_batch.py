"""moespec.routing.batch: the union of B windows from independent documents, U^B(n), its bytes and intervals."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from moespec import MoespecError
from moespec.cli import main
from moespec.formats.trace import Trace
from moespec.routing import batch as batch_module
from moespec.routing.batch import batch_union, check_batches
from moespec.routing.reuse import reuse_stats
from moespec.routing.synth import synthesize


def random_trace(seed: int, lengths: list[int], num_experts: int = 7, layers: int = 2, m: int = 2) -> Trace:
    """Short documents of random distinct expert sets (prime N, so no word boundary hides a bug)."""
    rng = np.random.default_rng(seed)
    tokens = sum(lengths)
    experts = np.stack([[rng.choice(num_experts, m, replace=False) for _ in range(layers)] for _ in range(tokens)])
    return Trace.from_arrays(experts, np.concatenate([[0], np.cumsum(lengths)]), num_experts)


def brute_force(trace: Trace, n: int, b: int) -> np.ndarray:
    """Per layer: in each class r of the n-token windows (start - document start = r mod n), the mean union over
    the ordered B-tuples of distinct windows, averaged over the classes weighted by their window counts."""
    found = []
    for layer in range(trace.num_layers):
        means, weights = [], []
        for r in range(n):
            windows = [set(trace.experts[t:t + n, layer].ravel().tolist()) for s, e in trace.documents()
                       for t in range(s + r, e - n + 1, n)]
            means.append(np.mean([len(set().union(*tup)) for tup in itertools.permutations(windows, b)]))
            weights.append(len(windows))
        found.append(np.average(means, weights=weights))
    return np.array(found)


@pytest.mark.parametrize("seed", [0, 1])
def test_equals_the_mean_union_of_every_tuple_of_windows(seed):
    trace = random_trace(seed, [8, 7, 9])
    found = batch_union(trace, [1, 2, 3], n_max=3)
    for n in (1, 2, 3):
        for b in (1, 2, 3):
            np.testing.assert_allclose(found.union[b][:, n], brute_force(trace, n, b), rtol=0, atol=1e-12)


def test_batch_one_is_the_reuse_union_and_its_bytes():
    trace = random_trace(2, [40, 17, 33], num_experts=67, layers=3, m=5)  # N past one 64-bit word
    w = [1.0, 2.0, 3.0]
    stats = reuse_stats(trace, 6, bootstrap=0, expert_bytes=w)
    found = batch_union(trace, [1], 6, expert_bytes=w)
    np.testing.assert_allclose(found.union[1], stats.union, rtol=1e-12)
    for name in ("E_slot", "E_dedup", "u", "union_mean"):
        np.testing.assert_allclose(getattr(found, name)[1], getattr(stats, name), rtol=1e-12)


def test_the_inclusion_rates_sum_to_the_union():
    """Σ_e pi_{l,e}(n) = U_l(n): each window's union counts each expert it holds once."""
    trace = random_trace(9, [30, 25, 41], num_experts=13, m=3)
    found = batch_union(trace, [1], 5)
    np.testing.assert_allclose(found.inclusion.sum(axis=-1), found.union[1], rtol=1e-12)
    assert np.all((found.inclusion >= 0) & (found.inclusion <= 1))


def test_all_tokens_on_the_same_experts_union_is_m_at_every_batch():
    experts = np.tile(np.array([[0, 3, 5]]), (100, 2, 1))  # m = 3 of N = 11, every token, both layers
    trace = Trace.from_arrays(experts, [0, 40, 100], 11)
    found = batch_union(trace, [1, 4, 16], 5)
    for b in (1, 4, 16):
        np.testing.assert_allclose(found.union_mean[b][1:], 3.0)
        np.testing.assert_allclose(found.u[b][1:], 3.0 / (3 * b * np.arange(1, 6)))


def test_m_equal_n_minus_one_union_saturates():
    trace = random_trace(3, [20, 20], num_experts=5, m=4)
    found = batch_union(trace, [1, 8], 4)
    assert np.all(found.union[8][:, 1:] <= 5 + 1e-12)
    assert np.all(found.union[8][:, 2:] > 4.99)  # two tokens of 4 of 5 miss a common expert almost never


def test_uniform_routing_matches_the_closed_form_within_its_interval():
    trace = synthesize("olmoe-1b-7b", "uniform", 20_000, 40, seed=7)
    found = batch_union(trace, [1, 2, 4, 8], 9, bootstrap=300, seed=1)
    q = 1 - trace.m / trace.num_experts
    for b in (1, 2, 4, 8):
        lo, hi = found.ci[b]["union_mean"]
        for n in range(1, 10):
            expected = trace.num_experts * (1 - q ** (n * b))
            assert lo[n] - 1e-9 <= expected <= hi[n] + 1e-9, (b, n, lo[n], expected, hi[n])


def test_intervals_hold_the_estimate_and_widen_with_batch_spread():
    trace = random_trace(4, [30] * 8, num_experts=13, m=3)
    found = batch_union(trace, [1, 4], 4, bootstrap=200)
    for b in (1, 4):
        lo, hi = found.ci[b]["u"]
        assert np.all(lo[1:] <= found.u[b][1:] + 1e-12) and np.all(found.u[b][1:] <= hi[1:] + 1e-12)
    assert np.all(found.union_mean[4][1:] >= found.union_mean[1][1:])  # more windows never shrink the union


def test_bootstrap_memory_is_bounded(monkeypatch):
    monkeypatch.setattr(batch_module, "STATS_LIMIT", 100)
    trace = random_trace(5, [10, 10])
    with pytest.raises(MoespecError, match="--bootstrap 0"):
        batch_union(trace, [2], 3, bootstrap=10)
    assert batch_union(trace, [2], 3, bootstrap=0).ci == {}  # the estimate alone needs only summed counts


@pytest.mark.parametrize("bad", [[], [0], [2000], [True], ["2"], "2", None, [1.5], 3])
def test_bad_batch_sizes_are_refused_naming_the_argument(bad):
    with pytest.raises(ValueError, match="batches"):
        check_batches(bad)


@pytest.mark.parametrize("kwargs, name", [({"n_max": 0}, "n_max"), ({"bootstrap": -1}, "bootstrap"),
                                          ({"level": 1.0}, "level"), ({"expert_bytes": [1.0]}, "expert bytes"),
                                          ({"seed": "1"}, "seed")])
def test_bad_arguments_are_refused_naming_them(kwargs, name):
    trace = random_trace(6, [10, 10])
    with pytest.raises(ValueError, match=name):
        batch_union(trace, [2], **{"n_max": 3, **kwargs})


def test_cli_adds_the_batch_keys(tmp_path, capsys):
    path = tmp_path / "t.npz"
    random_trace(7, [12, 9, 14]).save(path)
    assert main(["reuse", str(path), "--n-max", "4", "--batch", "1,2,4", "--bootstrap", "20", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["batch_sizes"] == [1, 2, 4]
    assert set(doc["batch_union_mean"]) == {"1", "2", "4"}
    assert doc["batch_union_mean"]["1"][0] is None and len(doc["batch_union_mean"]["1"]) == 5
    np.testing.assert_allclose(doc["batch_union_mean"]["1"][1:], doc["union_mean"][1:], rtol=1e-12)
    assert len(doc["batch_union"]["2"]) == 2  # per layer
    assert set(doc["batch_intervals"]["4"]) == {"union_mean", "E_dedup", "u"}


@pytest.mark.parametrize("flag", ["0", "1025", "a", "", "2-1"])
def test_cli_bad_batch_is_one_line(tmp_path, capsys, flag):
    path = tmp_path / "t.npz"
    random_trace(8, [12, 9]).save(path)
    assert main(["reuse", str(path), "--batch", flag]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--batch" in err

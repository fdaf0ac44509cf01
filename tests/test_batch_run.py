"""`moespec run --batch` (moespec.measure.batch_run) on a tiny checkpoint (the batch rules on hand-made plans and
runs: test_batch_score)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from cli_cases import refused, run_cli

from moespec import MoespecError
from moespec.formats.runsfile import BATCH_ROW_KEYS, load_runs
from moespec.formats.trace import Trace, load_trace
from moespec.measure import rounds
from moespec.measure.batch_run import batch_unit_checks, batch_windows, pass_kernels, round_order, throughput_rows
from moespec.model import speculative

SMALL = ["--depth", "8", "--n", "1,2,3", "--reps", "2", "--max-reps", "2", "--k", "0,1,2", "--a", "0.5,0.9",
         "--prompts", "1", "--tokens", "5", "--dtype", "fp32"]


@pytest.fixture(scope="module")
def trace_path(tmp_path_factory):
    rng = np.random.default_rng(0)
    experts = np.stack([np.stack([rng.choice(8, 2, replace=False) for _ in range(2)]) for _ in range(160)])
    path = tmp_path_factory.mktemp("trace") / "t.npz"
    Trace.from_arrays(experts, [0, 40, 80, 120, 160], num_experts=8).save(path)
    return path


def test_run_batch_writes_the_documented_block(tiny_checkpoints, trace_path, tmp_path, monkeypatch):
    monkeypatch.setattr(rounds, "DISTURBED", 0.0)  # no round dropped as disturbed, however busy the machine
    out = tmp_path / "runs.json"
    code, err = run_cli(["run", "--model", tiny_checkpoints["olmoe"], *SMALL, "--batch", "1,2,3", "--replay",
                         trace_path, "--out", out])
    assert code == 0, err
    block = load_runs(out)["batch"]
    assert block["batches"] == [2, 3] and set(block["per_batch"]) == {"2", "3"}
    for entry in block["per_batch"].values():
        assert set(entry["verify_time_s"]) == {"slot", "dedup"} and set(entry["verify_time_s"]["slot"]) == {"1", "2",
                                                                                                           "3"}
        rows = entry["throughput"]
        assert len(rows) == 2 * 3 * 2 and all(tuple(r) == BATCH_ROW_KEYS for r in rows)  # policies x k x a
        assert all(r["greedy_exact"] for r in rows)  # each sequence's tokens are its plain decoding's
        for r in rows:
            assert r["tokens_per_s"] > 0 and r["counted_tokens_per_s"] > 0 and r["steps"] >= 1
    doc = json.loads(out.read_text())
    doc["batch"]["per_batch"]["2"]["throughput"][0]["a"] = 1.5
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    with pytest.raises(MoespecError, match="batch.per_batch.2.throughput"):
        load_runs(tmp_path / "bad.json")


def test_run_batch_bad_input_is_one_line(tiny_checkpoints, trace_path, tmp_path, capsys):
    base = ["run", "--model", tiny_checkpoints["olmoe"], *SMALL, "--out", tmp_path / "r.json"]
    for bad in ("0", "2000", "x"):
        assert "--batch" in refused([*base, "--batch", bad], capsys, tmp_path)
    assert "4 document(s)" in refused([*base, "--batch", "8", "--replay", trace_path], capsys, tmp_path)


def test_batch_windows_come_from_distinct_documents(trace_path):
    trace = load_trace(trace_path)
    windows = batch_windows(trace, 2, 3, 4, 5, seed=0)
    assert len(windows) == 5 and all(w.shape == (12, 2, 2) for w in windows)
    with pytest.raises(MoespecError, match="4 document"):
        batch_windows(trace, 2, 3, 5, 1, seed=0)
    assert pass_kernels({1: "slot", 3: "dedup"}, 4) == {4: "slot", 12: "dedup"} and pass_kernels(None, 2) is None


def test_round_order_alternates():
    assert round_order([0, 1, 2], 0) == [0, 1, 2] and round_order([2, 0, 1], 1) == [2, 1, 0]


def test_throughput_rows_from_rounds():
    rounds = {0.5: {"per_k": {"0": {"steps": [1.0, 3.0], "emitted": 4, "seconds": 4.0, "exact": True},
                              "2": {"steps": [2.0], "emitted": 6, "seconds": 2.0, "exact": True}}},
              0.9: {"per_k": {"0": {"steps": [2.0, 2.0], "emitted": 4, "seconds": 4.0, "exact": True},
                              "2": {"steps": [4.0, 6.0], "emitted": 10, "seconds": 10.0, "exact": False}}}}
    rows = throughput_rows(rounds, 2, "auto", [0, 2])
    assert [(r["k"], r["a"]) for r in rows] == [(0, 0.5), (0, 0.9), (2, 0.5), (2, 0.9)]
    assert [r["step_time_s"] for r in rows] == [2.0, 2.0, 4.0, 4.0]  # the median over every round at k
    assert rows[0]["tokens_per_s"] == pytest.approx(2 / 2.0)  # B G_a(0) / V_B(0)
    assert rows[3]["tokens_per_s"] == pytest.approx(2 * (1 + 0.9 + 0.81) / 4.0)
    assert [r["counted_tokens_per_s"] for r in rows] == [1.0, 1.0, 3.0, 1.0]  # the round's own emitted / seconds
    assert [r["steps"] for r in rows] == [2, 2, 1, 2] and [r["greedy_exact"] for r in rows] == [True] * 2 + [False] * 2


def test_round_unit_check_refuses_a_bad_unit():
    check = batch_unit_checks([1], ["slot"])["batch round"]
    good = {"per_k": {"1": {"steps": [0.1], "emitted": 2, "seconds": 0.1, "exact": True}}}
    check(good, "u")
    for bad in ({"per_k": {"1": {"steps": [], "emitted": 2, "seconds": 0.1, "exact": True}}},
                {"per_k": {"1": {"steps": [-1.0], "emitted": 2, "seconds": 0.1, "exact": True}}},
                {"per_k": {"1": {"steps": [0.1], "emitted": -1, "seconds": 0.1, "exact": True}}},
                {"per_k": {"1": {"steps": [0.1], "emitted": 2, "seconds": 0.1}}}, {"rows": []}):
        with pytest.raises(MoespecError, match="^u: "):
            check(bad, "u")


def test_every_k_of_a_round_decodes_on_the_same_draws(tiny_checkpoints, trace_path, tmp_path, monkeypatch):
    seeds = {}
    real = speculative.OracleDraft

    def recording(continuation, a, seed, vocab_size, prompt_len):
        seeds.setdefault((a, prompt_len, tuple(continuation[:4])), set()).add(seed)
        return real(continuation, a, seed, vocab_size, prompt_len)

    monkeypatch.setattr(rounds, "DISTURBED", 0.0)
    monkeypatch.setattr(speculative, "OracleDraft", recording)
    code, err = run_cli(["run", "--model", tiny_checkpoints["olmoe"], *SMALL, "--batch", "2", "--out",
                         tmp_path / "r.json"])
    assert code == 0, err
    batch_seeds = [s for (a, _, _), s in seeds.items()]
    assert batch_seeds and all(len(s) == 1 for s in batch_seeds)  # one seed per sequence and a, whatever the k

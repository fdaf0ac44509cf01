"""`moespec bench --batch B`: passes of B sequences x n tokens (moespec.measure.passes.plan_unit), chosen ids up to
U = N and recorded passes of B windows from B documents; bench.json keyed by the pass's token count B n."""

from __future__ import annotations

import json

import numpy as np
import pytest
from cli_cases import refused, run_cli

from moespec import MoespecError
from moespec.formats.benchfile import load_bench
from moespec.formats.trace import Trace, load_trace
from moespec.measure.passes import plan_unit
from moespec.model.spec import ModelSpec
from moespec.routing.batch import batch_union

SPEC = ModelSpec.from_dict({**ModelSpec.from_name("olmoe-1b-7b").to_dict(), "num_experts": 16, "top_k": 2})


def labelled_trace(docs: int = 8, length: int = 12) -> Trace:
    """Document d routes every token to experts {2d, 2d + 1} at every layer: a pass's U counts its documents."""
    experts = np.repeat(np.array([[2 * d, 2 * d + 1] for d in range(docs)]), length, axis=0)
    experts = np.broadcast_to(experts[:, None, :], (docs * length, SPEC.L, 2)).copy()
    return Trace.from_arrays(experts, np.arange(docs + 1) * length, SPEC.N)


@pytest.mark.parametrize("batch, n", [(1, 3), (2, 1), (4, 3), (8, 5)])
def test_recorded_passes_hold_b_windows_of_distinct_documents(batch, n):
    passes = plan_unit(labelled_trace(), SPEC, 0, n, windows=6, u_values=4, seed=1, batch=batch)
    recorded = [p for p in passes if p.source == "window"]
    assert len(recorded) == 6 and all(p.ids.shape == (batch * n, 2) for p in passes)
    assert all(p.U == 2 * batch for p in recorded)  # B documents, each its own two experts
    for p in recorded:  # each window lies inside one document: n consecutive tokens of the same pair
        pairs = p.ids.reshape(batch, n, 2)
        assert (pairs == pairs[:, :1]).all()


def test_chosen_ids_reach_every_expert_at_batch():
    passes = plan_unit(labelled_trace(), SPEC, 0, 3, windows=1, u_values=4, seed=0, batch=4)
    chosen = [p for p in passes if p.source == "chosen"]
    assert [p.U for p in chosen] == [2, 7, 11, 16]  # m .. N = 16 (24 slots of 12 tokens)
    assert all(len(np.unique(p.ids)) == p.U and all(len(set(row)) == 2 for row in p.ids) for p in chosen)


def test_batch_one_draws_the_passes_it_always_drew():
    trace = labelled_trace()
    one = plan_unit(trace, SPEC, 1, 3, windows=4, u_values=3, seed=2)
    assert [(p.U, p.start, p.ids.tolist()) for p in one] == \
        [(p.U, p.start, p.ids.tolist()) for p in plan_unit(trace, SPEC, 1, 3, 4, 3, 2, batch=1)]


def test_too_few_documents_for_the_batch_is_one_line():
    with pytest.raises(MoespecError, match="--batch 9: the trace has 8 document"):
        plan_unit(labelled_trace(), SPEC, 0, 3, windows=2, u_values=2, seed=0, batch=9)


def test_bench_at_batch_keys_the_pass_by_its_tokens_and_plan_refuses_it(bench_argv, bench_model, tmp_path, capsys):
    out = tmp_path / "b2.json"
    code, err = run_cli(bench_argv(out, "--batch", "2"))
    assert code == 0, err
    bench = load_bench(out)
    assert bench["batch"] == 2 and bench["n"] == [2, 4, 6]
    assert set(bench["kernels"]["slot"]["beta_gbps"]) == {"2", "4", "6"} and bench["per_layer"]["0"]["one_token_s"] \
        is None  # no pass of one token at B = 2
    expected = batch_union(load_trace(bench_model["trace"]), [2], 3).u[2]  # every layer's experts alike: w cancels
    for n in (1, 2, 3):
        assert bench["u"][str(2 * n)] == pytest.approx(expected[n])
    err = refused(["plan", "--bench", out, "--trace", bench_model["trace"], "--tau1", "0.01", "--out",
                   tmp_path / "plan.json"], capsys, tmp_path)
    assert "a bench of B = 2 sequences per pass" in err


@pytest.mark.parametrize("value", ["0", "1025", "x"])
def test_bad_batch_is_one_line(bench_argv, tmp_path, capsys, value):
    refused(bench_argv(tmp_path / "b.json", "--batch", value), capsys, tmp_path)


def test_a_bench_file_of_pass_sizes_not_multiples_of_its_batch_is_refused(bench_argv, tmp_path):
    out = tmp_path / "b.json"
    assert run_cli(bench_argv(out))[0] == 0
    doc = json.loads(out.read_text())
    doc["batch"] = 2  # n = 1, 2, 3 are no passes of two sequences
    out.write_text(json.dumps(doc))
    with pytest.raises(MoespecError, match="n must list pass sizes B n, n in 1..33, for B = 2"):
        load_bench(out)

"""The throughput the rules on acceptances read: the counted rate (every emitted token over the steps' time, the
paper's) with its interval over the steps, beside the computed G_a(k)/V(k); the plan names which one its score
reads (plan.json throughput_rate), `score --rate` scores the other and is then not pre-registered; older names of
the counted rate load; the report shows both."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from plan_cases import make_bench, uniform_trace
from score_cases import ACCEPTANCES, curve, k_hat_of, make_plan, make_runs, ran

from moespec import MoespecError, cli
from moespec.formats.files import write_json
from moespec.formats.planfile import load_plan
from moespec.formats.runsfile import load_runs
from moespec.measure import decoding as D
from moespec.measure.rounds import bootstrap_rate
from moespec.predict.acceptance import acceptance_rows
from moespec.predict.score import score_files

MISSED = ACCEPTANCES[4:7]  # k_hat* 4..6: the counted rate peaks two further on at these three


def counted_runs() -> dict[str, Any]:
    """make_runs' rows (the computed rate peaks at the plan's k_hat*) with a counted rate that peaks two further
    on at the MISSED acceptances, and equals the computed one elsewhere."""
    runs = make_runs()
    runs["format_version"] = 2
    for row in runs["throughput"]:
        peak = k_hat_of(row["a"]) - 2 if row["a"] in MISSED else k_hat_of(row["a"])
        row["counted_tokens_per_s"] = curve(peak)[row["k"]]
        row["counted_tokens_per_s_ci"] = [0.9 * row["counted_tokens_per_s"], 1.1 * row["counted_tokens_per_s"]]
    return runs


def score_json(tmp_path: Path, plan: dict, runs: dict, rate: str | None = None) -> dict[str, Any]:
    write_json(tmp_path / "plan.json", plan)
    write_json(tmp_path / "runs.json", {"plan": ran(tmp_path / "plan.json"), **runs})
    doc = score_files(str(tmp_path / "plan.json"), str(tmp_path / "runs.json"), rate=rate).to_json()
    return doc | {"by_name": {r["name"]: r for r in doc["rules"]}}


@pytest.mark.parametrize("rate, within, holds", [("counted", 8, False), ("computed", 11, True)])
def test_the_plan_names_the_rate_its_score_reads(tmp_path: Path, rate: str, within: int, holds: bool) -> None:
    plan = make_plan() | {"throughput_rate": rate}
    doc = score_json(tmp_path, plan, counted_runs())
    rule = doc["by_name"]["k_hat"]
    assert (rule["value"], rule["holds"]) == (within, holds)
    key = {"counted": "counted_tokens_per_s", "computed": "tokens_per_s"}[rate]
    assert doc["rate"] == {"name": rate, "key": key, "plan": rate} and doc["pre_registered"]


def test_a_plan_that_names_no_rate_is_scored_on_the_computed_one(tmp_path: Path) -> None:
    doc = score_json(tmp_path, make_plan(), counted_runs())
    assert doc["rate"]["name"] == "computed" and doc["by_name"]["k_hat"]["value"] == 11


def test_scoring_another_rate_than_the_plans_is_not_pre_registered(tmp_path: Path, capsys) -> None:
    plan = make_plan() | {"throughput_rate": "counted"}
    doc = score_json(tmp_path, plan, counted_runs(), rate="computed")
    assert doc["rate"] == {"name": "computed", "key": "tokens_per_s", "plan": "counted"}
    assert not doc["pre_registered"] and "scored on the computed throughput" in doc["pre_registration"]
    args = ["score", "--plan", str(tmp_path / "plan.json"), "--runs", str(tmp_path / "runs.json")]
    assert cli.main(args) == 0
    assert "throughput scored (rules 2, 3, 6): the counted rate (counted_tokens_per_s)" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:
        cli.main([*args, "--rate", "bogus"])
    assert exit_.value.code == 2 and capsys.readouterr().err.count("\n") == 1


def test_an_acceptance_without_a_counted_rate_is_left_out() -> None:
    runs = counted_runs()
    for row in runs["throughput"]:
        if row["a"] == 0.2:
            row["counted_tokens_per_s"] = None
    rows = acceptance_rows(make_plan(), runs, "runs", rate="counted")
    assert 0.2 not in [r["a"] for r in rows["auto"]] and len(rows["auto"]) == len(ACCEPTANCES) - 1
    with pytest.raises(ValueError, match="rate must be one of counted, computed"):
        acceptance_rows(make_plan(), runs, "runs", rate="realized")


def test_older_names_of_the_counted_rate_load(tmp_path: Path) -> None:
    runs = make_runs()  # version 1: tokens_per_s is what the steps emitted
    older = copy.deepcopy(runs) | {"format_version": 2}
    for row in older["throughput"]:
        row["realized_tokens_per_s"] = row["tokens_per_s"] / 2
    loaded = load_runs(write_json(tmp_path / "v1.json", runs))
    assert all(r["counted_tokens_per_s"] == r["tokens_per_s"] for r in loaded["throughput"])
    loaded = load_runs(write_json(tmp_path / "v2.json", older))
    assert all(r["counted_tokens_per_s"] == r["tokens_per_s"] / 2 and "realized_tokens_per_s" not in r
               for r in loaded["throughput"])


@pytest.mark.parametrize("change, problem", [
    ({"counted_tokens_per_s": 0.0}, "needs counted_tokens_per_s > 0 or null"),
    ({"counted_tokens_per_s": "fast"}, "needs counted_tokens_per_s > 0 or null"),
    ({"counted_tokens_per_s_ci": [2.0, 1.0]}, "needs counted_tokens_per_s_ci [lo, hi] with lo <= hi, or null"),
    ({"counted_tokens_per_s_ci": [1.0]}, "needs counted_tokens_per_s_ci [lo, hi] with lo <= hi, or null"),
])
def test_a_bad_counted_rate_is_refused_in_one_line(tmp_path: Path, change: dict, problem: str) -> None:
    runs = counted_runs()
    runs["throughput"][3].update(change)
    with pytest.raises(MoespecError, match=r"throughput\[3\] " + problem.replace("[", r"\[").replace("]", r"\]")):
        score_json(tmp_path, make_plan(), runs)


def test_a_plan_names_a_known_rate(tmp_path: Path) -> None:
    with pytest.raises(MoespecError, match="plan.json: throughput_rate must be one of counted, computed"):
        load_plan(write_json(tmp_path / "plan.json", make_plan() | {"throughput_rate": "realized"}))


def test_plan_writes_the_rate_it_is_given(tmp_path: Path, capsys) -> None:
    bench, trace = write_json(tmp_path / "bench.json", make_bench()), tmp_path / "trace.npz"
    uniform_trace().save(trace)
    base = ["plan", "--bench", str(bench), "--trace", str(trace), "--tau1", "0.05", "--json"]
    assert cli.main(base) == 0
    assert json.loads(capsys.readouterr().out)["throughput_rate"] == "counted"  # the paper's, by default
    assert cli.main([*base, "--rate", "computed"]) == 0
    assert json.loads(capsys.readouterr().out)["throughput_rate"] == "computed"


def test_bootstrap_rate_on_known_steps() -> None:
    rng = np.random.default_rng(0)
    assert bootstrap_rate([2, 4, 6], [0.1, 0.2, 0.3], rng) == pytest.approx((20.0, 20.0, 20.0))  # one ratio
    rate, lo, hi = bootstrap_rate([1, 3, 2, 3], [0.01, 0.01, 0.02, 0.02], rng)
    assert rate == pytest.approx(9 / 0.06) and 100.0 <= lo < rate < hi <= 300.0  # within the steps' own ratios
    for counts, seconds in (([1], [0.1]), ([1, 2], [0.1]), ([1, 2], [0.1, 0.0])):
        with pytest.raises(ValueError, match="at least 2 steps of positive time"):
            bootstrap_rate(counts, seconds, rng)


def test_a_cell_counts_its_steps_tokens_over_their_time() -> None:
    """Steps (drafted, accepted, verify, step, draft, host): 1 + 3 + 2 + 3 tokens emitted in 0.06 s."""
    steps = [[2, 0, 0.01, 0.01, 0.0, 0.0], [2, 2, 0.01, 0.01, 0.0, 0.0], [2, 1, 0.02, 0.02, 0.0, 0.0],
             [2, 2, 0.02, 0.02, 0.0, 0.0]]
    unit = {"a": 0.5, "steps": steps, "tokens": 8, "mismatch": None}
    row = D.cell_record("dedup", 2, 0.5, [unit], True)
    assert row["counted_tokens_per_s"] == pytest.approx(9 / 0.06)
    assert row["tokens_per_s"] == pytest.approx(1.75 / 0.015)  # G_0.5(2) over the median step time
    lo, hi = row["counted_tokens_per_s_ci"]
    assert (lo, hi) == pytest.approx(bootstrap_rate([1, 3, 2, 3], [0.01, 0.01, 0.02, 0.02],
                                                    np.random.default_rng(4))[1:])
    one = D.cell_record("dedup", 2, 0.5, [unit | {"steps": steps[:1]}], True)
    assert one["counted_tokens_per_s"] == pytest.approx(100.0) and one["counted_tokens_per_s_ci"] is None

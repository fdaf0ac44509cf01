"""Answers that were once silently wrong (issue 14, class 5): pre-registration needs the runs to have run exactly
the plan scored (its sha256), run refuses a plan of another dtype and an acceptance of 1 (score refuses both), and
NaN times never reach a table (the loaders refuse them). The theory API's domains are in test_theory_domain."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest
from cli_cases import refused
from plan_cases import make_bench
from score_cases import make_plan, make_runs, ran

from moespec import MoespecError, cli
from moespec.formats.files import write_json
from moespec.formats.runsfile import load_runs


def _score(tmp_path: Path, runs_plan: dict | None, capsys) -> dict:
    write_json(tmp_path / "plan.json", make_plan())
    write_json(tmp_path / "runs.json", {**make_runs(), "plan": runs_plan})
    assert cli.main(["score", "--plan", str(tmp_path / "plan.json"), "--runs", str(tmp_path / "runs.json"),
                     "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_runs_of_exactly_this_plan_are_pre_registered(tmp_path: Path, capsys):
    write_json(tmp_path / "plan.json", make_plan())
    doc = _score(tmp_path, ran(tmp_path / "plan.json"), capsys)
    assert doc["pre_registered"] and doc["pre_registration"].startswith("pre-registered: the runs ran this plan")


@pytest.mark.parametrize("runs_plan, reason", [
    (None, "the runs recorded no plan"),
    ({"path": "plan.json", "sha256": "0" * 64}, f"the runs ran another plan (sha256 {'0' * 64})"),
])
def test_runs_of_no_or_another_plan_are_not_pre_registered(runs_plan, reason, tmp_path: Path, capsys):
    doc = _score(tmp_path, runs_plan, capsys)
    assert not doc["pre_registered"] and doc["pre_registration"] == f"not pre-registered: {reason}" + \
        (" (run --plan PLAN records its sha256)" if runs_plan is None else "")
    assert cli.main(["score", "--plan", str(tmp_path / "plan.json"), "--runs", str(tmp_path / "runs.json")]) == 0
    assert f"not pre-registered: {reason}" in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("runs_plan", [{"sha256": "abc"}, {"sha256": None}, "plan.json", 7])
def test_a_malformed_plan_record_is_refused(runs_plan, tmp_path: Path, capsys):
    write_json(tmp_path / "plan.json", make_plan())
    write_json(tmp_path / "runs.json", {**make_runs(), "plan": runs_plan})
    err = refused(["score", "--plan", tmp_path / "plan.json", "--runs", tmp_path / "runs.json"], capsys, tmp_path)
    assert "runs.json: plan must be null or an object whose sha256 is 64 hex digits" in err


@pytest.mark.parametrize("key, value", [("dtype", "fp32"), ("device_kind", "cuda")])
def test_run_refuses_a_plan_for_another_dtype_or_device(key, value, tmp_path: Path, capsys, work_started):
    write_json(tmp_path / "plan.json", {**make_plan(), "dtype": "bf16", "device_kind": "cpu", key: value})
    err = refused(["run", "--plan", tmp_path / "plan.json", "--out", tmp_path / "runs.json"], capsys, tmp_path)
    assert f"plan.json: a plan for {key} {value!r}" in err and work_started == []


@pytest.mark.parametrize("a", ["1", "0.5,1.0", "-0.1", "nan"])
def test_run_refuses_an_acceptance_outside_0_1(a, tmp_path: Path, capsys):
    assert "--a: acceptance" in refused(["run", "--a", a, "--out", tmp_path / "runs.json"], capsys, tmp_path)


@pytest.mark.parametrize("where", ["verify_time_s.slot.3", "verify_time_ci_s.dedup.2.1", "saving_s.4.median"])
def test_nan_times_never_reach_the_report(where, tmp_path: Path, capsys):
    """The loader refuses the runs; the report renders without them and says why."""
    runs = {**make_runs(), "verify_time_ci_s": {"dedup": {"2": [0.1, 0.2]}}}
    node = runs
    *path, last = where.split(".")
    for key in path:
        node = node[int(key)] if isinstance(node, list) else node[key]
    node[int(last) if isinstance(node, list) else last] = float("nan")
    write_json(tmp_path / "bench.json", make_bench())
    write_json(tmp_path / "runs.json", runs)
    with pytest.raises(MoespecError, match=f"runs.json: {re.escape(where)} = nan must be a"):
        load_runs(tmp_path / "runs.json")
    assert cli.main(["report", str(tmp_path), "--out", str(tmp_path / "report.html")]) == 0
    page = html.unescape((tmp_path / "report.html").read_text())
    assert "runs.json is present but unreadable" in page and f"{where} = nan" in page
    assert len(re.findall(r"\bnan\b", page, re.IGNORECASE)) == page.count(f"{where} = nan")  # only in that note


def test_staircase_refuses_an_empty_acceptance_list(capsys):
    assert "--acceptance: an empty list" in refused(["staircase", "--step-times", "1,2", "--acceptance", " "], capsys)

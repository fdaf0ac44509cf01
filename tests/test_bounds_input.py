"""Sizes a user passes (issue 14, class 4): each has a bound in moespec.defaults, checked before any work, named in
the one-line error with the argument and stated in --help; files holding sizes past them are refused at load.
(Bounds of the theory are in test_bounds.)"""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_cases import refused
from plan_cases import make_bench, uniform_trace
from score_cases import make_plan, make_runs, ran

from moespec import MoespecError, cli
from moespec.defaults import (
    BOOTSTRAP_LIMIT,
    DEPTH_LIMIT,
    GENERATED_LIMIT,
    KMAX_LIMIT,
    LAYERS_LIMIT,
    REPS_LIMIT,
    SAMPLES_LIMIT,
    TOKENS_LIMIT,
    WINDOW_LIMIT,
)
from moespec.formats.files import write_json
from moespec.measure.bench import BenchConfig, run_bench
from moespec.measure.run import RunConfig, run_engine
from moespec.predict.plan import build_plan
from moespec.routing.reuse import reuse_stats

HUGE = "100000000"
# command, flag, bound: every size flag of every command
FLAGS = [
    (["spec", "olmoe-1b-7b"], "--kmax", KMAX_LIMIT), (["spec", "olmoe-1b-7b"], "--depth", DEPTH_LIMIT),
    (["plan", "--bench", "B", "--trace", "T"], "--kmax", KMAX_LIMIT),
    (["plan", "--bench", "B", "--trace", "T"], "--depth", DEPTH_LIMIT),
    (["reuse", "T"], "--n-max", WINDOW_LIMIT), (["reuse", "T"], "--bootstrap", BOOTSTRAP_LIMIT),
    (["bench"], "--reps", REPS_LIMIT), (["bench"], "--windows", SAMPLES_LIMIT),
    (["bench"], "--u-values", SAMPLES_LIMIT),
    (["run"], "--reps", REPS_LIMIT), (["run"], "--max-reps", REPS_LIMIT), (["run"], "--prompts", SAMPLES_LIMIT),
    (["run"], "--tokens", GENERATED_LIMIT), (["run"], "--depth", DEPTH_LIMIT),
    (["synth", "--out", "O"], "--tokens", TOKENS_LIMIT), (["synth", "--out", "O"], "--docs", TOKENS_LIMIT),
    (["trace", "--model", "M", "--text", "T", "--out", "O"], "--max-tokens", TOKENS_LIMIT),
    (["trace", "--model", "M", "--text", "T", "--out", "O"], "--chunk", DEPTH_LIMIT),
    *((["demo", "--out", "O"], flag, bound) for flag, bound in (
        ("--kmax", KMAX_LIMIT), ("--depth", DEPTH_LIMIT), ("--tokens", TOKENS_LIMIT), ("--docs", TOKENS_LIMIT),
        ("--bench-reps", REPS_LIMIT), ("--engine-layers", LAYERS_LIMIT))),
]


@pytest.mark.parametrize("argv, flag, bound", FLAGS)
def test_a_size_past_its_bound_is_refused_at_once(argv, flag, bound, tmp_path: Path, capsys, work_started):
    argv = [str(tmp_path / a) if a in ("B", "T", "M", "O") else a for a in argv]
    err = refused([*argv, flag, str(bound + 1)], capsys, tmp_path)
    assert work_started == [] and f"argument {flag}" in err and f"{bound:,}" in err


@pytest.mark.parametrize("argv, flag, bound", FLAGS)
def test_help_states_the_bound(argv, flag, bound, capsys):
    with pytest.raises(SystemExit):
        cli.main([argv[0], "--help"])
    lines = capsys.readouterr().out.splitlines()  # an option's entry: "  --flag ..." and its indented lines
    first = next(i for i, line in enumerate(lines) if line.startswith(f"  {flag} "))
    last = next((i for i in range(first + 1, len(lines)) if lines[i].startswith("  -")), len(lines))
    assert f"at most {bound:,}" in " ".join(" ".join(lines[first:last]).split())


@pytest.mark.parametrize("argv, needle", [
    (["staircase", "--step-times", ",".join(["1"] * (KMAX_LIMIT + 2))], f"at most {KMAX_LIMIT + 1}"),
    (["staircase", "--step-times", "1,2", "--acceptance", ",".join(["0.5"] * (SAMPLES_LIMIT + 1))],
     f"at most {SAMPLES_LIMIT:,}"),
    (["bench", "--n", f"1-{HUGE}"], "--n 1-100000000"),
    (["bench", "--layers", f"0-{HUGE}"], "--layers 0-100000000"),
])
def test_lists_past_their_bound(argv, needle, tmp_path: Path, capsys):
    assert needle in refused([*argv, *(["--out", tmp_path / "b.json"] if argv[0] == "bench" else [])], capsys,
                             tmp_path)


@pytest.mark.parametrize("kmax", [KMAX_LIMIT + 1, 10**9])
def test_a_plan_file_past_the_largest_draft_is_refused(kmax, tmp_path: Path, capsys):
    write_json(tmp_path / "plan.json", {**make_plan(), "kmax": kmax})
    write_json(tmp_path / "runs.json", {**make_runs(), "plan": ran(tmp_path / "plan.json")})
    err = refused(["score", "--plan", tmp_path / "plan.json", "--runs", tmp_path / "runs.json"], capsys, tmp_path)
    assert f"kmax = {kmax} must lie in 1..{KMAX_LIMIT}" in err and "plan.json" in err


def test_the_api_checks_the_same_bounds(tmp_path: Path):
    with pytest.raises(MoespecError, match=f"--kmax must be an integer in 1..{KMAX_LIMIT}"):
        build_plan(make_bench(), uniform_trace(), 0.1, kmax=10**9)
    with pytest.raises(MoespecError, match="--reps must lie in 1..1,000"):
        run_bench(BenchConfig(out=str(tmp_path / "b.json"), reps=10**8))
    with pytest.raises(MoespecError, match="--tokens must lie in 1..4,096"):
        run_engine(RunConfig(out=str(tmp_path / "r.json"), tokens=10**8))
    with pytest.raises(MoespecError, match=f"n_max must be an integer in 1..{WINDOW_LIMIT}"):
        reuse_stats(uniform_trace(), n_max=100_000)
    with pytest.raises(MoespecError, match="bootstrap must be an integer in 0..20,000"):
        reuse_stats(uniform_trace(), bootstrap=10**8)
    assert not list(tmp_path.iterdir())

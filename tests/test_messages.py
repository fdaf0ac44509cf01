"""Messages that once pointed the wrong way (issue 14, class 7): each names what is wrong where it is: a directory
or a FIFO given as an input file, a bad time in bench.json by its file and key (not a flag never given), a string
k_hat in a plan by its type."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from cli_cases import refused
from plan_cases import make_bench, make_runs, uniform_trace
from score_cases import make_plan, ran

from moespec.formats.files import write_json

INPUTS = {  # command line -> the input it reads from PATH, and what that input is called
    "trace": (["reuse", "PATH"], "trace"),
    "bench": (["plan", "--bench", "PATH", "--trace", "TRACE", "--tau1", "0.1"], "bench"),
    "plan": (["score", "--plan", "PATH", "--runs", "RUNS"], "plan"),
    "runs": (["plan", "--bench", "BENCH", "--trace", "TRACE", "--runs", "PATH"], "runs"),
}


@pytest.fixture
def job(tmp_path: Path) -> dict[str, Path]:
    """Valid inputs of every kind, and a folder and a FIFO to give in their place."""
    write_json(tmp_path / "bench.json", make_bench())
    uniform_trace().save(tmp_path / "trace.npz")
    write_json(tmp_path / "runs.json", make_runs())
    (tmp_path / "a-folder").mkdir()
    os.mkfifo(tmp_path / "a-fifo")
    return {"BENCH": tmp_path / "bench.json", "TRACE": tmp_path / "trace.npz", "RUNS": tmp_path / "runs.json",
            "a directory": tmp_path / "a-folder", "not a regular file": tmp_path / "a-fifo"}


@pytest.mark.parametrize("kind", ["a directory", "not a regular file"])
@pytest.mark.parametrize("what", INPUTS)
def test_an_input_that_is_not_a_file_is_named_as_such(what, kind, job, tmp_path: Path, capsys):
    argv, name = INPUTS[what]
    err = refused([job.get(a, job[kind] if a == "PATH" else a) for a in argv], capsys, tmp_path)
    assert f"{job[kind]}: {kind}, not a {name} file" in err


@pytest.mark.parametrize("kernel", ["slot", "dedup"])
def test_a_negative_op_time_blames_the_bench_file_and_key(kernel, job, tmp_path: Path, capsys):
    bench = make_bench()
    bench["per_layer"]["0"]["kernels"][kernel]["5"]["measured_mean_s"] = -0.004
    write_json(job["BENCH"], bench)
    err = refused(["plan", "--bench", job["BENCH"], "--trace", job["TRACE"], "--runs", job["RUNS"]], capsys,
                  tmp_path)
    assert f"bench.json: per_layer.0.kernels.{kernel}.5.measured_mean_s = -0.004 must be positive" in err
    assert "--tau1" not in err


def test_a_short_one_token_time_from_the_runs_blames_the_runs(job, tmp_path: Path, capsys):
    """The predicted expert times may fall below one token's (a fit); then the one-token time is too short, and
    the message names where it came from: the runs, when --tau1 was not given."""
    bench = make_bench()
    for entry in bench["per_layer"].values():
        entry["kernels"]["dedup"]["2"]["predicted_mean_s"] = -0.05  # a fit extrapolating below zero
    write_json(job["BENCH"], bench)
    err = refused(["plan", "--bench", job["BENCH"], "--trace", job["TRACE"], "--runs", job["RUNS"]], capsys,
                  tmp_path)
    assert "--tau1" not in err and "runs.json: verify_time_s.slot.1 = 0.1" in err and "bench.json" in err


@pytest.mark.parametrize("k_hat, problem", [("3", "has the wrong type (str, not int)"),
                                            (3.0, "has the wrong type (float, not int)"),
                                            (None, "has the wrong type (NoneType, not int)"),
                                            (99, "is outside 0..8")])
def test_a_k_hat_of_the_wrong_type_says_so(k_hat, problem, tmp_path: Path, capsys):
    plan = make_plan()
    plan["table"][4]["k_hat"] = k_hat
    write_json(tmp_path / "plan.json", plan)
    write_json(tmp_path / "runs.json", {**make_runs(), "plan": ran(tmp_path / "plan.json")})
    err = refused(["score", "--plan", tmp_path / "plan.json", "--runs", tmp_path / "runs.json"], capsys, tmp_path)
    assert f"plan.json: table[4].k_hat = {k_hat!r} {problem}" in err

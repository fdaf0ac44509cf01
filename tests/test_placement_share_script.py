"""benchmarks/placement_share.py: stored runs predicted again with each placement raised to a power, the line of
their errors on the placement, and its arguments' checks."""

import json
import math
import shutil
from pathlib import Path

import pytest
from cli_cases import load_script, run_script

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "placement_share.py"
RUN = SCRIPT.parents[1] / "results" / "structure-model" / "xeon-bf16-in-place" / "run-2"  # a stored in-place run


@pytest.fixture(scope="module")
def placement_share():
    return load_script(SCRIPT)


def test_a_power_raises_every_placement_and_keeps_a_bench_without_one(placement_share):
    bench = {"ceiling_gbps": 30.0, "placement": {"0": [0.25, 1.0], "1": None}}
    assert placement_share.powered(bench, 0.5)["placement"] == {"0": [0.5, 1.0], "1": None}
    assert placement_share.powered(bench, 0.0)["placement"]["0"] == [1.0, 1.0]
    assert placement_share.powered(bench, 1.0) == bench
    assert bench["placement"]["0"] == [0.25, 1.0]  # the bench read is left as it was
    assert placement_share.powered({"placement": None}, 0.5) == {"placement": None}


@pytest.mark.parametrize("beta", [-0.5, float("nan"), "1", True])
def test_a_power_outside_its_domain_is_refused(placement_share, beta):
    with pytest.raises(ValueError, match="beta"):
        placement_share.powered({"placement": {"0": [1.0]}}, beta)


@pytest.mark.parametrize("power", [0.0, -0.4, 0.7])
def test_the_line_is_exact_on_errors_that_go_as_a_power_of_the_placement(placement_share, power):
    """predicted / measured = 1.05 p^c: slope c, intercept log 1.05, and the spread their root mean square."""
    points = [(p, 1.05 * p ** power - 1) for p in (0.6, 0.8, 0.9, 1.0)]
    got = placement_share.line(points)
    assert got["slope"] == pytest.approx(power, abs=1e-12)
    assert got["intercept"] == pytest.approx(math.log(1.05), abs=1e-12) and got["points"] == 4
    logs = [math.log(1.05 * p ** power) for p, _ in points]
    assert got["rms_log_error"] == pytest.approx(math.sqrt(sum(v * v for v in logs) / 4), rel=1e-12)


def test_points_of_one_placement_give_no_line_and_none_are_refused(placement_share):
    got = placement_share.line([(0.9, 0.1), (0.9, 0.1)])
    assert got["slope"] is None and got["rms_log_error"] == pytest.approx(math.log(1.1))
    assert placement_share.line([(0.9, 0.1)])["slope"] is None
    with pytest.raises(ValueError, match="points"):
        placement_share.line([])


def _run_of_the_pair(tmp_path: Path, placement: list[float] | None) -> Path:
    """A copy of a stored run holding its profile and the pair's B = 1 bench and errors, the bench given
    `placement`."""
    run = tmp_path / "run-1"
    (run / "pair").mkdir(parents=True)
    shutil.copy(RUN / "device.json", run)
    (run / "table.json").write_text("{}")
    errors = json.loads((RUN / "pair" / "errors.json").read_text())
    errors["batches"] = {"1": errors["batches"]["1"]}
    (run / "pair" / "errors.json").write_text(json.dumps(errors))
    bench = json.loads((RUN / "pair" / "bench-B1.json").read_text())
    if placement is not None:
        bench["placement"] = {"0": placement}
    (run / "pair" / "bench-B1.json").write_text(json.dumps(bench))
    return run


def _rows(out: Path, beta: str) -> dict[str, dict]:
    return {r["kernel"]: r for r in json.loads((out / f"beta-{beta}" / "run-1" / "table.json").read_text())["rows"]}


def test_power_1_gives_the_runs_own_errors_and_a_slower_placement_predicts_slower(tmp_path, capsys, monkeypatch):
    """At beta = 1 a run's benches are predicted as the run predicted them in place (its errors.json, at its probe's
    loop factor); a placement of 0.2 on every expert predicts every pass slower at beta = 1 than at 0, and at 0 as a
    placement of 1 does (at the same ceiling samples)."""
    monkeypatch.chdir(tmp_path)
    stored = json.loads((RUN / "pair" / "errors.json").read_text())["batches"]["1"]["passes"]
    plain = _run_of_the_pair(tmp_path / "plain", None)
    code, err = run_script(SCRIPT, ["--runs", plain, "--betas", "0,1", "--out", tmp_path / "plain-out"], capsys)
    assert code == 0, err
    rows = _rows(tmp_path / "plain-out", "1")
    for kernel, by_n in stored.items():
        errors = sorted(abs(v["error"]) for v in by_n.values())
        assert rows[kernel]["max_error"] == pytest.approx(errors[-1], rel=1e-9)
        assert rows[kernel]["median_error"] == pytest.approx(errors[len(errors) // 2], rel=1e-9)
    for name, p in (("fifth", 0.2), ("ones", 1.0)):
        run = _run_of_the_pair(tmp_path / name, [p] * 64)
        code, err = run_script(SCRIPT, ["--runs", run, "--betas", "0,1", "--out", tmp_path / f"{name}-out"], capsys)
        assert code == 0, err
    at0, at1 = _rows(tmp_path / "fifth-out", "0"), _rows(tmp_path / "fifth-out", "1")
    for kernel, row in _rows(tmp_path / "ones-out", "1").items():
        assert at0[kernel]["median_signed_error"] == pytest.approx(row["median_signed_error"], rel=1e-12)
        assert at1[kernel]["median_signed_error"] > at0[kernel]["median_signed_error"] + 0.1
    slopes = json.loads((tmp_path / "fifth-out" / "slopes.json").read_text())
    assert set(slopes["betas"]) == {"0", "1"} and slopes["betas"]["1"]["points"] == 2
    assert slopes["betas"]["1"]["slope"] is None  # one placement: no line


@pytest.mark.parametrize("args, needle", [
    (["--runs", "nowhere", "--out", "o"], "--runs: give runs' folders"),
    (["--runs", "r", "--betas", "a,1", "--out", "o"], "--betas: give comma-separated numbers >= 0"),
    (["--runs", "r", "--betas", "-1", "--out", "o"], "--betas: give comma-separated numbers >= 0"),
    (["--runs", "r", "--dtype", "fp8", "--out", "o"], "--dtype: invalid choice"),
    (["--out", "o"], "the following arguments are required: --runs")])
def test_bad_arguments_end_in_one_line(args, needle, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, err = run_script(SCRIPT, args, capsys)
    assert code == 2 and needle in err and "Traceback" not in err


def test_two_runs_of_one_folder_name_are_refused_before_any_table(tmp_path, capsys, monkeypatch):
    """Each run's table goes under its folder's name: two runs named alike would overwrite one another."""
    monkeypatch.chdir(tmp_path)
    runs = [_run_of_the_pair(tmp_path / side, None) for side in ("a", "b")]
    code, err = run_script(SCRIPT, ["--runs", ",".join(map(str, runs)), "--out", tmp_path / "out"], capsys)
    assert code == 2 and "two runs share a folder name" in err
    assert not (tmp_path / "out").exists()


def test_a_run_without_the_format_or_a_profile_that_does_not_load_is_named_before_any_table(tmp_path, capsys,
                                                                                            monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = _run_of_the_pair(tmp_path, None)
    code, err = run_script(SCRIPT, ["--runs", run, "--dtype", "q4_0", "--out", tmp_path / "out"], capsys)
    assert code == 2 and "did not time q4_0" in err
    (run / "device.json").write_text("[1]")
    code, err = run_script(SCRIPT, ["--runs", run, "--out", tmp_path / "out"], capsys)
    assert code == 2 and "device.json" in err
    assert not (tmp_path / "out").exists()

"""`moespec sweep`: a grid through bench and plan, one bench per (model, format, device, kernels) shared by the
depths, resumed from its finished files, locally and on a local Ray instance; every key and cell checked before any
work, one line and exit 2 otherwise."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from moespec import cli
from moespec.measure import bench as bench_module

BENCH = "[bench]\nreps = 1\nwindows = 2\nu_values = 3\nlayers = [0, 1]\nn = [1, 2, 3]\n[plan]\nkmax = 2\n"


def sweep_file(tmp_path: Path, model: Path, body: str = "") -> Path:
    path = tmp_path / "sweep.toml"
    path.write_text(f'[grid]\nmodel = ["{model}"]\nformat = ["bf16", "fp32"]\ndepth = [512, 4096]\n'
                    f"[trace]\ntokens = 600\ndocs = 4\n{BENCH}{body}")
    return path


def summary(out: Path) -> list[dict]:
    return json.loads((out / "summary.json").read_text())["cells"]


def test_a_sweep_benches_once_per_format_and_plans_every_cell(bench_model, tmp_path: Path, capsys,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "out"
    assert cli.main(["sweep", str(sweep_file(tmp_path, bench_model["model"])), "--out", str(out)]) == 0
    assert "moespec sweep: 4 cells" in capsys.readouterr().out
    rows = summary(out)
    assert sorted((r["format"], r["depth"]) for r in rows) == [("bf16", 512), ("bf16", 4096), ("fp32", 512),
                                                               ("fp32", 4096)]
    assert len(list((out / "bench").glob("*/bench.json"))) == 2  # the depths share a bench
    for r in rows:  # each cell planned, or its refusal said (a tiny model may be too small to time)
        assert (r["plan"] and Path(r["plan"]).is_file() and r["tau1_from"] == "bytes at the ceiling") or r["refused"]
        assert r["routing"] == "uniform"  # the paper's profile has no targets for this shape
    assert (out / "summary.md").read_text().count("\n") == 2 + 4 and (out / "summary.html").is_file()

    def no_more(*args, **kwargs):
        raise AssertionError("a finished bench was run again")

    monkeypatch.setattr(bench_module, "run_bench", no_more)
    monkeypatch.setattr("moespec.sweep.run_bench", no_more)
    assert cli.main(["sweep", str(sweep_file(tmp_path, bench_model["model"])), "--out", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["cells"] == rows  # resumed: every unit was done


def test_the_sweep_on_ray_runs_the_same_cells(bench_model, tmp_path: Path) -> None:
    pytest.importorskip("ray")
    out = tmp_path / "ray"
    assert cli.main(["sweep", str(sweep_file(tmp_path, bench_model["model"])), "--out", str(out), "--ray",
                     "local"]) == 0
    rows = summary(out)
    assert len(rows) == 4 and len(list((out / "bench").glob("*/bench.json"))) == 2


RUN = """steps = ["bench", "plan", "run"]
[grid]
model = ["olmoe-1b-7b"]
batch = [1, 2]
[trace]
tokens = 2000
docs = 10
[bench]
layers = [1]
n = [1, 2, 3]
reps = 1
windows = 2
u_values = 2
[run]
layers = 1
n = [1, 2, 3]
reps = 2
max_reps = 2
budget_s = 1.0
[plan]
kmax = 2
"""


@pytest.mark.slow
def test_a_sweep_with_runs_plans_on_them_and_maps_the_batches(tmp_path: Path, capsys) -> None:
    """A preset's layer at real shapes: the verify-only run at B = 1 and 2 anchors the plan and its batch map."""
    path = tmp_path / "sweep.toml"
    path.write_text(RUN)
    assert cli.main(["sweep", str(path), "--out", str(tmp_path / "out"), "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)["cells"]
    assert row["tau1_from"] == "the verify-only run" and row["refused"] is None and row["batch"] == [1, 2]
    assert row["routing"] == "calibrated" and len(row["b_stop"]) == 11 and 2 <= row["crossover"] <= 3 or \
        row["crossover"] is None
    runs = json.loads(next((tmp_path / "out" / "runs").glob("*/runs-verify.json")).read_text())
    assert runs["batch"]["batches"] == [2] and row["tau1_s"] == runs["verify_time_s"]["slot"]["1"]


@pytest.mark.parametrize("body, needle", [
    ("colour = 1\n", "sweep.toml: colour: unknown key"),
    ("[grid.extra]\n", "grid.extra: unknown key"),
    ("[bench.more]\n", "bench.more: unknown key"),
    ('steps = ["plan"]\n', "steps must hold bench and plan"),
])
def test_bad_sweep_files_are_one_line(bench_model, tmp_path: Path, capsys, body: str, needle: str) -> None:
    path = sweep_file(tmp_path, bench_model["model"])
    text = path.read_text()
    path.write_text(body + text if not body.startswith("[") else text + body)
    assert cli.main(["sweep", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err
    assert not (tmp_path / "out").exists()  # refused before any work
    assert not (tmp_path / "out").exists()  # refused before any work


@pytest.mark.parametrize("grid, needle", [
    ('[grid]\nformat = ["bf16"]\n', "grid.model must list one or more models"),
    ('[grid]\nmodel = ["no-such-model"]\n', "grid.model: 'no-such-model' is neither a preset"),
    ('[grid]\nmodel = ["olmoe-1b-7b"]\nbatch = [1, 4]\n', "grid.batch beyond 1 needs steps"),
    ('[grid]\nmodel = ["olmoe-1b-7b"]\ndevice = ["tpu"]\n', "grid.device 'tpu': cpu or cuda"),
    ('[grid]\nmodel = ["olmoe-1b-7b"]\ndevice = ["cuda"]\n', "device cuda and this machine has no GPU"),
    ('[grid]\nmodel = "olmoe-1b-7b"\n', "grid.model must be a non-empty list"),
    ('[grid]\nmodel = ["olmoe-1b-7b"]\ndepth = ["deep"]\n', "grid.depth must list ints"),
    ('[grid]\nmodel = ["olmoe-1b-7b"]\ndepth = [-1]\n', "grid.depth must lie in 0..131,072"),
    ('[grid]\nmodel = ["olmoe-1b-7b"]\n[plan]\nkmax = 0\n', "plan.kmax must be a whole number in 1.."),
    ('[grid]\nmodel = ["olmoe-1b-7b"]\n[bench]\nreps = "many"\n', "bench.reps must be a number or a list"),
])
def test_bad_grids_are_one_line(tmp_path: Path, capsys, grid: str, needle: str) -> None:
    import torch
    if "cuda" in grid and torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    path = tmp_path / "sweep.toml"
    path.write_text(grid)
    assert cli.main(["sweep", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err
    assert not (tmp_path / "out").exists()  # refused before any work


def test_runs_are_of_presets(bench_model, tmp_path: Path, capsys) -> None:
    path = tmp_path / "sweep.toml"
    path.write_text(f'steps = ["bench", "plan", "run"]\n[grid]\nmodel = ["{bench_model["model"]}"]\n')
    assert cli.main(["sweep", str(path), "--out", str(tmp_path / "out")]) == 2
    assert "the engine runs presets" in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_a_cell_on_a_device_the_cluster_lacks_is_one_line(tmp_path: Path, capsys) -> None:
    ray = pytest.importorskip("ray")
    path = tmp_path / "sweep.toml"
    path.write_text('[grid]\nmodel = ["olmoe-1b-7b"]\ndevice = ["cuda"]\n')
    assert cli.main(["sweep", str(path), "--out", str(tmp_path / "out"), "--ray", "local"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the Ray cluster has no GPU" in err and not ray.is_initialized()
    assert not (tmp_path / "out" / "traces").exists()  # refused before any work

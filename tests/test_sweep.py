"""`moespec sweep`: a grid through bench and plan, one bench per (model, format, device, kernels) shared by the
depths, resumed from its finished files, locally and on a local Ray instance (traces and plans there as Ray tasks,
the summary equal to the local one); a GGUF cell traced by llama.cpp, benched at its file's shapes and format and
run by llama.cpp, an f32 file's format fp32 throughout; each bench and run timed on the cores of the machine it
runs on, counted there; every key and cell checked before any work, one line and exit 2 otherwise."""

from __future__ import annotations

import importlib.util
import json
import shlex
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from test_llama_cpp import CONFIGS, tiny
from transformers import OlmoeConfig

from moespec import MoespecError, cli
from moespec.formats.trace import load_trace
from moespec.measure import bench as bench_module
from moespec.measure import contention
from moespec.measure.contention import on_own_cores
from moespec.model.gguf_export import export_gguf
from moespec.sweep import bench_config, load_sweep, run_config

BENCH = "[bench]\nreps = 1\nwindows = 2\nu_values = 3\nlayers = [0, 1]\nn = [1, 2, 3]\n[plan]\nkmax = 2\n"
HAVE_LLAMA = importlib.util.find_spec("llama_cpp") is not None
needs_llama = pytest.mark.skipif(not HAVE_LLAMA, reason="llama-cpp-python (optional peer) is not installed")


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


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    """A one-layer OLMoE-class model of random weights exported to a bf16 GGUF (moespec.model.gguf_export)."""
    config = CONFIGS["olmoe"]()
    config.num_hidden_layers = 1
    folder = tmp_path_factory.mktemp("gguf")
    return Path(export_gguf(tiny("olmoe", config=config), folder / "tiny.gguf", "bf16", name="tiny-olmoe")[0].path)


@pytest.fixture(scope="module")
def timed_gguf(tmp_path_factory) -> Path:
    """A one-layer OLMoE-class GGUF with f32 experts (llama.cpp's F32, moespec's fp32) large enough to time here
    (6 MiB each, 32 of them), so its plan is made, not refused as too small."""
    config = OlmoeConfig(hidden_size=1024, num_attention_heads=8, num_key_value_heads=8, vocab_size=300,
                         max_position_embeddings=512, tie_word_embeddings=False, num_hidden_layers=1, num_experts=32,
                         num_experts_per_tok=4, intermediate_size=512)
    folder = tmp_path_factory.mktemp("gguf")
    return Path(export_gguf(tiny("olmoe", config=config), folder / "timed.gguf", "f32", name="timed-olmoe")[0].path)


def test_the_sweep_on_ray_equals_the_local_one(bench_model, tiny_gguf, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The traces and plans redone on Ray, as tasks (the driver's own tracing and planning would fail here), from
    the same benches: the same traces, naming the command that ran the sweep, and the same summary."""
    pytest.importorskip("ray")
    models = [str(bench_model["model"])] + ([str(tiny_gguf)] if HAVE_LLAMA else [])  # a GGUF is traced by llama.cpp
    path = tmp_path / "sweep.toml"
    path.write_text(f"[grid]\nmodel = {json.dumps(models)}\ndepth = [512, 4096]\n[trace]\ntokens = 600\ndocs = 4\n"
                    f"{BENCH.replace('[0, 1]', '[0]')}")
    out = tmp_path / "out"
    assert cli.main(["sweep", str(path), "--out", str(out)]) == 0
    local = summary(out)
    traces = {p.name: load_trace(p) for p in (out / "traces").glob("*.npz")}
    assert len(local) == 2 * len(models) and len(traces) == len(models)
    for done in ("traces", "cells"):
        shutil.rmtree(out / done)

    def not_here(*args, **kwargs):
        raise AssertionError("a trace or plan ran in the driver")

    for name in ("synthesize", "trace", "make_plan"):
        monkeypatch.setattr(f"moespec.sweep.{name}", not_here)
    assert cli.main(["sweep", str(path), "--out", str(out), "--ray", "local"]) == 0
    assert summary(out) == local
    for name, before in traces.items():
        after = load_trace(out / "traces" / name)
        assert np.array_equal(after.experts, before.experts) and np.array_equal(after.doc_starts, before.doc_starts)
        assert after.meta["provenance"]["command"] == shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]])


def test_timing_units_count_their_cores_where_they_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver makes a bench's and a run's config without a thread count (its own cores are not a node's); the
    unit counts the cores of the machine it runs on when it starts, whatever torch's threads were in its process
    (a Ray worker's are its first task's), and gives torch its threads back after; `threads` in the file wins."""
    path = tmp_path / "sweep.toml"
    path.write_text('[grid]\nmodel = ["olmoe-1b-7b"]\n')
    plain = load_sweep(str(path))
    path.write_text('steps = ["bench", "plan", "run"]\n[grid]\nmodel = ["olmoe-1b-7b"]\n[bench]\nthreads = 2\n'
                    '[run]\nthreads = 1\n')
    given = load_sweep(str(path))
    configs = [make(sweep, sweep.cells[0]) for sweep in (plain, given) for make in (bench_config, run_config)]
    assert [c.threads for c in configs] == [None, None, 2, 1]
    seen = []
    unit = on_own_cores(lambda config: seen.append((config.threads, torch.get_num_threads())))
    monkeypatch.setattr(contention, "cores", lambda: 3)  # the machine the unit runs on
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # what its process's torch had
    try:
        for config in configs:
            unit(config)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    assert seen == [(3, 3), (3, 3), (2, 2), (1, 1)]


def test_a_bench_on_ray_times_on_the_cores_of_its_node(bench_model, tmp_path: Path) -> None:
    """On Ray a bench's task counts the cores of the node it lands on (this machine's) when it starts: neither the
    driver's torch threads (one, here) nor those its worker's torch took for an earlier one-CPU task (a trace's)."""
    pytest.importorskip("ray")
    if contention.cores() < 2:
        pytest.skip("one core: the node's count and the driver's would agree")
    path = tmp_path / "sweep.toml"
    path.write_text(f'[grid]\nmodel = ["{bench_model["model"]}"]\n[trace]\ntokens = 600\ndocs = 4\n'
                    f"{BENCH.replace('[0, 1]', '[0]')}")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert cli.main(["sweep", str(path), "--out", str(tmp_path / "out"), "--ray", "local"]) == 0
    finally:
        torch.set_num_threads(before)
    bench = json.loads(next((tmp_path / "out" / "bench").glob("*/bench.json")).read_text())
    assert bench["device"].endswith(f", {contention.cores()} threads")


GGUF_RUN = """steps = ["bench", "plan", "run"]
[grid]
model = ["{model}"]
format = ["f32"]
depth = [256]
[trace]
tokens = 200
[bench]
reps = 3
windows = 4
u_values = 3
layers = [0]
n = [1, 2, 3]
[run]
n = [1, 2, 3]
reps = 3
max_reps = 3
budget_s = 1.0
[plan]
kmax = 2
"""


@needs_llama
def test_a_gguf_cell_is_traced_benched_run_and_planned(timed_gguf, tmp_path: Path, capsys, host_flush,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Its routing traced by llama.cpp, its bench at the file's shapes and format, its verify-only run on llama.cpp
    (dedup, its one kernel), its plan on that run's one-token pass. The file's f32 experts are fp32 throughout,
    whichever name grid.format gives, and `moespec plan` takes the bench and the run (a runs file naming the format
    f32 too). The bench and the run each time on the cores of the machine they run on, counted there (one, here); the
    bench's flush evicts what this host's cache keeps (host_flush), so its fits describe the op."""
    monkeypatch.setattr(contention, "cores", lambda: 1)
    path = tmp_path / "sweep.toml"
    path.write_text(GGUF_RUN.format(model=timed_gguf))
    out = tmp_path / "out"
    assert cli.main(["sweep", str(path), "--out", str(out), "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)["cells"]
    assert row["routing"] == "llama.cpp" and row["tau1_from"] == "the verify-only run" and row["refused"] is None
    assert row["crossover"] is not None and set(row["k_hat"]) == {"0.5", "0.7", "0.8", "0.9"}
    assert row["format"] == "fp32"
    bench_path, runs_path = next((out / "bench").glob("*/bench.json")), next((out / "runs").glob("*/runs-verify.json"))
    bench, runs = json.loads(bench_path.read_text()), json.loads(runs_path.read_text())
    assert bench["model"] == "timed-olmoe" and bench["dtype"] == "fp32" and bench["device"].endswith(", 1 threads")
    assert runs["engine"] == "llama.cpp" and runs["model"] == "timed-olmoe" and list(runs["verify_time_s"]) == ["dedup"]
    assert runs["dtype"] == "fp32" and runs["provenance"]["llama_cpp"]["threads"] == 1
    assert row["tau1_s"] == runs["verify_time_s"]["dedup"]["1"]
    trace_path = next((out / "traces").glob("*.npz"))
    for name in ("fp32", "f32"):
        runs_path.write_text(json.dumps(runs | {"dtype": name}))
        assert cli.main(["plan", "--bench", str(bench_path), "--trace", str(trace_path), "--runs", str(runs_path),
                         "--kmax", "2", "--depth", "256", "--out", str(tmp_path / f"plan-{name}.json")]) == 0
        assert json.loads((tmp_path / f"plan-{name}.json").read_text())["dtype"] == "fp32"
    # the routing is what `moespec trace --gguf` records of the same text and tokens
    assert cli.main(["trace", "--gguf", str(timed_gguf), "--max-tokens", "200", "--threads", "1",
                     "--out", str(tmp_path / "t.npz")]) == 0
    traced, swept = load_trace(tmp_path / "t.npz"), load_trace(trace_path)
    assert swept.num_tokens == 200 and np.array_equal(swept.experts, traced.experts)


@pytest.mark.parametrize("body, needle", [
    ('format = ["q8_0"]\n', "grid.format q8_0, but"),
    ('device = ["cuda"]\n', "a GGUF runs on llama.cpp's CPU build, not on cuda"),
    ("batch = [1, 2]\n", "llama.cpp's run measures one sequence per pass"),
    ("[trace]\ntext = \"missing.txt\"\n", "trace.text: missing.txt: no such text file"),
    ("absent", "a GGUF's routing is traced by llama.cpp: llama.cpp is not available"),
])
def test_gguf_cells_that_cannot_be_done_are_one_line(tiny_gguf, tmp_path: Path, capsys,
                                                     monkeypatch: pytest.MonkeyPatch, body: str, needle: str) -> None:
    def absent():
        raise MoespecError("llama.cpp is not available: llama-cpp-python cannot be imported (test)")

    monkeypatch.setattr("moespec.sweep.bindings", absent if body == "absent" else lambda: None)
    path = tmp_path / "sweep.toml"
    grid = f'steps = ["bench", "plan", "run"]\n[grid]\nmodel = ["{tiny_gguf}"]\n'
    path.write_text(grid + ("" if body == "absent" else body))
    assert cli.main(["sweep", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err and not (tmp_path / "out").exists()
    if body.startswith("format"):  # the line names the cell
        assert "cell " in err and "stores its experts as bf16" in err


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
    assert row["routing"] == "calibrated" and len(row["b_stop"]) == 11
    assert row["crossover"] is None or 2 <= row["crossover"] <= 3  # none where two rounds cannot tell the kernels apart
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
    ('steps = ["bench", "plan", "run"]\n[grid]\nmodel = ["olmoe-1b-7b"]\n[run]\nthreads = 1.5\n',
     "--threads must be a whole number in 1.."),
    ('[grid]\nmodel = ["olmoe-1b-7b"]\n[bench]\nthreads = 0\n', "--threads must be a whole number in 1.."),
    ('[grid]\nmodel = ["olmoe-1b-7b"]\n[trace]\ntokens = 0\n', "trace.tokens must be a whole number in 1.."),
    ('[grid]\nmodel = ["olmoe-1b-7b"]\n[trace]\ntext = "a.txt"\n', "trace.text: only a GGUF's routing is traced"),
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

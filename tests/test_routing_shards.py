"""The reuse estimator over several trace files (moespec.routing.shards): each file counted apart, in this process
or as Ray tasks, joined and reduced, equals the single-process estimate over all their documents in order,
bootstrap intervals included; files of another model are refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from moespec import MoespecError, cli
from moespec.formats.trace import concatenate
from moespec.routing.reuse import reuse_stats, trace_expert_bytes
from moespec.routing.shards import reuse_files
from moespec.routing.synth import synthesize

SEEDS = (1, 2, 3)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Three traces of one model, documents of different lengths in each."""
    root = tmp_path_factory.mktemp("shards")
    paths = []
    for i, seed in enumerate(SEEDS):
        path = root / f"part{i}.npz"
        synthesize("olmoe-1b-7b", "calibrated", 600 + 150 * i, 4 + i, seed=seed).save(path)
        paths.append(path)
    return paths


def whole(files: list[Path], seed: int = 7, bootstrap: int = 200):
    from moespec.formats.trace import load_trace
    trace = concatenate([load_trace(p) for p in files])
    w, units = trace_expert_bytes(trace, "bf16")
    return reuse_stats(trace, 6, bootstrap, seed, 0.9, expert_bytes=w, units=units)


def same(a, b) -> None:
    for name in ("windows", "rho", "union", "rho_mean", "E_dedup", "u", "gap", "rho_bar"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    assert a.ci.keys() == b.ci.keys() and a.num_documents == b.num_documents and a.num_tokens == b.num_tokens
    for name, (lo, hi) in a.ci.items():
        np.testing.assert_array_equal(lo, b.ci[name][0], err_msg=name)
        np.testing.assert_array_equal(hi, b.ci[name][1], err_msg=name)


def test_files_counted_apart_equal_the_joined_trace(files: list[Path]) -> None:
    stats, meta = reuse_files([str(p) for p in files], 6, 200, 7, 0.9, "bf16")
    same(stats, whole(files))
    assert stats.num_documents == sum(4 + i for i in range(3)) and meta["model"] == "olmoe-1b-7b"
    assert stats.units.startswith("bytes")


def test_the_ray_path_equals_the_single_process_one(files: list[Path], capsys: pytest.CaptureFixture) -> None:
    pytest.importorskip("ray")
    args = ["reuse", *map(str, files), "--n-max", "6", "--bootstrap", "200", "--seed", "7", "--level", "0.9", "--json"]
    assert cli.main([*args, "--ray", "local"]) == 0
    on_ray = json.loads(capsys.readouterr().out)
    assert cli.main(args) == 0
    here = json.loads(capsys.readouterr().out)
    assert on_ray.pop("provenance") and here.pop("provenance")
    assert on_ray == here and on_ray["trace"] == list(map(str, files))
    expected = whole(files).to_json()
    assert here["rho"] == expected["rho"] and here["intervals"] == expected["intervals"]


def test_files_of_another_model_are_refused(files: list[Path], tmp_path: Path, capsys) -> None:
    other = tmp_path / "other.npz"
    synthesize("qwen3-30b-a3b", "uniform", 400, 4, seed=0).save(other)
    with pytest.raises(MoespecError, match="other.npz: routes 'qwen3-30b-a3b'.*reuse joins traces of one model"):
        reuse_files([str(files[0]), str(other)], 4, 0, 0, 0.95, "bf16")
    assert cli.main(["reuse", str(files[0]), str(other)]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    assert cli.main(["reuse", str(files[0]), str(tmp_path / "missing.npz"), "--ray", "local"]) == 2
    assert "missing.npz: no such trace file" in capsys.readouterr().err
    assert cli.main(["reuse", str(files[0]), str(files[1]), "--batch", "2"]) == 2
    assert "--batch reads one trace file" in capsys.readouterr().err

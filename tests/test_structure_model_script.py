"""benchmarks/structure_model.py's summary over runs: each model, format and kernel apart, the target read per run."""

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "structure_model.py"


@pytest.fixture(scope="module")
def structure_model():
    spec = importlib.util.spec_from_file_location("structure_model", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _table(folder: Path, errors: dict[tuple[str, str], tuple[float, float]], k_hat: dict[str, dict[str, int]]):
    """A run's table.json: one B = 1 row per (dtype, kernel) of OLMoE with (median, max) errors; k_hat per dtype as
    (measured, predicted) at one acceptance."""
    folder.mkdir(parents=True)
    rows = [{"model": "olmoe-1b-7b", "dtype": dtype, "batch": 1, "kernel": kernel, "median_error": med,
             "max_error": top} for (dtype, kernel), (med, top) in errors.items()]
    sides = [{"model": "olmoe-1b-7b", "dtype": dtype, "crossover": {"measured": 2, "predicted": 3},
              "plan": {"measured": {"k_hat": {"0.8": k["measured"]}}, "predicted": {"k_hat": {"0.8": k["predicted"]}}}}
             for dtype, k in k_hat.items()]
    (folder / "table.json").write_text(json.dumps({"rows": rows, "side_by_side": sides}))
    return folder


def test_the_summary_keeps_each_format_apart(structure_model, tmp_path):
    """q8_0 and q4_0 share ggml's kernel names: their rows and their k_hat agreement are summarized apart, the median
    over runs per format, and the target is read over every row."""
    kernel = "ggml-mul_mat_id"
    runs = [_table(tmp_path / f"run-{i}", {("q8_0", kernel): (0.035 * i, 0.05 * i), ("q4_0", kernel): (0.3, 0.4)},
                   {"q8_0": {"measured": 2, "predicted": 2}, "q4_0": {"measured": 2, "predicted": 4 + i}})
            for i in (1, 2, 3)]
    structure_model.step_summary(tmp_path, runs)
    summary = json.loads((tmp_path / "summary.json").read_text())
    by_format = {r["dtype"]: r for r in summary["rows"]}
    assert set(by_format) == {"q8_0", "q4_0"} and all(r["runs"] == 3 for r in summary["rows"])
    assert by_format["q8_0"]["median_error"] == {"median": pytest.approx(0.07), "range": [0.035, pytest.approx(0.105)]}
    assert by_format["q8_0"]["runs_within"] == 2 and by_format["q4_0"]["runs_within"] == 0  # run 3: 10.5% median
    assert summary["within_one"]["olmoe-1b-7b/q8_0"]["k_hat"]["within"] == 3
    assert summary["within_one"]["olmoe-1b-7b/q4_0"]["k_hat"]["within"] == 0
    assert summary["within_one"]["olmoe-1b-7b/q4_0"]["measured_k_hat"] == {"0.8": [2, 2, 2]}
    assert summary["target_met_in_median"] is False  # q4_0's 30% median
    assert "| olmoe-1b-7b | q4_0 | ggml-mul_mat_id | 30.0%" in (tmp_path / "summary.md").read_text()

"""Values a user may type or a file may hold that once ended in a traceback (issue 14, class 3): each is one line
and exit 2 naming the argument, or the file and its key, and nothing is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_cases import refused
from plan_cases import make_bench, uniform_trace
from score_cases import make_plan, make_runs, ran

from moespec import MoespecError, cli
from moespec.formats.benchfile import load_bench
from moespec.formats.files import write_json


@pytest.mark.parametrize("argv, needle", [
    (["synth", "--process", "uniform", "--tokens", "100", "--docs", "2", "--seed", "-1"], "--seed"),
    (["reuse", "TRACE", "--seed", "-1"], "--seed"),
    (["bench", "--seed", "x"], "--seed"),
    (["demo", "--seed", "-3"], "--seed"),
    (["spec", "--format", "q9"], "--format"),
    (["staircase", "--step-times", "1e-300,1e300"], "magnitudes"),
    (["staircase", "--step-times", "1e999999,2"], "magnitudes"),
    (["staircase", "--step-times", "1,2", "--acceptance", ""], "an empty list"),
    (["trace", "--model", "MODEL", "--text", "TEXT", "--device", "nonsense"], "unknown device"),
])
def test_a_bad_value_is_one_line(argv, needle, tmp_path: Path, capsys):
    text = tmp_path / "doc.txt"
    text.write_text(" = Title = \\nsome text\\n")
    argv = [{"TRACE": str(tmp_path / "none.npz"), "MODEL": str(tmp_path), "TEXT": str(text)}.get(a, a) for a in argv]
    out = tmp_path / "out.npz"
    try:
        code = cli.main([*argv, *(["--out", str(out)] if argv[0] in ("synth", "trace") else [])])
    except SystemExit as e:  # argparse's own one-line errors
        code = e.code
    err = capsys.readouterr().err
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not out.exists()


@pytest.mark.parametrize("key, value", [("hidden_size", "32"), ("num_experts", 0), ("num_hidden_layers", "2"),
                                        ("num_attention_heads", 0), ("intermediate_size", 1.5),
                                        ("num_experts_per_tok", -1), ("vocab_size", True)])
def test_a_config_field_that_is_not_a_positive_integer(key, value, tiny_configs, tmp_path: Path, capsys):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({**tiny_configs["olmoe"].to_dict(), key: value}))
    err = refused(["spec", config], capsys, tmp_path)
    assert str(config) in err and key in err


@pytest.mark.parametrize("model_type, key, value", [("qwen3_moe", "mlp_only_layers", 1),
                                                    ("qwen3_moe", "mlp_only_layers", ["1"]),
                                                    ("gpt_oss", "layer_types", "full_attention"),
                                                    ("gpt_oss", "layer_types", [0, 1])])
def test_a_config_list_of_the_wrong_kind(model_type, key, value, tiny_configs, tmp_path: Path, capsys):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({**tiny_configs[model_type].to_dict(), key: value}))
    err = refused(["spec", config], capsys, tmp_path)
    assert str(config) in err and f"{key} = " in err and "must be a list" in err


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1e-3, 0.0, "1"])
@pytest.mark.parametrize("key", ["measured_mean_s", "measured_median_s"])
def test_bench_op_times_are_refused_before_plan(key, value, tmp_path: Path, capsys):
    bench = make_bench()
    bench["per_layer"]["7"]["kernels"]["dedup"]["3"][key] = value
    write_json(tmp_path / "bench.json", bench)
    uniform_trace().save(tmp_path / "trace.npz")
    err = refused(["plan", "--bench", tmp_path / "bench.json", "--trace", tmp_path / "trace.npz", "--tau1", "0.1",
                   "--out", tmp_path / "plan.json"], capsys, tmp_path)
    assert f"bench.json: per_layer.7.kernels.dedup.3.{key}" in err


@pytest.mark.parametrize("value", [float("nan"), "x", [], {"x": 1e-4}])
def test_a_one_token_prediction_without_a_fit_is_still_a_number(value, tmp_path: Path):
    """one_token_s.predicted_s is read by plan whether or not its kernel has a fit: a non-number there is refused by
    the loader, naming the file and the key, not met later as a crash."""
    bench = make_bench()
    assert bench["fits"] == {}
    bench["per_layer"]["7"]["one_token_s"]["predicted_s"] = value
    write_json(tmp_path / "bench.json", bench)
    with pytest.raises(MoespecError, match="bench.json: per_layer.7.one_token_s.predicted_s has the wrong type"):
        load_bench(tmp_path / "bench.json")


@pytest.mark.parametrize("coverage", [None, 3, "all", {"num_moe_layers": "16"}, {"num_moe_layers": 0}])
def test_a_bad_coverage_is_refused_before_score(coverage, tmp_path: Path, capsys):
    write_json(tmp_path / "plan.json", {**make_plan(), "coverage": coverage})
    write_json(tmp_path / "runs.json", {**make_runs(), "plan": ran(tmp_path / "plan.json")})
    err = refused(["score", "--plan", tmp_path / "plan.json", "--runs", tmp_path / "runs.json"], capsys, tmp_path)
    assert "plan.json: coverage" in err

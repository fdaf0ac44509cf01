"""The `staircase` and `demo` commands through the same entry point a user runs."""

import json

import pytest
from cli_cases import refused

from moespec.cli import main


def run_json(capsys, argv):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_staircase_json_jump_example(capsys):
    out = run_json(capsys, ["staircase", "--step-times", "1,2,2", "--acceptance", "0.5,0.9", "--json"])
    assert out["a0"] == 1.0
    assert [row["k_star"] for row in out["table"]] == [0, 2]
    assert out["table"][1]["speedup"] == pytest.approx((1 + 0.9 + 0.81) / 2)
    assert out["helps_at"] == [0.9]
    assert out["step_points"] == pytest.approx([(5**0.5 - 1) / 2] * 2, abs=1e-12)
    assert out["step_points_exact"] == [None, None]
    assert [s["k"] for s in out["intervals"]] == [0, 2]


def test_staircase_exact_fractions_and_default_grid(capsys):
    out = run_json(capsys, ["staircase", "--step-times", "2,3,4", "--json"])
    assert out["step_points_exact"][0] == "1/2"
    assert len(out["table"]) == 11 and out["table"][0]["a"] == 0.2 and out["table"][-1]["a"] == 0.98
    main(["staircase", "--step-times", "1,3/2,2"])  # tables print without error
    assert "step points" in capsys.readouterr().out


def test_staircase_for_llama_cpp(capsys):
    """Each interval of the staircase becomes the flags that draft exactly k tokens per step; k = 0 drafts nothing."""
    out = run_json(capsys, ["staircase", "--step-times", "1,2,2", "--for", "llama.cpp", "--json"])
    assert [(r["k"], r["from"], r["to"]) for r in out["llama_cpp"]] == [(s["k"], s["from"], s["to"])
                                                                       for s in out["intervals"]]
    assert out["llama_cpp"][0]["flags"] == "no draft model (plain decoding)"
    assert out["llama_cpp"][1]["flags"] == "--spec-draft-n-max 2 --spec-draft-n-min 0 --spec-draft-p-min 0"
    assert "llama_cpp" not in run_json(capsys, ["staircase", "--step-times", "1,2,2", "--json"])
    main(["staircase", "--step-times", "1,2,2", "--for", "llama.cpp"])
    assert "--spec-draft-n-max 2" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--step-times", "1,0"], "positive"),
        (["--step-times=-1,2"], "positive"),
        (["--step-times", "1"], "at least two"),
        (["--step-times", "1,x"], "not a number"),
        (["--step-times", "1,2", "--acceptance", "1"], "outside [0, 1)"),
        (["--step-times", "1,2", "--acceptance", "-0.1"], "outside [0, 1)"),
    ],
)
def test_staircase_bad_input_one_line_exit_2(capsys, argv, needle):
    assert main(["staircase", *argv]) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


@pytest.mark.parametrize("argv", [["nonsense"], ["staircase"], ["staircase", "--step-times", "1,2", "--bogus"],
                                  ["staircase", "--step-times", "1,2", "--for", "vllm"]])
def test_argument_errors_one_line(capsys, argv):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and len(capsys.readouterr().err.strip().splitlines()) == 1


def test_demo_json(capsys, tmp_path):
    out = run_json(capsys, ["demo", "--json", "--tokens", "6000", "--docs", "20", "--bench-reps", "0",
                                  "--out", str(tmp_path)])
    assert out["model"] == "olmoe-1b-7b" and out["shape"]["N"] == 64 and out["shape"]["m"] == 8
    assert out["bytes"]["w_l"] == 3 * 2048 * 1024 * 2
    slot, uniform, traced = (out["kernels"][k] for k in ("slot", "dedup_uniform", "dedup_trace"))
    # per-slot bytes are linear in k+1 with slope mW, up to one embedding row and one KV row per token
    steps = [b - a for a, b in zip(slot["step_bytes"], slot["step_bytes"][1:])]
    assert max(steps) - min(steps) <= 2 and abs(steps[0] - out["bytes"]["mW"]) < 1_000_000
    # dedup never reads more, and the traced routing (more reuse than uniform) reads less still
    for s, u, t in zip(slot["step_bytes"], uniform["step_bytes"], traced["step_bytes"]):
        assert t <= u <= s
    # uniform routing: rho_bar_1 = rho(2) = m/N; the calibrated trace hits the paper's rho(2) = 0.363
    assert out["rho_bar"]["uniform"][0] == pytest.approx(8 / 64)
    assert out["trace"]["rho_mean"][2] == pytest.approx(0.363, abs=0.01)
    # fewer bytes per draft at the same D: the staircase is never lower, the speedup never smaller
    for rs, ru, rt in zip(slot["table"], uniform["table"], traced["table"]):
        assert rs["k_star"] <= ru["k_star"] <= rt["k_star"] and rs["speedup"] <= ru["speedup"] + 1e-12
    saved = json.loads((tmp_path / "demo.json").read_text())
    assert saved["provenance"]["command"] and saved["provenance"]["dtype"] == "bf16"
    assert (tmp_path / "trace.npz").exists()


def test_demo_tables(capsys, tmp_path):
    assert main(["demo", "--tokens", "3000", "--docs", "10", "--bench-reps", "0", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "1. routing" in out and "2. theory" in out and "reuse threshold" in out
    assert "3. measurement" not in out and not (tmp_path / "bench.json").exists()


def test_demo_short_bench_and_drafting(capsys, tmp_path):
    """Step 3 runs the real bench on one OLMoE layer (one repetition here) and reports r(n) and the crossover; step 2b
    runs every constant k, the heuristic and the online policy on prompts sampled from the trained target, tokens
    equal to plain decoding's in every cell, and drafting.json feeds the report's drafting section."""
    assert main(["demo", "--tokens", "3000", "--docs", "10", "--bench-reps", "1", "--engine-layers", "0",
                 "--drafting-prompts", "1", "--kmax", "3", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "3. measurement" in out and "measured r(n)" in out and "crossover" in out
    saved = json.loads((tmp_path / "demo.json").read_text())
    bench = saved["bench"]
    assert set(bench["r"]) == {str(n) for n in range(1, 10)} and all(v > 0 for v in bench["r"].values())
    assert bench["crossover"] is None or 2 <= bench["crossover"] <= 9
    assert (tmp_path / "bench.json").exists() and (tmp_path / "fig2.png").exists()

    found = json.loads((tmp_path / "drafting.json").read_text())
    assert set(found["cells"]) == {"k=0", "k=1", "k=2", "k=3", "heuristic", "online"}
    assert all(row["greedy_exact"] for row in found["cells"].values())
    assert len(found["profile_calibration"]) == 3 and 0 <= found["k_hat_plan"] <= 3
    assert found["ceiling_gbps"]["before"] > 0 and found["ceiling_gbps"]["after"] > 0
    best = found["cells"][f"k={found['best_constant_k']}"]["vs_best_constant_paired"]
    assert best == [1.0, 1.0, 1.0]  # the best constant against itself, prompt by prompt
    for row in found["cells"].values():
        med, lo, hi = row["vs_best_constant_paired"]
        assert lo <= med <= hi
    assert set(found["replay"]) == set(found["cells"]) and max(found["replay"][f"k={k}"] for k in range(4)) == 1.0
    assert "drafting on the trained pair" in out
    assert main(["report", str(tmp_path)]) == 0
    assert "Drafting on the trained pair" in (tmp_path / "report.html").read_text()


@pytest.mark.parametrize("argv", [["--kmax", "0"], ["--tokens", "10", "--docs", "5"], ["--bench-reps", "-1"],
                                  ["--format", "q8_0", "--bench-reps", "1"]])
def test_demo_bad_input(capsys, argv, tmp_path):
    refused(["demo", *argv, "--out", tmp_path], capsys, tmp_path)

"""The `staircase` and `demo` commands through the same entry point a user runs."""

import json

import pytest

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


@pytest.mark.parametrize("argv", [["nonsense"], ["staircase"], ["staircase", "--step-times", "1,2", "--bogus"]])
def test_argument_errors_one_line(capsys, argv):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and len(capsys.readouterr().err.strip().splitlines()) == 1


def test_demo_json(capsys, tmp_path):
    out = run_json(capsys, ["demo", "--json", "--out", str(tmp_path / "demo.json")])
    assert out["model"] == "olmoe-1b-7b" and out["shape"]["N"] == 64 and out["shape"]["m"] == 8
    assert out["bytes"]["w_l"] == 3 * 2048 * 1024 * 2
    slot, dedup = out["kernels"]["slot"], out["kernels"]["dedup"]
    # per-slot bytes are linear in k+1 with slope mW; dedup never reads more
    steps = [b - a for a, b in zip(slot["step_bytes"], slot["step_bytes"][1:])]
    assert max(steps) - min(steps) <= 2048 * 2 * 8 + 1_000_000  # embedding row + kv growth only
    assert all(d <= s for d, s in zip(dedup["step_bytes"], slot["step_bytes"]))
    # uniform routing: u(n) = (1 - q^n)/(n (1 - q)), q = 7/8
    q = 7 / 8
    assert out["byte_share_u"][1] == pytest.approx((1 - q**2) / (2 * (1 - q)))
    # dedup's staircase is never below per-slot's: fewer bytes per draft at the same D
    for rs, rd in zip(slot["table"], dedup["table"]):
        assert rd["k_star"] >= rs["k_star"] and rd["speedup"] >= rs["speedup"] - 1e-12
    saved = json.loads((tmp_path / "demo.json").read_text())
    assert saved["provenance"]["command"] and saved["provenance"]["dtype"] == "bf16"


def test_demo_bad_input(capsys):
    assert main(["demo", "--kmax", "0"]) == 2
    assert "kmax" in capsys.readouterr().err

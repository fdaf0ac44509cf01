"""benchmarks/loop_state.py: the model's loop terms scaled with the host's state, and its arguments' checks."""

from pathlib import Path

import numpy as np
import pytest
from cli_cases import load_script, run_script

from moespec.kernels.structure import Rates, pass_time

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "loop_state.py"


@pytest.fixture(scope="module")
def loop_state():
    return load_script(SCRIPT)


RATES = Rates((1, 2, 4), (3e-11, 5e-11, 9e-11), (2e-11, 4e-11, 8e-11), 2e-6, 5e-5, node_s=3e-6,
              row_s=(1e-9, 2e-9, 3e-9), token_s=1e-6, hot_group_s=1e-6)


@pytest.mark.parametrize("ceiling, profile, alpha", [(20.0, 40.0, 0.0), (30.0, 30.0, 1.0), (25.0, 25.0, 0.5)])
def test_no_scaling_where_the_state_is_the_profiles_or_alpha_is_0(loop_state, ceiling, profile, alpha):
    assert loop_state.at_state(RATES, ceiling, profile, alpha) == RATES


@pytest.mark.parametrize("kind, ids", [("slot", [[0, 1], [1, 2]]), ("dedup", [[0, 1], [1, 2], [1, 3]]),
                                       ("dedup", [[4]])])
def test_every_term_but_the_stream_scales_by_the_ceilings_ratio(loop_state, kind, ids):
    """At a ceiling half the profile's, alpha = 1 doubles a pass's time past its stream (b s / C per cold group, s = 1
    here, no cache hits) and alpha = 0.5 multiplies it by sqrt(2); the stream's share stays."""
    b, rows, c = 3e6, 1000, 20.0
    ids = np.array(ids)
    stream = b * sum(1 for _ in (ids.reshape(-1) if kind == "slot" else np.unique(ids))) / (c * 1e9)
    base = pass_time(RATES, kind, ids, b, rows, c, 0.0) - stream
    for alpha, factor in ((1.0, 2.0), (0.5, 2 ** 0.5)):
        scaled = loop_state.at_state(RATES, c, 2 * c, alpha)
        assert scaled.stream_share == RATES.stream_share
        assert pass_time(scaled, kind, ids, b, rows, c, 0.0) - stream == pytest.approx(factor * base, rel=1e-12)


@pytest.mark.parametrize("args, name", [((0.0, 30.0, 1.0), "ceiling_gbps"), ((30.0, float("nan"), 1.0),
                                                                           "profile_gbps"),
                                        ((30.0, 30.0, -1.0), "alpha")])
def test_the_state_refuses_a_value_outside_its_domain(loop_state, args, name):
    with pytest.raises(ValueError, match=name):
        loop_state.at_state(RATES, *args)


@pytest.mark.parametrize("args, needle", [
    (["--runs", "nowhere", "--out", "o"], "--runs: give runs' folders"),
    (["--runs", "r", "--alphas", "a,1", "--out", "o"], "--alphas: give comma-separated numbers >= 0"),
    (["--runs", "r", "--alphas", "-1", "--out", "o"], "--alphas: give comma-separated numbers >= 0"),
    (["--out", "o"], "the following arguments are required: --runs")])
def test_bad_arguments_end_in_one_line(args, needle, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, err = run_script(SCRIPT, args, capsys)
    assert code == 2 and needle in err and "Traceback" not in err


def test_a_profile_that_does_not_load_is_named_before_any_table(tmp_path, capsys):
    run = tmp_path / "run-1"
    run.mkdir()
    (run / "device.json").write_text("[1]")
    (run / "table.json").write_text("{}")
    code, err = run_script(SCRIPT, ["--runs", run, "--out", tmp_path / "out"], capsys)
    assert code == 2 and "device.json" in err
    assert not (tmp_path / "out").exists()

"""moespec plan: (22) arithmetic on a hand-made bench, crossover and the AUTO policy, the band (18) around the
measured-time saving, k_hat* and the band (21), plan.json round trip and validation, one-line CLI errors.
No assertion depends on how fast anything runs."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

from moespec import MoespecError, cli, theory
from moespec.benchfile import load_bench
from moespec.io import write_json
from moespec.plan import build_plan, crossover, kernel_by_n, load_plan
from moespec.spec import ModelSpec
from moespec.trace import Trace

MODEL = "olmoe-1b-7b"  # 16 MoE layers of equal w_l: untimed layers scale the two timed ones by 16/2
TIMED = [0, 7]
NS = list(range(1, 10))
TAU1 = 0.1
EPS = 0.05
MS = 1e-3
# per timed layer, in ms: slot(n) = n, dedup(n) = 1.5 + n/2, so the saving per layer is n/2 - 1.5:
# negative at n = 2, zero at n = 3, positive from n = 4 (the crossover)
SLOT = {n: n * MS for n in NS}
DEDUP = {n: (1.5 + n / 2) * MS for n in NS}
SCALE = 16 / len(TIMED)


def make_bench(errors: Callable[[], float] = lambda: 0.0, eps: float = EPS, r: float = 0.5) -> dict[str, Any]:
    """A bench.json document that passes load_bench; measured times = predicted x (1 + e), e from `errors`."""
    def entry(t: float) -> dict[str, float]:
        return {"windows": 4, "predicted_mean_s": t, "measured_mean_s": t * (1 + errors()), "measured_median_s": t}

    per_layer = {str(layer): {
        "kernels": {"slot": {str(n): entry(SLOT[n]) for n in NS}, "dedup": {str(n): entry(DEDUP[n]) for n in NS}},
        "one_token_s": {"kernel": "slot", "predicted_s": SLOT[1], "measured_s": SLOT[1] * (1 + errors())}}
        for layer in TIMED}
    beta = {"kind": "slot", "beta_gbps": {str(n): 10.0 for n in NS}, "beta_iqr_gbps": {str(n): 1.0 for n in NS}}
    return {"format": "moespec-bench", "format_version": 1, "model": MODEL, "device": "test device",
            "device_kind": "cpu", "dtype": "bf16", "ceiling_kind": "streaming read", "ceiling_gbps": 20.0,
            "layers": TIMED, "n": NS,
            "kernels": {"slot": beta, "dedup": {**beta, "kind": "dedup"}},
            "r": {str(n): r for n in NS}, "u": {str(n): 1.0 for n in NS}, "eps": {"slot": eps / 2, "dedup": eps},
            "crossover": None, "fits": {}, "per_layer": per_layer, "chosen": {}, "provenance": {}}


@pytest.fixture(scope="module")
def trace() -> Trace:
    """Uniform random routing of the model's shape, two documents."""
    spec = ModelSpec.from_name(MODEL)
    rng = np.random.default_rng(0)
    experts = np.argsort(rng.random((300, spec.L, spec.N)), axis=-1)[..., :spec.m]
    return Trace.from_arrays(experts, [0, 150, 300], spec.N, meta={"model": MODEL})


@pytest.fixture(scope="module")
def plan(trace: Trace) -> dict[str, Any]:
    return build_plan(make_bench(), trace, TAU1)


def test_verify_time_follows_22(plan: dict[str, Any]) -> None:
    for n in NS:
        slot = TAU1 + SCALE * len(TIMED) * (SLOT[n] - SLOT[1])
        dedup = TAU1 if n == 1 else TAU1 + SCALE * len(TIMED) * (DEDUP[n] - SLOT[1])
        assert plan["tau_hat"]["slot"][str(n)] == pytest.approx(slot, rel=1e-12)
        assert plan["tau_hat"]["dedup"][str(n)] == pytest.approx(dedup, rel=1e-12)
        if n > 1:
            assert plan["saving"][str(n)]["predicted_s"] == pytest.approx(slot - dedup, abs=1e-15)
    assert plan["coverage"]["scale"] == SCALE and plan["eps"] == EPS


def test_crossover_and_auto_policy(plan: dict[str, Any]) -> None:
    assert plan["crossover"] == 4  # S(3) = 0 exactly is not a positive saving
    assert plan["kernel_by_n"] == {str(n): "slot" if n < 4 else "dedup" for n in NS}
    for n in map(str, NS):
        auto = plan["tau_hat"]["auto"][n]
        assert auto == pytest.approx(min(plan["tau_hat"]["slot"][n], plan["tau_hat"]["dedup"][n]), rel=1e-12)


@pytest.mark.parametrize("saving, expected", [([0, 1, 1], 2), ([0, -1, 1, 1], 3), ([0, 1, -1, 1], 4),
                                              ([0, 1, 1, -1], None), ([0, 0, 0], None)])
def test_crossover_needs_positive_saving_at_every_larger_n(saving: list[float], expected: int | None) -> None:
    assert crossover(np.array(saving, dtype=float)) == expected
    policy = kernel_by_n(expected, len(saving))
    assert policy[1] == "slot" and (expected is None or policy[len(saving)] == "dedup")


@pytest.mark.parametrize("seed", range(5))
def test_band_18_contains_the_measured_time_saving(trace: Trace, seed: int) -> None:
    rng = np.random.default_rng(seed)
    result = build_plan(make_bench(lambda: float(rng.uniform(-EPS, EPS))), trace, TAU1)
    for n, s in result["saving"].items():
        assert s["lo_s"] <= s["measured_s"] <= s["hi_s"], n
        assert s["hi_s"] - s["lo_s"] == pytest.approx(2 * s["band_s"])
    # the AUTO policy is never slower than the better fixed kernel by more than the band
    for k in range(result["kmax"] + 1):
        best = min(result["step_times"]["slot"][k], result["step_times"]["dedup"][k])
        band = result["saving"].get(str(k + 1), {"band_s": 0.0})["band_s"]
        assert result["step_times"]["auto"][k] <= best + band


def test_best_draft_length_and_speedup_band(trace: Trace) -> None:
    h = 0.002
    result = build_plan(make_bench(), trace, TAU1, kmax=8, draft_time=[h] * 9)
    delta = EPS / (1 - EPS)
    assert result["delta"] == pytest.approx(delta)
    assert result["step_times"]["dedup"][3] == pytest.approx(result["tau_hat"]["dedup"]["4"] + h)
    assert len(result["table"]) == len(theory.PAPER_ACCEPTANCES) * 3
    for row in result["table"]:
        V = result["step_times"][row["policy"]]
        assert row["k_hat"] == theory.best_draft_length(V, row["a"])
        assert row["speedup"] == pytest.approx(theory.speedup(V, row["a"], row["k_hat"]))
        assert row["speedup_lo"] == pytest.approx(row["speedup"] * (1 - 2 * EPS))  # (1-d)/(1+d) = 1 - 2 eps
    points = result["staircase"]["slot"]["step_points"]
    assert points == pytest.approx([float(b) for b in theory.step_points(result["step_times"]["slot"])])


def test_byte_model_comparison(plan: dict[str, Any]) -> None:
    spec = ModelSpec.from_name(MODEL)
    mW, D = spec.m * spec.W("bf16"), spec.dense_bytes("bf16")
    # beyond D, a step verifying k+1 tokens reads its cache and one embedding row per extra token
    kv = [spec.kv_bytes(k, 512) + spec.dense_bytes("bf16", tokens=k + 1) - D for k in range(9)]
    assert plan["reuse_threshold"]["rho_star"]["0.5"]["2"] == pytest.approx(
        float(theory.reuse_threshold_bytes(0.5, 2, mW, D, kv)))
    for s in plan["saving"].values():  # uniform routing of 8 of 64: u(n) > r = 0.5 at small n, below 1 everywhere
        assert s["byte_model"] == "dedup"
        assert s["two_bandwidth"] == ("dedup" if s["u"] < 0.5 else "slot")
    assert plan["saving"]["2"]["two_bandwidth"] == "slot"


@pytest.mark.parametrize("change, kwargs, problem", [
    (lambda b: b["eps"].update(dedup=0.5), {}, "needs eps < 1/2"),
    (lambda b: None, {"kmax": 9}, "needs n up to 10"),
    (lambda b: None, {"tau1": 0.0}, "must be a positive time"),
    (lambda b: b.update(model="qwen3-30b-a3b"), {}, "records 'olmoe-1b-7b'"),
    (lambda b: [entry["kernels"]["dedup"]["2"].update(predicted_mean_s=0.0) for entry in b["per_layer"].values()],
     {"tau1": 0.01}, "a predicted verify time is not positive"),
])
def test_bad_inputs_are_rejected(trace: Trace, change, kwargs: dict, problem: str) -> None:
    bench = make_bench()
    change(bench)
    with pytest.raises(MoespecError, match=problem):
        build_plan(bench, trace, **{"tau1": TAU1, **kwargs})


def test_plan_round_trips(plan: dict[str, Any], tmp_path: Path) -> None:
    path = write_json(tmp_path / "plan.json", plan)
    assert load_plan(path) == json.loads(json.dumps(plan))


@pytest.mark.parametrize("change, problem", [
    (lambda d: d.update(format="other"), "not a moespec plan file"),
    (lambda d: d.update(format_version=2), "version 2 is not supported"),
    (lambda d: d.pop("table"), "missing key 'table'"),
    (lambda d: d.update(crossover=99), "crossover 99 is outside"),
    (lambda d: d["kernel_by_n"].update({"2": "fast"}), "kernel_by_n must map"),
    (lambda d: d["kernel_by_n"].pop("9"), "kernel_by_n must map"),
    (lambda d: d["tau_hat"]["auto"].pop("5"), "tau_hat.auto"),
    (lambda d: d["table"][0].update(k_hat=99), "k_hat 99 is outside"),
    (lambda d: d["table"][1].update(speedup_lo=9.0), "speedup_lo <= speedup"),
    (lambda d: d["table"][2].update(policy="fastest"), "policy 'fastest'"),
])
def test_load_plan_rejects(plan: dict[str, Any], tmp_path: Path, change, problem: str) -> None:
    doc = copy.deepcopy(plan)
    change(doc)
    path = write_json(tmp_path / "bad.json", doc)
    with pytest.raises(MoespecError, match=problem) as info:
        load_plan(path)
    assert str(path) in str(info.value)


def _cli(tmp_path: Path, trace: Trace, bench: dict[str, Any], *extra: str) -> list[str]:
    write_json(tmp_path / "bench.json", bench)
    load_bench(tmp_path / "bench.json")  # the hand-made bench is a valid bench file
    trace.save(tmp_path / "trace.npz")
    return ["plan", "--bench", str(tmp_path / "bench.json"), "--trace", str(tmp_path / "trace.npz"), *extra]


def test_cli_writes_plan_and_prints_json(trace: Trace, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "plan.json"
    assert cli.main(_cli(tmp_path, trace, make_bench(), "--tau1", "0.1", "--out", str(out), "--json")) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["crossover"] == 4 and load_plan(out)["kernel_by_n"] == printed["kernel_by_n"]
    assert printed["device_kind"] == "cpu"
    assert cli.main(_cli(tmp_path, trace, make_bench(), "--tau1", "0.1", "--kmax", "3")) == 0
    assert "crossover" in capsys.readouterr().out


def test_plan_device_defaults_to_the_bench_and_may_repeat_it(trace: Trace, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture) -> None:
    for extra in ([], ["--device", "cpu"]):
        assert cli.main(_cli(tmp_path, trace, make_bench(), "--tau1", "0.1", "--json", *extra)) == 0
        assert json.loads(capsys.readouterr().out)["device_kind"] == "cpu"
    old = {k: v for k, v in make_bench().items() if k not in ("device_kind", "ceiling_kind")}
    assert cli.main(_cli(tmp_path, trace, old, "--tau1", "0.1", "--device", "cuda")) == 2  # an old bench is a cpu one
    assert "was measured on cpu" in capsys.readouterr().err


@pytest.mark.parametrize("bench, extra, problem", [
    (make_bench(), ["--tau1", "-1"], "must be a positive time"),
    (make_bench(eps=0.6), ["--tau1", "0.1"], "needs eps < 1/2"),
    (make_bench(), ["--tau1", "0.1", "--kmax", "12"], "needs n up to 13"),
    (make_bench(), ["--tau1", "0.1", "--draft-time", "1,2"], "--draft-time needs one or 9"),
    (make_bench(), ["--tau1", "0.1", "--device", "cuda"],
     "bench.json was measured on cpu; a cuda plan needs a bench run with --device cuda"),
])
def test_cli_errors_are_one_line(trace: Trace, tmp_path: Path, capsys: pytest.CaptureFixture, bench: dict,
                                 extra: list[str], problem: str) -> None:
    assert cli.main(_cli(tmp_path, trace, bench, *extra)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and problem in err

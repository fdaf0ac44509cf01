"""moespec plan: (22) arithmetic on a hand-made bench, its calibrated version on a hand-made runs.json, reduced
models (--moe-layers), measured draft times, crossover and the AUTO policy, the band (18) around the
measured-time saving, k_hat* and the bands (20)-(21), a property test of every band against true values, plan.json
round trip and validation, one-line CLI errors. No assertion depends on how fast anything runs."""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, reject, settings
from hypothesis import strategies as st
from plan_cases import (
    DEDUP,
    EPS,
    MODEL,
    MS,
    NS,
    RUNS_DRAFT,
    RUNS_SLOT,
    SLOT,
    TAU1,
    TIMED,
    make_bench,
    make_runs,
    uniform_trace,
)

from moespec import MoespecError, cli, theory
from moespec.formats.benchfile import load_bench
from moespec.formats.files import write_json
from moespec.formats.planfile import load_plan
from moespec.formats.trace import Trace
from moespec.model.spec import ModelSpec
from moespec.predict.plan import build_plan, kernel_by_n, reduced_model
from moespec.routing.reuse import reuse_stats
from moespec.theory import crossover

SCALE = 16 / len(TIMED)
# whole-model expert-op times M_p(n) of the fits (both kernels run the per-slot one at n = 1), seconds
M_HAT = {"slot": {n: SCALE * len(TIMED) * SLOT[n] for n in NS},
         "dedup": {n: SCALE * len(TIMED) * (DEDUP[n] if n > 1 else SLOT[1]) for n in NS}}
DELTA = EPS / (1 - EPS)


@pytest.fixture(scope="module")
def trace() -> Trace:
    return uniform_trace()


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
    assert crossover(dict(enumerate(saving, start=1))) == expected  # saving listed from n = 1
    # AUTO runs dedup exactly where the saving is positive: from the crossover on, and below it where positive
    policy = kernel_by_n(np.array(saving, dtype=float))
    assert policy == {n: "dedup" if n > 1 and saving[n - 1] > 0 else "slot" for n in range(1, len(saving) + 1)}
    assert expected is None or all(policy[n] == "dedup" for n in range(expected, len(saving) + 1))


@pytest.mark.parametrize("seed", range(5))
def test_band_18_contains_the_measured_time_saving(trace: Trace, seed: int) -> None:
    rng = np.random.default_rng(seed)
    result = build_plan(make_bench(lambda kernel, n: float(rng.uniform(-EPS, EPS))), trace, TAU1)
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
        d = result["delta_steps"]["prediction"][row["policy"]]
        assert row["version"] == "prediction"
        assert (row["speedup_lo"], row["speedup_hi"]) == pytest.approx(theory.speedup_band(row["speedup"], d))
    points = result["staircase"]["slot"]["step_points"]
    assert points == pytest.approx([float(b) for b in theory.step_points(result["step_times"]["slot"])])


def _delta(V: list[float], bound: list[float]) -> float:
    """max_k b(k)/(V_hat(k) - b(k)): the relative error bound on V that |V_hat - V| <= b implies."""
    return max(b / (v - b) for v, b in zip(V, bound))


def test_step_time_delta_follows_the_error_bounds(plan: dict[str, Any]) -> None:
    # (22) is exact at n = 1 and elsewhere off by at most delta (M_p(n) + M_slot(1)): two expert terms
    bound = {p: [0.0] + [DELTA * (M_HAT[p][n] + M_HAT["slot"][1]) for n in NS[1:]] for p in ("slot", "dedup")}
    bound["auto"] = [bound[plan["kernel_by_n"][str(n)]][n - 1] for n in NS]
    for p, b in bound.items():
        V = plan["step_times"][p]
        assert V == pytest.approx([plan["tau_hat"][p][str(n)] for n in NS], rel=1e-15)  # h = 0
        assert plan["delta_steps"]["prediction"][p] == pytest.approx(_delta(V, b), rel=1e-12)


@pytest.fixture(scope="module")
def calibrated(trace: Trace) -> dict[str, Any]:
    """A plan with the hand-made runs.json: no --tau1, the runs' draft times."""
    return build_plan(make_bench(), trace, runs=make_runs(), draft_time=list(RUNS_DRAFT.values()))


def test_calibrated_version_is_the_measured_time_version_calibrated(trace: Trace) -> None:
    """The paper's calibrated version (Section 4.2): the measured-time version with the growth outside the expert
    operation measured, so its saving is the measured-time version's, not the fits'."""
    plan = build_plan(make_bench(lambda kernel, n: 0.1 if kernel == "dedup" and n > 1 else 0.0), trace,
                      runs=make_runs(), draft_time=list(RUNS_DRAFT.values()))
    for n in NS:
        assert plan["tau_calibrated"]["slot"][str(n)] == RUNS_SLOT[n]
        if n > 1:
            saving = plan["saving"][str(n)]
            assert saving["calibrated_s"] == pytest.approx(saving["measured_s"], abs=1e-15)
            assert saving["measured_s"] == pytest.approx(M_HAT["slot"][n] - 1.1 * M_HAT["dedup"][n], rel=1e-12)
            assert saving["calibrated_s"] != pytest.approx(saving["predicted_s"], abs=1e-12)
    assert plan["crossover_calibrated"] == plan["crossover_measured"]


def test_calibrated_version_follows_its_formula(calibrated: dict[str, Any], trace: Trace) -> None:
    plan = calibrated
    assert plan["tau1_s"] == RUNS_SLOT[1]  # --tau1 defaults to the runs' dedup-off one-token pass
    assert plan["runs"] == {"path": "runs", "moe_layers": 16, "depth": 4096}
    assert plan["reuse_threshold"]["depth"] == 4096  # --depth defaults to the runs' too
    for n in NS:  # tau_cal_p(n) = tau_meas_slot(n) - M_slot(n) + M_p(n)
        expected = {p: RUNS_SLOT[n] - M_HAT["slot"][n] + M_HAT[p][n] for p in ("slot", "dedup")}
        assert plan["tau_calibrated"]["slot"][str(n)] == RUNS_SLOT[n]
        assert plan["tau_calibrated"]["dedup"][str(n)] == pytest.approx(expected["dedup"], rel=1e-12)
        assert plan["tau_calibrated"]["auto"][str(n)] == pytest.approx(expected[plan["kernel_by_n"][str(n)]])
        if n > 1:  # both kernels gain the same measured time: the calibrated saving is the measured-time one,
            # here (measured op times = fits) the predicted one
            saving = plan["saving"][str(n)]
            assert saving["calibrated_s"] == pytest.approx(saving["predicted_s"], abs=1e-15)
            assert saving["predicted_s"] == pytest.approx(M_HAT["slot"][n] - M_HAT["dedup"][n], abs=1e-15)
    assert plan["crossover_calibrated"] == plan["crossover"] == 4
    # calibrated errors: none per-slot (measured), delta (M_dedup(n) + M_slot(n)) for dedup at n >= 2
    bound = {"slot": [0.0] * len(NS),
             "dedup": [0.0] + [DELTA * (M_HAT["dedup"][n] + M_HAT["slot"][n]) for n in NS[1:]]}
    bound["auto"] = [bound[plan["kernel_by_n"][str(n)]][n - 1] for n in NS]
    for p, b in bound.items():
        V = plan["step_times_calibrated"][p]
        assert V == pytest.approx([plan["tau_calibrated"][p][str(n)] + RUNS_DRAFT[n - 1] for n in NS], rel=1e-15)
        assert plan["delta_steps"]["calibrated"][p] == pytest.approx(_delta(V, b), rel=1e-12, abs=0)
        points = [float(x) for x in theory.step_points(V)]
        assert plan["staircase_calibrated"][p]["step_points"] == pytest.approx(points)
    assert len(plan["table_calibrated"]) == len(theory.PAPER_ACCEPTANCES) * 3
    for row in plan["table_calibrated"]:
        V = plan["step_times_calibrated"][row["policy"]]
        assert row["version"] == "calibrated"
        assert row["k_hat"] == theory.best_draft_length(V, row["a"])
        assert row["speedup"] == pytest.approx(theory.speedup(V, row["a"], row["k_hat"]))
        d = plan["delta_steps"]["calibrated"][row["policy"]]
        assert (row["speedup_lo"], row["speedup_hi"]) == pytest.approx(theory.speedup_band(row["speedup"], d))
        if row["policy"] == "slot":  # the measured time: no bandwidth enters it
            assert row["speedup_lo"] == row["speedup"] == row["speedup_hi"]
    # the prediction is the plan without runs, given the same tau(1), draft times and depth
    alone = build_plan(make_bench(), trace, RUNS_SLOT[1], draft_time=list(RUNS_DRAFT.values()), depth=4096)
    for key in ("tau_hat", "step_times", "staircase", "table", "kernel_by_n", "crossover", "reuse_threshold"):
        assert plan[key] == alone[key], key
    assert all(row["version"] == "prediction" for row in plan["table"])


def test_reduced_model_covers_the_first_moe_layers(trace: Trace) -> None:
    spec, L = ModelSpec.from_name(MODEL), 4
    result = build_plan(make_bench(), trace, TAU1, moe_layers=L)
    cov = result["coverage"]
    assert (cov["num_moe_layers"], cov["model_moe_layers"], cov["scale"]) == (L, 16, L / len(TIMED))
    for n in NS:  # four equal layers: each timed layer's time counts twice
        assert result["tau_hat"]["slot"][str(n)] == pytest.approx(TAU1 + L * (SLOT[n] - SLOT[1]), rel=1e-12)
    small = reduced_model(spec, L)
    assert small == replace(spec, layers=L) and small.L == L
    sub = Trace.from_arrays(trace.experts[:, :L], trace.doc_starts, trace.num_experts)
    w = [small.expert_bytes(layer, "bf16") for layer in range(L)]
    stats = reuse_stats(sub, n_max=9, bootstrap=0, expert_bytes=w)
    assert list(result["reuse_threshold"]["rho_bar"].values()) == pytest.approx(stats.rho_bar[1:].tolist())
    assert [s["u"] for s in result["saving"].values()] == pytest.approx(stats.u[2:].tolist())
    mW, D, kv = small.byte_model("bf16", 512, 8)
    assert result["reuse_threshold"]["rho_star"]["0.5"]["2"] == pytest.approx(
        float(theory.reuse_threshold_bytes(0.5, 2, mW, D, kv)))
    deepseek = ModelSpec.from_name("deepseek-v2-lite")  # a dense first layer stays in front of the MoE layers
    first3 = reduced_model(deepseek, 3)
    assert (first3.layers, first3.dense_layers, first3.L) == (4, (0,), 3)
    assert first3.W("bf16") == sum(deepseek.expert_bytes(layer, "bf16") for layer in range(3))
    assert reduced_model(deepseek, deepseek.L) == deepseek


def test_moe_layers_come_from_the_runs(trace: Trace) -> None:
    assert build_plan(make_bench(), trace, runs=make_runs(moe_layers=4))["coverage"]["num_moe_layers"] == 4
    assert build_plan(make_bench(), trace, runs=make_runs(moe_layers=4), moe_layers=4)["coverage"]["scale"] == 2
    with pytest.raises(MoespecError, match="--moe-layers 8 differs from the 4 MoE layers of the model runs timed"):
        build_plan(make_bench(), trace, runs=make_runs(moe_layers=4), moe_layers=8)
    with pytest.raises(MoespecError, match="outside 1..16"):
        build_plan(make_bench(), trace, TAU1, moe_layers=17)


# ---- property: every band holds the truth ---------------------------------------------------------------------
SLOTS = [(kernel, n) for kernel in ("slot", "dedup") for n in NS]
SLACK = 1e-9  # float rounding in sums of times: bounds are checked to this relative precision


@settings(max_examples=30, deadline=None)
@given(eps=st.floats(0.0, 0.4), beta=st.lists(st.floats(0.5, 4.0), min_size=len(SLOTS), max_size=len(SLOTS)),
       e=st.lists(st.floats(-1.0, 1.0), min_size=len(SLOTS), max_size=len(SLOTS)),
       share=st.lists(st.floats(0.1, 1.0), min_size=len(NS), max_size=len(NS)),
       outside=st.floats(0.0, 3.0), draft=st.floats(0.0, 0.5))
def test_true_values_lie_in_the_plans_bands(trace: Trace, eps: float, beta: list[float], e: list[float],
                                            share: list[float], outside: float, draft: float) -> None:
    """True op times are bytes over true bandwidths (per-slot: n m slots, dedup: a share of them); the fits read
    every bandwidth off by a factor 1 + e, |e| <= eps. Then the true saving lies in the band (18); per version and
    policy, V_hat is within the plan's delta of the true V, and the true k* and best speedup obey (20) and (21)
    for it; AUTO's true step time exceeds the faster kernel's by at most the band."""
    index = {key: i for i, key in enumerate(SLOTS)}
    true = {p: {n: (1.0 if p == "slot" else share[n - 1]) * n * MS / beta[index[p, n]] for n in NS}
            for p in ("slot", "dedup")}
    error = lambda p, n: eps * e[index[p, n]]  # noqa: E731
    fit = {p: {n: t / (1 + error(p, n)) for n, t in times.items()} for p, times in true.items()}
    M = {p: {n: SCALE * len(TIMED) * true[p if n > 1 else "slot"][n] for n in NS} for p in true}
    tau1 = (1 + outside) * M["slot"][1]  # time outside the experts: `outside` x the one-token expert time
    tau = {p: {n: tau1 + M[p][n] - M["slot"][1] for n in NS} for p in M}
    h = draft * tau1
    try:
        plan = build_plan(make_bench(error, eps=eps, slot=fit["slot"], dedup=fit["dedup"]), trace, tau1,
                          draft_time=[h] * len(NS), runs=make_runs(slot=tau["slot"]))
    except MoespecError as problem:  # the plan refuses where its bounds leave no band: it claims nothing
        assert "not positive" in str(problem)
        reject()
    for n, s in plan["saving"].items():  # (18)
        S = tau["slot"][int(n)] - tau["dedup"][int(n)]
        assert s["lo_s"] - SLACK * tau1 <= S <= s["hi_s"] + SLACK * tau1
    for version, suffix, table in (("prediction", "", "table"), ("calibrated", "_calibrated", "table_calibrated")):
        V_hat, V = plan[f"step_times{suffix}"], {}
        for p in ("slot", "dedup", "auto"):
            kernel = lambda n: plan["kernel_by_n"][str(n)] if p == "auto" else p  # noqa: E731
            V[p] = [tau[kernel(k + 1)][k + 1] + h for k in range(len(NS))]
            d = plan["delta_steps"][version][p]
            assert d is None or all((1 - d) * v * (1 - SLACK) <= v_hat <= (1 + d) * v * (1 + SLACK)
                                    for v, v_hat in zip(V[p], V_hat[p])), (version, p)
        for k in range(1, len(NS)):  # AUTO: predicted the faster kernel, truly slower by at most the band (18)
            # AUTO runs the plan's kernel (chosen on the prediction): the faster one there, and in the calibrated
            # version (on the measured op times) that kernel's time
            assert V_hat["auto"][k] == V_hat[plan["kernel_by_n"][str(k + 1)]][k]
            assert version != "prediction" or V_hat["auto"][k] == min(V_hat["slot"][k], V_hat["dedup"][k])
            assert V["auto"][k] <= min(V["slot"][k], V["dedup"][k]) + plan["saving"][str(k + 1)]["band_s"] \
                + SLACK * tau1
        for row in plan[table]:
            p, a, k_hat = row["policy"], row["a"], row["k_hat"]
            d = plan["delta_steps"][version][p]
            if d is None:  # the bound reaches half of V(k): no band, no claim
                assert row["speedup_lo"] is None and row["speedup_hi"] is None
                continue
            k_star = theory.best_draft_length(V[p], a)
            floor = theory.throughput_floor(d)
            assert theory.throughput(V[p], a, k_hat) >= floor * theory.throughput(V[p], a, k_star) * (1 - SLACK)
            assert row["speedup_lo"] * (1 - SLACK) <= theory.speedup(V[p], a, k_star) <= \
                row["speedup_hi"] * (1 + SLACK)  # (21)
            if theory.separated(V_hat[p], a, min(d + SLACK, (1 + d) / 2)):  # (20): the predicted best is the true best
                assert k_hat == k_star


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


OUTSIDE = {n: 0.08 + 0.01 * (n - 1) for n in NS}  # seconds: a pass with the expert operation taken out


def test_whole_pass_version_adds_the_measured_outside_time(trace: Trace) -> None:
    """Runs that timed the pass with the expert operation taken out give the whole-pass version, (22) plus the
    measured outside growth: tau_p(n) = tau(1) + tau_out(n) - tau_out(1) + M_p(n) - M_slot(1), bound (22)'s
    delta (M_p(n) + M_slot(1)), 0 at n = 1; the calibrated version stays."""
    runs = make_runs()
    runs["verify_time_s"]["outside"] = {str(n): t for n, t in OUTSIDE.items()}
    plan = build_plan(make_bench(), trace, runs=runs, draft_time=list(RUNS_DRAFT.values()))
    tau1 = runs["verify_time_s"]["slot"]["1"]
    for n in NS:
        for p in ("slot", "dedup"):
            assert plan["tau_whole_pass"][p][str(n)] == pytest.approx(
                tau1 + OUTSIDE[n] - OUTSIDE[1] + M_HAT[p][n] - M_HAT["slot"][1], rel=1e-12)
            assert plan["tau_whole_pass"][p][str(n)] - plan["tau_hat"][p][str(n)] == pytest.approx(
                OUTSIDE[n] - OUTSIDE[1], rel=1e-9, abs=1e-15)  # (22) plus the outside growth
        if n > 1:
            assert plan["saving"][str(n)]["whole_pass_s"] == pytest.approx(plan["saving"][str(n)]["predicted_s"])
    assert plan["crossover_whole_pass"] == plan["crossover"] == 4 and "tau_calibrated" in plan
    for p in ("slot", "dedup"):
        V = plan["step_times_whole_pass"][p]
        assert V == pytest.approx([plan["tau_whole_pass"][p][str(n)] + RUNS_DRAFT[n - 1] for n in NS], rel=1e-15)
        bound = [0.0 if n == 1 else DELTA * (M_HAT[p][n] + M_HAT["slot"][1]) for n in NS]
        assert plan["delta_steps"]["whole-pass"][p] == pytest.approx(_delta(V, bound))
    assert {row["version"] for row in plan["table_whole_pass"]} == {"whole-pass"}
    without = build_plan(make_bench(), trace, runs=make_runs(), draft_time=list(RUNS_DRAFT.values()))
    assert "tau_whole_pass" not in without and "table_whole_pass" not in without  # older runs: no outside time


def test_a_whole_pass_version_not_positive_is_left_out_and_said(trace: Trace) -> None:
    """An outside time at n = 1 longer than the one-token pass leaves (one stalled sample) drives the whole-pass
    times below zero: the plan is made on its other versions and its verdict names the version, n and times."""
    runs = make_runs()
    tau1 = runs["verify_time_s"]["slot"]["1"]
    outside = {**OUTSIDE, 1: OUTSIDE[2] + 2 * tau1}
    runs["verify_time_s"]["outside"] = {str(n): t for n, t in outside.items()}
    plan = build_plan(make_bench(), trace, runs=runs, draft_time=list(RUNS_DRAFT.values()))
    assert "tau_whole_pass" not in plan and "table_whole_pass" not in plan and "tau_calibrated" in plan
    [line] = [w for w in plan["verdict"]["warnings"] if "whole-pass" in w]
    assert line.startswith("runs: the whole-pass version is left out: its ") and "at n = 2 is -" in line
    assert f"{1e3 * outside[1]:.3g} ms at n = 1" in line
    kept = make_runs()
    kept["verify_time_s"]["outside"] = {str(n): t for n, t in OUTSIDE.items()}
    assert not any("whole-pass" in w for w in build_plan(make_bench(), trace, runs=kept)["verdict"]["warnings"])


@pytest.mark.parametrize("change, kwargs, problem", [
    (lambda b: b["eps"].update(dedup=0.5), {}, "needs eps < 1/2"),
    (lambda b: None, {"kmax": 9}, "needs n up to 10"),
    (lambda b: None, {"tau1": 0.0}, "must be a positive time"),
    (lambda b: b.update(model="qwen3-30b-a3b"), {}, "a trace of olmoe-1b-7b, not of qwen3-30b-a3b"),
    (lambda b: [entry["kernels"]["dedup"]["2"].update(predicted_mean_s=0.0) for entry in b["per_layer"].values()],
     {"tau1": 0.01}, "a predicted verify time is not positive"),
])
def test_bad_inputs_are_rejected(trace: Trace, change, kwargs: dict, problem: str) -> None:
    bench = make_bench()
    change(bench)
    with pytest.raises(MoespecError, match=problem):
        build_plan(bench, trace, **{"tau1": TAU1, **kwargs})


@pytest.mark.parametrize("which", ["plan", "calibrated"])
def test_plan_round_trips(which: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    doc = request.getfixturevalue(which)
    path = write_json(tmp_path / "plan.json", doc)
    assert load_plan(path) == json.loads(json.dumps(doc)) and ("tau_calibrated" in doc) == (which == "calibrated")


def test_a_prediction_without_band_loads(plan: dict, tmp_path: Path) -> None:
    """A noisy bench can leave the prediction without a band (delta null): the plan still loads and serves its
    staircase and AUTO policy; half a band is refused."""
    doc = json.loads(json.dumps(plan))
    doc["delta_steps"]["prediction"] = {p: None for p in doc["delta_steps"]["prediction"]}
    for row in doc["table"]:
        row["speedup_lo"] = row["speedup_hi"] = None
    assert load_plan(write_json(tmp_path / "plan.json", doc))["table"][0]["speedup_lo"] is None
    doc["table"][0]["speedup_hi"] = 2.0
    with pytest.raises(MoespecError, match="speedup_lo <= speedup <= speedup_hi"):
        load_plan(write_json(tmp_path / "plan.json", doc))


@pytest.mark.parametrize("change, problem", [
    (lambda d: d.update(format="other"), "not a moespec plan file"),
    (lambda d: d.update(format_version=3), "version 3 is not supported"),
    (lambda d: d.pop("table"), "missing key 'table'"),
    (lambda d: d.update(crossover=99), "crossover 99 is outside"),
    (lambda d: d["kernel_by_n"].update({"2": "fast"}), "kernel_by_n must map"),
    (lambda d: d["kernel_by_n"].pop("9"), "kernel_by_n must map"),
    (lambda d: d["tau_hat"]["auto"].pop("5"), "tau_hat.auto"),
    (lambda d: d["table"][0].update(k_hat=99), "k_hat = 99 is outside"),
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


@pytest.mark.parametrize("change, problem", [
    (lambda d: d["tau_calibrated"]["dedup"].pop("5"), "tau_calibrated.dedup must give"),
    (lambda d: d.pop("tau_calibrated"), "tau_calibrated.slot must give"),
    (lambda d: d.pop("table_calibrated"), "table_calibrated must be a list"),
    (lambda d: d["table_calibrated"][0].update(version="prediction"), "version 'prediction' is not 'calibrated'"),
    (lambda d: d["table"][0].update(version="calibrated"), r"table\[0\]: version 'calibrated'"),
    (lambda d: d["table"][3].update(speedup_lo=None), "speedup_lo <= speedup"),
    (lambda d: d["table_calibrated"][4].update(speedup_lo=9.0), "speedup_lo <= speedup"),
])
def test_load_plan_rejects_a_bad_calibrated_version(calibrated: dict[str, Any], tmp_path: Path, change,
                                                    problem: str) -> None:
    doc = copy.deepcopy(calibrated)
    change(doc)
    with pytest.raises(MoespecError, match=problem):
        load_plan(write_json(tmp_path / "bad.json", doc))
    no_band = copy.deepcopy(calibrated)  # a calibrated row may carry no band (its delta is null)
    no_band["table_calibrated"][4].update(speedup_lo=None, speedup_hi=None)
    assert load_plan(write_json(tmp_path / "ok.json", no_band))["table_calibrated"][4]["speedup_hi"] is None


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
    (make_bench(), [], "give --tau1 or --runs"),
    (make_bench(), ["--tau1", "0.1", "--draft-time", "no-such-runs.json"],
     "--draft-time 'no-such-runs.json': not a number, a comma-separated list of numbers or a runs.json file"),
])
def test_cli_errors_are_one_line(trace: Trace, tmp_path: Path, capsys: pytest.CaptureFixture, bench: dict,
                                 extra: list[str], problem: str) -> None:
    assert cli.main(_cli(tmp_path, trace, bench, *extra)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and problem in err


def test_cli_reads_runs(trace: Trace, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    runs = write_json(tmp_path / "runs.json", make_runs(moe_layers=4))
    args = _cli(tmp_path, trace, make_bench(), "--runs", str(runs), "--draft-time", str(runs))
    assert cli.main([*args, "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["draft_time_s"] == list(RUNS_DRAFT.values())  # h(k) measured by the run
    assert printed["tau1_s"] == RUNS_SLOT[1] and printed["coverage"]["num_moe_layers"] == 4
    assert printed["runs"] == {"path": str(runs), "moe_layers": 4, "depth": 4096}
    assert printed["tau_calibrated"]["slot"] == {str(n): t for n, t in RUNS_SLOT.items()}
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    assert "calibrated version from" in out and "calibrated speedup" in out


@pytest.mark.parametrize("runs, extra, problem", [
    (make_runs(model="qwen3-30b-a3b"), [], "model 'qwen3-30b-a3b' differs from"),
    (make_runs(device_kind="cuda"), [], "device_kind 'cuda' differs from"),
    (make_runs(dtype="fp32"), [], "dtype 'fp32' differs from"),
    (make_runs(format="moespec-bench"), [], "not a moespec runs file"),
    (make_runs(format_version=7), [], "runs format version 7 is not supported"),
    (make_runs(slot={n: RUNS_SLOT[n] for n in range(1, 6)}), [], "verify_time_s.slot lacks 6, 7, 8, 9"),
    (make_runs(slot={**RUNS_SLOT, 3: 0.0}), [], "verify_time_s.slot.3 = 0.0 must be a positive finite number"),
    (make_runs(verify_time_s={}), [], "no verify_time_s.slot"),
    (make_runs(moe_layers=0), [], "moe_layers = 0 must be an integer >= 1"),
    (make_runs(depth="deep"), [], "depth = 'deep' must be an integer >= 0"),
    (make_runs(moe_layers=20), [], "20 MoE layers (--moe-layers or"),
    (make_runs(), ["--moe-layers", "4"], "--moe-layers 4 differs from the 16 MoE layers"),
    (make_runs(draft_time_s={"0": 0.1}), ["--draft-time", "RUNS"], "draft_time_s lacks 1, 2, 3"),
    (make_runs(draft_time_s={str(k): -0.1 for k in range(9)}), ["--draft-time", "RUNS"],
     "draft_time_s.0 = -0.1 must be a non-negative time"),
    (make_runs(slot={n: 0.001 for n in NS}), [], "a calibrated dedup verify time is not positive"),
])
def test_cli_runs_errors_are_one_line(trace: Trace, tmp_path: Path, capsys: pytest.CaptureFixture, runs: dict,
                                      extra: list[str], problem: str) -> None:
    path = str(write_json(tmp_path / "runs.json", runs))
    args = _cli(tmp_path, trace, make_bench(), "--runs", path, *(path if x == "RUNS" else x for x in extra))
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and problem in err and path in err


def test_runs_of_dedup_alone_calibrate_from_dedup(trace: Trace) -> None:
    """llama.cpp's CPU engine has one expert kernel, dedup: the calibration anchors on its measured times, and the
    measured kernel's bound is its 95% interval's half-width where the runs give one."""
    dedup = {n: t * 0.9 for n, t in RUNS_SLOT.items()}
    runs = make_runs(verify_time_s={"dedup": {str(n): t for n, t in dedup.items()}},
                     verify_time_ci_s={"dedup": {str(n): [t * 0.98, t * 1.01] for n, t in dedup.items()}})
    plan = build_plan(make_bench(), trace, runs=runs, draft_time=list(RUNS_DRAFT.values()))
    assert plan["tau1_s"] == dedup[1]
    for n in NS:  # tau_cal_p(n) = tau_meas_dedup(n) - M_dedup(n) + M_p(n)
        assert plan["tau_calibrated"]["dedup"][str(n)] == dedup[n]
        want = dedup[n] - M_HAT["dedup"][n] + M_HAT["slot"][n]
        assert plan["tau_calibrated"]["slot"][str(n)] == pytest.approx(want, rel=1e-12)
    V = plan["step_times_calibrated"]["dedup"]
    half = [0.02 * dedup[n] for n in NS]  # the larger side of [0.98, 1.01] x the median
    assert plan["delta_steps"]["calibrated"]["dedup"] == pytest.approx(_delta(V, half), rel=1e-9)
    block = plan["llama_cpp"]  # the answer in llama.cpp's flags: the calibrated dedup staircase
    assert (block["version"], block["policy"]) == ("calibrated", "dedup")
    assert [r["k"] for r in block["intervals"]] == [s["k"] for s in plan["staircase_calibrated"]["dedup"]["intervals"]]
    for row in block["table"]:
        assert row["k_hat"] == theory.best_draft_length(V, row["a"])
        assert row["flags"] == (f"--spec-draft-n-max {row['k_hat']} --spec-draft-n-min 0 --spec-draft-p-min 0"
                                if row["k_hat"] else "no draft model (plain decoding)")


def test_cli_prints_the_verdict_first_within_100_columns(trace: Trace, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture) -> None:
    """The verdict block comes first and is stored in plan.json; every table of a non-terminal's output, the
    llama.cpp flags included, fits 100 columns with no cell cut ("…")."""
    runs = write_json(tmp_path / "runs.json", make_runs())
    out = tmp_path / "plan.json"
    args = _cli(tmp_path, trace, make_bench(), "--runs", str(runs), "--draft-time", str(runs), "--out", str(out),
                "--for", "llama.cpp")
    assert cli.main(args) == 0
    lines = capsys.readouterr().out.splitlines()
    verdict = load_plan(out)["verdict"]
    assert lines[:len(verdict["lines"])] == verdict["lines"] and lines[0] == "VERDICT for olmoe-1b-7b bf16 on cpu"
    assert max(map(len, lines)) <= 100 and not any("…" in line for line in lines)
    for cell in ("cal. dedup", "S_hat ± (18)", "decided", "rho_bar_k", "--spec-draft-n-max 8"):
        assert any(cell in line for line in lines), cell
    assert [row["choice"] for row in verdict["kernel_by_n"]][:3] == \
        ["per-slot", "no measurable difference (interval includes 0, or under 5% of the pass)", "dedup"]
    assert verdict["version"] == "calibrated" and verdict["warnings"] == []


def test_a_plan_on_contended_measurements_says_so(trace: Trace, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture) -> None:
    """A bench and runs timed while another process wanted a core reach the plan's verdict by name, with what to
    do; a quiet pair adds nothing."""
    busy = {"cores": 2, "threads": 2, "fitted": True, "calls": 40, "contended": 30, "fewer_threads": 30,
            "others_max": 1, "wait_share_max": 0.2}
    quiet = busy | {"contended": 0, "fewer_threads": 0, "others_max": 0, "wait_share_max": 0.0}
    for record, expected in ((busy, True), (quiet, False)):
        runs = write_json(tmp_path / "runs.json", make_runs(contention={"verify": record, "throughput": None}))
        out = tmp_path / "plan.json"
        args = _cli(tmp_path, trace, make_bench() | {"contention": record}, "--runs", str(runs), "--out", str(out))
        assert cli.main(args) == 0
        text = capsys.readouterr().out
        warnings = load_plan(out)["verdict"]["warnings"]
        named = [w for w in warnings if "contention: 30 of 40" in w]
        assert (len(named) == 2) == expected and ("quiet" in text) == expected
        assert all("--fresh" in w for w in named)


def test_the_measured_time_version_is_scoreable(trace: Trace) -> None:
    """(22) with the bench's measured per-window op times in place of the fits: its own verify times (AUTO
    included), step times, staircase and table, the bound of the prediction's delta; plan_cases' measured times
    are the predicted ones x (1 + e), so with e = 0 the version equals the prediction."""
    from plan_cases import make_bench

    plan = build_plan(make_bench(), trace, TAU1)
    assert {"tau_measured", "step_times_measured", "staircase_measured", "table_measured"} <= set(plan)
    assert set(plan["tau_measured"]) == {"slot", "dedup", "auto"} and plan["delta_steps"]["measured-time"] is not None
    assert plan["tau_measured"] == plan["tau_hat"] and plan["table_measured"] == [
        {**row, "version": "measured-time"} for row in plan["table"]]
    slow = build_plan(make_bench(errors=lambda kernel, n: 0.1 if kernel == "dedup" else 0.0), trace, TAU1)
    assert slow["tau_measured"]["dedup"]["5"] > slow["tau_hat"]["dedup"]["5"]

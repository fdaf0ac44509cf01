"""The plain answer (moespec.predict.verdict, moespec.predict.checks): the kernel per n decided by the measured
S(n) interval where one exists and by the predicted saving and its band (18) otherwise; the draft length per
acceptance with its band (21), and for a measured profile; every input check (a bench too small to time or noisy,
verify times flat in n or far from bytes over the ceiling, AUTO against a measurement, a version without a band, a
score's failing rules, the caller's own lines); text within 100 columns; the refusals of `plan` naming what to
change; the verdict first on the HTML page. Hand-made inputs of plan_cases; nothing is timed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from plan_cases import NS, RUNS_DRAFT, TAU1, make_bench, make_runs, uniform_trace

from moespec import MoespecError, cli, theory
from moespec.formats.benchfile import TOO_SMALL_FLOOR, TOO_SMALL_SHARE, too_small
from moespec.formats.files import write_json
from moespec.formats.planfile import load_plan
from moespec.formats.trace import Trace
from moespec.predict.checks import BYTES_RANGE, bench_checks, rerun_bench, runs_checks
from moespec.predict.plan import build_plan
from moespec.predict.measured import SAVING_MARGIN, measured_choice
from moespec.predict.verdict import DEDUP, SAME, SLOT, WIDTH, build_verdict, kernel_answers, measured_crossover

TOO_SMALL = "the expert operation of this model is too small to time on this machine"


@pytest.fixture(scope="module")
def trace() -> Trace:
    return uniform_trace()


@pytest.fixture(scope="module")
def plan(trace: Trace) -> dict[str, Any]:
    """A prediction: S_hat(n) < 0 beyond its band at n = 2, = 0 at n = 3, > 0 beyond its band from n = 4."""
    return build_plan(make_bench(), trace, TAU1, draft_time=list(RUNS_DRAFT.values()))


def saving(**intervals: tuple[float, float, float]) -> dict[str, dict[str, float]]:
    """runs.json saving_s from n_<n>=(median, lo, hi) in ms."""
    return {key.removeprefix("n"): {"median": m * 1e-3, "lo": lo * 1e-3, "hi": hi * 1e-3}
            for key, (m, lo, hi) in intervals.items()}


def verify(times: dict[int, float], ci: float | None = None, **changes: Any) -> dict[str, Any]:
    """A runs document whose per-slot verify times are `times` (s), with 95% intervals of +-ci x the time."""
    runs = make_runs(slot=times, **changes)
    if ci is not None:
        runs["verify_time_ci_s"] = {"slot": {str(n): [t * (1 - ci), t * (1 + ci)] for n, t in times.items()}}
    return runs


# ---- the kernel per n ----------------------------------------------------------------------------------------
def test_the_predicted_saving_and_its_band_decide_without_runs(plan: dict[str, Any]) -> None:
    answers = {a.n: a for a in kernel_answers(plan)}
    assert [answers[n].choice for n in (2, 3, 4, 9)] == [SLOT, SAME, DEDUP, DEDUP]
    assert {a.evidence for a in answers.values()} == {"predicted"} and min(answers) == 2
    for n, a in answers.items():  # the interval is S_hat +- band (18)
        s = plan["saving"][str(n)]
        assert (a.lo_s, a.hi_s) == pytest.approx((s["lo_s"], s["hi_s"]))
    assert "no measurable difference (interval includes 0, or under 5% of the pass)" in answers[3].text() and "AUTO runs slot" in \
        answers[3].text()


def test_the_measured_interval_decides_whatever_the_median_says(plan: dict[str, Any]) -> None:
    """dedup where the 95% interval lies above 0, per-slot where below, none where it includes 0, even with a
    positive median; the prediction keeps deciding the n the runs did not measure."""
    runs = {"saving_s": saving(n2=(3, 1, 5), n3=(-2, -3, -1), n4=(5, -1, 11))}
    answers = {a.n: a for a in kernel_answers(plan, runs)}
    assert (answers[2].choice, answers[3].choice, answers[4].choice) == (DEDUP, SLOT, SAME)
    assert {answers[n].evidence for n in (2, 3, 4)} == {"measured"} and answers[5].evidence == "predicted"
    assert "measured S(n) = +5.00 ms, 95% interval [-1.00, +11.00] ms" in answers[4].text()
    verdict = build_verdict(plan, runs, runs_path="runs.json")
    # the plan's AUTO runs slot at n = 2 where the measurement says dedup: which files, and what to do
    line = next(w for w in verdict.warnings if "disagree at n = 2" in w)
    assert line.startswith("plan and runs.json") and "--fresh" in line


def test_a_crossover_of_medians_whose_intervals_include_0_is_not_a_difference() -> None:
    both = saving(n2=(-1, -3, 1), n3=(1, -1, 3), n4=(2, -1, 4))
    assert "every S(n) 95% interval includes 0: no measurable difference" in \
        measured_crossover({"crossover": 3, "saving_s": both})
    decided = {**both, "4": {"median": 0.002, "lo": 0.001, "hi": 0.003}}
    assert measured_crossover({"crossover": 3, "saving_s": decided}).startswith("n = 3 (the smallest n")


# ---- the draft length per acceptance ---------------------------------------------------------------------------
def test_draft_length_and_band_of_the_auto_policy(plan: dict[str, Any]) -> None:
    verdict = build_verdict(plan)
    V, d = plan["step_times"]["auto"], plan["delta_steps"]["prediction"]["auto"]
    assert verdict.version == "prediction" and len(verdict.drafts) == len(theory.PAPER_ACCEPTANCES)
    for answer, a in zip(verdict.drafts, map(float, theory.PAPER_ACCEPTANCES)):
        k = theory.best_draft_length(V, a)
        s = float(theory.speedup(V, a, k))
        assert (answer.a, answer.k) == (a, k) and answer.speedup == pytest.approx(s)
        assert (answer.lo, answer.hi) == pytest.approx(tuple(map(float, theory.speedup_band(s, d))))
        assert f"draft k = {k}, expected speedup {s:.3f}x, band (21) [{answer.lo:.3f}, {answer.hi:.3f}]" in \
            answer.text()


def test_the_calibrated_version_answers_where_the_plan_has_it(trace: Trace) -> None:
    plan = build_plan(make_bench(), trace, runs=make_runs(), draft_time=list(RUNS_DRAFT.values()))
    verdict = build_verdict(plan)
    rows = [r for r in plan["table_calibrated"] if r["policy"] == "auto"]
    assert verdict.version == "calibrated" and [d.k for d in verdict.drafts] == [r["k_hat"] for r in rows]
    assert plan["verdict"]["version"] == "calibrated" and plan["verdict"]["lines"] == verdict.lines()


def test_a_measured_acceptance_profile_gets_its_own_draft_length(plan: dict[str, Any]) -> None:
    profile = [0.9, 0.8, 0.6, 0.5]
    runs = {"throughput_draft_model": [{"policy": "auto", "k": 4, "acceptance_profile": profile}]}
    answer = build_verdict(plan, runs).drafts[-1]
    padded = profile + [0.5] * (plan["kmax"] - len(profile))  # untested positions take the last tested one's
    V = plan["step_times"]["auto"]
    assert answer.profile == tuple(padded) and answer.k == theory.best_draft_length_for(V, padded)
    assert answer.speedup == pytest.approx(float(theory.profile_speedup(V, padded, answer.k)))
    d = plan["delta_steps"]["prediction"]["auto"]
    assert (answer.lo, answer.hi) == pytest.approx(tuple(map(float, theory.speedup_band(answer.speedup, d))))
    assert answer.text().startswith("measured profile a_1..a_8 = 0.90, 0.80, 0.60, 0.50")


# ---- the input checks ------------------------------------------------------------------------------------------
def test_a_bench_far_below_the_ceiling_is_too_small_to_time() -> None:
    bench = make_bench()  # beta 10 GB/s of a 20 GB/s ceiling: timeable
    assert too_small(bench) == {"flag": False, "share_of_ceiling": 0.5, "fixed_share": None, "eps": 0.05,
                                "reason": None}
    assert bench_checks(bench, "bench.json") == []
    for kernel in bench["kernels"].values():  # 1 GB/s: 5% of the ceiling, as the trained pair's target reaches
        kernel["beta_gbps"] = {k: 1.0 for k in kernel["beta_gbps"]}
    small = too_small(bench)
    assert small["flag"] and small["share_of_ceiling"] == 0.05 < TOO_SMALL_SHARE
    [line] = bench_checks(bench, "bench.json")
    assert line.startswith(f"bench.json: {TOO_SMALL}: the kernels reach 5% of the streaming read ceiling")
    assert "larger experts" in line and "--fresh" in line and "--reps" in line


@pytest.mark.parametrize("beta, t_op, flagged", [(4.0, 0.9, True), (4.0, 0.5, True), (4.0, 0.3, False),
                                                 (2.0, 0.3, True), (2.0, -0.2, True)])
def test_a_bench_under_the_share_is_too_small_only_where_its_fixed_time_sets_it(beta: float, t_op: float,
                                                                                flagged: bool) -> None:
    """Under TOO_SMALL_SHARE of the ceiling a bench is flagged only where its fits' fixed time t_op is FIXED_SHARE or
    more of a pass at its fewest tokens (the least over the pair, the median over layers): a kernel its own loop
    holds under the share (ggml's q4_0 blocks) is timed well. Under TOO_SMALL_FLOOR the share alone flags it, whatever
    the fits' intercept says."""
    bench = make_bench()
    for kernel in bench["kernels"].values():
        kernel["beta_gbps"] = {k: beta for k in kernel["beta_gbps"]}  # 20% or 10% of the ceiling
    bench["fits"] = {layer: {k: {"t_op_s": t_op * times["1"]["measured_mean_s"] * (1 if k == "slot" else 2)}
                             for k, times in entry["kernels"].items()} for layer, entry in bench["per_layer"].items()}
    share = beta / bench["ceiling_gbps"]
    assert (share < TOO_SMALL_FLOOR) is (beta == 2.0) and TOO_SMALL_FLOOR < 0.2 < TOO_SMALL_SHARE
    small = too_small(bench)
    assert small["fixed_share"] == pytest.approx(min(t_op, 2 * t_op)) and small["flag"] is flagged
    reason = small["reason"] or ""
    if share >= TOO_SMALL_FLOOR:
        assert reason.endswith(f"(median over n; under 25%) and their fixed time is {t_op:.0%} of a pass's at the "
                               f"fewest tokens, so fixed per-call costs, not the bytes, set their time") is flagged
    else:
        assert reason.endswith("the streaming read ceiling (median over n; under 15%), so fixed per-call costs, not "
                               "the bytes, set their time"), reason
    lines = bench_checks(bench, "b.json")
    assert bool(lines) is flagged and all("larger experts" in line for line in lines)


def test_a_fit_error_past_its_bound_is_named_with_the_other_cause() -> None:
    small = too_small(make_bench(eps=0.6))
    assert small["flag"] and small["reason"].startswith(f"{TOO_SMALL}, or the machine was disturbed: ")
    assert "eps = 0.6 >= 1/2" in small["reason"]
    [line] = bench_checks(make_bench(eps=0.6), "b.json")
    assert "verify-only runs (--runs) or refuses: rerun `moespec bench --fresh`" in line and "--layers" in line


def test_a_noisy_bench_says_to_rerun_fresh_and_says_when_it_resumed(plan: dict[str, Any], trace: Trace) -> None:
    noisy = {**make_bench(), "noisy": {"threshold": 0.2, "count": 3, "total": 10, "worst": 0.9}}
    [line] = bench_checks(noisy, "bench.json")
    assert "noisy bench: 3 of 10 timings have an IQR above 20% of their median (widest 90%)" in line
    assert "--fresh` (without it a rerun resumes" in line and "--reps" in line and "quieter machine" in line
    assert bench_checks({**noisy, "noisy": {**noisy["noisy"], "count": 1}}, "bench.json") == []  # 10%: not noisy
    resumed = build_plan({**noisy, "resumed_rounds": 3}, trace, TAU1)["verdict"]["warnings"]
    assert any("--fresh` (3 of its rounds were resumed from an earlier run's checkpoint)" in w for w in resumed)
    assert rerun_bench({"resumed_rounds": 0}) == rerun_bench()
    [quiet] = bench_checks({**make_bench(), "resumed_rounds": 2}, "bench.json")  # a resumed result is named
    assert quiet.startswith("bench.json: 2 of its rounds were resumed") and "--fresh" in quiet


@pytest.mark.parametrize("times, ci, flat", [
    ({n: 0.010 for n in NS}, 0.01, True),  # no growth at all
    ({n: 0.010 + 0.0001 * n for n in NS}, 0.05, True),  # growth inside the two intervals
    ({n: 0.010 * (1 + 0.1 * n) for n in NS}, 0.05, False),
    ({n: 0.010 * (1 + 0.002 * n) for n in NS}, None, True),  # no intervals: under FLAT_SHARE
    ({n: 0.010 * (1 + 0.1 * n) for n in NS}, None, False),
])
def test_a_verify_time_flat_in_n(times: dict[int, float], ci: float | None, flat: bool) -> None:
    lines = runs_checks(verify(times, ci), "runs.json")
    assert any(line.startswith("runs.json: the slot verify time is flat in n") for line in lines) == flat
    assert all("--fresh" in line and "larger experts" in line for line in lines)


@pytest.mark.parametrize("factor, problem, at_2000", [
    (1.0, None, True), (0.01, "faster than its bytes can stream", False),
    (100.0, "fixed per-pass costs, not bytes, set them", True)])
def test_verify_times_far_from_bytes_over_the_ceiling(plan: dict[str, Any], factor: float, problem: str | None,
                                                      at_2000: bool) -> None:
    ceiling = plan["inputs_ceiling_gbps"]["bench"] * 1e9
    times = {n: factor * plan["pass_bytes"]["slot"][str(n)] / ceiling * (1 + 0.05 * n) for n in NS}
    lines = [line for line in runs_checks(verify(times), "runs.json", plan) if "the bytes a pass reads" in line]
    assert [problem in line for line in lines] == ([] if problem is None else [True])
    assert all(f"expected {BYTES_RANGE[0]:g}x-{BYTES_RANGE[1]:g}x" in line and "--fresh" in line for line in lines)
    # the runs' own ceiling, where they measured one, is the one their times are read against: 100x the bench's
    fast = runs_checks(verify(times, ceiling_gbps={"before": 2000.0, "after": 2000.0}), "runs.json", plan)
    assert any("2000.0 GB/s ceiling" in line for line in fast) == at_2000


def test_a_version_without_band_a_failing_score_and_the_callers_lines(plan: dict[str, Any], tmp_path: Path) -> None:
    no_band = json.loads(json.dumps(plan))
    no_band["delta_steps"]["prediction"]["dedup"] = None
    contention = "bench.json: 40% of its timed calls ran while another process held a core"
    verdict = build_verdict(no_band, warnings=[contention], plan_path="plan.json")
    assert verdict.warnings[-1] == contention and contention in " ".join(verdict.lines())
    assert any(w.startswith("plan.json: the prediction version has no speedup band (21) for dedup") and
               "--fresh" in w for w in verdict.warnings)
    with pytest.raises(ValueError, match="warnings"):
        build_verdict(plan, warnings="one line")


def test_lines_fit_the_width(plan: dict[str, Any]) -> None:
    long = "runs.json: " + "a long warning with a `moespec run --fresh` in it " * 8
    verdict = build_verdict(plan, {"saving_s": saving(n3=(5, -1, 11))}, warnings=[long])
    for width in (WIDTH, 60):
        lines = verdict.lines(width)
        assert max(map(len, lines)) <= width and lines[0].startswith("VERDICT for olmoe-1b-7b")
    assert " ".join(" ".join(verdict.lines()).split()).count("a long warning") == 8  # wrapped, nothing cut
    with pytest.raises(ValueError, match="width"):
        verdict.lines(10)


# ---- refusals that say what to do ------------------------------------------------------------------------------
def _plan_cli(tmp_path: Path, trace: Trace, bench: dict[str, Any], *extra: str) -> list[str]:
    write_json(tmp_path / "bench.json", bench)
    trace.save(tmp_path / "trace.npz")
    return ["plan", "--bench", str(tmp_path / "bench.json"), "--trace", str(tmp_path / "trace.npz"), *extra]


def _small_bench() -> dict[str, Any]:
    bench = make_bench()
    for kernel in bench["kernels"].values():
        kernel["beta_gbps"] = {k: 1.0 for k in kernel["beta_gbps"]}
    return bench


def _no_eps() -> dict[str, Any]:
    bench = make_bench()
    del bench["eps"]["dedup"]
    return bench


def _extrapolating() -> dict[str, Any]:
    """A bench whose dedup fit predicts less time at n = 2 than the one-token pass takes."""
    bench = make_bench()
    for entry in bench["per_layer"].values():
        entry["kernels"]["dedup"]["2"]["predicted_mean_s"] = -0.05
    return bench


@pytest.mark.parametrize("bench, extra, advice", [
    (_small_bench(), ["--tau1", "0.1"], [TOO_SMALL, "larger experts", "--fresh", "--reps", "--no-throughput"]),
    (make_bench(eps=0.6), ["--tau1", "0.1"], ["needs eps < 1/2", "--fresh", "--reps", "quieter", "--layers"]),
    (_no_eps(), ["--tau1", "0.1"], ["no fit error eps for kernel(s) dedup", "--fresh", "--n 1-9"]),
    (_extrapolating(), ["--tau1", "0.1"], ["not positive", "give (in seconds) the one-token pass", "--moe-layers",
                                          "--fresh"]),
])
def test_plan_refusals_name_the_setting_to_change(trace: Trace, tmp_path: Path, capsys: pytest.CaptureFixture,
                                                 bench: dict[str, Any], extra: list[str], advice: list[str]) -> None:
    assert cli.main(_plan_cli(tmp_path, trace, bench, *extra, "--out", str(tmp_path / "plan.json"))) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and all(a in err for a in advice), err
    assert not (tmp_path / "plan.json").exists()  # refused before anything was built


def test_a_too_small_bench_is_refused_before_anything_is_built(trace: Trace) -> None:
    with pytest.raises(MoespecError, match=f"bench: {TOO_SMALL}"):
        build_plan(_small_bench(), trace, TAU1, kmax=8)


# ---- the HTML page ---------------------------------------------------------------------------------------------
def test_the_report_shows_the_verdict_first(plan: dict[str, Any], tmp_path: Path,
                                            capsys: pytest.CaptureFixture) -> None:
    write_json(tmp_path / "bench.json", {**make_bench(), "noisy": {"threshold": 0.2, "count": 5, "total": 10}})
    write_json(tmp_path / "plan.json", plan)
    # savings past 5% of the per-slot pass (0.12 s at n = 2, 0.17 s at n = 4) where their intervals exclude 0
    runs = make_runs(saving_s=saving(n2=(-8, -9, -7), n3=(1, -1, 3), n4=(10, 9, 11)), crossover=3)
    write_json(tmp_path / "runs-verify.json", runs)
    assert cli.main(["report", str(tmp_path)]) == 0
    page = (tmp_path / "report.html").read_text(encoding="utf-8")
    capsys.readouterr()
    top = page.index('<div id="verdict">')
    assert top < page.index('id="inputs"') < page.index("<section")
    block = page[top:page.index("</div>", top)]
    assert "<li>n = 2: per-slot (measured S(n)" in block and f"<li>n = 3: {SAME} (measured S(n)" in block and \
        "<li>n = 4: dedup (measured" in block
    assert "<li>bench.json: noisy bench: 5 of 10 timings" in block and "a = 0.9: draft k = " in block
    assert "every S(n) 95% interval includes 0" not in page  # n = 2 and 4 are decided


def test_a_finding_is_listed_once_however_its_file_is_named(trace: Trace) -> None:
    """The plan stores its bench's lines; the report redoes the checks on the same file under another name; the
    caller's lines about two files stay two."""
    noisy = {**make_bench(), "noisy": {"threshold": 0.2, "count": 5, "total": 10}}
    plan = build_plan(noisy, trace, TAU1, bench_path="w/bench.json")
    contention = ["bench.json: 40% of calls contended", "runs.json: 40% of calls contended"]
    verdict = build_verdict(plan, bench=noisy, bench_path="bench.json", warnings=[*contention, contention[0]])
    assert [w.split(": ")[0] for w in verdict.warnings] == ["w/bench.json", "bench.json", "runs.json"]


def test_a_bench_too_small_to_time_plans_on_the_measured_runs(trace: Trace, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture) -> None:
    """With verify-only runs of both kernels, a too-small bench gives a plan on their measured times (basis runs):
    tau_hat is the runs' times, a kernel is decided only where the runs' S(n) interval excludes 0 (AUTO runs dedup
    there, per-slot elsewhere), the verdict says so in its title and keeps the too-small line among its checks."""
    runs = make_runs()
    ns = sorted(int(n) for n in runs["verify_time_s"]["slot"])
    # S(n) = 0.1 x slot(n) > 0 at every n; its interval excludes 0 at n = 3 only
    runs["saving_s"] = {str(n): {"median": 0.1 * runs["verify_time_s"]["slot"][str(n)],
                                 "lo": 0.001 if n == 3 else -0.001, "hi": 1.0} for n in ns if n > 1}
    out = tmp_path / "plan.json"
    args = _plan_cli(tmp_path, trace, _small_bench(), "--runs", str(write_json(tmp_path / "runs.json", runs)),
                     "--out", str(out))
    assert cli.main(args) == 0
    plan = load_plan(out)
    assert plan["basis"]["kind"] == "runs" and TOO_SMALL in plan["basis"]["why"] and plan["eps"] == 0.0
    kmax = plan["kmax"]
    assert {n: plan["tau_hat"]["dedup"][str(n)] for n in range(1, kmax + 2)} == \
        {n: runs["verify_time_s"]["dedup"][str(n)] for n in range(1, kmax + 2)}
    assert plan["kernel_by_n"] == {str(n): "dedup" if n == 3 else "slot" for n in range(1, kmax + 2)}
    assert plan["saving"]["3"]["decided"] and not plan["saving"]["2"]["decided"]
    choices = {row["n"]: row["choice"] for row in plan["verdict"]["kernel_by_n"]}
    assert choices[3] == "dedup" and choices[2] == "no measurable difference (interval includes 0, or under 5% of the pass)"
    assert "too small to time" in " ".join(plan["verdict"]["lines"][:2])
    assert any(TOO_SMALL in w for w in plan["verdict"]["warnings"]) and "table_calibrated" in plan


def test_a_too_small_bench_with_one_kernel_runs_is_refused(trace: Trace, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture) -> None:
    """Runs of dedup alone (llama.cpp's) cannot stand in for the bench: the refusal names the runs it needs."""
    runs = make_runs()
    del runs["verify_time_s"]["slot"]
    args = _plan_cli(tmp_path, trace, _small_bench(), "--runs", str(write_json(tmp_path / "runs.json", runs)),
                     "--out", str(tmp_path / "plan.json"))
    assert cli.main(args) == 2 and "--no-throughput" in capsys.readouterr().err


@pytest.mark.parametrize("saving, lo, hi, choice", [
    (0.06, 0.05, 0.07, "dedup"), (-0.06, -0.07, -0.05, "slot"),  # 6% of a 1 s pass, the interval clear of 0
    (0.04, 0.03, 0.05, None),  # 4%: under the margin, however narrow its interval
    (0.06, -0.01, 0.13, None),  # past the margin, but the interval includes 0
])
def test_a_measured_saving_decides_past_the_margin_only(saving: float, lo: float, hi: float,
                                                        choice: str | None) -> None:
    assert measured_choice(saving, lo, hi, 1.0) == choice and SAVING_MARGIN == 0.05

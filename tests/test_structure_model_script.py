"""benchmarks/structure_model.py's summary over runs: each model, format, batch and kernel apart, the target read per
run."""

import json
from pathlib import Path

import pytest
from cli_cases import load_script, run_script

from moespec import theory
from moespec.kernels.structure import Rates
from moespec.measure.bench import bench_passes, bench_trace
from moespec.measure.device_profile import pair_of
from moespec.model.gguf import resolve_model

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "structure_model.py"
PLAN_SIDES = SCRIPT.with_name("plan_sides.py")


@pytest.fixture(scope="module")
def structure_model():
    return load_script(SCRIPT)


@pytest.fixture(scope="module")
def sides():
    return load_script(PLAN_SIDES)


def _table(folder: Path, errors: dict[tuple[str, str], tuple[float, float]], k_hat: dict[str, dict[str, int]],
           at_level: bool, crossover: int | None = 2, loss: float | None = None):
    """A run's table.json: one B = 1 row per (dtype, kernel) of OLMoE with (median, max) errors, its bench at the
    profile's level or not; k_hat per dtype as (measured, predicted) at one acceptance, and where given the speedup
    the predicted one gives up; the measured crossover."""
    folder.mkdir(parents=True)
    rows = [{"model": "olmoe-1b-7b", "dtype": dtype, "batch": 1, "kernel": kernel, "median_error": med,
             "max_error": top, "profile_median_error": 2 * med, "profile_max_error": 2 * top,
             "at_profile_level": at_level} for (dtype, kernel), (med, top) in errors.items()]
    sides = [{"model": "olmoe-1b-7b", "dtype": dtype, "crossover": {"measured": crossover, "predicted": 3},
              "plan": {"measured": {"k_hat": {"0.8": k["measured"]}}, "predicted": {"k_hat": {"0.8": k["predicted"]}},
                       **({} if loss is None else {"loss": {"0.8": loss, "0.5": 0.0}})}}
             for dtype, k in k_hat.items()]
    (folder / "table.json").write_text(json.dumps({"rows": rows, "side_by_side": sides}))
    return folder


def test_the_summary_keeps_each_format_apart(structure_model, tmp_path):
    """q8_0 and q4_0 share ggml's kernel names: their rows and their k_hat agreement are summarized apart, the median
    over runs per format, and the target is read over every row."""
    kernel = "ggml-mul_mat_id"
    runs = [_table(tmp_path / f"run-{i}", {("q8_0", kernel): (0.035 * i, 0.05 * i), ("q4_0", kernel): (0.3, 0.4)},
                   {"q8_0": {"measured": 2, "predicted": 2}, "q4_0": {"measured": 2, "predicted": 4 + i}}, i != 2)
            for i in (1, 2, 3)]
    structure_model.step_summary(tmp_path, runs)
    summary = json.loads((tmp_path / "summary.json").read_text())
    by_format = {r["dtype"]: r for r in summary["rows"]}
    assert set(by_format) == {"q8_0", "q4_0"} and all(r["runs"] == 3 for r in summary["rows"])
    assert by_format["q8_0"]["median_error"] == {"median": pytest.approx(0.07), "range": [0.035, pytest.approx(0.105)]}
    assert by_format["q8_0"]["runs_within"] == 2 and by_format["q4_0"]["runs_within"] == 0  # run 3: 10.5% median
    assert by_format["q8_0"]["at_level"] == {"runs": 2, "within": 1}  # runs 1 and 3 at their profile's level
    assert by_format["q8_0"]["profile_median_error"]["median"] == pytest.approx(0.14)
    assert by_format["q8_0"]["profile_runs_within"] == 1 and by_format["q8_0"]["paired_median_error"] is None
    assert summary["within_one"]["olmoe-1b-7b/q8_0"]["k_hat"]["within"] == 3
    assert summary["within_one"]["olmoe-1b-7b/q4_0"]["k_hat"]["within"] == 0
    assert summary["within_one"]["olmoe-1b-7b/q4_0"]["measured_k_hat"] == {"0.8": [2, 2, 2]}
    assert summary["within_one"]["olmoe-1b-7b/q4_0"]["measured_crossover"] == {"runs": [2, 2, 2], "pairs": 3,
                                                                              "within": 3}
    assert summary["target_met_in_median"] is False  # q4_0's 30% median
    assert "| olmoe-1b-7b | q4_0 | 1 | ggml-mul_mat_id | 30.0%" in (tmp_path / "summary.md").read_text()


def test_the_summary_keeps_each_batch_apart_over_the_runs_that_measured_it(structure_model, tmp_path):
    """Three runs at B = 1 within the target, one of them also at B = 8 off it: B = 8 is its own row over that one run
    and sets the target's verdict."""
    runs = [_table(tmp_path / f"run-{i}", {("bf16", "slot"): (0.05, 0.1)}, {"bf16": {"measured": 2, "predicted": 2}},
                   True) for i in (1, 2, 3)]
    table = json.loads((runs[0] / "table.json").read_text())
    table["rows"].append(table["rows"][0] | {"batch": 8, "median_error": 0.15, "max_error": 0.3})
    (runs[0] / "table.json").write_text(json.dumps(table))
    structure_model.step_summary(tmp_path, runs)
    summary = json.loads((tmp_path / "summary.json").read_text())
    by_batch = {r["batch"]: r for r in summary["rows"]}
    assert by_batch[1]["runs"] == 3 and by_batch[1]["runs_within"] == 3
    assert by_batch[8]["runs"] == 1 and by_batch[8]["runs_within"] == 0
    assert by_batch[8]["median_error"] == {"median": 0.15, "range": [0.15, 0.15]}
    assert summary["target_met_in_median"] is False
    assert "| olmoe-1b-7b | bf16 | 8 | slot | 15.0% (15.0%-15.0%)" in (tmp_path / "summary.md").read_text()


@pytest.mark.parametrize("crossings, within", [((6, 4, 2, 2), 1), ((2, 3, 4), 2), ((None, None, 3), 1),
                                               ((5,), 0)])
def test_the_summary_reads_the_measured_crossovers_own_repeatability(structure_model, tmp_path, crossings, within):
    """Per model, the measured crossover of each run and how many pairs of runs measured it within one of each other
    (no crossover agrees only with none): the floor under the predicted crossover's agreement."""
    runs = [_table(tmp_path / f"run-{i}", {("q4_0", "ggml-mul_mat_id"): (0.05, 0.1)},
                   {"q4_0": {"measured": 2, "predicted": 2}}, True, c) for i, c in enumerate(crossings)]
    structure_model.step_summary(tmp_path, runs)
    got = json.loads((tmp_path / "summary.json").read_text())["within_one"]["olmoe-1b-7b/q4_0"]["measured_crossover"]
    pairs = len(crossings) * (len(crossings) - 1) // 2
    assert got == {"runs": list(crossings), "pairs": pairs, "within": within}
    shown = ", ".join(map(str, crossings))
    assert f"| {shown} ({within} of {pairs}) |" in (tmp_path / "summary.md").read_text()


def test_the_side_by_side_predicts_at_the_state_of_the_measured_passes(sides):
    """The predicted side of a measured bench: at the ceiling it sampled at each n where it has them (keys as n), else
    at its one ceiling; each layer's placement where it measured one."""
    bench = {"ceiling_gbps": 36.5, "ceiling_by_n_gbps": {"1": 33.3, "2": 33.1}, "placement": {"0": [0.9, 1.0],
                                                                                              "3": None}}
    assert sides.side_state(bench) == {"ceiling_gbps": {1: 33.3, 2: 33.1}, "placement": {0: [0.9, 1.0]}}
    assert sides.side_state({"ceiling_gbps": 36.5}) == {"ceiling_gbps": 36.5, "placement": None}


def test_the_loss_is_the_measured_speedup_given_up_at_the_predicted_k_hat(sides):
    """plan_loss reads the measured plan's step times at both k_hat*: T_a(k) = G_a(k) V(0) / V(k) (9), exact on a
    small V; none where a plan refused."""
    V = [1.0, 1.2, 1.5, 2.0]
    measured = {"k_hat": {"0.5": 1, "0.8": 2}, "step_times": V}
    predicted = {"k_hat": {"0.5": 1, "0.8": 3}, "step_times": [1.0, 1.1, 1.2, 1.3]}
    loss = sides.plan_loss(measured, predicted)
    at = lambda a, k: sum(a ** i for i in range(k + 1)) * V[0] / V[k]  # noqa: E731
    assert loss == {"0.5": 0.0, "0.8": pytest.approx(1 - at(0.8, 3) / at(0.8, 2))}
    assert sides.plan_loss({"refused": "too small"}, predicted) is None


def test_the_summary_reports_the_speedup_given_up_where_the_runs_have_it(structure_model, tmp_path):
    """Per model: each run's largest loss over a, their median and range; runs without one (older tables) left out."""
    runs = [_table(tmp_path / f"run-{i}", {("bf16", "dedup"): (0.05, 0.1)}, {"bf16": {"measured": 3, "predicted": 7}},
                   True, loss=loss) for i, loss in enumerate((0.008, None, 0.002, 0.004))]
    structure_model.step_summary(tmp_path, runs)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["within_one"]["olmoe-1b-7b"]["loss"] == [0.008, 0.002, 0.004]
    assert "| 0.40% (0.20%-0.80%; 3 runs) |" in (tmp_path / "summary.md").read_text()


@pytest.mark.parametrize("off, loss, every, rules", [(0, 0.01, True, True), (2, 0.01, False, True),
                                                     (3, 0.01, False, False), (0, 0.07, True, False)])
def test_k_hat_is_read_at_every_a_and_by_the_papers_rules(sides, off, loss, every, rules):
    """within_one: k_hat*(a) within one at every acceptance, and the paper's rules 2 and 3 (within one at >= 9 of the
    11, at most 6% given up at every one): two misses pass the rules, three do not, nor a 7% loss; a refused plan or a
    side without losses decides neither rule."""
    acceptances = [str(float(a)) for a in theory.PAPER_ACCEPTANCES]
    measured = dict.fromkeys(acceptances, 2)
    predicted = {a: 5 if i < off else 2 for i, a in enumerate(acceptances)}
    side = {"crossover": {"measured": 2, "predicted": 2},
            "plan": {"measured": {"k_hat": measured}, "predicted": {"k_hat": predicted},
                     "loss": {a: loss if i == 0 else 0.0 for i, a in enumerate(acceptances)}}}
    assert len(acceptances) == 11
    assert sides.within_one(side) == {"crossover": True, "k_hat": every, "paper_rules": rules}
    side["plan"]["loss"] = None
    assert sides.within_one(side)["paper_rules"] is None
    side["plan"]["predicted"] = {"refused": "too small to time"}
    assert sides.within_one(side) == {"crossover": True, "k_hat": None, "paper_rules": None}


def test_a_plan_side_is_read_in_the_version_asked(sides, tmp_path):
    """plan_summary: k_hat*(a) of the AUTO policy at the paper's 11 acceptances and the step times, of the plan's
    prediction (22) or of its measured-time version; a plan that refuses is a one-line reason."""
    from plan_cases import MODEL, make_bench

    from moespec.formats.files import write_json
    from moespec.predict.plan import PlanConfig, make_plan
    from moespec.routing.synth import synthesize

    bench, trace = tmp_path / "bench.json", tmp_path / "trace.npz"
    write_json(bench, make_bench())
    synthesize(MODEL, "calibrated", 2000, 10, seed=0).save(trace)
    plan = make_plan(PlanConfig(bench=str(bench), trace=str(trace), tau1=0.05))
    for version, suffix in (("prediction", ""), ("measured-time", "_measured")):
        got = sides.plan_summary(str(bench), str(trace), 0.05, version)
        want = {str(r["a"]): r["k_hat"] for r in plan["table" + suffix] if r["policy"] == "auto"}
        assert got["k_hat"] == want and len(want) == 11 and got["version"] == version
        assert got["step_times"] == plan["step_times" + suffix]["auto"]
        assert got["crossover"] == plan["crossover" + suffix]
    assert "refused" in sides.plan_summary(str(tmp_path / "missing.json"), str(trace), 0.05)


def test_the_agreement_counts_the_profile_alone_where_a_run_recorded_it(sides):
    """agreement over runs: the predicted bench's k_hat*(a) and the profile alone's, each at every a and by the
    paper's rules; a run without the profile-alone side (an older table) is not counted for it; a refused plan is."""
    def side(predicted, alone, loss):
        plan = {"measured": {"k_hat": {"0.8": 3}, "step_times": [1.0]}, "predicted": {"k_hat": {"0.8": predicted}},
                "loss": {"0.8": loss}}
        if alone is not None:
            plan |= {"from_profile": alone, "loss_from_profile": {"0.8": 0.0} if "k_hat" in alone else None}
        return {"crossover": {"measured": 2, "predicted": 2}, "plan": plan}

    got = sides.agreement([side(7, {"k_hat": {"0.8": 3}}, 0.01), side(3, {"refused": "too uncertain"}, 0.0),
                           side(4, None, 0.0)])
    assert got["k_hat"] == {"within": 2, "refused": 0, "runs": 3}
    assert got["paper_rules"] == {"within": 2, "refused": 0, "runs": 3}
    assert got["k_hat_alone"] == got["paper_rules_alone"] == {"within": 1, "refused": 1, "runs": 2}
    assert got["measured_k_hat"] == {"0.8": [3, 3, 3]} and got["loss"] == [0.01, 0.0, 0.0]
    assert got["crossover"] == {"within": 3, "refused": 0, "runs": 3}


def test_a_bench_from_the_profile_alone_is_scored_against_the_measured_one(structure_model, sides):
    """bench_errors: per kernel and n, the predicted mean over windows over the measured, less 1; summary_rows reads
    its median and largest |error| over n (the user's view: bench --predict without a bench), none where it is
    missing."""
    def bench(times):
        return {"per_layer": {"0": {"kernels": {"slot": {n: {"measured_mean_s": t} for n, t in times.items()}}}}}

    got = sides.bench_errors(bench({"1": 2.0, "2": 4.0, "3": 5.0}), bench({"1": 2.2, "2": 3.6, "3": 5.0}))
    assert got == {"slot": {"1": pytest.approx(0.1), "2": pytest.approx(-0.1), "3": 0.0}}
    passes = {n: {"error": 0.02, "passes": [{"predicted_s": 1.02, "measured_s": 1.0}]} for n in ("1", "2", "3")}
    entry = {"ceiling_gbps": 30.0, "passes": {"slot": passes}, "crossover": {"measured": 2, "predicted": 2}}
    result = {"model": "olmoe-1b-7b", "dtype": "bf16", "batches": {"1": entry}}
    assert "profile_median_error" not in structure_model.summary_rows(result)[0]
    entry["from_profile"] = got
    row = structure_model.summary_rows(result)[0]
    assert (row["profile_median_error"], row["profile_max_error"]) == (pytest.approx(0.1), pytest.approx(0.1))


def test_the_table_says_which_benches_met_their_profiles_level(structure_model, tmp_path, monkeypatch):
    """With a pinned profile, a bench whose ceiling reads outside the level's band met another state of the host:
    the table marks it (the level's own rule, +-15%); without one it marks nothing."""
    def errors(model: str, ceiling: float) -> None:
        passes = {n: {"error": 0.05, "passes": [{"predicted_s": 1.05, "measured_s": 1.0}]} for n in ("1", "2")}
        folder = structure_model.model_dir(tmp_path, model, "q8_0")
        folder.mkdir(parents=True)
        (folder / "errors.json").write_text(json.dumps({"model": model, "dtype": "q8_0", "batches": {"1": {
            "ceiling_gbps": ceiling, "passes": {"ggml-mul_mat_id": passes},
            "crossover": {"measured": 2, "predicted": 2}}}}))

    errors("olmoe-1b-7b", 36.0)
    errors("qwen3-30b-a3b", 47.0)
    profile = tmp_path / "device.json"
    profile.write_text("{}")
    for level, marks in (({"pinned_gbps": 48.9, "wait_s": 60.0}, {"olmoe-1b-7b": False, "qwen3-30b-a3b": True}),
                         (None, {"olmoe-1b-7b": None, "qwen3-30b-a3b": None})):
        monkeypatch.setattr(structure_model, "load_profile", lambda path: {"level": level})
        structure_model.step_table(tmp_path, profile)
        table = json.loads((tmp_path / "table.json").read_text())
        assert {r["model"]: r["at_profile_level"] for r in table["rows"]} == marks
        assert ("at the profile's 48.9 GB/s" in (tmp_path / "table.md").read_text()) == (level is not None)


@pytest.mark.parametrize("args, needle", [
    (["--runs", "nowhere", "--share-from", "x.json", "--out", "o"], "--runs: give runs' folders"),
    (["--share-from", "x.json", "--out", "o"], "the following arguments are required: --runs")])
def test_the_share_rerun_refuses_bad_arguments_in_one_line(args, needle, tmp_path, capsys, monkeypatch):
    """benchmarks/stream_share_pinned.py: runs without their profile and table, or no runs, end in one line."""
    monkeypatch.chdir(tmp_path)
    code, err = run_script(SCRIPT.with_name("stream_share_pinned.py"), args, capsys)
    assert code == 2 and needle in err


def test_the_share_rerun_names_a_profile_that_does_not_load(structure_model, tmp_path, capsys):
    """A --share-from that is not a device profile ends in one line naming the file, before any table is written."""
    run = tmp_path / "run-1"
    run.mkdir()
    (run / "device.json").write_text("{}")
    (run / "table.json").write_text("{}")
    (tmp_path / "bad.json").write_text("[1, 2]")
    code, err = run_script(SCRIPT.with_name("stream_share_pinned.py"), ["--runs", run, "--share-from",
                                                                       tmp_path / "bad.json", "--out",
                                                                       tmp_path / "out"], capsys)
    assert code == 2 and "bad.json" in err
    assert not (tmp_path / "out").exists()


def test_the_table_names_a_profile_that_does_not_load(tmp_path, capsys):
    """`table` reads the run's profile for its level: one that does not load ends in one line naming it."""
    (tmp_path / "device.json").write_text("[1]")
    code, err = run_script(SCRIPT, ["table", "--out", tmp_path], capsys)
    assert code == 2 and "device.json: not a moespec device profile" in err


@pytest.mark.parametrize("flagged, takes, profiles", [(True, 2, 2), (True, 1, 1), (False, 3, 1)])
def test_a_flagged_profile_is_taken_again_up_to_its_takes(structure_model, tmp_path, flagged, takes, profiles,
                                                          monkeypatch):
    """`profile --takes N` re-takes a profile the checks flag, N takes at most, and stops at the first clean one."""
    taken = []
    monkeypatch.setattr(structure_model, "run_profile", lambda config, say: taken.append(config) or {})
    monkeypatch.setattr(structure_model, "profile_checks", lambda profile, where: ["two states"] if flagged else [])
    assert structure_model.main(["profile", "--takes", str(takes), "--out", str(tmp_path)]) == 0
    assert len(taken) == profiles and all(c.out == str(tmp_path / "device.json") for c in taken)


def test_the_profile_refuses_no_takes_in_one_line(tmp_path, capsys):
    """`--takes 0` ends in one line and exit 2 before any folder is made."""
    code, err = run_script(SCRIPT, ["profile", "--takes", "0", "--out", tmp_path / "run"], capsys)
    assert code == 2 and "--takes must be a positive count, got 0" in err
    assert not (tmp_path / "run").exists()


RECORDED = SCRIPT.with_name("structure_model_recorded.py")
RUN = SCRIPT.parents[1] / "results" / "structure-model" / "epyc-avx2" / "run-11"  # a recorded CPU run


def test_a_recorded_run_is_predicted_again_from_its_own_calls(tmp_path, capsys, monkeypatch):
    """benchmarks/structure_model_recorded.py on a recorded run's profile and one model's measured bench: the
    predicted bench, errors and table of that model, the self-check taken again on the recorded check passes (the
    same calls), nothing timed."""
    import shutil

    recorded = tmp_path / "recorded"
    (recorded / "pair").mkdir(parents=True)
    shutil.copy(RUN / "device.json", recorded)
    shutil.copy(RUN / "pair" / "bench-B1.json", recorded / "pair")
    monkeypatch.chdir(tmp_path)
    code, err = run_script(RECORDED, [recorded, tmp_path / "out"], capsys)
    assert code == 0, err
    out = tmp_path / "out"
    table = json.loads((out / "table.json").read_text())
    assert {(r["model"], r["kernel"]) for r in table["rows"]} == {("pair", "slot"), ("pair", "dedup")}
    assert all(0 <= r["median_error"] <= r["max_error"] for r in table["rows"])
    errors = json.loads((out / "pair" / "errors.json").read_text())
    assert set(errors["batches"]["1"]["passes"]) == {"slot", "dedup"}
    again, before = (json.loads((folder / "device.json").read_text())["self_check_by_dtype"]["bf16"]["passes"]
                     for folder in (out, RUN))
    assert [p["measured_s"] for p in again] == [p["measured_s"] for p in before]


def test_a_recorded_run_refuses_a_folder_without_benches_or_profile(tmp_path, capsys, monkeypatch):
    """No model's bench, or a profile that does not load: one line, exit 2, nothing written."""
    monkeypatch.chdir(tmp_path)
    code, err = run_script(RECORDED, [tmp_path, tmp_path / "out"], capsys)
    assert code == 2 and "no model's bench-B1.json" in err
    (tmp_path / "pair").mkdir()
    (tmp_path / "pair" / "bench-B1.json").write_text("{}")
    (tmp_path / "device.json").write_text("[1]")
    code, err = run_script(RECORDED, [tmp_path, tmp_path / "out"], capsys)
    assert code == 2 and "device.json" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("placed, ceiling", [(False, 20.0), (True, 10.0)])
def test_a_bench_is_predicted_at_the_samples_its_placement_is_against(structure_model, tmp_path, placed, ceiling):
    """The samples a bench takes after each call read the buffer its placement is measured against: a bench with a
    placement is predicted at their median (10 GB/s here), one without at the samples between its groups (20)."""
    config = structure_model.configs("pair", tmp_path, "bf16", (1,))[1]
    spec = resolve_model(config.model)
    plan, _, _ = bench_passes(spec, config, bench_trace(spec, config.trace, config.seed)[0], [0])
    kernels = list(pair_of("bf16").values())

    def row(p):
        return {"U": p.U, "median_s": dict.fromkeys(kernels, 1e-3), "iqr_s": dict.fromkeys(kernels, 0.0),
                "round_s": {k: [1e-3] * 3 for k in kernels}, "round_ceiling_gbps": {k: [10.0] * 3 for k in kernels}}
    bench = {name: {"0": {str(n): [row(p) for p in passes if p.source == source] for (_, n), passes in plan.items()}}
             for name, source in (("chosen", "chosen"), ("windows", "window"))}
    bench |= {"ceiling_by_n_gbps": {str(n): 20.0 for _, n in plan},
              "placement": {"0": [1.0] * spec.num_experts} if placed else None}
    rates = Rates((1, 2), (3e-11, 5e-11), (2e-11, 4e-11), 2e-6, 5e-5)
    out = structure_model.pass_errors(config, bench, {"slot": rates, "dedup": rates}, 0.0)
    assert {v["ceiling_gbps"] for by in out.values() for v in by.values()} == {ceiling}
    assert all(len(q["round_predicted_s"]) == 3 for by in out.values() for v in by.values() for q in v["passes"])


def test_every_model_is_measured_at_n_1_to_9_and_at_passes_up_to_72_tokens(structure_model, tmp_path, monkeypatch):
    """B = 1 times n = 1..9 for every model; B = 8 passes from 8 to 72 tokens (fewer pass sizes, windows and rounds:
    each reads most of the layer), Mixtral's fewest; every setting within the bench's own domain."""
    monkeypatch.setattr(structure_model, "model_arg", lambda name, out: (name, str(out / f"{name}.npz")))
    for name in structure_model.MODELS:
        by_batch = structure_model.configs(name, tmp_path, "bf16", structure_model.BATCHES)
        assert by_batch[1].n == tuple(range(1, 10)) and by_batch[1].batch == 1
        eight = by_batch[8]
        assert eight.batch == 8 and min(eight.n) * 8 == 8 and max(eight.n) * 8 == 72
        assert eight.reps <= by_batch[1].reps and eight.windows <= by_batch[1].windows and eight.u_values >= 2
        assert len(eight.n) == (3 if name == "mixtral-8x7b" else 5)
        for config in by_batch.values():
            Path(config.out).parent.mkdir(parents=True, exist_ok=True)
            config.check()

"""Hostile checkpoints, result files and flag values (issue 31): a checkpoint made with other arguments or holding a
damaged unit, a results file with unknown keys or numbers out of bounds, and flag values past their stated bounds
each end in one line naming what to change (exit 2, no traceback, no file made or changed); loaders name the file
and the key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_cases import contents, one_line
from cli_cases import run_cli as main

from moespec import MoespecError, cli
from moespec.formats.benchfile import load_bench
from moespec.formats.checkpoint import Checkpoint
from moespec.formats.planfile import load_plan
from moespec.formats.runsfile import load_runs
from moespec.measure import bench, rounds
from moespec.model import speculative
from moespec.routing.synth import synthesize

RESULTS = Path(__file__).resolve().parents[1] / "results" / "llama-cpp" / "plan"
RUN = ["run", "--depth", "8", "--reps", "2", "--max-reps", "2", "--no-throughput", "--dtype", "fp32", "--n", "1,2"]





def refused(argv: list[str], folder: Path, *words: str) -> None:
    """`argv` ends with exit 2 and one line holding `words`, and leaves every file under `folder` as it was."""
    before = contents(folder)
    code, err = main(argv)
    assert code == 2, err
    one_line(err, *words)
    assert contents(folder) == before


# ---- checkpoints -------------------------------------------------------------------------------------------
def test_a_bench_checkpoint_of_other_pass_sizes_or_a_damaged_round_is_refused(bench_argv, tmp_path, bench_stopper):
    """Interrupted at --n 1-2 and rerun at --n 1-3 (more) or 1 (fewer): refused naming n, never an IndexError or
    rounds of the other run taken; a round of the right settings but the wrong shape: refused naming the unit."""
    out = tmp_path / "bench.json"
    assert main(bench_argv(out, "--n", "1-2"))[0] == 130
    bench_stopper.resume()
    for n in ("1-3", "1"):
        refused(bench_argv(out, "--n", n), tmp_path, f"{out}.partial", "(n differ)", "--fresh")
    unit = next(Path(f"{out}.partial").glob("layer*.json"))
    doc = json.loads(unit.read_text())
    doc["unit"] = doc["unit"][:1]  # one group where the round has one per pass size
    unit.write_text(json.dumps(doc))
    refused(bench_argv(out, "--n", "1-2"), tmp_path, str(unit), "2 groups", "damaged checkpoint unit", "--fresh")


@pytest.fixture(scope="module")
def interrupted_run(tiny_checkpoints, tmp_path_factory) -> tuple[list[str], Path]:
    """(argv, folder): a run interrupted in its second verify round, its checkpoint in folder/runs.json.partial."""
    folder = tmp_path_factory.mktemp("interrupted")
    argv = [*RUN, "--model", str(tiny_checkpoints["olmoe"]), "--out", str(folder / "runs.json")]
    timed, seen = speculative.timed_forward, []

    def interrupt_in_round_two(model, tokens, state):
        seen.append(1)
        if len(seen) == 3 * 2 * 2 + 1:  # the warm-up and round one (3 policies x 2 pass sizes each)
            raise KeyboardInterrupt
        return timed(model, tokens, state)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(rounds, "DISTURBED", 0.0)
        patch.setattr(speculative, "timed_forward", interrupt_in_round_two)
        assert main(argv)[0] == 130
    return argv, folder


def _truncated(text: str) -> str:
    return text[: len(text) // 2]


def _wrong_time(text: str) -> str:
    doc = json.loads(text)
    doc["unit"]["rounds"][0]["times"]["1 slot"] = "fast"
    return json.dumps(doc)


def _other_key(text: str) -> str:
    doc = json.loads(text)
    doc["key"] = "cell slot k 2 prompt 0"
    return json.dumps(doc)


def _huge_count(text: str) -> str:
    doc = json.loads(text)
    doc["unit"]["repeated"] = -1
    return json.dumps(doc)


@pytest.mark.parametrize("damage", [_truncated, _wrong_time, _other_key, _huge_count])
def test_a_damaged_run_checkpoint_unit_is_refused_naming_it(interrupted_run, damage):
    argv, folder = interrupted_run
    unit = folder / "runs.json.partial" / "verify_rounds.json"
    original = unit.read_text()
    unit.write_text(damage(original))
    try:
        refused(argv, folder, str(unit), "damaged checkpoint unit", "--fresh")
    finally:
        unit.write_text(original)


def test_a_run_checkpoint_of_other_settings_is_refused_naming_them(interrupted_run):
    argv, folder = interrupted_run
    refused([*argv, "--threads", "3", "--n", "1,3"], folder, "runs.json.partial", "n, threads differ", "--fresh")


def test_a_checkpoint_unit_with_no_key_of_the_folder_is_refused(tmp_path):
    out = tmp_path / "x.json"
    Checkpoint(out, {"a": 1}, "run")
    (tmp_path / "x.json.partial" / "stray.json").write_text(json.dumps({"key": "other name", "unit": 1}))
    with pytest.raises(MoespecError, match=r"stray\.json: not a \{key, unit\} object of this folder.*--fresh"):
        Checkpoint(out, {"a": 1}, "run")


# ---- result files ------------------------------------------------------------------------------------------
def _edited(tmp_path: Path, source: str, edit) -> Path:
    doc = json.loads((RESULTS / source).read_text())
    edit(doc)
    path = tmp_path / source
    path.write_text(json.dumps(doc))
    return path


RUNS_EDITS = [
    (lambda d: d.update(depth=10 ** 400), "depth = an integer of 401 digits must be an integer >= 0 (at most 131,072)"),
    (lambda d: d.update(depth=-1), "depth = -1"),
    (lambda d: d.update(moe_layers=0), "moe_layers = 0"),
    (lambda d: d["verify_time_s"].update(fast={"1": 0.1}), "verify_time_s.fast: unknown key"),
    (lambda d: d["verify_time_s"]["dedup"].update({"99": 0.1}), "verify_time_s.dedup.99: unknown key"),
    (lambda d: d["verify_time_s"]["dedup"].update({"01": 0.1}), "verify_time_s.dedup.01: unknown key"),
    (lambda d: d["verify_time_s"]["dedup"].update({"1": 1e200}), "verify_time_s.dedup.1 = 1e+200"),
    (lambda d: d.update(auto_reference={"2": "fast"}), "auto_reference must name slot or dedup"),
    (lambda d: d.update(ceiling_gbps={"during": 3.0}), "ceiling_gbps.during: unknown key"),
    (lambda d: d.update(throughput=[{"policy": "dedup", "k": 10 ** 6, "a": 0.5, "tokens_per_s": 1.0}]),
     "throughput[0] needs k in 0..32"),
]


BENCH_EDITS = [
    (lambda d: d["per_layer"].update({"7": d["per_layer"]["0"]}), "per_layer and fits must be keyed by the timed"),
    (lambda d: d["r"].update({"01": 1.0}), "r has key '01'"),
    (lambda d: d["eps"].update(fast=0.1), "eps.fast"),
    (lambda d: d.update(layers=[10 ** 400]), "layers must list MoE layer indices in 0..999"),
    (lambda d: d["protocol"].update(reps=0), "protocol.reps = 0"),
    (lambda d: d["per_layer"]["0"]["kernels"]["slot"]["1"].update(predicted_mean_s=None),
     "per_layer.0.kernels.slot.1.predicted_mean_s"),
]


PLAN_EDITS = [
    (lambda d: d["tau_hat"].update(fast=d["tau_hat"]["slot"]), "tau_hat must be keyed by the policies"),
    (lambda d: d.update(draft_time_s=[0.0]), "draft_time_s must list kmax + 1"),
    (lambda d: d.update(coverage={**d["coverage"], "num_moe_layers": 10 ** 400}), "num_moe_layers is an integer"),
    (lambda d: d["step_times"].update(fast=d["step_times"]["slot"]), "step_times.fast"),
]


@pytest.mark.parametrize("name, load, edit, problem",
                         [("verify-llama.json", load_runs, *e) for e in RUNS_EDITS]
                         + [("bench.json", load_bench, *e) for e in BENCH_EDITS]
                         + [("plan.json", load_plan, *e) for e in PLAN_EDITS])
def test_a_loader_names_the_file_and_key(tmp_path, name, load, edit, problem):
    path = _edited(tmp_path, name, edit)
    with pytest.raises(MoespecError) as e:
        load(path)
    assert str(e.value).startswith(str(path)) and problem in str(e.value), e.value


# ---- flags -------------------------------------------------------------------------------------------------
def test_an_empty_acceptance_list_is_refused(tiny_checkpoints, tmp_path):
    refused([*RUN, "--model", str(tiny_checkpoints["olmoe"]), "--a", "", "--out", str(tmp_path / "r.json")],
            tmp_path, "--a ''")


def test_run_replays_only_a_trace_of_its_model_as_bench_does(tiny_checkpoints, tmp_path):
    synthesize("olmoe-1b-7b", "uniform", 200, 2, seed=0).save(tmp_path / "other.npz")
    refused([*RUN, "--model", str(tiny_checkpoints["olmoe"]), "--replay", str(tmp_path / "other.npz"), "--out",
             str(tmp_path / "r.json")], tmp_path, "a trace of olmoe-1b-7b, not of")


@pytest.fixture(scope="module")
def narrow_bench(bench_argv, tmp_path_factory) -> Path:
    """A finished bench of pass sizes 1 and 2 only (too few for the fits (4), (E.1))."""
    out = tmp_path_factory.mktemp("narrow") / "bench.json"
    assert main(bench_argv(out, "--n", "1,2", "--layers", "0"))[0] == 0
    return out


@pytest.mark.parametrize("extra, words", [
    (["--tau1", "1e-300"], ["--tau1 1e-300: must be a positive time of magnitude 1e-100..1e+100"]),
    (["--tau1", "1e-3", "--draft-time", "1e200"], ["--draft-time 1e+200: must be a non-negative time"]),
    (["--tau1", "1e-3", "--draft-time", "0,nan"], ["--draft-time"]),
    (["--tau1", "1e-3", "--moe-layers", "0"], ["--moe-layers", "1..1,000"]),
    (["--tau1", "1e-3", "--kmax", "1"], ["covers too few pass sizes", "it timed 2 (n = 1, 2)",
                                        "needs n up to 3, all 3 of 1..3"]),
    (["--tau1", "1e-3"], ["it timed 2 (n = 1, 2)", "--kmax 8 needs n up to 9", "--n 1-9"]),
])
def test_plan_flags_and_a_narrow_bench_are_refused_in_one_line(narrow_bench, bench_model, tmp_path, extra, words):
    load_bench(narrow_bench)  # its unfitted predictions (null) are valid
    refused(["plan", "--bench", str(narrow_bench), "--trace", str(bench_model["trace"]), "--out",
             str(tmp_path / "plan.json"), *extra], tmp_path, *words)


def test_the_ends_of_the_stated_magnitudes_are_taken():
    code, err = main(["staircase", "--step-times", "1e-100,2e-100"])
    assert "outside the magnitudes" not in err
    code, err = main(["staircase", "--step-times", "1,9.99e-101"])
    assert code == 2 and "outside the magnitudes 1e-100..1e+100" in err

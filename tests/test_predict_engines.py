"""moespec.predict.engines: the best draft length per batch size in vLLM's, TensorRT-LLM's, SGLang's and llama.cpp's
forms, on a hand-made batch block whose k*(a, B) are computed by hand below; a per-position profile; bad inputs
refused with a ValueError naming the argument; `moespec plan --for ENGINE`'s flags and its refusal without --batch
(one line, exit 2, nothing written)."""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path
from typing import Any

import pytest
from cli_cases import refused
from plan_cases import make_bench, uniform_trace

from moespec import MoespecError, cli
from moespec.cli.plan import answer_engine, check_engine_flags
from moespec.formats.files import write_json
from moespec.predict.engines import (
    FORMS,
    draft_lengths,
    engine_form,
    for_llama_cpp_parallel,
    for_sglang,
    for_tensorrt_llm,
    for_vllm,
    vllm_ranges,
    write_engine_config,
)

MS = 1e-3
# step times V_B(k), k = 0..3, in units of 10 ms. T = G/V at a = 1/2 (G = 1, 1.5, 1.75, 1.875):
FLAT = [10, 10.5, 11, 11.5]   # T = 1, 1.43, 1.59, 1.63: k* = 3
STEEP = [10, 12, 15, 21]      # T = 1, 1.25, 1.17, 0.89: k* = 1
STEEPER = [10, 16, 22, 28]    # T = 1, 0.94, 0.80, 0.67: k* = 0
# the profile (0.9, 0.2, 0.2): G = 1, 1.9, 2.08, 2.116, so FLAT -> 2 (T = 1, 1.81, 1.89, 1.84), STEEP -> 1
# (1, 1.58, 1.39, 1.01), STEEPER -> 1 (1, 1.19, 0.95, 0.76); at a = 1 (G = k + 1): FLAT -> 3, STEEP -> 2
# (1, 1.67, 2, 1.90), STEEPER -> 3 (1, 1.25, 1.36, 1.43)
PROFILE = [0.9, 0.2, 0.2]


def entry(auto: list[float], dedup: list[float] | None = None) -> dict[str, Any]:
    """A per_batch entry of the batch block with the given step times (ms x 10) for auto (and slot), and dedup."""
    seconds = lambda v: [x * 10 * MS for x in v]  # noqa: E731
    return {"step_time_s": {"slot": seconds(auto), "dedup": seconds(dedup or auto), "auto": seconds(auto)},
            "kernel_by_n": {str(n): "slot" for n in range(1, 5)}, "crossover": None,
            "k_hat": [0, 3, 3], "tokens_per_s": [1.0, 1.0, 1.0], "speedup": [1.0, 1.0, 1.0]}


def make_batch(**per_batch: dict[str, Any]) -> dict[str, Any]:
    """The batch block of a plan (the schema plan.json's `batch` has) on the grid 1, 2, 4, 8, kmax 3."""
    rows = {"1": entry(FLAT), "2": entry(FLAT), "4": entry(STEEP), "8": entry(STEEPER, dedup=STEEP), **per_batch}
    return {"batches": [int(b) for b in rows], "kmax": 3, "policy": "auto", "source": "hand-made step times",
            "acceptances": [0.0, 0.5, 1.0], "per_batch": rows, "b_stop": [1, 8, None]}


@pytest.fixture
def batch() -> dict[str, Any]:
    return make_batch()


def test_draft_lengths_per_batch_size(batch: dict[str, Any]) -> None:
    assert draft_lengths(batch, 0.5) == {1: 3, 2: 3, 4: 1, 8: 0}
    assert draft_lengths(batch, PROFILE) == {1: 2, 2: 2, 4: 1, 8: 1}
    assert draft_lengths(batch, 1) == {1: 3, 2: 3, 4: 2, 8: 3}  # a = 1: every draft accepted
    assert draft_lengths(batch, 0.5, "dedup") == {1: 3, 2: 3, 4: 1, 8: 1}  # B = 8's dedup times are STEEP


def test_vllm_ranges_take_the_k_of_the_grid_point_at_or_below(batch: dict[str, Any]) -> None:
    form = for_vllm(batch, 0.5)
    assert form["k_by_batch"] == {"1": 3, "2": 3, "4": 1, "8": 0}
    assert form["config"] == {"num_speculative_tokens": 3,
                              "num_speculative_tokens_per_batch_size": [[1, 3, 3], [4, 7, 1], [8, 8, 0]]}
    assert vllm_ranges({2: 4, 3: 2}) == [[1, 2, 4], [3, 3, 2]]  # the first range starts at 1
    profile = form["step_time_profile_ms"]  # (batch size, k) -> ms, every grid point and k = 0..kmax
    assert list(profile) == ["1", "2", "4", "8"] and all(list(row) == ["0", "1", "2", "3"] for row in profile.values())
    assert profile["4"] == pytest.approx({"0": 100, "1": 120, "2": 150, "3": 210})
    assert json.loads(json.dumps(form)) == form  # plain JSON


def test_vllm_with_no_speculation_anywhere_has_no_config() -> None:
    form = for_vllm(make_batch(**{b: entry(STEEPER) for b in ("1", "2", "4")}), 0.5)
    assert form["k_by_batch"] == {"1": 0, "2": 0, "4": 0, "8": 0} and form["config"] is None
    assert "without --speculative-config" in form["notes"][0]


def test_tensorrt_llm_schedule_has_zero_past_its_last_key(batch: dict[str, Any]) -> None:
    form = for_tensorrt_llm(batch, 0.5)
    # keys one below each next grid point: 1..3 -> 3, 4..7 -> 1, 8 -> 0 (the trailing 0 is TensorRT-LLM's own)
    assert form["config"] == {"speculative_config": {"max_draft_len": 3, "draft_len_schedule": {"3": 3, "7": 1}}}
    assert form["capped"] == []
    assert for_tensorrt_llm(batch, PROFILE)["config"]["speculative_config"] == \
        {"max_draft_len": 2, "draft_len_schedule": {"3": 2, "8": 1}}


def test_tensorrt_llm_caps_every_k_at_the_first_keys() -> None:
    """TensorRT-LLM requires schedule[smallest key] == max_draft_len >= every value: B = 2's k* = 3 above B = 1's
    k* = 1 becomes the best k <= 1 on B = 2's step times (T = 1, 1.43: 1)."""
    form = for_tensorrt_llm({**make_batch(), "batches": [1, 2],
                             "per_batch": {"1": entry(STEEP), "2": entry(FLAT)}}, 0.5)
    assert form["k_by_batch"] == {"1": 1, "2": 3}
    assert form["capped"] == [{"batch": 2, "k_star": 3, "k": 1}]
    assert form["config"] == {"speculative_config": {"max_draft_len": 1, "draft_len_schedule": {"2": 1}}}


def test_sglang_slots_by_lower_bound(batch: dict[str, Any]) -> None:
    form = for_sglang(batch, 0.5)
    assert form["config"] == {"1": {"candidate_steps": [3]}, "4": {"candidate_steps": [1]},
                              "8": {"candidate_steps": [0]}}
    assert "--speculative-adaptive-config" in form["usage"]
    assert for_sglang(batch, PROFILE)["config"] == {"1": {"candidate_steps": [2]}, "4": {"candidate_steps": [1]}}


def test_llama_cpp_parallel_slots_on_the_dedup_times(batch: dict[str, Any]) -> None:
    form = for_llama_cpp_parallel(batch, 0.5)
    assert form["policy"] == "dedup" and form["k_by_batch"] == {"1": 3, "2": 3, "4": 1, "8": 1}
    assert form["config"]["4"] == {"k": 1, "args": "--parallel 4 --spec-draft-n-max 1 --spec-draft-n-min 0 "
                                                   "--spec-draft-p-min 0"}
    plain = for_llama_cpp_parallel(make_batch(**{"8": entry(STEEPER)}), 0.5)["config"]["8"]
    assert plain == {"k": 0, "args": "--parallel 8"}


def test_every_form_has_the_same_fields(batch: dict[str, Any]) -> None:
    for engine in FORMS:
        form = engine_form(engine, batch, PROFILE)
        assert form["engine"] == engine and form["acceptance"] == PROFILE
        assert {"policy", "k_by_batch", "config", "usage", "source", "notes", "step_times_from"} <= set(form)


@pytest.mark.parametrize("change, acceptance, problem", [
    (None, 1.5, "acceptance a = 1.5 is outside"),
    (None, -0.1, "acceptance a = -0.1 is outside"),
    (None, "0.5", "acceptance must be a list of values"),
    (None, [0.9, 0.2], "acceptance: profile: 2 positions"),
    (None, [0.9, 1.2, 0.2], "acceptance: profile: position 2"),
    (lambda b: b.update(batches=[]), 0.5, r"batch\['batches'\]: an empty list"),
    (lambda b: b.update(batches=[1, 1, 4, 8]), 0.5, "ascending and distinct"),
    (lambda b: b.update(batches=[0, 2, 4, 8]), 0.5, r"batch\['batches'\]\[0\] must be an integer >= 1"),
    (lambda b: b.pop("per_batch"), 0.5, "batch: missing key 'per_batch'"),
    (lambda b: b.pop("kmax"), 0.5, "batch: missing key 'kmax'"),
    (lambda b: b["per_batch"].pop("4"), 0.5, r"batch\['per_batch'\]\['4'\]\['step_time_s'\]: missing"),
    (lambda b: b["per_batch"]["2"]["step_time_s"].pop("auto"), 0.5, r"\['2'\]\['step_time_s'\]\['auto'\]"),
    (lambda b: b["per_batch"]["2"]["step_time_s"]["auto"].pop(), 0.5, "3 step times, kmax = 3 needs 4"),
    (lambda b: b["per_batch"]["2"]["step_time_s"]["auto"].__setitem__(1, -1.0), 0.5, r"V\(1\) = -1.0"),
])
def test_bad_inputs_are_value_errors_naming_the_argument(batch: dict[str, Any], change, acceptance,
                                                         problem: str) -> None:
    if change:
        change(batch)
    for form in FORMS.values():
        with pytest.raises(ValueError, match=problem):
            form(batch, acceptance)


def test_other_bad_arguments(batch: dict[str, Any], tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="batch must be a plan's batch block"):
        for_vllm([1, 2], 0.5)
    with pytest.raises(ValueError, match="engine = 'trt'"):
        engine_form("trt", batch, 0.5)
    with pytest.raises(ValueError, match="policy = 'slot'"):
        draft_lengths(batch, 0.5, "slot")
    with pytest.raises(ValueError, match="form: vllm has no config"):
        write_engine_config(tmp_path / "vllm.json", for_vllm(make_batch(**{b: entry(STEEPER) for b in "124"}), 0.5))
    with pytest.raises(MoespecError, match="--engine-out .*a directory"):
        write_engine_config(tmp_path, for_vllm(batch, 0.5))
    assert not (tmp_path / "vllm.json").exists()


def test_write_engine_config_writes_the_config(batch: dict[str, Any], tmp_path: Path) -> None:
    for engine in FORMS:
        form = engine_form(engine, batch, 0.5)
        path = write_engine_config(tmp_path / "out" / f"{engine}.json", form)
        assert json.loads(path.read_text()) == form["config"]


def _args(**given: Any) -> argparse.Namespace:
    """`moespec plan`'s engine flags as parsed (--batch's text where given)."""
    return argparse.Namespace(**{"engine": None, "batch": None, "acceptance": None, "acceptance_profile": None,
                                 "engine_out": None, "kmax": 3, "json": False, **given})


@pytest.mark.parametrize("given, problem", [
    ({"acceptance": "0.5"}, "--acceptance needs --for ENGINE"),
    ({"engine": "sglang"}, "--for sglang answers per batch size: give --batch"),
    ({"engine": "llama.cpp", "engine_out": "x.json", "acceptance": "0.5"}, "--for llama.cpp with --acceptance"),
    ({"engine": "vllm", "batch": "1,2", "acceptance": "1.5"}, "--acceptance 1.5: every acceptance must lie in"),
    ({"engine": "vllm", "batch": "1,2", "acceptance": "0.5,0.6"}, "--acceptance: 2 numbers, at most 1"),
    ({"engine": "vllm", "batch": "1,2", "acceptance_profile": "0.9,0.5"}, "2 positions, drafts up to --kmax 3"),
    ({"engine": "vllm", "batch": "1,2", "engine_out": "x.json"}, "--engine-out writes one config"),
])
def test_engine_flags_are_checked_before_any_work(given: dict[str, Any], problem: str) -> None:
    with pytest.raises(MoespecError, match=problem):
        check_engine_flags(_args(**given))


def test_engine_flags_give_the_acceptance() -> None:
    assert check_engine_flags(_args(engine="llama.cpp")) is None  # llama.cpp's staircase form needs no --batch
    assert check_engine_flags(_args(engine="vllm", batch="1", acceptance="7/10")) == pytest.approx(0.7)
    assert check_engine_flags(_args(engine="vllm", batch="1", acceptance_profile="0.9,0.2,0.2,0.1")) == \
        pytest.approx([0.9, 0.2, 0.2, 0.1])


def test_answer_engine_prints_and_writes(batch: dict[str, Any], tmp_path: Path,
                                         capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "trt.json"
    answer_engine({"batch": batch}, _args(engine="tensorrt-llm", engine_out=str(out)), 0.5)
    printed = capsys.readouterr().out
    assert "draft_len_schedule" in printed and "TensorRT-LLM" in printed
    assert json.loads(out.read_text()) == for_tensorrt_llm(batch, 0.5)["config"]
    answer_engine({"batch": batch}, _args(engine="sglang"), None)  # no acceptance: a row per acceptance of the grid
    lines = capsys.readouterr().out.splitlines()
    assert max(map(len, lines)) <= 100 and any("candidate_steps" in line for line in lines)
    answer_engine({}, _args(engine="llama.cpp"), None)  # no batch block: llama.cpp's staircase form only
    assert capsys.readouterr().out == ""


def _plan_cli(tmp_path: Path, *extra: str) -> list[str]:
    write_json(tmp_path / "bench.json", make_bench())
    uniform_trace().save(tmp_path / "trace.npz")
    return ["plan", "--bench", tmp_path / "bench.json", "--trace", tmp_path / "trace.npz", "--tau1", "0.1", *extra]


@pytest.mark.parametrize("engine", ["vllm", "tensorrt-llm", "sglang"])
def test_plan_for_a_batch_engine_without_batch_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                          engine: str) -> None:
    argv = _plan_cli(tmp_path, "--for", engine, "--out", tmp_path / "plan.json", "--engine-out",
                     tmp_path / "engine.json", "--acceptance", "0.5")
    line = refused(argv, capsys, tmp_path)
    assert f"--for {engine}" in line and "--batch" in line


def test_plan_flags_refused_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    argv = _plan_cli(tmp_path)
    assert "not allowed with argument" in refused([*argv, "--acceptance", "0.5", "--acceptance-profile", "0.5"],
                                                  capsys, tmp_path)
    assert "--engine-out needs --for ENGINE" in refused([*argv, "--engine-out", tmp_path / "e.json"], capsys,
                                                        tmp_path)
    assert "invalid choice" in refused([*argv, "--for", "trt"], capsys, tmp_path)


def test_plan_for_llama_cpp_without_batch_still_answers(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert cli.main([str(a) for a in _plan_cli(tmp_path, "--for", "llama.cpp")]) == 0
    assert "--spec-draft-n-max" in capsys.readouterr().out


def test_the_batch_block_is_not_changed(batch: dict[str, Any]) -> None:
    before = copy.deepcopy(batch)
    for engine in FORMS:
        engine_form(engine, batch, PROFILE)
    assert batch == before

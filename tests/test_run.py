"""`moespec run` on a tiny checkpoint: the results keys, greedy agreement, resume, replay, the statistics
helpers and bad input (one line, exit 2)."""

from __future__ import annotations

import contextlib
import io
import itertools
import json
from types import SimpleNamespace

import numpy as np
import pytest

from moespec import cli, theory
from moespec.formats.trace import Trace
from moespec.measure import decoding as D
from moespec.measure import rounds
from moespec.measure import run as R
from moespec.measure.contention import Cores
from moespec.measure.level import Level

SMALL = ["--depth", "8", "--n", "1,2,3", "--reps", "2", "--max-reps", "2", "--k", "0,1,2", "--a", "0.5,0.9",
         "--prompts", "1", "--tokens", "5", "--dtype", "fp32"]


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(["run", *argv])
        except SystemExit as e:  # argparse rejects bad flag values itself
            code = e.code
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def tiny_run(tiny_checkpoints, tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "runs.json"
    with pytest.MonkeyPatch.context() as patch:  # no round dropped as disturbed, however busy the machine
        patch.setattr(rounds, "DISTURBED", 0.0)
        code, stdout, _ = run_cli(["--model", str(tiny_checkpoints["olmoe"]), *SMALL, "--out", str(out)])
    assert code == 0
    return out, json.loads(out.read_text()), stdout


def test_run_writes_the_documented_keys(tiny_run):
    out, doc, stdout = tiny_run
    assert doc["format"] == R.FORMAT_NAME and doc["format_version"] == R.FORMAT_VERSION
    assert set(doc["verify_time_s"]) == {"slot", "dedup", "outside"}
    assert set(doc["verify_time_s"]["slot"]) == {"1", "2", "3"}
    for policy in ("slot", "dedup", "outside"):
        for n, t in doc["verify_time_s"][policy].items():
            lo, hi = doc["verify_time_ci_s"][policy][n]
            assert 0 < lo <= t <= hi and len(doc["verify_samples_s"][policy][n]) == 2
    assert set(doc["saving_s"]) == {"1", "2", "3"}
    rows = doc["throughput"]
    # k = 0 measured once per policy and listed at both acceptances; k = 1, 2 at each
    assert len(rows) == 2 * 3 * 2
    assert {(r["policy"], r["k"], r["a"]) for r in rows} == {(p, k, a) for p in ("slot", "dedup") for k in (0, 1, 2)
                                                              for a in (0.5, 0.9)}
    # one prompt per cell: at k >= 1 it ran at one of the two acceptances (the grid in turn), the other row has
    # T_a(k) over the cell's V(k) and nothing realized
    assert all(sum(r["prompts"] for r in rows if (r["policy"], r["k"]) == (p, k)) == 1
               for p in ("slot", "dedup") for k in (1, 2))
    for r in rows:
        assert r["tokens_per_s"] > 0 and 0 <= r["overhead_share"] < 1
        # the oracle's rate: G_a(k) at the nominal a over the measured step time; realized: what the steps emitted
        assert r["tokens_per_s"] == pytest.approx(r["G_a"] / r["step_time_s"]) and r["draft"] == "oracle"
        assert r["G_a"] == pytest.approx(float(theory.geometric_sum(r["a"], r["k"])) if r["k"] else 1.0)
        if not r["prompts"]:
            assert r["k"] and r["steps"] == 0 and r["tokens"] == 0 and r["counted_tokens_per_s"] is None
            continue
        assert r["steps"] >= 1 and r["counted_tokens_per_s"] > 0
        assert (r["realized_acceptance"] is None) == (r["k"] == 0)
        # steady state: each step emits its accepted drafts plus one, the last one in full (it may overshoot the 5)
        assert r["tokens_per_step"] * r["steps"] >= 5 - 1 and (r["k"] or r["tokens_per_step"] == 1.0)
        assert r["tokens_per_step"] <= r["k"] + 1 and r["tokens"] == 5
    assert doc["greedy_match"] is doc["greedy_exact"] is True and doc["depth"] == 8 and doc["moe_layers"] == 2
    native = doc["dense"] == "native"  # the lean pass rides on the native kernels (absent: transformers' forward)
    assert doc["verify_pass"] == ("lean (2 of 2 layers one native call each)" if native else
                                  "transformers (dense path torch)")
    assert set(doc["draft_time_s"]) == {"0", "1", "2"}
    assert doc["provenance"]["timestamp"] and doc["device_kind"] == "cpu"
    assert set(doc["ceiling_gbps"]) == {"before", "between", "after"} and min(doc["ceiling_gbps"].values()) > 0
    assert set(doc["noise"]["per_n"]) == {"1", "2", "3"} and doc["noise"]["target"] == R.TARGET
    assert all(v["rounds"] == 2 and v["stopped_by"] in ("target", "max_reps") for v in doc["noise"]["per_n"].values())
    assert json.loads(stdout.strip().splitlines()[-1])["out"] == str(out)
    assert not (out.parent / "runs.json.partial").exists()


def test_interrupted_run_resumes_without_remeasuring(tiny_checkpoints, tmp_path, monkeypatch):
    from moespec.model import speculative

    out = tmp_path / "runs.json"
    argv = ["--model", str(tiny_checkpoints["olmoe"]), *SMALL, "--out", str(out)]
    real, done = D.decode_prompt, []

    def interrupted(*args, **kwargs):
        if len(done) == 2:
            raise KeyboardInterrupt
        done.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(D, "decode_prompt", interrupted)
    assert run_cli(argv)[0] == 130  # interrupted
    units = [p for p in (tmp_path / "runs.json.partial").glob("*.json") if p.name != "state.json"]
    assert len(units) == 1 + 2  # the verify rounds and two cells survived
    cells, passes = [], []
    monkeypatch.setattr(D, "decode_prompt", lambda *a, **k: cells.append(1) or real(*a, **k))
    timed = speculative.timed_forward
    monkeypatch.setattr(speculative, "timed_forward", lambda *a, **k: passes.append(1) or timed(*a, **k))
    code, _, _ = run_cli([*argv, "--resume"])
    assert code == 0 and passes == [] and len(cells) == 2 * 3 - 2  # (policy, k) cells, one prompt each
    assert len(json.loads(out.read_text())["throughput"]) == 12
    code, _, err = run_cli([*argv[:-2], "--tokens", "6", "--out", str(out), "--resume"])
    assert code == 0  # no checkpoint left: a fresh run


def test_replay_in_verify_passes_and_decoding(tiny_checkpoints, tmp_path):
    rng = np.random.default_rng(0)
    experts = np.stack([np.stack([rng.choice(8, 2, replace=False) for _ in range(2)]) for _ in range(40)])
    trace = Trace.from_arrays(experts, [0, 20, 40], num_experts=8)
    trace.save(tmp_path / "t.npz")
    out = tmp_path / "runs.json"
    code, _, _ = run_cli(["--model", str(tiny_checkpoints["olmoe"]), *SMALL, "--k", "0,2", "--a", "0.6", "--replay",
                          str(tmp_path / "t.npz"), "--out", str(out)])
    doc = json.loads(out.read_text())
    assert code == 0 and doc["replay"] == str(tmp_path / "t.npz") and len(doc["throughput"]) == 4
    assert doc["greedy_match"]  # routing replayed by position: speculative and plain decoding see one model


def test_statistics_helpers():
    rng = np.random.default_rng(0)
    med, lo, hi = rounds.bootstrap_median([1.0, 2.0, 3.0, 4.0, 100.0], rng)
    assert med == 3.0 and 1.0 <= lo <= med <= hi <= 100.0
    s = rounds.bootstrap_saving([2.0] * 5, [1.0] * 5, rng)
    assert s == {"median": 1.0, "lo": 1.0, "hi": 1.0}
    assert theory.crossover({1: -1.0, 2: -0.5, 3: 0.2, 4: 0.1}) == 3
    assert theory.crossover({2: 0.5, 3: -0.1}) is None
    assert theory.crossover({2: 0.5, 3: 0.1}) == 2
    cells = [{"k": 0, "a": None, "x": 1}, {"k": 1, "a": 0.5, "x": 2}]
    assert D.expand_k0(cells, [0.5, 0.9]) == [{"k": 0, "a": 0.5, "x": 1}, {"k": 0, "a": 0.9, "x": 1},
                                              {"k": 1, "a": 0.5, "x": 2}]
    assert D.throughput_cells(["slot", "dedup"], [0, 2]) == [("slot", 0), ("slot", 2), ("dedup", 0), ("dedup", 2)]
    grid = [0.4, 0.6, 0.8]
    assert [D.prompt_acceptance(2, i, grid) for i in range(4)] == [0.8, 0.4, 0.6, 0.8]
    # across the draft lengths every prompt meets every acceptance
    assert {D.prompt_acceptance(k, 0, grid) for k in (1, 2, 3)} == set(grid)
    assert D.prompt_acceptance(2, 1, None) is None  # a draft model: no oracle acceptance


@pytest.mark.parametrize("argv, needle", [
    (["--n", "0-3"], "pass sizes"), (["--k", "0-9"], "draft lengths"), (["--a", "1.5"], "acceptance"),
    (["--reps", "1"], "--reps"), (["--n", "x"], "--n"), (["--device", "cuda"], "cuda"),
    (["--plan", "missing.json"], "missing.json"), (["--replay", "missing.npz"], "missing.npz"),
    (["--layers", "0"], "layers"), (["--max-reps", "1"], "--max-reps"),
    (["--target", "0"], "--target"),
])
def test_bad_input_is_one_line(argv, needle, tiny_checkpoints, tmp_path):
    code, _, err = run_cli(["--model", str(tiny_checkpoints["olmoe"]), *SMALL, *argv, "--out",
                            str(tmp_path / "r.json")])
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1


def test_draft_model_grid(tiny_checkpoints, tmp_path):
    """A real draft (here an unrelated tiny model with the same vocabulary) drafts greedily; tokens stay plain
    decoding's and the grid runs over k only."""
    out = tmp_path / "runs.json"
    code, stdout, _ = run_cli(["--model", str(tiny_checkpoints["olmoe"]), *SMALL, "--draft-model",
                               str(tiny_checkpoints["mixtral"]), "--out", str(out)])
    doc = json.loads(out.read_text())
    assert code == 0 and doc["throughput"] == [] and doc["greedy_match"]
    rows = doc["throughput_draft_model"]
    assert {(r["policy"], r["k"]) for r in rows} == {(p, k) for p in ("slot", "dedup") for k in (0, 1, 2)}
    assert all(r["a"] is None and r["draft"] == "model" for r in rows)
    assert "draft model, slot k = 2" in stdout


def test_disturbed_rounds_are_dropped_and_repeated(tiny_checkpoints, tmp_path, monkeypatch):
    """A round whose reference read runs at a fraction of the machine's bandwidth is measured again, and the rounds
    stop at the target interval, the round limit or the budget, whichever comes first; the file says which."""
    reads = iter([20.0] * 8 + [2.0] + [20.0] * 1000)  # GB/s: the ninth reference read is disturbed
    monkeypatch.setattr("moespec.measure.level.StreamRead", lambda nbytes: lambda: next(reads))
    passes = itertools.cycle([0.010, 0.011, 0.012])  # seconds: spread too wide for a 1e-9 target
    monkeypatch.setattr(R.speculative, "timed_forward", lambda *args: next(passes))
    out = tmp_path / "runs.json"
    argv = ["--model", str(tiny_checkpoints["olmoe"]), "--depth", "8", "--n", "2", "--reps", "3", "--max-reps", "4",
            "--target", "1e-9", "--no-throughput", "--dtype", "fp32", "--out", str(out)]
    assert run_cli(argv)[0] == 0
    noise = json.loads(out.read_text())["noise"]
    unit = noise["per_n"]["2"]
    assert unit["repeated"] == 1 and noise["repeated"] == 1  # reads 7-9 are round 3: its slowest read was 2 GB/s
    assert unit["rounds"] == 4 and unit["stopped_by"] == "max_reps" and not unit["met"] and not noise["met"]
    doc = json.loads(out.read_text())
    assert all(len(v["2"]) == 4 for v in doc["verify_samples_s"].values())  # the dropped round left no sample
    monkeypatch.setattr(R.speculative, "timed_forward", lambda *args: 0.01)  # a steady pass meets any target
    code, _, _ = run_cli([*argv[:-1], str(tmp_path / "loose.json")])
    loose = json.loads((tmp_path / "loose.json").read_text())["noise"]["per_n"]["2"]
    assert code == 0 and loose["rounds"] == 3 and loose["stopped_by"] == "target" and loose["met"]


def test_an_unknown_dense_path_is_one_line(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["run", "--dense", "fast", "--out", "never.json"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "--dense" in err and len(err.strip().splitlines()) == 1


def test_throughput_cells_interleave_by_prompt(monkeypatch):
    """Round i decodes prompt i of every cell, in order on even rounds and reversed on odd ones, the oracle at the
    grid's acceptances in turn; every a's row divides its G_a(k) by the cell's one V(k) over all its prompts, and
    reports what its own prompts realized."""
    calls = []

    def decode(lm, policy, k, a, kernel_by_n, ps, i, drafter=None):
        calls.append((policy, k, i))
        # V(k) is the median step over every prompt of the cell, whatever its a; prompt 1's second step was
        # disturbed (10x): it moves the median by one rank, not V
        steps = [0.02] if a == 0.5 else [0.04, 0.4] if i == 1 else [0.04]
        return {"a": a, "steps": [[k, k // 2, 0.01, t, 0.0, 0.005] for t in steps], "tokens": k // 2 + 1,
                "mismatch": None}

    class Units:
        units: dict = {}

        def save(self, key, value):
            self.units[key] = value

    monkeypatch.setattr(D, "decode_prompt", decode)
    cells = [("slot", 0), ("slot", 2), ("dedup", 2)]
    rows = D.measure_throughput(None, cells, None, SimpleNamespace(count=3), [0.5, 0.9], Units(), None,
                                lambda n: None, Level(wait_s=0), Cores())
    assert calls == [c + (0,) for c in cells] + [c + (1,) for c in cells[::-1]] + [c + (2,) for c in cells]
    assert [(r["policy"], r["k"], r["a"]) for r in rows] == [("slot", 0, None), ("slot", 2, 0.5), ("slot", 2, 0.9),
                                                             ("dedup", 2, 0.5), ("dedup", 2, 0.9)]
    by = {(r["policy"], r["k"], r["a"]): r for r in rows}
    # k = 2: prompts 0 and 2 at a = 0.5 (a step of 0.02 s), prompt 1 at 0.9 (0.04 s, then 0.4 s): V is the median
    # of 0.02, 0.02, 0.04 and 0.4 for both rows (the mean would be 0.12)
    V = 0.03
    for a, prompts, steps in ((0.5, 2, 2), (0.9, 1, 2)):
        row = by["slot", 2, a]
        assert row["step_time_s"] == pytest.approx(V) and row["prompts"] == prompts and row["steps"] == steps
        assert row["tokens_per_s"] == pytest.approx(float(theory.geometric_sum(a, 2)) / V)
        assert row["counted_tokens_per_s"] == pytest.approx(4 / 0.04 if a == 0.5 else 4 / 0.44)
    assert by["slot", 0, None]["step_time_s"] == pytest.approx(V) and by["slot", 0, None]["prompts"] == 3


@pytest.mark.parametrize("a", [None, (0.5, 0.9), (0.7,)])
def test_default_prompts_decode_every_acceptance_in_every_cell(a):
    """By default a cell has one prompt per acceptance, so the counted rate (the plan's default) has a row at every
    (k, a); a draft model has no grid to cover; an explicit --prompts wins."""
    config = R.RunConfig(a=a)
    assert config.prompt_count == len(config.acceptances)
    for k in range(9):
        met = {D.prompt_acceptance(k, i, config.acceptances) for i in range(config.prompt_count)}
        assert met == set(config.acceptances), k
    assert R.RunConfig(a=a, draft_model="d").prompt_count == R.DRAFT_MODEL_PROMPTS
    assert R.RunConfig(a=a, draft_gguf="d.gguf").prompt_count == R.DRAFT_MODEL_PROMPTS
    assert R.RunConfig(a=a, prompts=3).prompt_count == 3


def test_an_acceptance_no_prompt_met_keeps_its_row():
    """More acceptances than prompts: the row of an a no prompt ran at has T_a(k) over the cell's V(k) and no
    realized numbers."""
    unit = {"a": 0.6, "steps": [[3, 1, 0.01, 0.03, 0.0, 0.001]], "tokens": 2, "mismatch": None}
    rows = D.cell_rows("dedup", 3, [unit], [0.6, 0.9])
    assert [r["prompts"] for r in rows] == [1, 0]
    empty = rows[1]
    assert empty["tokens_per_s"] == pytest.approx(float(theory.geometric_sum(0.9, 3)) / 0.03)
    assert empty["counted_tokens_per_s"] is None and empty["tokens_per_step"] is None
    assert empty["realized_acceptance"] is None and empty["steps"] == 0 and empty["greedy_exact"]
    model = D.cell_rows("dedup", 3, [unit | {"a": None}], None)
    assert len(model) == 1 and model[0]["a"] is None and model[0]["draft"] == "model"
    assert model[0]["tokens_per_s"] == pytest.approx(2 / 0.03)  # a draft model's: what it emitted


def test_auto_ratio_pairs_the_passes_of_a_round():
    """Drift that moves a whole round cancels: AUTO always 1% above dedup in its round gives 1.01, however the
    rounds' levels differ; the better fixed kernel is the one the paired ratio tells apart."""
    levels = [1.0, 2.0, 1.0, 3.0, 1.5]  # the machine's state per round
    samples = {"slot": {4: [1.3 * x for x in levels]}, "dedup": {4: list(levels)},
               "auto": {4: [1.01 * x for x in levels]}}
    rng = np.random.default_rng(0)
    assert R.auto_reference(samples, {4: "slot"}, 4, rng) == "dedup"  # 1.3x in every round: told apart
    assert R.paired_ratio(samples, "dedup", 4) == pytest.approx(1.01)
    samples["auto"][4][3] *= 3  # one of AUTO's passes disturbed: the median of the round ratios does not move
    assert R.paired_ratio(samples, "dedup", 4) == pytest.approx(1.01)


def test_auto_is_compared_with_its_own_kernel_where_the_fixed_ones_tie():
    """At n = 1 slot and dedup read the same experts: their paired ratio scatters around 1, the smaller median is
    noise, and AUTO (running slot there) is compared with slot."""
    rng = np.random.default_rng(3)
    noise = lambda: list(np.exp(rng.normal(0, 0.05, 25)))  # noqa: E731
    samples = {"slot": {1: noise()}, "dedup": {1: noise()}, "auto": {1: noise()}}
    assert R.auto_reference(samples, {1: "slot"}, 1, np.random.default_rng(0)) == "slot"
    assert R.auto_reference(samples, {1: "dedup"}, 1, np.random.default_rng(0)) == "dedup"
    samples = {p: {9: v[1]} for p, v in samples.items()}  # past the plan's sizes: the largest size's kernel
    assert R.auto_reference(samples, {1: "slot", 2: "dedup"}, 9, np.random.default_rng(0)) == "dedup"


def test_a_verify_round_covers_every_size_and_policy_in_turn():
    """Even rounds go up the pass sizes, odd ones down; each size's policies rotate by the round."""
    assert rounds._round_order([1, 2], ["slot", "dedup"], 0) == [(1, "slot"), (1, "dedup"), (2, "slot"), (2, "dedup")]
    assert rounds._round_order([1, 2], ["slot", "dedup"], 1) == [(2, "dedup"), (2, "slot"), (1, "dedup"), (1, "slot")]
    assert len(rounds._round_order(list(range(1, 10)), ["slot", "dedup", "auto"], 5)) == 27


@pytest.mark.parametrize("bf16_gemm", [True, False])
def test_prompts_are_prefilled_by_the_dedup_kernel_where_torch_has_no_bf16_gemm(tiny_configs, monkeypatch, bf16_gemm):
    """transformers' eager experts where torch multiplies bf16 (and for fp32 models); on an AVX2 CPU a bf16 model's
    prompts go through the dedup kernel, and the prefilled cache is the eager one's up to rounding."""
    import copy

    import torch
    from transformers import AutoModelForCausalLM

    from moespec.model import speculative
    from moespec.model.policies import moe_experts, pass_kernel, set_policy

    monkeypatch.setattr(D, "matmul_dtype", lambda dtype, device: dtype if bf16_gemm else torch.float32)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(copy.deepcopy(tiny_configs["olmoe"])).eval()
    assert D.set_prefill_policy(model) == "eager"  # fp32: torch's GEMM either way
    model = model.to(torch.bfloat16)
    policy = D.set_prefill_policy(model)
    assert policy == ("eager" if bf16_gemm else "dedup")
    assert pass_kernel(moe_experts(model)[0], 37) == (None if bf16_gemm else "dedup")
    ids = torch.arange(3, 40)[None]
    got = speculative.prefill(model, ids)
    set_policy(model, "eager")
    want = speculative.prefill(model, ids)
    assert got.length == want.length == 37
    for layer in range(len(model.model.layers)):
        torch.testing.assert_close(got.cache.layers[layer].keys, want.cache.layers[layer].keys, atol=5e-2, rtol=5e-2)

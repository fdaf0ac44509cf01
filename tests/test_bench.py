"""moespec bench: chosen ids, fits on synthetic timings, crossover, bench.json round trip and validation, and an
end-to-end run on a tiny model (with interrupt and resume). No assertion depends on how fast anything runs."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from cli_cases import refused
from hypothesis import example, given, settings
from hypothesis import strategies as st

from moespec import MoespecError, cli
from moespec.cli.args import parse_ints
from moespec.formats.benchfile import load_bench, too_small
from moespec.formats.checkpoint import Checkpoint
from moespec.formats.files import write_json
from moespec.formats.trace import Trace
from moespec.measure import bench, bench_rounds, passes, placement
from moespec.measure.contention import Cores
from moespec.measure.fits import analyze, engine_of, fit_time
from moespec.measure.level import Level
from moespec.model.spec import ModelSpec, resolve
from moespec.routing.synth import synthesize
from moespec.theory import crossover, requested_bytes

SMOKE_ROUNDS = 2  # conftest's bench_argv: 2 layers x 1 round (each over 3 pass sizes)


# ---- chosen ids ------------------------------------------------------------------------------------------
@st.composite
def union_cases(draw: st.DrawFn) -> tuple[int, int, int, int]:
    N = draw(st.integers(2, 70))  # noqa: N806
    m = draw(st.integers(1, N - 1))
    n = draw(st.integers(1, 12))
    return n, m, N, draw(st.sampled_from(passes.union_range(n, m, N)))


@settings(max_examples=300, deadline=None)
@given(union_cases(), st.integers(0, 2**32 - 1))
@example((9, 6, 7, 7), 0)  # m = N - 1, prime N, every expert named
@example((9, 6, 7, 6), 1)  # m = N - 1, all tokens on the same experts
@example((5, 4, 13, 13), 2)  # prime N, U = N < n m
@example((1, 8, 64, 8), 3)  # n = 1
@example((9, 8, 64, 64), 4)  # OLMoE's largest pass naming all experts
def test_chosen_ids_name_exactly_u_experts_with_valid_tokens(case: tuple[int, int, int, int], seed: int) -> None:
    n, m, N, U = case  # noqa: N806
    ids = passes.chosen_ids(n, m, N, U, np.random.default_rng(seed))
    assert ids.shape == (n, m) and ids.dtype == np.int64
    assert ids.min() >= 0 and ids.max() < N
    assert all(len(set(row)) == m for row in ids.tolist())  # every token names m distinct experts
    assert np.unique(ids).size == U


@settings(max_examples=100, deadline=None)
@given(union_cases())
def test_chosen_ids_reject_unreachable_u(case: tuple[int, int, int, int]) -> None:
    n, m, N, _ = case  # noqa: N806
    for U in (m - 1, min(n * m, N) + 1, 0):  # noqa: N806
        with pytest.raises(MoespecError, match="unreachable"):
            passes.chosen_ids(n, m, N, U, np.random.default_rng(0))


def test_chosen_ids_randomize_which_experts() -> None:
    rng = np.random.default_rng(0)
    sets = {frozenset(passes.chosen_ids(3, 8, 64, 12, rng).ravel().tolist()) for _ in range(20)}
    assert len(sets) > 10


@pytest.mark.parametrize("n, m, N, size, expected", [
    (2, 8, 64, 8, [8, 9, 10, 11, 13, 14, 15, 16]),  # 9 reachable values, 8 asked: spread, both ends
    (2, 8, 64, 20, list(range(8, 17))),  # fewer reachable than asked: all of them
    (9, 8, 64, 3, [8, 36, 64]),
    (1, 8, 64, 8, [8]),  # one token: U = m only
])
def test_union_grid_spreads_evenly_with_both_ends(n: int, m: int, N: int, size: int,  # noqa: N803
                                                   expected: list[int]) -> None:
    assert passes.union_grid(n, m, N, size) == expected


# ---- fits on synthetic timings ----------------------------------------------------------------------------
M, N_EXPERTS, B = 8, 64, 12_582_912  # OLMoE: one bf16 expert is 12.6 MB
SLOT_TRUE = (2e-4, 1 / 25e9, 0.3 / 25e9)  # t_op, c_u, c_re: first reads at 25 GB/s, re-read cost 0.3
DEDUP_TRUE = (3e-4, 1 / 20e9, 5e-5)  # t_op, c_g, c_t: union bytes at 20 GB/s, 50 us per token


def _chosen_passes(ns: range) -> tuple[np.ndarray, np.ndarray]:
    pairs = [(n, U) for n in ns for U in passes.union_grid(n, M, N_EXPERTS, 8)]  # noqa: N806
    return np.array([p[0] for p in pairs], float), np.array([p[1] for p in pairs], float)


def _true_time(kind: str, n: np.ndarray, U: np.ndarray) -> np.ndarray:  # noqa: N803
    t_op, c1, c2 = SLOT_TRUE if kind == "slot" else DEDUP_TRUE
    return t_op + c1 * U * B + c2 * ((n * M - U) * B if kind == "slot" else n)


@pytest.mark.parametrize("kind, truth", [("slot", SLOT_TRUE), ("dedup", DEDUP_TRUE)])
def test_fits_recover_known_constants(kind: str, truth: tuple[float, float, float]) -> None:
    n, U = _chosen_passes(range(2, 10))  # noqa: N806
    noise = 1 + 0.002 * np.random.default_rng(0).standard_normal(n.size)  # 0.2% timing noise
    fit = fit_time(kind, n, U, _true_time(kind, n, U) * noise, M, B)
    assert fit is not None and fit.passes == n.size
    assert fit.coef[1] == pytest.approx(truth[1], rel=0.02)
    assert fit.coef[2] == pytest.approx(truth[2], rel=0.1)
    assert fit.coef[0] == pytest.approx(truth[0], abs=2e-4)  # t_op is small beside ~30 ms passes
    if kind == "slot":
        assert fit.to_json()["re_read_cost"] == pytest.approx(0.3, abs=0.03)
    exact = fit_time(kind, n, U, _true_time(kind, n, U), M, B)
    assert np.allclose(exact.coef, truth, rtol=1e-6, atol=1e-12)
    assert exact.median_relative_error(n, U, _true_time(kind, n, U)) < 1e-9


@pytest.mark.parametrize("kind", ["slot", "dedup"])
def test_fit_needs_two_pass_sizes(kind: str) -> None:
    n, U = _chosen_passes(range(4, 5))  # noqa: N806
    assert fit_time(kind, n, U, _true_time(kind, n, U), M, B) is None


@pytest.mark.parametrize("u, r, expected", [
    ({1: 1.0, 2: 0.8, 3: 0.7, 4: 0.6, 5: 0.5}, {1: 1.0, 2: 0.6, 3: 0.6, 4: 0.61, 5: 0.6}, 4),
    ({2: 0.8, 3: 0.7, 4: 0.6, 5: 0.5}, {2: 0.75, 3: 0.6, 4: 0.65, 5: 0.45}, None),  # fails again at n = 5
    ({2: 0.8, 3: 0.5, 4: 0.6, 5: 0.5}, {2: 0.6, 3: 0.6, 4: 0.55, 5: 0.6}, 5),  # holds at 3, fails at 4
    ({1: 1.0, 2: 0.8, 3: 0.7}, {1: 1.2, 2: 0.9, 3: 0.9}, 2),  # n = 1 never counts
    ({1: 1.0, 2: 0.8}, {1: 1.2, 2: 0.8}, None),  # equality is not faster
    ({2: 0.8}, {}, None),
])
def test_crossover(u: dict[int, float], r: dict[int, float], expected: int | None) -> None:
    assert crossover({n: r[n] - u[n] for n in u if n in r}) == expected  # (7): dedup faster where u(n) < r(n)


def _synthetic_units(layers: list[int], ns: list[int], slow_dedup: float) -> dict:
    """Timed units whose every time follows the true fits exactly (dedup scaled by slow_dedup on windows)."""
    rng = np.random.default_rng(1)
    units = {}
    for layer in layers:
        for n in ns:
            rows = [("chosen", U) for U in passes.union_grid(n, M, N_EXPERTS, 8)]  # noqa: N806
            rows += [("window", int(U)) for U in rng.integers(M, min(n * M, N_EXPERTS) + 1, size=4)]  # noqa: N806
            timed = []
            for source, U in rows:  # noqa: N806
                t = {k: float(_true_time(k, np.array(n), np.array(U))) for k in ("slot", "dedup")}
                if source == "window":
                    t["dedup"] *= slow_dedup
                timed.append({"source": source, "U": U, "median_s": t, "iqr_s": {k: 0.0 for k in t}}
                              | ({"start": 0} if source == "window" else {}))
            units[layer, n] = {"passes": timed}
    return units


def test_analyze_on_exact_timings() -> None:
    layers, ns = [0, 7], list(range(1, 10))
    u = {n: 1.0 if n == 1 else 1.0 - 0.06 * n for n in ns}
    doc = analyze(_synthetic_units(layers, ns, 1.0), {"slot": "slot", "dedup": "dedup"}, M, {0: B, 7: B}, layers,
                  ns, u)
    assert doc["eps"] == pytest.approx({"slot": 0.0, "dedup": 0.0}, abs=1e-9)
    assert doc["eps_engine"]["moespec"] == pytest.approx(0.0, abs=1e-9)
    fit = doc["fits"]["7"]["slot"]
    assert fit["equation"] == "(4)" and fit["re_read_cost"] == pytest.approx(0.3)
    assert doc["fits"]["0"]["dedup"]["c_t_s_per_token"] == pytest.approx(DEDUP_TRUE[2])
    # beta on requested bytes at n = 1 (U = m): m b / (t_op + c_u m b), the same for both byte models there
    t1 = SLOT_TRUE[0] + SLOT_TRUE[1] * M * B
    assert doc["kernels"]["slot"]["beta_gbps"]["1"] == pytest.approx(M * B / t1 / 1e9)
    r = {int(n): v for n, v in doc["r"].items()}
    assert doc["crossover"] == crossover({n: r[n] - u[n] for n in ns})
    per = doc["per_layer"]["0"]
    assert per["one_token_s"] == {"kernel": "slot", "measured_s": pytest.approx(t1), "predicted_s": pytest.approx(t1)}
    assert per["kernels"]["dedup"]["5"]["predicted_mean_s"] == pytest.approx(per["kernels"]["dedup"]["5"][
        "measured_mean_s"])


def test_analyze_scores_fits_on_windows_they_did_not_see() -> None:
    layers, ns = [0], list(range(1, 6))
    doc = analyze(_synthetic_units(layers, ns, 1.1), {"slot": "slot", "dedup": "dedup"}, M, {0: B}, layers, ns,
                  {n: 0.5 for n in ns})
    assert doc["eps"]["dedup"] == pytest.approx(0.1 / 1.1)  # windows run 10% slower than the fit predicts
    assert doc["eps"]["slot"] == pytest.approx(0.0, abs=1e-9)
    assert doc["eps_engine"]["moespec"] == pytest.approx(0.1 / 1.1)


def test_requested_bytes() -> None:
    assert requested_bytes("slot", 3, 10, M, B) == 3 * M * B
    assert requested_bytes("dedup", 3, 10, M, B) == 10 * B


# ---- arguments -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, expected", [("1-9", list(range(1, 10))), ("2", [2]), ("9,1,2,2", [1, 2, 9])])
def test_parse_ns(text: str, expected: list[int]) -> None:
    assert parse_ints(text, "--n", 1) == expected


def test_kernels_that_cannot_run_are_skipped_by_all_and_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from moespec import kernels

    def fp32_only(x, ids, weights, gate_up, *rest):
        if gate_up.dtype != torch.float32:
            raise MoespecError("runs float32 only")
        return kernels.KERNELS["slot"].run(x, ids, weights, gate_up, *rest)

    ours = {k: v for k, v in kernels.KERNELS.items() if engine_of(k) == "moespec"}
    monkeypatch.setattr(kernels, "KERNELS", ours | {"fake-fp32": kernels.Kernel("fake-fp32", "slot", fp32_only, "")})
    spec = ModelSpec.from_name("olmoe-1b-7b")  # probed on a tiny layer of its structure, not its real size
    assert bench.parse_kernels("all", spec, "bf16") == (["slot", "dedup"], {"fake-fp32": "runs float32 only"})
    assert bench.parse_kernels("all", spec, "fp32") == (["slot", "dedup", "fake-fp32"], {})
    with pytest.raises(MoespecError, match="kernel fake-fp32 cannot run olmoe-1b-7b experts in bf16 on cpu"):
        bench.parse_kernels("dedup,fake-fp32", spec, "bf16")


def test_engine_of() -> None:
    assert [engine_of(k) for k in ("slot", "dedup", "hf-eager", "mlx-sorted", "ggml-mul_mat_id")] == \
        ["moespec", "moespec", "transformers", "mlx-lm", "llama.cpp ggml"]


def test_default_layers_are_first_and_before_middle() -> None:
    assert bench.bench_layers(None, ModelSpec.from_name("olmoe-1b-7b")) == [0, 7]
    assert bench.bench_layers(None, ModelSpec.from_name("deepseek-v2-lite")) == [0, 12]  # decoder layers 1, 13


def test_default_trace_is_synthesized_and_says_so() -> None:
    spec = ModelSpec.from_name("olmoe-1b-7b")
    trace, info = bench.bench_trace(spec, None, 0)
    assert trace.meta["model"] == spec.name and info["synthetic"] and info["path"] is None
    assert "no --trace given: synthesized the calibrated default" in info["note"]
    with pytest.raises(MoespecError, match="no --trace given"):
        bench.bench_trace(ModelSpec.from_name("mixtral-8x7b"), None, 0)


# ---- end to end on a tiny model ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny(bench_model: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """conftest's bench_model, a trace of another model of its shape and one of a bigger unnamed model."""
    root = tmp_path_factory.mktemp("bench")
    other = root / "other"
    other.mkdir()
    (other / "config.json").write_text((bench_model["model"] / "config.json").read_text())
    synthesize(str(other), "uniform", 100, 2, seed=0).save(root / "other.npz")
    big = synthesize("olmoe-1b-7b", "uniform", 100, 2, seed=0)  # N = 64, 16 layers, named by no model
    Trace.from_arrays(big.experts, big.doc_starts, big.num_experts).save(root / "big.npz")
    return {**bench_model, "root": root, "other": root / "other.npz", "big": root / "big.npz"}


@pytest.fixture(scope="module")
def smoke(tiny: dict[str, Path], bench_argv) -> dict[str, object]:
    out = tiny["root"] / "bench.json"
    plot = tiny["root"] / "figure2.png"
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        rc = cli.main(bench_argv(out, "--plot", str(plot)))
    return {"rc": rc, "out": out, "plot": plot, "last": stdout.getvalue().strip().splitlines()[-1],
            "stdout": stdout.getvalue()}


def test_smoke_run_writes_a_valid_bench(smoke: dict[str, object], tiny: dict[str, Path]) -> None:
    assert smoke["rc"] == 0
    doc = load_bench(smoke["out"])
    assert doc["model"] == "tiny" and doc["dtype"] == "bf16" and doc["layers"] == [0, 1] and doc["n"] == [1, 2, 3]
    assert doc["ceiling_gbps"] > 0 and doc["device"].startswith("cpu: ") and doc["device_kind"] == "cpu"
    assert doc["ceiling_kind"] == "streaming read" and doc["protocol"]["timer"] == "perf_counter"
    assert set(doc["kernels"]) == {"slot", "dedup"} and set(doc["r"]) == {"1", "2", "3"}
    assert doc["u"]["1"] == 1.0 and doc["u"]["3"] < doc["u"]["2"] < 1
    assert set(doc["eps"]) <= {"slot", "dedup"} and set(doc["fits"]) == {"0", "1"}
    assert doc["crossover"] in (None, 2, 3)
    assert set(doc["ceiling_by_n_gbps"]) == {"1", "2", "3"} and min(doc["ceiling_by_n_gbps"].values()) > 0
    reps = doc["protocol"]["reps"]  # each round's ceiling sample and times, in one order: a pass's round r ran
    for layer in ("0", "1"):       # just before sample r
        by_round = doc["ceiling_rounds_gbps"][layer]
        assert set(by_round) == {"1", "2", "3"} and all(len(c) == reps for c in by_round.values())
        assert doc["ceiling_by_n_gbps"]["2"] == pytest.approx(float(np.median(doc["ceiling_rounds_gbps"]["0"]["2"]
                                                                                + doc["ceiling_rounds_gbps"]["1"]["2"])))
        for row in doc["windows"][layer]["2"]:
            assert all(len(t) == reps and row["median_s"][k] == pytest.approx(float(np.median(t)))
                       for k, t in row["round_s"].items())
    for kernel in ("slot", "dedup"):  # FLOPs per token-slot: 2 x 3 d f (d = 64, f = 32 here)
        flops = doc["kernels"][kernel]["gflops"]
        assert set(flops) == {"1", "2", "3"} and min(flops.values()) > 0
    assert [row["U"] for row in doc["chosen"]["0"]["3"]] == passes.union_grid(3, 2, 8, 3)
    windows = doc["windows"]["1"]["2"]
    assert len(windows) == 2 and all(row["U"] in passes.union_range(2, 2, 8) for row in windows)
    assert doc["trace"]["path"] == str(tiny["trace"]) and doc["provenance"]["dtype"] == "bf16"
    assert not Path(f"{smoke['out']}.partial").exists()
    assert Path(smoke["plot"]).stat().st_size > 0
    summary = json.loads(smoke["last"])  # the command ends with one JSON line
    assert summary["out"] == str(smoke["out"]) and set(summary["beta_gbps"]) == {"slot", "dedup"}


def test_the_too_small_flag_is_written_and_warned(smoke: dict[str, object]) -> None:
    """bench.json's too_small is too_small() of its own numbers (so a reader and a plan agree on it), the run says
    so in a warning line naming the settings to change, and no round was resumed."""
    doc = load_bench(smoke["out"])
    assert doc["too_small"] == too_small(doc) and doc["resumed_rounds"] == 0
    summary = json.loads(smoke["last"])
    assert summary["too_small"] == doc["too_small"]["flag"]
    printed = " ".join(str(smoke["stdout"]).split())  # the console wraps long lines
    warned = "the expert operation of this model is too small to time on this machine" in printed
    assert warned == doc["too_small"]["flag"]
    if warned:
        assert "--fresh" in printed.split("too small to time", 1)[1]


def test_bench_json_round_trips(smoke: dict[str, object], tmp_path: Path) -> None:
    doc = load_bench(smoke["out"])
    write_json(tmp_path / "again.json", doc)
    assert load_bench(tmp_path / "again.json") == doc
    assert (tmp_path / "again.json").read_text() == Path(smoke["out"]).read_text()


@pytest.mark.parametrize("change, problem", [
    (lambda d: d.pop("ceiling_gbps"), "missing key 'ceiling_gbps'"),
    (lambda d: d.update(format_version=99), "version 99 is not supported"),
    (lambda d: d.update(format="other"), "not a moespec bench file"),
    (lambda d: d["kernels"]["slot"]["beta_gbps"].update({"2": -1.0}), "must be a positive finite number"),
    (lambda d: d["r"].update({"0": 1.0}), "not a timed pass size"),
    (lambda d: d["u"].update({"x": 0.5}), "not a timed pass size"),
    (lambda d: d.update(model="olmoe-1b-7b"), "differs from its spec"),
    (lambda d: d.update(dtype="int4"), "dtype 'int4'"),
    (lambda d: d.update(crossover="3"), "crossover has the wrong type"),
    (lambda d: d.update(crossover=7), "crossover 7 is not a timed pass size"),
    (lambda d: d.update(n=[0, 1]), "pass sizes B n, n in 1..33, for B = 1"),
    (lambda d: d.update(eps={"slot": -0.1}), "must be a finite number >= 0"),
    (lambda d: d.update(device_kind="tpu"), "device_kind 'tpu' is not one of cpu, cuda"),
    (lambda d: d.update(ceiling_kind=""), "ceiling_kind '' must name what the ceiling measures"),
    (lambda d: d.update(retimed=[{"layer": 0, "n": 1, "kernel": "slot", "first_s": 1.0, "seconds": 0.0}]),
     "retimed must list calls"),
    (lambda d: d.update(retimed=[{"layer": 99, "n": 1, "kernel": "slot", "first_s": 1.0, "seconds": 1.0}]),
     "retimed must list calls"),
])
def test_load_bench_rejects(smoke: dict[str, object], tmp_path: Path, change, problem: str) -> None:
    doc = json.loads(Path(smoke["out"]).read_text())
    change(doc)
    path = tmp_path / "bad.json"
    write_json(path, doc)
    with pytest.raises(MoespecError, match=problem) as err:
        load_bench(path)
    assert str(path) in str(err.value)


def test_load_bench_reads_a_file_from_before_devices(smoke: dict[str, object], tmp_path: Path) -> None:
    doc = json.loads(Path(smoke["out"]).read_text())
    for key in ("device_kind", "ceiling_kind"):
        del doc[key]
    del doc["protocol"]["timer"]
    write_json(tmp_path / "old.json", doc)
    loaded = load_bench(tmp_path / "old.json")
    assert (loaded["device_kind"], loaded["ceiling_kind"]) == ("cpu", "streaming read")


def test_call_ceilings_sample_the_state_of_every_call(tiny: dict[str, Path], bench_argv, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """--call-ceilings: every timed call is followed by a ceiling sample, kept per pass, kernel and round beside its
    time, through the checkpoint, and each expert's placement against that sample's buffer (the tiny layer's in
    blocks of 64 KiB); the protocol says so."""
    monkeypatch.setattr(placement, "BLOCK_BYTES", 64 << 10)
    out = tmp_path / "bench.json"
    with contextlib.redirect_stdout(io.StringIO()):
        assert cli.main(bench_argv(out, "--reps", "2", "--layers", "0", "--n", "2,3", "--call-ceilings")) == 0
    doc = load_bench(out)
    assert doc["protocol"]["call_ceilings"] is True
    for rows in (doc["windows"]["0"]["2"], doc["chosen"]["0"]["3"]):
        for row in rows:
            assert set(row["round_ceiling_gbps"]) == set(row["round_s"]) == {"slot", "dedup"}
            assert all(len(c) == 2 and min(c) > 0 for c in row["round_ceiling_gbps"].values())
    placed = doc["placement"]["0"]  # each expert's read rate over the ceiling buffer's (moespec.measure.placement)
    assert len(placed) == doc["spec"]["num_experts"] and min(placed) > 0
    doc["placement"]["0"] = placed[:-1]
    out.write_text(json.dumps(doc))
    with pytest.raises(MoespecError, match="placement must map timed layers"):
        load_bench(out)


def test_load_bench_rejects_non_json(tmp_path: Path) -> None:
    (tmp_path / "x.json").write_text("{not json")
    with pytest.raises(MoespecError, match="not readable JSON"):
        load_bench(tmp_path / "x.json")
    with pytest.raises(MoespecError, match="no such bench file"):
        load_bench(tmp_path / "missing.json")


def test_interrupted_run_resumes_without_retiming(tiny: dict[str, Path], bench_argv, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "bench.json"
    timed: list[str] = []  # the key of every round timed to the end
    save, time_round = Checkpoint.save, bench_rounds.time_round
    monkeypatch.setattr(Checkpoint, "save", lambda self, key, unit: (" round " in key and timed.append(key))
                        or save(self, key, unit))

    def interrupt_after_two_rounds(*args, **kwargs):
        if len(timed) == 2:
            raise KeyboardInterrupt
        return time_round(*args, **kwargs)

    monkeypatch.setattr(bench_rounds, "time_round", interrupt_after_two_rounds)
    assert cli.main(bench_argv(out, "--reps", "2")) == 130
    units = [p for p in Path(f"{out}.partial").glob("layer*round*.json")]
    assert len(units) == 2 and not out.exists()

    first, timed[:] = list(timed), []
    monkeypatch.setattr(bench_rounds, "time_round", time_round)
    assert cli.main(bench_argv(out, "--reps", "2", "--resume")) == 0
    assert len(timed) == SMOKE_ROUNDS * 2 - 2 and not set(first) & set(timed)  # finished rounds are not re-timed
    doc = load_bench(out)
    assert len(doc["windows"]["0"]) == 3 and not Path(f"{out}.partial").exists()
    assert doc["resumed_rounds"] == 2  # bench.json says its result holds rounds of the interrupted run


@pytest.mark.parametrize("burst", [(1.0, 2.0), (8 / 9, 10 / 9)], ids=["round 1", "two rounds' ends"])
def test_a_burst_meets_each_pass_size_once(burst: tuple[float, float]) -> None:
    """Rounds over every n: a burst of the host as long as one round (or across the end of round 0 and the start of
    round 1) slows at most one of each n's three samples, so every median is the quiet time. Timed one n after
    another (the bench before the rounds), the whole round's burst took every sample of the pass sizes it fell
    on; in rounds run ascending and descending in turn, the second burst took two of n = 8's and 9's samples."""
    ns, kernels, reps = list(range(1, 10)), ["slot", "dedup"], 3
    plan = {(0, n): [passes.Pass("chosen", np.zeros((n, 2), dtype=np.int64), 2)] * 2 for n in ns}
    size, calls = [0], [0]
    per_round = sum(len(p) for p in plan.values()) * len(kernels)

    def timed(fn) -> float:
        fn()
        calls[0] += 1
        return size[0] * 1e-3 * (2.0 if burst[0] * per_round < calls[0] <= burst[1] * per_round else 1.0)

    layer = SimpleNamespace(shape=(4, 8), tensors=[], run=lambda kernel, x, ids, w: size.__setitem__(0, ids.shape[0]))
    timer = SimpleNamespace(flush=lambda: None, time=timed, ceiling=lambda repeats: [30.0])
    inputs = [bench.pass_inputs(plan[0, n], 8, torch.float32, "cpu") for n in ns]
    rounds = [bench_rounds.time_round(inputs, kernels, layer, rep, reps, timer, lambda count: None, Level(wait_s=0),
                                Cores())
              for rep in range(reps)]
    units = bench_rounds.unit_records(0, ns, kernels, plan, rounds)
    for n in ns:
        assert [row["median_s"] for row in units[0, n]["passes"]] == [{"slot": n * 1e-3, "dedup": n * 1e-3}] * 2
        assert len(units[0, n]["ceiling_gbps"]) == reps


def _rounds_with(times: dict[tuple[int, int, int, int], float], reps: int = 3,
                 per: int = 2) -> tuple[list, list, list]:
    """Rounds of time_round over n = 1, 2, 3 (`per` passes each, U = n), each call taking n ms except the calls
    (round, group, pass, kernel index) in `times`; with the inputs and each call's requested bytes (dedup: U b,
    slot: n m b with m = 2, b = 1)."""
    ns, kernels = [1, 2, 3], ["slot", "dedup"]
    plan = {n: [passes.Pass("chosen", np.zeros((n, 2), dtype=np.int64), n)] * per for n in ns}
    inputs = [bench.pass_inputs(plan[n], 8, torch.float32, "cpu") for n in ns]
    rounds = [[{"times": [[times.get((rep, i, j, c), n * 1e-3) for c in range(2)] for j in range(per)],
                "ceiling_gbps": [30.0], "contention": Cores().take()} for i, n in enumerate(ns)] for rep in range(reps)]
    requested = [[[requested_bytes(k, n, n, 2, 1) for k in kernels] for _ in plan[n]] for n in ns]
    return rounds, inputs, requested


def _retime(rounds: list, inputs: list, requested: list, again: Callable[[int], float]) -> tuple[list, list]:
    """retime_outliers over `rounds` with every new call of pass size i taking again(i) seconds; (records, calls)."""
    calls: list[int] = []
    size = [0]
    layer = SimpleNamespace(tensors=[], run=lambda kernel, x, ids, w: size.__setitem__(0, ids.shape[0]))
    timer = SimpleNamespace(flush=lambda: None,
                            time=lambda fn: fn() or calls.append(size[0]) or again(size[0]))
    return bench_rounds.retime_outliers(rounds, inputs, ["slot", "dedup"], layer, requested, timer, Level(wait_s=0),
                                        Cores()), calls


def test_a_call_a_core_was_taken_from_is_timed_again() -> None:
    """One dedup call at n = 3 of round 1 took 3x (a core taken mid-call, that the contention record missed): it
    alone is timed again, and the medians are the quiet times. Under 1.5x is left alone (1.4x here)."""
    rounds, inputs, requested = _rounds_with({(1, 2, 0, 1): 9e-3, (2, 2, 0, 1): 4.2e-3})
    records, calls = _retime(rounds, inputs, requested, lambda n: n * 1e-3)
    assert calls == [3]
    assert records == [{"round": 1, "group": 2, "pass": 0, "kernel": "dedup", "first_s": 9e-3, "seconds": 3e-3,
                        "ceiling_gbps": None}]
    fixed = bench_rounds.apply_retimes(rounds, records, ["slot", "dedup"])
    assert fixed[1][2]["times"][0] == [3e-3, 3e-3] and rounds[1][2]["times"][0] == [3e-3, 9e-3]  # a copy
    plan = {(0, n): [passes.Pass("chosen", np.zeros((n, 2), dtype=np.int64), n)] * 2 for n in (1, 2, 3)}
    units = bench_rounds.unit_records(0, [1, 2, 3], ["slot", "dedup"], plan, fixed)
    assert units[0, 3]["passes"][0]["round_s"]["dedup"] == [3e-3, 3e-3, 4.2e-3]


def test_a_pass_slow_every_time_stays_slow() -> None:
    """A call slow again at every try is timed RETIME_TRIES times and its last time kept: the rule drops a
    disturbance, never a pass's own time."""
    rounds, inputs, requested = _rounds_with({(0, 1, 1, 0): 7e-3})
    records, calls = _retime(rounds, inputs, requested, lambda n: 3.5 * n * 1e-3)
    assert calls == [2] * bench_rounds.RETIME_TRIES and records[0]["seconds"] == 7e-3


@pytest.mark.parametrize("fixed_s", [0.0, 5e-3], ids=["through 0", "fixed time"])
def test_passes_compare_on_the_line_of_their_bytes(fixed_s: float) -> None:
    """Passes of one size and kernel that request different bytes compare on a line of time against bytes: dedup
    passes of 1, 2, 3, 4 and 6 experts at 1 ms each past 5 ms of fixed and per-token time (the one-expert pass at 6x
    the largest's seconds per byte) are no outliers; 3x the line is, even where it was slow in two of three rounds
    (its median off the line too)."""
    rounds, inputs, requested = _rounds_with({}, per=5)
    for j, experts in enumerate((1, 2, 3, 4, 6)):
        requested[2][j][1] = experts
        for r in rounds:
            r[2]["times"][j][1] = fixed_s + experts * 1e-3
    assert _retime(rounds, inputs, requested, lambda n: 1.0) == ([], [])
    for rep in (0, 1):
        rounds[rep][2]["times"][4][1] = 3 * (fixed_s + 6e-3)
    records, _ = _retime(rounds, inputs, requested, lambda n: fixed_s + 6e-3)
    assert [(f["round"], f["pass"], f["seconds"]) for f in records] == [(0, 4, fixed_s + 6e-3), (1, 4, fixed_s + 6e-3)]


def test_an_interrupted_retime_resumes_without_timing_rounds_again(tiny: dict[str, Path], bench_argv,
                                                                   tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Interrupted after layer 0's round, before its outliers were timed again: the rerun does not time that round
    again, retimes both layers and writes the bench, its `retimed` a list and the protocol's outlier ratio in it."""
    out, retime = tmp_path / "bench.json", bench_rounds.retime_outliers
    monkeypatch.setattr(bench_rounds, "retime_outliers", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt))
    assert cli.main(bench_argv(out)) == 130
    monkeypatch.setattr(bench_rounds, "retime_outliers", retime)
    rounds: list[str] = []
    save = Checkpoint.save
    monkeypatch.setattr(Checkpoint, "save", lambda self, key, unit: (" round " in key and rounds.append(key))
                        or save(self, key, unit))
    with contextlib.redirect_stdout(io.StringIO()):
        assert cli.main(bench_argv(out, "--resume")) == 0
    doc = load_bench(out)
    assert [k.split(" round")[0] for k in rounds] == ["layer 1"]  # layer 0's round is not timed again
    assert doc["resumed_rounds"] == 1 and isinstance(doc["retimed"], list)
    assert doc["protocol"]["outlier_ratio"] == bench_rounds.OUTLIER_RATIO


def test_resume_refuses_other_settings(tiny: dict[str, Path], bench_argv, tmp_path: Path, capsys) -> None:
    out = tmp_path / "bench.json"
    Checkpoint(out, {"reps": 9}, "bench")  # an unfinished bench of other settings
    assert cli.main(bench_argv(out)) == 2
    assert "made with other settings" in capsys.readouterr().err


@pytest.mark.parametrize("args, problem", [
    (["--kernels", "slot,fast"], "unknown kernel 'fast'"),
    (["--kernels", "reference"], "unknown kernel 'reference'"),
    (["--n", "0-3"], "must lie in 1..33"),
    (["--n", "5-2"], "empty range"),
    (["--n", "1-x"], "give a range like 1-9"),
    (["--layers", "0,2"], "layer 2 outside 0..1"),
    (["--trace", "/nonexistent/trace.npz"], "no such trace file"),
    (["--trace", "OTHER"], "a trace of other, not of tiny"),
    (["--trace", "BIG"], "routes N=64, m=8, L=16 but tiny has N=8, m=2, L=2"),
    (["--n", "1-200"], "pass sizes n must lie in 1..33"),
    (["--reps", "0"], "argument --reps: expected an integer in 1..1,000"),
    (["--plot", "figure.gif"], "must end in"),
])
def test_bad_input_exits_2_with_one_line(tiny: dict[str, Path], bench_argv, tmp_path: Path, capsys, args: list[str],
                                         problem: str) -> None:
    args = [{"OTHER": str(tiny["other"]), "BIG": str(tiny["big"])}.get(a, a) for a in args]
    assert problem in refused(bench_argv(tmp_path / "b.json", *args), capsys)
    assert not (tmp_path / "b.json").exists()


@pytest.mark.parametrize("device, problem", [
    ("cuda", "moespec bench: error: --device cuda: no CUDA device here (torch.cuda.is_available() is False)"),
    ("tpu", "moespec bench: error: --device tpu: unknown device; use cpu, cuda or cuda:N"),
])
def test_bad_device_exits_2_with_one_line(tiny: dict[str, Path], bench_argv, tmp_path: Path, capsys,
                                          monkeypatch: pytest.MonkeyPatch, device: str, problem: str) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the same answer on a machine with a GPU
    assert cli.main(bench_argv(tmp_path / "b.json", "--device", device)) == 2
    err = capsys.readouterr().err
    assert err.strip() == problem
    assert not (tmp_path / "b.json").exists()


def test_unknown_model_or_dtype_exits_2(capsys) -> None:
    assert cli.main(["bench", "--model", "no-such-model"]) == 2
    err = capsys.readouterr().err
    assert "neither a preset" in err and len(err.strip().splitlines()) == 1
    with pytest.raises(SystemExit) as exit_:
        cli.main(["bench", "--dtype", "int4"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "invalid choice" in err and len(err.strip().splitlines()) == 1


def test_bench_weights_have_the_spec_bytes() -> None:
    tiny_oss = dataclasses.replace(resolve("gpt-oss-20b"), name="tiny-oss", hidden=16, expert_width=8)
    layer = bench.layer_weights(tiny_oss, 0, "bf16", seed=0)
    from moespec.kernels import GPT_OSS, expert_bytes

    assert layer.act == GPT_OSS and layer.gate_up_bias is not None
    assert expert_bytes(layer.gate_up, layer.down, layer.gate_up_bias, layer.down_bias) == \
        tiny_oss.expert_bytes(0, "bf16")


class _Clock:
    """A CPU timer whose first flush touches its buffer's pages (`first_s`), every later one `flush_s`, a ceiling sample
    `sample_s`; time() returns what the call it wraps cost."""

    def __init__(self, first_s: float, flush_s: float = 0.01, sample_s: float = 0.002, kind: str = "cpu") -> None:
        self.kind, self.first_s, self.flush_s, self.sample_s = kind, first_s, flush_s, sample_s
        self.flushes, self.cost = 0, 0.0

    def flush(self) -> None:
        self.cost = self.first_s if self.flushes == 0 else self.flush_s
        self.flushes += 1

    def sample(self) -> float:
        self.cost = self.sample_s
        return 30.0

    def time(self, fn) -> float:
        fn()
        return self.cost


def test_the_estimate_counts_what_each_call_pays_around_it_and_not_the_first_flush(monkeypatch) -> None:
    """The bench's estimate: a first flush 100x the rest leaves it unchanged; a ceiling sample after every call adds
    its time per call; on a CPU each call's read of its U experts at the ceiling is in it, on a GPU not."""
    from moespec.measure.passes import Pass

    tiny = dataclasses.replace(resolve("olmoe-1b-7b"), name="tiny-olmoe", hidden=16, expert_width=8)
    layer = bench.layer_weights(tiny, 0, "bf16", seed=0)
    m, b = tiny.m, tiny.expert_bytes(0, "bf16")
    passes = [Pass("chosen", np.arange(n * m).reshape(n, m) % tiny.N, min(n * m, tiny.N)) for n in (1, 3, 9)] * 5
    kinds = {"slot": "slot", "dedup": "dedup"}
    monkeypatch.setattr(bench.bench_rounds, "time_round", lambda inputs, kernels, *args: [
        {"times": [[0.001] * len(kernels)]}, {"times": [[0.011] * len(kernels)]}])

    def estimate(clock: _Clock, sample: bool = False) -> float:
        return bench._estimate(kinds, layer, passes, m, b, clock, 30.0, clock.sample if sample else None)[0]

    calls, reads = len(passes) * len(kinds), len(kinds) * sum(p.U for p in passes) * b / 30e9
    base = estimate(_Clock(first_s=1.0))
    assert base == pytest.approx(estimate(_Clock(first_s=0.01)), rel=1e-12)
    assert estimate(_Clock(first_s=1.0), sample=True) == pytest.approx(base + calls * 0.002, rel=1e-12)
    assert estimate(_Clock(first_s=1.0, kind="cuda")) == pytest.approx(base - reads, rel=1e-12)
    assert base > calls * 0.01 + reads

"""moespec.predict.batch_map: the plan's batch block on verify times of linear growth, whose k*(a, B), B_stop(a) and
crossovers follow by hand: with tau(n) = 1 + c (n - 1) and h = 0, V(k) = 1 + c k, and drafting one token beats plain
decoding iff 1 + a > 1 + c; for c >= 1/2 no longer draft beats it where that one does not (G_a(k) <= 1/(1 - a))."""

from __future__ import annotations

import pytest
import json

from cli_cases import refused, run_cli
from plan_cases import make_bench, make_runs, uniform_trace

from moespec import MoespecError, theory
from moespec.formats.planfile import load_plan
from moespec.predict.batch_map import NotPositive, b_stop, batch_block, batch_entry
from moespec.predict.plan import build_plan

KMAX = 4
NS = range(1, KMAX + 2)
GROWTH = {1: 0.05, 2: 0.25, 4: 0.55, 8: 1.0}  # c per batch size: the first drafted token's price grows with B
A = [float(a) for a in theory.PAPER_ACCEPTANCES]
# fits (4) and (E.1) of known coefficients (bench.json's fits.{layer}.{kernel})
FITS = {"slot": {"t_op_s": 1e-4, "c_u_s_per_byte": 2e-11, "c_re_s_per_byte": 1e-11},
        "dedup": {"t_op_s": 2e-4, "c_g_s_per_byte": 1.5e-11, "c_t_s_per_token": 3e-4}}


def per_n(c: float, scale: float = 1.0) -> dict[str, float]:
    return {str(n): scale * (1 + c * (n - 1)) for n in NS}


def verify(c: float, dedup_from: int) -> dict:
    """slot 1 + c (n - 1); dedup 0.1% slower below n = dedup_from and 0.1% faster from it."""
    slot = per_n(c)
    return {"slot": slot, "dedup": {n: t * (0.999 if int(n) >= dedup_from else 1.001) for n, t in slot.items()}}


def runs_doc() -> dict:
    crossovers = {2: 2, 4: 3, 8: 5}
    batch = {"batches": [2, 4, 8], "per_batch": {str(b): {"verify_time_s": verify(GROWTH[b], crossovers[b]),
                                                          "throughput": []} for b in (2, 4, 8)}}
    return make_runs(verify_time_s=verify(GROWTH[1], 4), batch=batch)


def test_the_batch_block_by_hand():
    block = batch_block(runs_doc(), "runs.json", [1, 2, 4, 8], KMAX, [0.0] * (KMAX + 1))
    assert block["batches"] == [1, 2, 4, 8] and block["acceptances"] == A and block["policy"] == "auto"
    per = block["per_batch"]
    assert [per[str(b)]["crossover"] for b in (1, 2, 4, 8)] == [4, 2, 3, 5]
    assert per["4"]["kernel_by_n"] == {"1": "slot", "2": "slot", "3": "dedup", "4": "dedup", "5": "dedup"}
    for b in (1, 2, 4, 8):
        V = per[str(b)]["step_time_s"]["auto"]
        auto = per[str(b)]["kernel_by_n"]
        assert V == pytest.approx([verify(GROWTH[b], per[str(b)]["crossover"])[auto[str(k + 1)]][str(k + 1)]
                                   for k in range(KMAX + 1)])
        for i, a in enumerate(A):
            k = per[str(b)]["k_hat"][i]
            assert (k == 0) == (a < GROWTH[b]), (b, a)  # no acceptance within dedup's 0.1% of a c
            assert per[str(b)]["tokens_per_s"][i] == pytest.approx(b * theory.throughput(V, a, k))
            assert per[str(b)]["speedup"][i] == pytest.approx(theory.speedup(V, a, k))
    # B_stop: the first B of the grid whose c reaches a
    assert block["b_stop"] == [next((b for b in (1, 2, 4, 8) if a < GROWTH[b]), None) for a in A]
    assert block["b_stop"][:4] == [2, 4, 4, 4] and block["b_stop"][-1] == 8  # a = 0.2 stops at B = 2


def test_b_stop_and_entry_rules():
    # no draft from B = 4; none from B = 1 on; a draft that pays again at B = 4 leaves no B from which none pays
    assert b_stop([1, 2, 4], {1: [2, 0, 1], 2: [1, 0, 0], 4: [0, 0, 3]}, 3) == [4, 1, None]
    assert b_stop([1, 2, 4, 8], {1: [0, 0], 2: [0, 1], 4: [0, 0], 8: [0, None]}, 2) == [1, None]  # None drafts
    entry = batch_entry({"slot": [1.0, 1.1], "dedup": [1.0, 1.0]}, [0.5, 0.5], 2, [0.5])
    assert entry["kernel_by_n"] == {"1": "slot", "2": "dedup"} and entry["step_time_s"]["auto"] == [1.5, 1.5]


def test_a_plan_carries_its_batch_block_and_refuses_missing_batches():
    trace = uniform_trace()
    plan = build_plan(make_bench(), trace, runs=make_runs(), draft_time=[0.0] * 9)
    assert "batch" not in plan  # only a plan asked for batches holds one
    with pytest.raises(MoespecError, match="no verify times at batch 16"):
        batch_block(runs_doc(), "runs.json", [1, 16], KMAX, [0.0] * (KMAX + 1))
    with pytest.raises(MoespecError, match="n = 6"):
        batch_block(runs_doc(), "runs.json", [1, 2], KMAX + 1, [0.0] * (KMAX + 2))


@pytest.mark.parametrize("batches, h, match", [([], [0.0] * 5, "batches"), ([2, 1], [0.0] * 5, "batches"),
                                               ([0], [0.0] * 5, "batches"), ([1], [0.0], "h must")])
def test_bad_arguments(batches, h, match):
    with pytest.raises(ValueError, match=match):
        batch_block(runs_doc(), "runs.json", batches, KMAX, h)


def test_plan_batch_on_the_command_line(tmp_path, capsys):
    paths = {name: tmp_path / f"{name}.json" for name in ("bench", "runs", "partial")}
    paths["bench"].write_text(json.dumps(make_bench()))
    paths["runs"].write_text(json.dumps(runs_doc()))
    paths["partial"].write_text(json.dumps(make_runs()))
    uniform_trace().save(tmp_path / "trace.npz")
    common = ["plan", "--bench", paths["bench"], "--trace", tmp_path / "trace.npz", "--kmax", KMAX]
    code, err = run_cli([*common, "--runs", paths["runs"], "--batch", "1,2,4,8", "--out", tmp_path / "plan.json"])
    assert code == 0, err
    block = load_plan(tmp_path / "plan.json")["batch"]
    assert block.pop("predicted") is None  # hand-made runs without outside times: no prediction to anchor
    expected = batch_block(runs_doc(), str(paths["runs"]), [1, 2, 4, 8], KMAX, [0.0] * (KMAX + 1))
    assert expected.pop("predicted") is None and block == json.loads(json.dumps(expected))
    assert "--runs" in refused([*common, "--batch", "1,2"], capsys, tmp_path)
    assert "batch 2" in refused([*common, "--runs", paths["partial"], "--batch", "1,2"], capsys, tmp_path)
    for bad in ("0", "1,x", "2000"):
        assert "--batch" in refused([*common, "--runs", paths["runs"], "--batch", bad], capsys, tmp_path)


def test_the_prediction_from_the_bench_by_hand():
    """(22)'s whole pass at B n tokens: the fits at (B n, U^B(n)) of the trace, the outside line, the one-token
    anchor; checked against the formula written out with the trace's own unions."""
    from moespec.predict.batch_map import predicted_block, predicted_times
    from moespec.routing.batch import batch_union

    trace = uniform_trace()
    b, m, scale = 12_582_912.0, trace.m, 8.0
    bench = {"fits": {"7": FITS}, "layers": [7], "expert_bytes": {"7": b}}
    outside = {str(n): 0.01 + 0.002 * n for n in NS}
    runs = make_runs(verify_time_s={"slot": per_n(0.1), "dedup": per_n(0.1), "outside": outside})
    found = batch_union(trace, [1, 4], KMAX + 1)
    times = predicted_times(bench, found, runs, "runs.json", KMAX, scale)
    union = found.union
    anchor = scale * (1e-4 + 2e-11 * m * b)
    for B in (1, 4):
        for n in NS:
            T, U = B * n, union[B][7, n]
            slot = 1.0 + 0.002 * (T - 1) + scale * (1e-4 + 2e-11 * U * b + 1e-11 * (T * m - U) * b) - anchor
            dedup = 1.0 + 0.002 * (T - 1) + scale * (2e-4 + 1.5e-11 * U * b + 3e-4 * T) - anchor
            assert times[B]["slot"][n - 1] == pytest.approx(slot) and times[B]["dedup"][n - 1] == pytest.approx(dedup)
    block = predicted_block(bench, trace, runs, "runs.json", [1, 4], KMAX, [0.0] * (KMAX + 1), scale)
    assert set(block["per_batch"]) == {"1", "4"} and len(block["b_stop"]) == len(A)
    stalled = make_runs(verify_time_s={"slot": per_n(0.1), "dedup": per_n(0.1),
                                       "outside": {str(n): 5.0 if n == 1 else 0.01 for n in NS}})
    with pytest.raises(NotPositive, match="not positive"):  # the one error make_plan turns into a verdict line
        predicted_block(bench, trace, stalled, "runs.json", [1, 4], KMAX, [0.0] * (KMAX + 1), scale)
    with pytest.raises(MoespecError, match="outside the expert operation") as other:
        predicted_times(bench, found, make_runs(), "runs.json", KMAX, scale)
    assert not isinstance(other.value, NotPositive)  # every other error still refuses the plan
    from moespec.predict.batch_map import predictable
    assert predictable(bench, runs, KMAX)  # the anchors and a fit of both kernels at every timed layer
    assert not predictable({**bench, "fits": {"7": {**FITS, "dedup": None}}}, runs, KMAX)  # a kernel with no fit
    assert not predictable(bench, make_runs(), KMAX)  # no outside times


# a two-layer bench of known fits for rule (7) at batch B: dedup's negative t_op makes its time at one token negative
RATIO_FITS = {"slot": {"t_op_s": 1e-4, "c_u_s_per_byte": 2e-11, "c_re_s_per_byte": 1e-11},
              "dedup": {"t_op_s": -3e-4, "c_g_s_per_byte": 1.5e-11, "c_t_s_per_token": 1e-4}}
RATIO_BYTES = {0: 1e6, 1: 3e6}


def two_layer_trace(tokens: int = 40, m: int = 2):
    """Layer 0 routes every token to the same m experts (U_0^B(n) = m); layer 1 gives each token m experts no other
    token selects (U_1^B(n) = B n m): both unions known by hand, one document."""
    import numpy as np
    from moespec.formats.trace import Trace

    experts = np.zeros((tokens, 2, m), dtype=np.int64)
    experts[:, 0] = np.arange(m)
    experts[:, 1] = np.arange(tokens * m).reshape(tokens, m)
    return Trace.from_arrays(experts, [0, tokens], tokens * m)


def test_union_share_and_r_at_batch_by_hand():
    """u_B(n) = Σ_l w_l U_l^B(n) / (B n m Σ_l w_l) and r(B n) = (E_dedup / M_dedup) / (E_slot / M_slot) with each
    kernel's fit summed over the timed layers at the pass's B n tokens; null where a fitted time is not positive."""
    from moespec.predict.batch_map import byte_ratios, expert_times, predicted_block
    from moespec.routing.batch import batch_union

    trace, m = two_layer_trace(), 2
    bench = {"fits": {str(layer): RATIO_FITS for layer in RATIO_BYTES}, "layers": list(RATIO_BYTES),
             "expert_bytes": {str(layer): w for layer, w in RATIO_BYTES.items()}}
    union = batch_union(trace, [1, 2, 4], KMAX + 1)
    w0, w1 = RATIO_BYTES[0], RATIO_BYTES[1]
    for B in (1, 2, 4):
        found = byte_ratios(bench, union, B, KMAX)
        assert len(found["union_share"]) == len(found["r"]) == KMAX + 1
        for n in NS:
            T, U = B * n, {0: m, 1: B * n * m}
            assert found["union_share"][n - 1] == pytest.approx((w0 * m + w1 * T * m) / (T * m * (w0 + w1)))
            slot = sum(1e-4 + 2e-11 * U[l] * w + 1e-11 * (T * m - U[l]) * w for l, w in RATIO_BYTES.items())
            dedup = sum(-3e-4 + 1.5e-11 * U[l] * w + 1e-4 * T for l, w in RATIO_BYTES.items())
            assert expert_times(bench, union, B, KMAX)["dedup"][n - 1] == pytest.approx(dedup)
            e_dedup, e_slot = w0 * U[0] + w1 * U[1], T * m * (w0 + w1)
            expected = (e_dedup / dedup) / (e_slot / slot) if dedup > 0 else None
            assert found["r"][n - 1] == pytest.approx(expected), (B, n)
    # r at the pass's B n tokens: one token's dedup time is negative, two tokens' (B = 2, n = 1) is not
    assert byte_ratios(bench, union, 1, KMAX)["r"][0] is None and byte_ratios(bench, union, 2, KMAX)["r"][0] > 0
    runs = make_runs(verify_time_s={"slot": per_n(0.1), "dedup": per_n(0.1),
                                    "outside": {str(n): 0.01 for n in NS}})
    block = predicted_block(bench, trace, runs, "runs.json", [1, 2, 4], KMAX, [0.0] * (KMAX + 1), 1.0)
    for B in (1, 2, 4):
        entry = block["per_batch"][str(B)]
        assert {"union_share": entry["union_share"], "r": entry["r"]} == byte_ratios(bench, union, B, KMAX)
    for bad in ({"batch": 3}, {"kmax": KMAX + 1}, {"kmax": 0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            byte_ratios(bench, union, **{"batch": 1, "kmax": KMAX, **bad})


def test_union_share_at_batch_one_is_the_plans_u_and_falls_with_b():
    """At B = 1 u_B(n) is the plan's batch-one u(n) when the timed layers route as the others (every layer of this
    trace routes alike); at fixed n, u_B(n) does not rise with B (U^B / B falls: one more window adds no more new
    experts than the one before it)."""
    import numpy as np
    from moespec.formats.trace import Trace
    from moespec.predict.batch_map import byte_ratios
    from moespec.routing.batch import batch_union

    uniform = uniform_trace()
    alike = np.repeat(uniform.experts[:, :1], uniform.num_layers, axis=1)
    trace = Trace.from_arrays(alike, uniform.doc_starts, uniform.num_experts, meta={"model": "olmoe-1b-7b"})
    bench = make_bench()
    plan = build_plan(bench, trace, kmax=KMAX, runs=make_runs(), draft_time=[0.0] * (KMAX + 1))
    timed = {str(layer): 12_582_912.0 for layer in bench["layers"]}
    bench |= {"fits": {layer: RATIO_FITS for layer in timed}, "expert_bytes": timed}
    union = batch_union(trace, [1, 2, 4, 8], KMAX + 1)
    share = {B: byte_ratios(bench, union, B, KMAX)["union_share"] for B in (1, 2, 4, 8)}
    assert share[1][0] == pytest.approx(1.0)  # one token reads its m experts with either kernel
    assert share[1][1:] == pytest.approx([plan["saving"][str(n)]["u"] for n in NS if n > 1])
    for n in NS:
        assert all(share[a][n - 1] >= share[b][n - 1] - 1e-12 for a, b in ((1, 2), (2, 4), (4, 8))), n
    assert share[8][-1] < share[1][-1]  # a uniform trace's windows overlap: strictly


def with_ratios(block: dict, share: list, r: list) -> dict:
    """The batch block with a prediction (the measured map's entries) holding `share` and `r` at every B."""
    return block | {"predicted": {"per_batch": {b: e | {"union_share": share, "r": r}
                                                for b, e in block["per_batch"].items()}, "b_stop": block["b_stop"]}}


def test_the_plan_loader_checks_union_share_and_r(tmp_path):
    """Older plans lack the keys and load; present, they must list kmax + 1 ratios >= 0 (r: or null), together."""
    plan = build_plan(make_bench(), uniform_trace(), kmax=KMAX, runs=make_runs(), draft_time=[0.0] * (KMAX + 1))
    block = batch_block(runs_doc(), "runs.json", [1, 2], KMAX, [0.0] * (KMAX + 1))
    good_share, good_r = [1.0, 0.8, 0.6, 0.5, 0.4], [None, 0.7, 0.7, 0.7, 0.7]
    path = tmp_path / "plan.json"
    for predicted, problem in [(block | {"predicted": None}, None), (with_ratios(block, good_share, good_r), None),
                               (with_ratios(block, good_share[:-1], good_r), "union_share must give"),
                               (with_ratios(block, good_share, [*good_r[:-1], -0.1]), "r must give"),
                               (with_ratios(block, good_share, [*good_r[:-1], "0.7"]), "r must give"),
                               (with_ratios(block, [None, *good_share[1:]], good_r), "union_share must give")]:
        path.write_text(json.dumps(plan | {"batch": predicted}))
        if problem is None:
            assert load_plan(path)["batch"] == json.loads(json.dumps(predicted))
        else:
            with pytest.raises(MoespecError, match=f"batch.predicted.per_batch.1.{problem}"):
                load_plan(path)
    alone = with_ratios(block, good_share, good_r)
    del alone["predicted"]["per_batch"]["2"]["r"]
    path.write_text(json.dumps(plan | {"batch": alone}))
    with pytest.raises(MoespecError, match="union_share and r come together"):
        load_plan(path)


def test_a_prediction_not_positive_is_left_out_and_said(tmp_path, capsys):
    """An outside time at n = 1 far above the rest (one stalled sample) tilts the outside line below zero at B n
    tokens: the plan keeps its measured map, holds no prediction, and its verdict names the batch, n and times."""
    runs = runs_doc()
    runs["verify_time_s"]["outside"] = {str(n): 5.0 if n == 1 else 0.01 for n in NS}
    paths = {name: tmp_path / f"{name}.json" for name in ("bench", "runs")}
    bench = make_bench()
    bench["fits"] = {str(layer): FITS for layer in bench["layers"]}
    paths["bench"].write_text(json.dumps({k: v for k, v in bench.items() if k != "expert_bytes"}))
    paths["runs"].write_text(json.dumps(runs))
    uniform_trace().save(tmp_path / "trace.npz")
    args = ["plan", "--bench", paths["bench"], "--trace", tmp_path / "trace.npz", "--kmax", KMAX,
            "--runs", paths["runs"], "--batch", "1,2,4,8", "--out", tmp_path / "plan.json"]
    assert "bench.json: missing key 'expert_bytes'" in refused(args, capsys, tmp_path)  # what the fits read
    paths["bench"].write_text(json.dumps(bench))
    code, err = run_cli(args)
    assert code == 0, err
    plan = load_plan(tmp_path / "plan.json")
    measured = batch_block(runs_doc(), "runs.json", [1, 2, 4, 8], KMAX, [0.0] * (KMAX + 1))
    assert plan["batch"]["predicted"] is None and plan["batch"]["b_stop"] == measured["b_stop"]
    [line] = [w for w in plan["verdict"]["warnings"] if "prediction is left out" in w]
    assert "a predicted batch verify time is not positive" in line and "at B = 8, n = 5" in line and "5000.0" in line
    runs["verify_time_s"]["outside"] = {str(n): 0.01 * n for n in NS}  # a line that grows: the prediction is made
    paths["runs"].write_text(json.dumps(runs))
    code, err = run_cli(["plan", "--bench", paths["bench"], "--trace", tmp_path / "trace.npz", "--kmax", KMAX,
                         "--runs", paths["runs"], "--batch", "1,2", "--out", tmp_path / "kept.json"])
    assert code == 0, err
    assert load_plan(tmp_path / "kept.json")["batch"]["predicted"]["per_batch"].keys() == {"1", "2"}

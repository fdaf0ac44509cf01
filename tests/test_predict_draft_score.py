"""moespec.predict.draft_score: runs drafted by a real draft model are scored at the acceptance the draft measured:
the pooled per-position rate (weights steps x k), or its per-position profile (the longest-drafting cell's, gaps
filled), read against the plan's step times of the version: k_hat* (geometric (9) or profile), the measured k*
(smallest on ties), the loss at k_hat*, and the band (21) of the planned speedup. Hand-computed values."""

from __future__ import annotations

import pytest

from moespec import MoespecError
from moespec.predict.draft_score import draft_model_rows, measured_profile, pooled_acceptance


def test_pooled_acceptance_weights_each_cell_by_the_positions_it_tested() -> None:
    rows = [{"k": 2, "steps": 10, "realized_acceptance": 0.5},  # 20 positions
            {"k": 4, "steps": 5, "realized_acceptance": 0.8},  # 20 positions
            {"k": 0, "steps": 100, "realized_acceptance": None}]  # plain decoding tests none
    assert pooled_acceptance(rows) == pytest.approx(0.65, rel=1e-15)
    rows.append({"k": 1, "steps": 60, "realized_acceptance": 0.2})  # 60 more: (10 + 16 + 12)/100
    assert pooled_acceptance(rows) == pytest.approx(0.38, rel=1e-15)
    rows.append({"k": 3, "steps": 7, "realized_acceptance": None})  # a cell without a rate is left out
    assert pooled_acceptance(rows) == pytest.approx(0.38, rel=1e-15)


def test_pooled_acceptance_of_no_drafting_is_none() -> None:
    assert pooled_acceptance([]) is None
    assert pooled_acceptance([{"k": 0, "steps": 10, "realized_acceptance": 0.9}]) is None
    assert pooled_acceptance([{"k": 3, "steps": 0, "realized_acceptance": 0.9}]) is None  # no step: no weight
    assert pooled_acceptance([{"k": 3, "steps": 5, "realized_acceptance": None}]) is None


def test_measured_profile_of_the_longest_drafting_cell() -> None:
    rows = [{"k": 2, "acceptance_profile": [0.9, 0.8]},
            {"k": 4, "acceptance_profile": [None, 0.7, None, 0.5]},
            {"k": 1, "acceptance_profile": [0.99]}]
    # the k = 4 cell's profile; a leading gap takes the first tested value, a later gap the last one before it,
    # and positions past the cell's length the last tested one
    assert measured_profile(rows, 6) == [0.7, 0.7, 0.7, 0.5, 0.5, 0.5]
    assert measured_profile(rows, 4) == [0.7, 0.7, 0.7, 0.5]
    assert measured_profile(rows, 2) == [0.7, 0.7]  # cut to kmax before the gaps are filled


def test_measured_profile_absent() -> None:
    assert measured_profile([], 3) is None
    assert measured_profile([{"k": 2}, {"k": 3, "acceptance_profile": []}], 3) is None  # older files: no profile
    assert measured_profile([{"k": 2, "acceptance_profile": [None, None]}], 2) is None  # nothing tested
    # a shorter cell's profile is used where the longest has none
    assert measured_profile([{"k": 5}, {"k": 2, "acceptance_profile": [0.6, 0.4]}], 3) == [0.6, 0.4, 0.4]


# A plan's step times (kmax = 2) and step-time deltas, per version.
PLAN = {"step_times": {"slot": [1.0, 1.2, 1.5], "dedup": [1.0, 1.1, 1.3]},
        "delta_steps": {"prediction": {"slot": 0.05, "dedup": None}, "calibrated": {"slot": 0.1, "dedup": 0.02}},
        "step_times_calibrated": {"slot": [1.0, 1.2, 1.5], "dedup": [1.0, 1.1, 1.3]}}


def _row(policy: str, k: int, tokens: float, steps: int, a: float | None, profile: list | None = None) -> dict:
    row = {"policy": policy, "k": k, "tokens_per_s": tokens, "steps": steps, "realized_acceptance": a}
    return row if profile is None else row | {"acceptance_profile": profile}


SLOT_ROWS = [_row("slot", 0, 10.0, 100, None), _row("slot", 1, 14.0, 50, 0.6), _row("slot", 2, 13.0, 40, 0.7)]
DEDUP_ROWS = [_row("dedup", 0, 10.0, 100, None), _row("dedup", 1, 15.0, 40, 0.9, [0.9]),
              _row("dedup", 2, 14.0, 30, 0.55, [0.9, 0.2])]


def test_geometric_row_at_the_pooled_acceptance() -> None:
    out = draft_model_rows(PLAN, {"throughput_draft_model": SLOT_ROWS}, "runs.json", "table", "prediction", 0.0)
    assert list(out) == ["slot"]
    (row,) = out["slot"]
    a = (0.6 * 50 + 0.7 * 80) / 130  # 43/65
    # V = (1, 1.2, 1.5): T = (1, 1.6615/1.2 = 1.3846, (1 + a + a^2)/1.5 = 1.3994): k_hat* = 2
    G2 = 1 + a + a * a
    planned = G2 * 1.0 / 1.5  # (9)
    assert row["a"] == pytest.approx(a, rel=1e-15) and row["profile"] is None
    assert row["k_hat"] == 2 and row["k_star"] == 1  # measured best: 14 tokens/s at k = 1
    assert row["loss"] == pytest.approx(1 / 14, rel=1e-12)  # 1 - 13/14
    assert row["speedup"] == pytest.approx(1.4, rel=1e-15)  # 14/10, the measured best speedup
    assert row["lo"] == pytest.approx(planned * 0.95 / 1.05, rel=1e-12)  # (21), delta = 0.05
    assert row["hi"] == pytest.approx(planned * 1.05 / 0.95, rel=1e-12)
    assert row["inside"] is True


def test_profile_row_and_a_policy_without_band() -> None:
    out = draft_model_rows(PLAN, {"throughput_draft_model": DEDUP_ROWS}, "runs.json", "table", "prediction", 0.0)
    (row,) = out["dedup"]
    # profile (0.9, 0.2): G(1) = 1.9, G(2) = 2.08; V = (1, 1.1, 1.3): T = (1, 1.727, 1.6): k_hat* = 1, whereas the
    # pooled rate 0.69 alone (geometric) would give T(2) = 2.1661/1.3 = 1.666 > T(1) = 1.536: k = 2
    assert row["profile"] == [0.9, 0.2]
    assert row["a"] == pytest.approx((0.9 * 40 + 0.55 * 60) / 100, rel=1e-15)
    assert row["k_hat"] == 1 and row["k_star"] == 1 and row["loss"] == 0.0
    assert row["speedup"] == pytest.approx(1.5, rel=1e-15)
    assert row["lo"] is None and row["hi"] is None and row["inside"] is None  # delta None: no band (21)


def test_calibrated_version_reads_its_own_keys() -> None:
    runs = {"throughput_draft_model": DEDUP_ROWS + SLOT_ROWS}
    out = draft_model_rows(PLAN, runs, "runs.json", "table_calibrated", "calibrated", 0.0)
    assert set(out) == {"slot", "dedup"}
    planned = 1.9 / 1.1
    assert out["dedup"][0]["lo"] == pytest.approx(planned * 0.98 / 1.02, rel=1e-12)  # delta 0.02
    assert out["dedup"][0]["hi"] == pytest.approx(planned * 1.02 / 0.98, rel=1e-12)
    assert out["dedup"][0]["inside"] is False  # 1.5 lies below 1.727 x 0.98/1.02 = 1.659
    with pytest.raises(MoespecError, match="step_times_whole_pass"):
        draft_model_rows(PLAN, runs, "runs.json", "table_whole_pass", "whole-pass", 0.0)


def test_slack_widens_the_band() -> None:
    rows = [*SLOT_ROWS[:1], _row("slot", 1, 16.5, 50, 0.6), SLOT_ROWS[2]]
    runs = {"throughput_draft_model": rows}
    a = (0.6 * 50 + 0.7 * 80) / 130
    hi = (1 + a + a * a) / 1.5 * 1.05 / 0.95  # 1.5468; the measured best speedup is 1.65
    assert draft_model_rows(PLAN, runs, "runs.json", "table", "prediction", 0.0)["slot"][0]["inside"] is False
    assert draft_model_rows(PLAN, runs, "runs.json", "table", "prediction", 1.65 - hi + 1e-9)["slot"][0]["inside"]
    assert not draft_model_rows(PLAN, runs, "runs.json", "table", "prediction", 1.65 - hi - 1e-9)["slot"][0]["inside"]


def test_measured_best_is_the_smallest_k_on_ties() -> None:
    rows = [_row("slot", 0, 10.0, 100, None), _row("slot", 1, 14.0, 50, 0.7), _row("slot", 2, 14.0, 40, 0.7)]
    (row,) = draft_model_rows(PLAN, {"throughput_draft_model": rows}, "r", "table", "prediction", 0.0)["slot"]
    # a = 0.7: T = (1, 1.7/1.2 = 1.417, 2.19/1.5 = 1.46): k_hat* = 2; measured tie 14 = 14: k* = 1, no loss
    assert row["k_hat"] == 2 and row["k_star"] == 1 and row["loss"] == 0.0


def test_policies_the_plan_lacks_or_without_plain_decoding_are_left_out() -> None:
    rows = SLOT_ROWS + [_row("auto", 0, 9.0, 10, None), _row("auto", 1, 12.0, 10, 0.5)]  # no auto in the plan
    rows += [_row("dedup", 1, 12.0, 10, 0.5)]  # dedup has no k = 0 cell: no speedup to score
    out = draft_model_rows(PLAN, {"throughput_draft_model": rows}, "runs.json", "table", "prediction", 0.0)
    assert list(out) == ["slot"]


def test_refusals() -> None:
    with pytest.raises(MoespecError, match="runs.json: no draft-model throughput row matches a policy of the plan"):
        draft_model_rows(PLAN, {"throughput_draft_model": [_row("auto", 0, 9.0, 10, None)]}, "runs.json", "table",
                         "prediction", 0.0)
    # a = 0.7 on V_slot gives k_hat* = 2, a draft length the runs never drafted
    rows = [_row("slot", 0, 10.0, 100, None), _row("slot", 1, 14.0, 50, 0.7)]
    with pytest.raises(MoespecError, match=r"runs.json: no draft-model throughput for policy slot at the plan's "
                                           r"k_hat\* = 2 \(a = 0\.700\)"):
        draft_model_rows(PLAN, {"throughput_draft_model": rows}, "runs.json", "table", "prediction", 0.0)
    with pytest.raises(MoespecError, match="throughput_draft_model"):
        draft_model_rows(PLAN, {}, "runs.json", "table", "prediction", 0.0)
    with pytest.raises(MoespecError, match="delta_steps.whole-pass"):
        draft_model_rows(PLAN, {"throughput_draft_model": SLOT_ROWS}, "runs.json", "table", "whole-pass", 0.0)

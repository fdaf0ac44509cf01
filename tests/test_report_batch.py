"""moespec.report.batch: the batch map's table, crossovers and figure, with the measured best k and the batch rules
where the runs measured at batch."""

from __future__ import annotations

from test_predict_batch_map import KMAX, runs_doc, with_ratios

from moespec.predict.batch_map import batch_block
from moespec.report.batch import batch_section


def test_the_batch_section_shows_the_map_and_b_stop():
    runs = runs_doc()
    plan = {"batch": batch_block(runs, "runs.json", [1, 2, 4, 8], KMAX, [0.0] * (KMAX + 1)),
            "draft_time_s": [0.0] * (KMAX + 1)}
    html = batch_section(plan, None)
    assert "<th>B = 8</th>" in html and "B_stop" in html and "data:image/png;base64" in html
    assert "<td>0.2</td><td>1</td><td>0</td><td>0</td><td>0</td><td>2</td>" in html  # a = 0.2 stops at B = 2
    assert "measured best" not in html  # no run at batch: the plan's map alone
    best = {1: 1, 2: 0, 4: 0, 8: 0}
    for b, entry in [(1, runs)] + [(b, runs["batch"]["per_batch"][str(b)]) for b in (2, 4, 8)]:
        entry["throughput"] = [{"policy": "auto", "k": k, "a": a, "step_time_s": 1.0, "tokens_per_s": 5.0 - abs(
            k - best[b]), "counted_tokens_per_s": 1.0, "steps": 1, "greedy_exact": True} for a in
            plan["batch"]["acceptances"] for k in range(KMAX + 1)]
        entry["crossover"] = plan["batch"]["per_batch"][str(b)]["crossover"]
    html = batch_section(plan, runs)
    assert "<td>0.2</td><td>1 / 1</td><td>0 / 0</td>" in html and "B_stop within one grid step" in html
    # Table 8's rules at each B: the run's verify times are the plan's (0% off); no saving, so no sign to score
    assert "B = 2: k_hat " in html and "verify_time 0.0% (holds)" in html and "saving_sign n/a," in html


def test_the_prediction_shows_beside_the_measured_map():
    runs = runs_doc()
    block = batch_block(runs, "runs.json", [1, 2], KMAX, [0.0] * (KMAX + 1))
    predicted = {"per_batch": {b: dict(e, k_hat=[k + 1 for k in e["k_hat"]]) for b, e in block["per_batch"].items()},
                 "b_stop": [None] * len(block["acceptances"])}
    html = batch_section({"batch": block | {"predicted": predicted}}, None)
    assert "<td>0.2</td><td>1 [2]</td><td>0 [1]</td><td>2 [-]</td>" in html
    assert "predicted V_B(kmax) error" in html and "<td>+0.0%</td>" in html
    # a plan from before u_B and r: the section renders without their figure and table
    assert html.count("data:image/png;base64") == 1 and "dedup faster from n" not in html


def test_u_b_against_r_shows_where_the_prediction_holds_them():
    block = batch_block(runs_doc(), "runs.json", [1, 2], KMAX, [0.0] * (KMAX + 1))
    block = with_ratios(block, [1.0, 0.8, 0.6, 0.5, 0.4], [None, 0.7, 0.7, 0.7, 0.7])
    block["predicted"]["per_batch"]["2"] |= {"union_share": [0.9, 0.75, 0.72, 0.71, 0.69],
                                             "r": [0.5, 0.7, 0.7, 0.7, 0.7]}
    html = batch_section({"batch": block}, None)
    assert html.count("data:image/png;base64") == 2 and "u_B(n) (solid) against r(B n) (dashed)" in html
    assert "<th>dedup faster from n</th><th>n = 1</th>" in html
    # B = 1: u < r from n = 3 (r not evaluated at n = 1); B = 2: only at n = 5, after 0.72 and 0.71 >= 0.7
    assert "<td>1</td><td>3</td><td>1.000 / -</td><td>0.800 &gt;= 0.700</td><td>0.600 &lt; 0.700</td>" in html
    assert "<td>2</td><td>5</td><td>0.900 &gt;= 0.500</td>" in html and "<td>0.690 &lt; 0.700</td>" in html

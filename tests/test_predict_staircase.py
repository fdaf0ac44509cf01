"""moespec.predict.staircase: analyse() reports a0 (B.4), the step points (B.31) exactly where rational and as
certified brackets, k*(0), the staircase as intervals, and per acceptance k*(a), the speedup (9) and whether
speculation helps (B.3); for_llama_cpp() turns each interval into llama.cpp's flags. Hand-computed values."""

from __future__ import annotations

import json
from fractions import Fraction as F

import pytest

from moespec.predict.staircase import LLAMA_CPP_FLAGS, LLAMA_CPP_PLAIN, analyse, for_llama_cpp

# V = (4, 5, 7), convex: c_1 = 1, c_2 = 2.
#   a0 = 5/4 - 1 = 1/4 (B.4); a_1 = min(alpha_{1,0}, alpha_{2,0}) = min(1/4, 1/2) = 1/4, where alpha_{2,0} solves
#   4 (1 + a + a^2) = 7, i.e. (2a + 3)(2a - 1) = 0; a_2 = max(alpha_{2,0}, alpha_{2,1}) = (1 + sqrt 11)/5, where
#   alpha_{2,1} solves (1 + a + a^2)/7 = (1 + a)/5, i.e. 5a^2 - 2a - 2 = 0: irrational.
V = [F(4), F(5), F(7)]
A2 = (1 + 11**0.5) / 5
ACCEPTANCES = [F(1, 5), F(1, 4), F(1, 2), F(9, 10)]


@pytest.fixture(scope="module")
def doc() -> dict:
    return analyse(V, ACCEPTANCES)


def test_step_times_threshold_and_step_points(doc: dict) -> None:
    assert doc["step_times"] == [4.0, 5.0, 7.0]
    assert doc["a0"] == 0.25
    assert doc["step_points"][0] == 0.25 and doc["step_points"][1] == pytest.approx(A2, abs=1e-14)
    assert doc["step_points_exact"] == ["1/4", None]  # a_2 is irrational: no exact value
    (lo1, hi1), (lo2, hi2) = doc["step_brackets"]
    assert lo1 == hi1 == 0.25
    assert lo2 <= A2 <= hi2 and 0 < hi2 - lo2 <= 2**-49


def test_staircase_intervals(doc: dict) -> None:
    assert doc["k_star_at_zero"] == 0
    assert [row["k"] for row in doc["intervals"]] == [0, 1, 2]
    ends = [x for row in doc["intervals"] for x in (row["from"], row["to"])]
    assert ends == pytest.approx([0.0, 0.25, 0.25, A2, A2, 1.0], abs=1e-14)


def test_table_per_acceptance(doc: dict) -> None:
    # a = 1/5: T = (1/4, (6/5)/5, (31/25)/7) = (0.25, 0.24, 0.177): k* = 0
    # a = 1/4: T_a(1) = (5/4)/5 = 1/4 = T_a(0), an exact tie at a = a0: the smaller k, and (8) is strict
    # a = 1/2: T = (0.25, 0.3, 0.25): k* = 1, speedup (3/2) 4/5 = 6/5
    # a = 9/10: T = (0.25, 0.38, 2.71/7 = 0.387): k* = 2, speedup 2.71 x 4/7
    assert doc["table"] == [
        {"a": 0.2, "k_star": 0, "speedup": 1.0, "helps": False},
        {"a": 0.25, "k_star": 0, "speedup": 1.0, "helps": False},
        {"a": 0.5, "k_star": 1, "speedup": 1.2, "helps": True},
        {"a": 0.9, "k_star": 2, "speedup": pytest.approx(2.71 * 4 / 7, rel=1e-15), "helps": True},
    ]
    assert doc["helps_at"] == [0.5, 0.9]


def test_the_document_is_plain_json(doc: dict) -> None:
    assert json.loads(json.dumps(doc)) == doc


def test_no_acceptance_reaches_one_draft() -> None:
    # V(1) >= 2 V(0): T_a(1) = (1 + a)/3 < 1 for every a < 1, so a_1 = 1 and k* = 0 everywhere; a0 = 2 lies
    # outside [0, 1)
    doc = analyse([F(1), F(3)], [F(1, 2), F(98, 100)])
    assert doc["a0"] == 2.0
    assert doc["step_points"] == [1.0] and doc["step_points_exact"] == ["1"] and doc["step_brackets"] == [[1.0, 1.0]]
    assert doc["intervals"] == [{"k": 0, "from": 0.0, "to": 1.0}]
    assert [row["k_star"] for row in doc["table"]] == [0, 0] and doc["helps_at"] == []


def test_a_faster_first_draft_and_a_jump() -> None:
    # V = (2, 1, 3): one draft is faster than none at every a (a0 = -1/2); k*(0) = 1, the smallest argmin of V;
    # two drafts never pay (alpha_{2,1} = 1): k* = 1 on (0, 1]
    doc = analyse([F(2), F(1), F(3)], [F(0), F(1, 2)])
    assert doc["a0"] == -0.5 and doc["k_star_at_zero"] == 1
    assert doc["step_points_exact"] == ["0", "1"]
    assert doc["intervals"] == [{"k": 1, "from": 0.0, "to": 1.0}]
    assert doc["table"] == [{"a": 0.0, "k_star": 1, "speedup": 2.0, "helps": True},
                            {"a": 0.5, "k_star": 1, "speedup": 3.0, "helps": True}]
    # V = (1, 2, 2) (Appendix B.3): k* jumps from 0 to 2 at (sqrt 5 - 1)/2, and k = 1 has no interval
    doc = analyse([F(1), F(2), F(2)], [F(1, 2), F(9, 10)])
    assert [row["k"] for row in doc["intervals"]] == [0, 2]
    assert doc["intervals"][0]["to"] == pytest.approx((5**0.5 - 1) / 2, abs=1e-14)
    assert [row["k_star"] for row in doc["table"]] == [0, 2]


def test_rational_step_point_with_a_large_denominator() -> None:
    # V = (7, 10): a_1 = a0 = 3/7 exactly
    doc = analyse([F(7), F(10)], [])
    assert doc["step_points_exact"] == ["3/7"] and doc["step_brackets"] == [[3 / 7, 3 / 7]]
    assert doc["table"] == [] and doc["helps_at"] == []


def test_one_step_time_is_refused() -> None:
    with pytest.raises(ValueError, match="step times"):
        analyse([F(1)], [F(1, 2)])


def test_llama_cpp_flags_per_interval() -> None:
    rows = [{"k": 0, "from": 0.0, "to": 0.25}, {"k": 1, "from": 0.25, "to": 0.8}, {"k": 12, "from": 0.8, "to": 1.0}]
    out = for_llama_cpp(rows)
    assert [row["flags"] for row in out] == [
        "no draft model (plain decoding)",
        "--spec-draft-n-max 1 --spec-draft-n-min 0 --spec-draft-p-min 0",
        "--spec-draft-n-max 12 --spec-draft-n-min 0 --spec-draft-p-min 0",
    ]
    assert LLAMA_CPP_PLAIN == out[0]["flags"] and LLAMA_CPP_FLAGS.format(k=1) == out[1]["flags"]
    assert [{key: row[key] for key in ("k", "from", "to")} for row in out] == rows  # the rest is kept
    assert all("flags" not in row for row in rows)  # the input is left as it was
    assert for_llama_cpp([]) == []


def test_llama_cpp_flags_of_an_analysed_staircase(doc: dict) -> None:
    out = for_llama_cpp(doc["intervals"])
    assert [row["flags"].split()[:2] if row["k"] else row["flags"] for row in out] == \
        ["no draft model (plain decoding)", ["--spec-draft-n-max", "1"], ["--spec-draft-n-max", "2"]]
    assert all("--spec-draft-p-min 0" in row["flags"] for row in out[1:])

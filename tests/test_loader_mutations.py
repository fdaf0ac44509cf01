"""Random mutations of valid bench.json, plan.json and runs.json documents (issue 14): a key deleted, a value of
another type, NaN or infinite, negative, zero, huge, an empty container or the value nested one level deeper.
Every mutated file is either refused by its loader or consumer in one line naming the file (a MoespecError, never
another exception), or accepted with the same results as the original (the plan a bench gives, the score of a plan
and runs); a finite number or null put where one was, text put where the device's name was, or one entry of a
list or of an object keyed by n deleted, may change the results, but never into a crash or NaN."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from plan_cases import TAU1, make_bench, uniform_trace
from score_cases import make_plan, make_runs

from moespec import MoespecError
from moespec.formats.benchfile import load_bench
from moespec.formats.files import write_json
from moespec.predict.plan import build_plan
from moespec.predict.score import score_files

EXAMPLES = 150
DELETE = object()
# what a value is replaced by: another type, a non-finite, negative, zero or huge number, an empty container
OTHERS = [None, True, "x", "", [], {}, float("nan"), float("inf"), -float("inf"), -1, -1e-3, 0, 0.0, 10**12, 1e100,
          1e308]
WRAP = ("in a list", "in an object")
# the parts of a score that name the plan file's bytes rather than what it predicts (a mutation changes the bytes)
# free text a loader takes as it is and a plan repeats (the device's name): other text there changes the plan's words
ECHOED_TEXT = ("device",)
OF_THE_BYTES = ("plan_sha256", "runs_plan_sha256", "pre_registered", "pre_registration")


@st.composite
def mutations(draw: st.DrawFn, doc: Any) -> tuple[list[Any], Any]:
    """A path into `doc` (stopping at any depth) and what to put there: DELETE, a replacement, or a wrap."""
    node, path = doc, []
    while isinstance(node, (dict, list)) and node and (not path or draw(st.integers(0, 3))):
        key = draw(st.sampled_from(sorted(node) if isinstance(node, dict) else range(len(node))))
        path.append(key)
        node = node[key]
    return path, draw(st.sampled_from([DELETE, *OTHERS, *WRAP]) if path else st.sampled_from(OTHERS))


def mutate(doc: Any, path: list[Any], change: Any) -> tuple[Any, bool]:
    """A deep copy of `doc` changed at `path`; also whether the change may legitimately change the results: a
    finite number or null put where one was (values some keys take), text where echoed text was (ECHOED_TEXT), or an
    entry of a list or n-keyed object deleted."""
    doc = json.loads(json.dumps(doc))
    if not path:
        return change, False
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    old = parent[path[-1]]
    if change is DELETE:  # an entry of a list or of an object keyed by n or k: a run or plan of fewer sizes
        del parent[path[-1]]
        return doc, isinstance(path[-1], int) or path[-1].isdigit()
    new = parent[path[-1]] = [old] if change == WRAP[0] else {"x": old} if change == WRAP[1] else change
    if path[-1] in ECHOED_TEXT and isinstance(old, str) and isinstance(new, str):
        return doc, True
    return doc, _number_or_null(old) and _number_or_null(new)


def _number_or_null(value: Any) -> bool:
    return value is None or isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check(result: Callable[[], Any], original: Any, path: Path, numbers_changed: bool) -> None:
    """Refused in one line naming `path`, or accepted with the original results (any finite results when
    `numbers_changed`)."""
    try:
        got = result()
    except MoespecError as e:
        assert str(path) in str(e) and "\n" not in str(e), str(e)
        return
    json.dumps(got, allow_nan=False)  # no NaN or infinity reaches a result
    if not numbers_changed:
        assert got == original


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mutations")


def _scored(plan_path: Path, runs_path: Path) -> dict[str, Any]:
    doc = score_files(str(plan_path), str(runs_path)).to_json()
    return {k: v for k, v in doc.items() if k not in OF_THE_BYTES}


SETTINGS = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow],
                    derandomize=True)


def _score_with_mutated(folder: Path, which: str, mutation) -> None:
    """Score valid plan.json and runs.json, then again with `which` of them mutated: refused or the same score."""
    files = {"plan": folder / "plan.json", "runs": folder / "runs.json"}
    valid = {"plan": make_plan(), "runs": make_runs()}
    for name, doc in valid.items():
        write_json(files[name], doc)
    original = _scored(files["plan"], files["runs"])
    doc, numbers_changed = mutate(valid[which], *mutation)
    write_json(files[which], doc)
    check(lambda: _scored(files["plan"], files["runs"]), original, files[which], numbers_changed)


@SETTINGS
@given(mutation=mutations(make_plan()))
def test_plan_mutations(folder: Path, mutation) -> None:
    _score_with_mutated(folder, "plan", mutation)


@SETTINGS
@given(mutation=mutations(make_runs()))
def test_runs_mutations(folder: Path, mutation) -> None:
    _score_with_mutated(folder, "runs", mutation)


TRACE = uniform_trace()


def _planned(bench_path: Path) -> dict[str, Any]:
    doc = build_plan(load_bench(bench_path), TRACE, TAU1, bench_path=str(bench_path))
    return {k: v for k, v in doc.items() if k != "provenance"}


@pytest.fixture(scope="module")
def planned(folder: Path) -> dict[str, Any]:
    """The plan of the unmutated bench (built once: every example compares with it)."""
    bench = folder / "bench.json"
    write_json(bench, make_bench())
    return _planned(bench)


@SETTINGS
@given(mutation=mutations(make_bench()))
def test_bench_mutations(folder: Path, planned: dict[str, Any], mutation) -> None:
    bench = folder / "bench.json"
    doc, numbers_changed = mutate(make_bench(), *mutation)
    write_json(bench, doc)
    check(lambda: _planned(bench), planned, bench, numbers_changed)

"""The format-version rule (moespec.formats.files.version_problem): a loader reads its format's current version and
the one before it, and refuses any other in one line naming both it reads."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest
from plan_cases import make_bench
from score_cases import make_plan, make_runs

from moespec import MoespecError
from moespec.formats import benchfile, planfile, runsfile
from moespec.formats.files import write_json

FORMATS: list[tuple[Callable[[], dict[str, Any]], Callable[[Path], Any], int]] = [
    (make_bench, benchfile.load_bench, benchfile.FORMAT_VERSION),
    (make_plan, planfile.load_plan, planfile.FORMAT_VERSION),
    (make_runs, runsfile.load_runs, runsfile.FORMAT_VERSION),
]


@pytest.mark.parametrize("make, load, current", FORMATS)
def test_the_current_and_the_previous_version_load(tmp_path: Path, make, load, current) -> None:
    for version in (current - 1, current):
        write_json(tmp_path / "f.json", {**make(), "format_version": version})
        load(tmp_path / "f.json")


@pytest.mark.parametrize("make, load, current", FORMATS)
@pytest.mark.parametrize("shift", [-2, 1, "bool", "text"])
def test_other_versions_are_refused_naming_what_is_read(tmp_path: Path, make, load, current, shift) -> None:
    version = {"bool": True, "text": str(current)}.get(shift, current + shift if isinstance(shift, int) else None)
    write_json(tmp_path / "f.json", {**make(), "format_version": version})
    with pytest.raises(MoespecError, match=f"f.json: .*format version .* is not supported \\(this moespec reads "
                                           f"versions {current - 1} and {current}\\)"):
        load(tmp_path / "f.json")

"""benchmarks/idle_memory.py on tiny experts and no gap: every pass it reports is timed, and the file it writes
carries the rows, the medians by gap and its provenance; a bad --gaps is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_cases import load_script

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def idle():
    return load_script(BENCHMARKS / "idle_memory.py")


def test_a_short_run_writes_every_pass(idle, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(idle, "SHAPE", (64, 32))
    monkeypatch.setattr(idle, "EXPERTS", 4)
    monkeypatch.setattr(idle, "REPS", 1)
    assert idle.main(["--gaps", "0,0.1", "--out", str(tmp_path / "idle.json")]) == 0
    doc = json.loads((tmp_path / "idle.json").read_text())
    assert [r["gap_s"] for r in doc["rows"]] == [0.0, 0.1] and doc["pass_bytes"] == 4 * 3 * 64 * 32 * 2
    for row in doc["rows"]:
        assert len(row["first_gbps"]) == len(row["again_gbps"]) == idle.SETS - 1
        assert min(row["first_gbps"] + row["again_gbps"] + [row["read_first_gbps"], row["ceiling_gbps"]]) > 0
    assert set(doc["median_by_gap"]) == {"0.0", "0.1"} and doc["provenance"]["command"]


@pytest.mark.parametrize("gaps", ["", "-1", "five"])
def test_bad_gaps_are_refused(idle, tmp_path: Path, gaps: str) -> None:
    with pytest.raises(SystemExit) as exit_:
        idle.main(["--gaps", gaps, "--out", str(tmp_path / "idle.json")])
    assert exit_.value.code == 2 and not (tmp_path / "idle.json").exists()

"""The report checks itself: it names every file it read (path from the page, size, sha256 prefix), flags a plan
made from other files than the folder's (plan.json provenance.inputs) and runs that ran another plan, never calls a
present file missing, shows the folder as given, draws the ceiling where it was measured and names in a legend
only what is drawn."""

from __future__ import annotations

import hashlib
import html
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from plan_cases import make_bench, make_runs, uniform_trace

from moespec import MoespecError, cli, demo
from moespec.formats.benchfile import load_bench
from moespec.formats.files import provenance, write_json
from moespec.formats.planfile import input_records, load_plan
from moespec.report.figures import bandwidth_figure, reuse_figure
from moespec.report.folder import load_folder
from moespec.report.inputs import mismatches, size_text
from moespec.routing.reuse import reuse_stats

SHA_SHOWN = 12  # hex digits of a sha256 the page shows


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def plan_from(folder: Path, bench: str) -> None:
    """`moespec plan` on the folder's trace and `bench`, written to the folder's plan.json."""
    assert cli.main(["plan", "--bench", str(folder / bench), "--trace", str(folder / "trace.npz"), "--tau1", "0.1",
                     "--out", str(folder / "plan.json")]) == 0


@pytest.fixture
def job(tmp_path: Path, capsys: pytest.CaptureFixture) -> Path:
    """A folder with trace.npz, bench.json and the plan `moespec plan` made from them."""
    folder = tmp_path / "job"
    folder.mkdir()
    uniform_trace().save(folder / "trace.npz")
    write_json(folder / "bench.json", make_bench())
    plan_from(folder, "bench.json")
    capsys.readouterr()
    return folder


def page_of(folder: Path, capsys: pytest.CaptureFixture, out: Path | None = None) -> str:
    assert cli.main(["report", str(folder), *(["--out", str(out)] if out else [])]) == 0
    capsys.readouterr()
    return (out or folder / "report.html").read_text(encoding="utf-8")


def texts(page: str, pattern: str) -> list[str]:
    """The text (tags dropped, entities resolved) of every match of `pattern`'s group in the page."""
    return [html.unescape(re.sub(r"<[^>]+>", "", m)) for m in re.findall(pattern, page, re.S)]


def rows(page: str, first_column: str) -> dict[str, list[str]]:
    """The data rows of the table whose header starts with `first_column`, keyed by their first cell."""
    for table in re.findall(r"<table>(.*?)</table>", page, re.S):
        if f"<th class=\"text\">{first_column}</th>" in table.split("</thead>")[0]:
            body = table.split("<tbody>")[1]
            cells = [texts(row, r"<td[^>]*>(.*?)</td>") for row in re.findall(r"<tr>(.*?)</tr>", body, re.S)]
            return {row[0]: row for row in cells}
    raise AssertionError(f"no table whose first column is {first_column!r}")


# ---- the plan's inputs -----------------------------------------------------------------------------------------
def test_the_plan_records_the_sha256_of_its_inputs(job: Path) -> None:
    plan = load_plan(job / "plan.json")
    assert plan.inputs == {"bench": {"path": str(job / "bench.json"), "sha256": sha256(job / "bench.json")},
                           "trace": {"path": str(job / "trace.npz"), "sha256": sha256(job / "trace.npz")}}
    doc = json.loads((job / "plan.json").read_text())
    doc["provenance"]["inputs"]["bench"]["sha256"] = "not a sha256"
    write_json(job / "plan.json", doc)
    with pytest.raises(MoespecError, match="provenance.inputs.bench"):
        load_plan(job / "plan.json")
    with pytest.raises(ValueError, match="paths"):
        input_records({"weights": str(job / "bench.json")})


def test_a_plan_of_the_folders_files_is_not_flagged(job: Path, capsys: pytest.CaptureFixture) -> None:
    page = page_of(job, capsys)
    assert texts(page, r'<p class="warning">(.*?)</p>') == []
    made_from = rows(page, "input")
    assert made_from["bench"][-1] == made_from["trace"][-1] == "same file"


def test_a_plan_made_from_another_bench_is_flagged(job: Path, capsys: pytest.CaptureFixture) -> None:
    """The user's folder: the plan was made from bench1.json; bench.json beside it is a noisier bench."""
    shutil.move(job / "bench.json", job / "bench1.json")
    plan_from(job, "bench1.json")
    noisy = make_bench()
    noisy["kernels"]["slot"]["beta_gbps"]["5"] = 3.0
    write_json(job / "bench.json", noisy)
    page = page_of(job, capsys)
    warnings = texts(page, r'<p class="warning">(.*?)</p>')
    assert len(warnings) == 1
    recorded, present = sha256(job / "bench1.json")[:SHA_SHOWN], sha256(job / "bench.json")[:SHA_SHOWN]
    assert f"made from {job / 'bench1.json'} (sha256 {recorded}), not from this folder's bench.json (sha256 " \
           f"{present})" in warnings[0]
    assert f"moespec plan --bench {job / 'bench.json'} --trace {job / 'trace.npz'} --out {job / 'plan.json'}" \
           in warnings[0]
    assert page.index('class="warning"') < page.index('id="inputs"') < page.index('id="reuse"')
    assert rows(page, "input")["bench"][-1] == f"DIFFERENT (sha256 {present})"
    assert any("not read" in line and "bench1.json" in line for line in texts(page, r'<p class="note">(.*?)</p>'))


def test_a_plan_that_records_no_inputs_cannot_be_checked(job: Path, capsys: pytest.CaptureFixture) -> None:
    doc = json.loads((job / "plan.json").read_text())
    del doc["provenance"]["inputs"]
    write_json(job / "plan.json", doc)
    write_json(job / "bench.json", make_bench(eps=0.04))
    page = page_of(job, capsys)
    assert texts(page, r'<p class="warning">(.*?)</p>') == []
    assert any("records no sha256" in line for line in texts(page, r'<p class="note">(.*?)</p>'))


def test_runs_of_another_plan_are_flagged(job: Path) -> None:
    plan_sha = sha256(job / "plan.json")
    for ran, flagged in (("0" * 64, True), (plan_sha, False)):
        write_json(job / "runs.json", make_runs(plan={"path": "plan.json", "sha256": ran}, provenance=provenance()))
        found = mismatches(load_folder(job))
        assert len(found) == flagged
        if flagged:
            assert f"runs.json ran another plan (sha256 {'0' * SHA_SHOWN}) than this folder's plan.json (sha256 " \
                   f"{plan_sha[:SHA_SHOWN]})" in found[0]


# ---- what the page says about the files -------------------------------------------------------------------------
def test_the_inputs_name_every_file_read(job: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    page = page_of(job, capsys, tmp_path / "pages" / "report.html")
    listed = rows(page, "artifact")
    for name in ("trace.npz", "bench.json", "plan.json"):
        row = listed[f"../job/{name}"]  # the path from the page
        size = (job / name).stat().st_size
        assert row[2:5] == ["read", size_text(size).replace(" ", "\u00a0"), sha256(job / name)[:SHA_SHOWN]]
    assert listed["../job/runs.json"][2:5] == ["missing", "-", "-"]
    with pytest.raises(ValueError, match="size"):
        size_text(-1)


def test_a_present_file_is_never_called_missing(job: Path, capsys: pytest.CaptureFixture,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(job.parent)
    absent = page_of(Path("job"), capsys)
    assert "Made from the folder job." in absent  # the folder as given, not resolved elsewhere
    assert rows(absent, "artifact")["demo.json"][2] == "missing"
    write_json(job / "demo.json", {"provenance": provenance()})
    present = page_of(Path("job"), capsys)
    assert rows(present, "artifact")["demo.json"][2] == "read"
    assert "demo.json is missing" not in present and \
        not any("demo.json" in line for line in texts(present, r'class="missing">(.*?)</p>'))


def test_the_demo_writes_its_report_after_demo_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The report reads demo.json: the demo writes it first (the bench and engine steps stubbed)."""
    out = tmp_path / "demo"
    seen = []
    write_json(tmp_path / "bench.json", make_bench())
    monkeypatch.setattr(demo, "_bench", lambda *args: load_bench(tmp_path / "bench.json"))
    monkeypatch.setattr(demo, "_engine", lambda *args: {"stub": True})
    monkeypatch.setattr(demo, "write_report", lambda folder: seen.append((Path(folder) / "demo.json").is_file()))
    demo.demo(demo.DemoConfig(out=str(out), tokens=400, docs=4, drafting=0))
    assert seen == [True]


# ---- figures ----------------------------------------------------------------------------------------------------
def ceiling_line(fig) -> np.ndarray:
    (line,) = [artist for artist in fig.axes[0].get_children() if artist.get_gid() == "ceiling"]
    return np.asarray(line.get_ydata(), dtype=float)


def test_the_ceiling_is_drawn_where_it_was_measured() -> None:
    bench = make_bench()
    bench["ceiling_gbps"] = 17.6  # the samples before and after the timing
    by_n = {str(n): 24.0 if n in (3, 4) else 18.0 for n in bench["n"]}  # between each n's rounds
    bench["kernels"]["slot"]["beta_gbps"] = {str(n): 21.7 if n in (3, 4) else 15.0 for n in bench["n"]}
    assert ceiling_line(bandwidth_figure(bench)).tolist() == [17.6, 17.6]  # older files: the only samples there are
    bench["ceiling_before_after_gbps"] = [18.1, 17.0]
    (band,) = [a for a in bandwidth_figure(bench).axes[0].get_children() if a.get_gid() == "ceiling band"]
    assert (band.get_y(), band.get_y() + band.get_height()) == pytest.approx((17.0, 18.1))
    bench["ceiling_by_n_gbps"] = by_n
    drawn = ceiling_line(bandwidth_figure(bench))
    assert drawn.tolist() == [by_n[str(n)] for n in bench["n"]]
    assert all(drawn >= [bench["kernels"]["slot"]["beta_gbps"][str(n)] for n in bench["n"]])


def legend_labels(fig) -> list[str]:
    return [t.get_text() for t in fig.axes[0].get_legend().get_texts()]


def test_figure_1_names_in_its_legend_only_what_shows() -> None:
    stats = reuse_stats(uniform_trace(), 9, bootstrap=50)
    lo, hi = stats.ci["rho_mean"]
    stats.ci["rho_mean"] = (stats.rho_mean.copy(), stats.rho_mean.copy())  # an interval hidden by the line
    narrow = reuse_figure(stats, "trace")
    assert not any("interval" in label for label in legend_labels(narrow))
    notes = [t.get_text() for t in narrow.axes[0].texts]
    assert any("Too narrow to show" in note and "95% bootstrap interval (width at most 0.000)" in note
               for note in notes)
    stats.ci["rho_mean"] = (stats.rho_mean - 0.1, stats.rho_mean + 0.1)
    wide = reuse_figure(stats, "trace")
    assert "95% bootstrap interval" in legend_labels(wide)
    assert not any("interval" in t.get_text() for t in wide.axes[0].texts)

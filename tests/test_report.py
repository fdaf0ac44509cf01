"""moespec report: from a small fixture job (a synthetic trace, a hand-made bench, the plan built from them and a
hand-made runs.json), one self-contained HTML page: every figure an embedded PNG with a caption, every table
filled, the six scoring verdicts; sections whose artifact is missing say so; an empty folder is a one-line error."""

from __future__ import annotations

import base64
import json
import re
import shutil
import struct
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from plan_cases import MODEL, RUNS_DRAFT, make_bench, make_runs

from matplotlib.figure import Figure
from matplotlib.text import Text

from moespec import cli, theory
from moespec.defaults import POLICIES
from moespec.formats.files import provenance, write_json
from moespec.formats.trace import Trace
from moespec.predict.plan import build_plan
from moespec.report import html
from moespec.report.figures import FIG_DPI
from moespec.routing.synth import synthesize

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
MIN_PIXELS = 200  # every figure is at least 5.5 inches wide and 3.8 high at 110 dpi
SECTIONS = ["reuse", "bandwidth", "staircase", "saving", "acceptance", "score", "engine", "drafting", "batch"]
FIGURES = 5  # Figure 1, Figure 2, the staircase, Figure 4, Figure 5
MISMATCH_GAP = 0.0123  # plain decoding's top-2 logit gap at the one mismatch of the fixture runs
MIN_TEXT_PX = 10  # the smallest text a figure may show on the page, in CSS pixels
IMG_BORDER_PX = 1  # the page's border around each figure image


class Page(HTMLParser):
    """The parts of the report the tests check: images, figure captions, tables (rows of (tag, text) cells),
    section ids and the 'not shown' lines."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.images: list[str] = []
        self.captions: list[str] = []
        self.tables: list[list[list[tuple[str, str]]]] = []
        self.sections: list[str] = []
        self.missing: list[str] = []
        self._open: list[tuple[str, list[str]]] = []  # elements whose text is being collected
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "img":
            self.images.append(a["src"] or "")
        elif tag == "section":
            self.sections.append(a["id"] or "")
        elif tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        if tag in ("td", "th", "figcaption") or (tag == "p" and a.get("class") == "missing"):
            self._open.append((tag, []))

    def handle_data(self, data: str) -> None:
        if self._open:
            self._open[-1][1].append(data)

    def handle_endtag(self, tag: str) -> None:
        if not self._open or self._open[-1][0] != tag:
            return
        _, parts = self._open.pop()
        text = "".join(parts).strip()
        if tag in ("td", "th"):
            self.tables[-1][-1].append((tag, text))
        elif tag == "figcaption":
            self.captions.append(text)
        else:
            self.missing.append(text)


def engine_runs(plan: dict[str, Any]) -> dict[str, Any]:
    """A runs.json of `moespec run --plan` (keys in moespec.formats.runsfile): make_runs' verify times plus AUTO,
    intervals, the saving, and a throughput grid at every (policy, k, a) of the plan whose tokens/s follow the plan's
    own step times with a 2% slowdown per drafted token; one cell differs from plain decoding at a near tie."""
    runs = make_runs()
    verify = runs["verify_time_s"]
    ns = list(verify["slot"])
    verify["auto"] = {n: verify[plan["kernel_by_n"][n]][n] for n in ns}
    rows = []
    for p in POLICIES:
        V = plan["step_times"][p]
        for a in map(float, theory.PAPER_ACCEPTANCES):
            for k in range(plan["kmax"] + 1):
                rows.append({"policy": p, "k": k, "a": a, "realized_acceptance": a if k else None,
                             "tokens_per_s": float(theory.throughput(V, a, k)) / (1 + 0.02 * k),
                             "step_time_s": V[k] * (1 + 0.02 * k),
                             "overhead_share": 0.01, "greedy_match": True, "mismatches": []})
    rows[-1].update(greedy_match=False, mismatches=[{"prompt": 1, "position": 7, "plain_top2_gap": MISMATCH_GAP}])
    runs.update(
        source="preset olmoe-1b-7b (2 of 16 layers), random weights (seed 0)", device="cpu", replay="trace.npz",
        verify_time_ci_s={p: {n: [0.98 * t, 1.02 * t] for n, t in times.items()} for p, times in verify.items()},
        saving_s={n: {"median": (s := verify["slot"][n] - verify["dedup"][n]), "lo": s - 0.002, "hi": s + 0.002}
                  for n in ns[1:]},
        crossover=2, auto_ratio={n: 1.0 for n in ns}, throughput=rows, draft_model=None, throughput_draft_model=[],
        overhead_share=0.01, greedy_match=False, plan={"path": "plan.json", "sha256": "0" * 64},
        kernel_by_n=plan["kernel_by_n"], provenance=provenance(dtype="bf16"))
    return runs


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with trace.npz, bench.json, plan.json (both versions) and runs.json, as a job leaves them."""
    folder = tmp_path_factory.mktemp("job")
    trace: Trace = synthesize(MODEL, "calibrated", 2000, 10, seed=0)
    trace.save(folder / "trace.npz")
    bench = make_bench()
    bench["fits"] = {"0": {"slot": {"equation": "(4)", "passes": 8, "t_op_s": 1e-4, "c_u_s_per_byte": 1e-10,
                                    "c_re_s_per_byte": 5e-11, "re_read_cost": 0.5, "first_read_gbps": 10.0,
                                    "eps": 0.02},
                           "dedup": None}}
    write_json(folder / "bench.json", bench)
    plan = build_plan(bench, trace, runs=make_runs(), draft_time=list(RUNS_DRAFT.values()))
    write_json(folder / "plan.json", plan)
    write_json(folder / "runs.json", engine_runs(plan))
    return folder


def report(folder: Path, capsys: pytest.CaptureFixture, *extra: str) -> Page:
    assert cli.main(["report", str(folder), *extra]) == 0
    out = capsys.readouterr().out.strip()
    path = Path(extra[-1]) if extra else folder / "report.html"
    assert out == f"report -> {path}"
    return Page(path.read_text(encoding="utf-8"))


def check_figures(page: Page, count: int) -> None:
    """`count` embedded PNGs that decode, each of a real figure's size, each with a caption."""
    assert len(page.images) == count and len(page.captions) == count
    for src in page.images:
        assert src.startswith("data:image/png;base64,")
        png = base64.b64decode(src.split(",", 1)[1], validate=True)
        assert png[:8] == PNG_SIGNATURE and png[12:16] == b"IHDR"
        width, height = struct.unpack(">II", png[16:24])
        assert width >= MIN_PIXELS and height >= MIN_PIXELS
    assert all(caption.endswith(".") and len(caption) > 40 for caption in page.captions)


def check_tables(page: Page) -> None:
    """Every table has rows and no empty data cell."""
    for table in page.tables:
        cells = [text for row in table for tag, text in row if tag == "td"]
        assert cells and all(cells), table


def table_with(page: Page, column: str) -> list[list[str]]:
    """The data rows of the first table that has `column` in its header."""
    for table in page.tables:
        if any(tag == "th" and text == column for tag, text in table[0]):
            return [[text for _, text in row] for row in table[1:]]
    raise AssertionError(f"no table with column {column!r}")


def test_full_report(job: Path, capsys: pytest.CaptureFixture) -> None:
    page = report(job, capsys)
    assert page.sections == SECTIONS  # drafting.json (the demo's drafting step) is not in this job
    assert len(page.missing) == 2 and "drafting.json is missing" in page.missing[0]  # and the batch map
    assert "no batch map" in page.missing[1]
    check_figures(page, FIGURES)
    check_tables(page)
    facts = {row[0][1]: row[1][1] for table in page.tables for row in table if len(row) == 2}
    assert facts["model"] == MODEL and facts["dtype"] == "bf16" and facts["context depth"] == "4096"
    assert facts["trace"].startswith("synthetic: calibrated process, calibrated to paper-wikitext")
    artifacts = {row[0]: row for row in table_with(page, "artifact")}
    made = json.loads((job / "plan.json").read_text())["provenance"]
    assert artifacts["plan.json"][2] == "read" and artifacts["plan.json"][5:7] == [made["timestamp"], made["command"]]
    assert artifacts["demo.json"][2] == "missing"
    rules = table_with(page, "verdict")
    assert len(rules) == 6 and {row[3] for row in rules} <= {"holds", "fails"}
    per_n = table_with(page, "verify error slot")
    assert [row[0] for row in per_n] == [str(n) for n in range(2, 10)]
    per_a = table_with(page, "k* measured")
    assert len(per_a) == len(POLICIES) * len(theory.PAPER_ACCEPTANCES)
    # version-1 runs count what they emitted in tokens_per_s: both rates are that one, without an interval
    assert all(row[11] == row[12] and row[13] == "1.000" for row in per_a)
    assert facts["throughput scored"] == "the computed rate (rules 2, 3 and 6)"  # the plan names none
    staircase = table_with(page, "V_hat(k) slot, ms")
    assert [row[0] for row in staircase] == [str(k) for k in range(9)]
    assert len(table_with(page, "layer")) == 2  # the fit of layer 0's slot kernel, and its dedup kernel's "no fit"
    assert table_with(page, "plain top-2 logit gap") == [["auto", "8", "0.98", "1", "7", f"{MISMATCH_GAP:.4g}"]]


def test_without_runs_the_other_sections_remain(job: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    for name in ("trace.npz", "bench.json", "plan.json"):
        shutil.copy(job / name, tmp_path / name)
    page = report(tmp_path, capsys)
    assert page.sections == SECTIONS
    check_figures(page, FIGURES - 1)  # Figure 5 compares with the runs
    check_tables(page)
    assert len(page.missing) == 6  # Figure 4's measured saving, Figure 5, Tables 3 and 8, engine, drafting, batch
    assert sum(f"runs.json is missing from {tmp_path}" in line for line in page.missing) == 4


def test_a_bench_alone_gives_a_report(job: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    shutil.copy(job / "bench.json", tmp_path / "bench.json")
    (tmp_path / "plan.json").write_text("{")
    out = tmp_path / "elsewhere" / "page.html"
    page = report(tmp_path, capsys, "--out", str(out))
    check_figures(page, 1)
    check_tables(page)
    assert not (tmp_path / "report.html").exists()
    assert any(line.startswith("Not shown: trace.npz is missing") for line in page.missing)
    assert any("plan.json is present but unreadable" in line for line in page.missing)


def test_runs_of_one_kernel_fill_what_they_measured(job: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """llama.cpp's runs (dedup verify times alone, no saving, dedup throughput rows) against a plan of both kernels:
    every section renders; Table 3 has a row per n with the dedup error and "-" where nothing was measured."""
    for name in ("trace.npz", "bench.json", "plan.json"):
        shutil.copy(job / name, tmp_path / name)
    runs = json.loads((job / "runs.json").read_text())
    runs.update(engine="llama.cpp", saving_s={}, crossover=None,
                throughput=[row for row in runs["throughput"] if row["policy"] == "dedup"],
                **{key: {"dedup": runs[key]["dedup"]} for key in ("verify_time_s", "verify_time_ci_s")})
    write_json(tmp_path / "runs.json", runs)
    page = report(tmp_path, capsys)
    assert page.sections == SECTIONS
    per_n = table_with(page, "verify error slot")
    assert [row[0] for row in per_n] == [str(n) for n in range(2, 10)]
    assert all(row[3:7] == ["-", "-", "-", "-"] and row[7].endswith("%") for row in per_n), per_n
    assert all(row[1] != "-" for row in per_n)  # the plan's S_hat(n) stands without a measured saving


@pytest.mark.parametrize("make, problem", [(lambda p: p.mkdir(), "no moespec artifact here"),
                                           (lambda p: None, "no such folder")])
def test_no_artifact_is_a_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture, make, problem: str) -> None:
    folder = tmp_path / "job"
    make(folder)
    assert cli.main(["report", str(folder)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("moespec report: error:") and problem in err
    assert not (folder / "report.html").exists()


def page_width_px(page_text: str) -> float:
    """The page's content width in CSS pixels: its body's max-width (the style sheet's first rule)."""
    match = re.search(r"body\s*\{[^}]*max-width:\s*(\d+)px", page_text)
    assert match, "the page's style sheet gives its body no max-width in px"
    return float(match.group(1))


def smallest_text_px(fig: Figure, page_px: float) -> float:
    """The smallest visible text of `fig` in CSS pixels on the page: points / 72 x dpi x the page's scaling of the
    PNG (1 up to the page's width less the image border, proportionally down beyond)."""
    fig.draw_without_rendering()  # the tick labels it shows
    sizes = [t.get_fontsize() for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]
    image_px = fig.get_figwidth() * FIG_DPI
    return min(sizes) / 72 * FIG_DPI * min(1.0, (page_px - 2 * IMG_BORDER_PX) / image_px)


def test_figure_text_is_legible_at_the_page_width(job: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every figure of the page, as the report draws it, shows no text below MIN_TEXT_PX at the page's width."""
    drawn: list[Figure] = []
    embed = html._figure
    monkeypatch.setattr(html, "_figure", lambda fig, caption: (drawn.append(fig), embed(fig, caption))[1])
    page = html.render(html.load_folder(job))
    page_px = page_width_px(page)
    assert len(drawn) == FIGURES
    for fig in drawn:
        assert smallest_text_px(fig, page_px) >= MIN_TEXT_PX, fig.axes[0].get_title()
    # the check measures: the old Figure 5 (13 inches, 6-point legends) read 7.4 pixels at this width
    old = Figure(figsize=(13, 3.9))
    old.subplots().legend(handles=old.axes[0].plot([0, 1], label="slot"), fontsize=6)
    assert smallest_text_px(old, page_px) < MIN_TEXT_PX



def test_the_verdict_comes_first(job: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """The page opens with the plan's verdict (after the title): a kernel line per n >= 2 and a draft line per
    acceptance, as `moespec plan` prints them; a contended bench shows in its checks; the Inputs section follows."""
    folder = tmp_path / "job"
    shutil.copytree(job, folder)
    bench = json.loads((folder / "bench.json").read_text())
    bench["contention"] = {"cores": 2, "threads": 2, "fitted": True, "calls": 10, "contended": 8,
                           "fewer_threads": 8, "others_max": 1, "wait_share_max": 0.3}
    write_json(folder / "bench.json", bench)
    report(folder, capsys)
    text = (folder / "report.html").read_text(encoding="utf-8")
    body = text[text.index("<body>"):]
    verdict = body[body.index('<div id="verdict">'):body.index("</div>", body.index('<div id="verdict">'))]
    assert body.index('<div id="verdict">') < body.index("Inputs") and "VERDICT for" in verdict
    plan = json.loads((folder / "plan.json").read_text())
    assert verdict.count("<li>n = ") == plan["kmax"] and verdict.count("<li>a = ") >= len(theory.PAPER_ACCEPTANCES)
    assert "contention: 8 of 10 timed calls" in verdict and "--fresh" in verdict

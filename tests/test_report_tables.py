"""moespec.report.tables and moespec.report.markup: Table 1 and the fits table as formatted cells (number formats
checked by hand), rich tables that stay within 100 columns and fold a wide cell onto more lines instead of cutting
it with "…", and the HTML pieces of the report page: every cell, header and caption escaped (HTML-special
characters, and control characters that must not reach a page or a terminal raw), Markup passed as it is."""

from __future__ import annotations

import base64
import io
import re
import struct

from rich.cells import cell_len
from rich.console import Console

from moespec.report import markup
from moespec.report.tables import FITS_CAPTION, TABLE1_CAPTION, bench_tables, fits_table, rich_table, table1

WIDTH = 100  # the columns plan and score print at where the output is not a terminal (moespec.console.NARROW)
# C0 controls but tab and newline, DEL, C1 controls (ESC starts an ANSI sequence; CSI = 0x9b in C1)
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _bench_doc(ns=(1, 2, 3), gflops: bool = True) -> dict:
    kernels = {"slot": {"kind": "slot", "beta_gbps": {"1": 10.0, "2": 12.34, "3": 15.0}},
               "dedup": {"kind": "dedup", "beta_gbps": {"1": 5.0, "2": 6.0, "3": 14.4}}}
    if gflops:
        kernels["dedup"]["gflops"] = {"1": 1234.4, "2": 99.6, "3": 7.0}
    return {"model": "olmoe-1b-7b", "dtype": "bf16", "layers": [0, 7], "n": list(ns), "kernels": kernels,
            "ceiling_gbps": 20.0, "ceiling_by_n_gbps": {"3": 16.0},
            "r": {"2": 0.6, "3": 0.9}, "u": {"1": 1.0, "2": 0.7496, "3": 0.8},
            "fits": {"0": {"slot": {"equation": "(4)", "t_op_s": 2.5e-4, "first_read_gbps": 123.44,
                                    "re_read_cost": 0.3333, "eps": 0.0456},
                           "dedup": {"equation": "(E.1)", "t_op_s": 1e-3, "union_gbps": 55.54,
                                     "c_t_s_per_token": 3e-6, "eps": 0.1}},
                     "7": {"slot": None, "dedup": None}}}


def _render(*tables, width: int = WIDTH) -> str:
    con = Console(width=width, file=io.StringIO(), color_system=None)
    for t in tables:
        con.print(t)
    return con.file.getvalue()


# ---- Table 1 and the fits as cells ------------------------------------------------------------------------------

def test_table1_cells() -> None:
    columns, rows = table1(_bench_doc())
    assert columns == ["n", "ceiling", "slot", "dedup", "r(n)", "u(n)", "faster", "dedup GFLOP/s"]
    assert rows == [
        # n = 1: the run's ceiling; no r at n = 1; both engines run the same kernel on one token
        ["1", "20.0", "10.0 (50%)", "5.0 (25%)", "-", "1.000", "same kernel", "1234"],
        # u = 0.7496 >= r = 0.6: per-slot faster (7); 12.34/20 = 62%
        ["2", "20.0", "12.3 (62%)", "6.0 (30%)", "0.600", "0.750", "slot", "100"],
        # n = 3: the ceiling sampled between its rounds, 16 GB/s; u = 0.8 < r = 0.9: dedup faster
        ["3", "16.0", "15.0 (94%)", "14.4 (90%)", "0.900", "0.800", "dedup", "7"],
    ]


def test_table1_shows_the_flop_rate_as_a_share_of_the_matmul_peak() -> None:
    columns, rows = table1({**_bench_doc(), "matmul_peak_gflops": 2000.0})
    assert [row[-1] for row in rows] == ["1234 (62%)", "100 (5%)", "7 (0%)"]


def test_table1_without_flops_or_r_and_with_a_pair_of_other_kernels() -> None:
    doc = _bench_doc(gflops=False)
    del doc["r"]["3"]
    doc["kernels"] = {"mul_mat": {**doc["kernels"]["slot"]}, "mul_mat_id": {**doc["kernels"]["dedup"]}}
    columns, rows = table1(doc)
    assert columns == ["n", "ceiling", "mul_mat (slot)", "mul_mat_id (dedup)", "r(n)", "u(n)", "faster"]
    assert rows[2] == ["3", "16.0", "15.0 (94%)", "14.4 (90%)", "-", "0.800", "-"]  # no r: no faster kernel
    assert all(len(row) == len(columns) for row in rows)


def test_fits_table_cells() -> None:
    columns, rows = fits_table(_bench_doc())
    assert columns == ["layer", "kernel", "eq.", "t_op ms", "1/c_u or 1/c_g GB/s", "c_re/c_u", "c_t ms/token", "eps"]
    assert rows == [
        ["0", "slot", "(4)", "0.250", "123.4", "0.333", "-", "0.046"],
        ["0", "dedup", "(E.1)", "1.000", "55.5", "-", "0.003", "0.100"],
        ["7", "slot", "no fit", "-", "-", "-", "-", "-"],
        ["7", "dedup", "no fit", "-", "-", "-", "-", "-"],
    ]


# ---- rich tables: within 100 columns, folded, never cut ---------------------------------------------------------

def test_rich_table_columns_are_right_aligned_and_fold() -> None:
    t = rich_table("T", ["a", "b"], [["1", "2"]], caption="c")
    assert [(str(c.header), c.justify, c.overflow) for c in t.columns] == [("a", "right", "fold"),
                                                                            ("b", "right", "fold")]
    assert str(t.title) == "T" and str(t.caption) == "c" and t.row_count == 1
    lines = _render(t).splitlines()
    body = lines[lines.index(next(line for line in lines if line.startswith("┡"))) + 1]
    assert body == "│ 1 │ 2 │"


def test_a_wide_cell_folds_within_100_columns_and_is_not_cut() -> None:
    cell = "".join(str(i % 10) for i in range(350))  # no spaces: only folding can split it
    out = _render(rich_table("wide", ["value"], [[cell]]))
    lines = out.splitlines()
    assert max(cell_len(line) for line in lines) <= WIDTH
    assert "…" not in out and "..." not in out
    body = [line for line in lines if line.startswith("│")]
    assert len(body) == 4  # 350 characters in a 96-wide column: four lines
    assert "".join(line.strip("│ ") for line in body) == cell


def test_many_columns_of_long_cells_stay_within_100_columns() -> None:
    columns = [f"column number {i} with a long header" for i in range(9)]
    row = [f"{i * 1234.5678:.4f} ± {i * 0.001:.3f} [{i - 5:+.3f}, {i + 5:+.3f}]" for i in range(9)]
    out = _render(rich_table("a table wider than the page " * 6, columns, [row], caption="caption words " * 20))
    assert max(cell_len(line) for line in out.splitlines()) <= WIDTH
    assert "…" not in out
    body = [line.split("│")[1:-1] for line in out.splitlines() if line.startswith("│")]
    assert body and all(len(parts) == 9 for parts in body)
    for i, cell in enumerate(row):  # each column's lines, joined, hold the whole cell
        assert "".join(parts[i] for parts in body).replace(" ", "") == cell.replace(" ", "")
    squeezed = re.sub(r"\s", "", out)
    assert squeezed.count("caption") == 20 and squeezed.count("wider") == 6


def test_interval_cells_are_not_read_as_markup() -> None:
    cells = ["[0.950, 1.050]", "[-0.100, +0.200]", "1: 1.234 [1.111, 1.357]", "(no band)"]
    out = _render(rich_table("bands", [f"c{i}" for i in range(4)], [cells]))
    for cell in cells:
        assert cell in out


def test_bench_tables_fit_100_columns() -> None:
    doc = _bench_doc(ns=range(1, 10))
    for key in ("slot", "dedup"):
        doc["kernels"][key]["beta_gbps"] = {str(n): 10.0 + n for n in range(1, 10)}
    doc["kernels"]["dedup"]["gflops"] = {str(n): 1000.0 * n for n in range(1, 10)}
    doc["u"] = {str(n): 1 - n / 20 for n in range(1, 10)}
    doc["r"] = {str(n): 0.5 + n / 50 for n in range(2, 10)}
    tables = bench_tables(doc)
    assert [str(t.caption) for t in tables] == [TABLE1_CAPTION, FITS_CAPTION]
    title = str(tables[0].title)
    assert title.startswith("Table 1:") and "olmoe-1b-7b bf16, MoE layers 0, 7" in title
    assert [t.row_count for t in tables] == [9, 4]
    out = _render(*tables)
    assert max(cell_len(line) for line in out.splitlines()) <= WIDTH
    assert "…" not in out
    flat = " ".join(out.split())
    for caption in (TABLE1_CAPTION, FITS_CAPTION):  # wrapped at spaces, every word kept
        assert " ".join(caption.split()) in flat
    # n = 9: u = 0.55 < r = 0.68, dedup faster; 19 GB/s of 20 = 95%
    assert re.search(r"│ 9 │ +20\.0 │ 19\.0 \(95%\) │ 19\.0 \(95%\) │ 0\.680 │ 0\.550 │ +dedup │ +9000 │",
                     out)


# ---- HTML pieces -------------------------------------------------------------------------------------------------

def test_escape() -> None:
    assert markup.escape('<a href="x">Q&A\'s</a>') == "&lt;a href=&quot;x&quot;&gt;Q&amp;A&#x27;s&lt;/a&gt;"
    assert markup.escape(3.5) == "3.5" and markup.escape(None) == "None"
    assert markup.escape("&amp;") == "&amp;amp;"  # text, not HTML: escaped again
    html = markup.Markup("<b>kept</b>")
    assert markup.escape(html) is html


def test_table_escapes_header_cells_and_caption() -> None:
    out = markup.table(["a<b", "c&d"], [["x > y", markup.Markup("<i>z</i>")], ['"q"', "'s'"]],
                       caption="S < 0 & more", text_columns=1)
    assert out == ('<table><caption>S &lt; 0 &amp; more</caption>'
                   '<thead><tr><th class="text">a&lt;b</th><th>c&amp;d</th></tr></thead>'
                   '<tbody><tr><td class="text">x &gt; y</td><td><i>z</i></td></tr>'
                   '<tr><td class="text">&quot;q&quot;</td><td>&#x27;s&#x27;</td></tr></tbody></table>')


def test_table_without_header_or_caption() -> None:
    assert markup.table(None, [["1", "2"]]) == "<table><tbody><tr><td>1</td><td>2</td></tr></tbody></table>"
    assert markup.table(["n"], []) == "<table><thead><tr><th>n</th></tr></thead><tbody></tbody></table>"
    assert markup.facts([("model", "<m>"), ("eps", "0.05")]) == (
        '<table><tbody><tr><td class="text">model</td><td class="text">&lt;m&gt;</td></tr>'
        '<tr><td class="text">eps</td><td class="text">0.05</td></tr></tbody></table>')


def test_one_line_notes() -> None:
    assert markup.missing("no runs <file>") == '<p class="missing">Not shown: no runs &lt;file&gt;.</p>'
    assert markup.note("a & b") == '<p class="note">a &amp; b</p>'
    assert markup.warning("rerun `moespec bench --n 1-9 <x>` & `plan`, then 'score'") == (
        '<p class="warning">rerun <code>moespec bench --n 1-9 &lt;x&gt;</code> &amp; <code>plan</code>, then '
        '&#x27;score&#x27;</p>')
    assert markup.warning("one ` backquote") == '<p class="warning">one ` backquote</p>'
    assert markup.VERDICT[True] == '<span class="holds">holds</span>' and isinstance(markup.VERDICT[None],
                                                                                      markup.Markup)


def test_figure_embeds_a_png_at_the_figure_dpi() -> None:
    from matplotlib.figure import Figure

    from moespec.report.figures import FIG_DPI

    fig = Figure(figsize=(2, 1))
    out = markup.figure(fig, 'S(n) < 0 & "band"')
    m = re.fullmatch(r'<figure><img alt="([^"]*)" src="data:image/png;base64,([A-Za-z0-9+/=]+)">'
                     r"<figcaption>(.*)</figcaption></figure>", out)
    assert m is not None
    assert m.group(1) == m.group(3) == "S(n) &lt; 0 &amp; &quot;band&quot;"
    png = base64.b64decode(m.group(2))
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", png[16:24])  # IHDR
    assert (width, height) == (2 * FIG_DPI, 1 * FIG_DPI)


# ---- control characters ------------------------------------------------------------------------------------------

CELL = "a\x1b[31mb\x00c\x07d\x7fe\x9bf"  # an ANSI colour, NUL, BEL, DEL, CSI


def test_html_control_characters_are_escaped() -> None:
    """A page must not carry raw control characters (HTML forbids them; NUL is dropped by the parser) in a cell,
    a header or a caption; the visible text around them stays, in order."""
    for cols, rows, cap in (([CELL], [["1"]], None), (["n"], [[CELL]], None), (["n"], [["1"]], CELL)):
        out = markup.table(cols, rows, caption=cap)
        assert not CONTROL.search(out), repr(out)
        assert re.search("a.*b.*c.*d.*e.*f", out)


def test_rich_markup_in_a_cell_is_taken_literally() -> None:
    """A name read from a file with brackets in it is printed as it is, never parsed as rich markup."""
    out = _render(rich_table("[b]T[/b]", ["[k]"], [["x[/bar]"], ["[a, b]"]]))
    assert "[b]T[/b]" in out and "[k]" in out and "x[/bar]" in out and "[a, b]" in out


def test_terminal_control_characters_are_escaped() -> None:
    """A table printed to a terminal must not carry an ANSI sequence or other control character from a cell."""
    out = _render(rich_table("T", ["x"], [[CELL]]))
    assert not CONTROL.search(out), repr(out)
    assert re.search("a.*b.*c.*d.*e.*f", out)

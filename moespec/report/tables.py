"""The tables of a bench (Table 1, the fits) as rows of formatted cells, shown alike in the terminal (`rich_table`)
and on the HTML page (moespec.report.html)."""

from __future__ import annotations

from typing import Any, Sequence

from rich.table import Table
from rich.text import Text

from moespec import printable

Rows = tuple[list[str], list[list[str]]]  # (column names, rows of cells), for the terminal and the HTML report

TABLE1_CAPTION = ("median over recorded windows; slot kind on n m b, dedup kind on U b; % of the ceiling sampled "
                  "between the rounds of that n; dedup faster where u(n) < r(n) (7); GFLOP/s: 2 x 3 d f per "
                  "token-slot (% of the measured matrix-multiply peak)")

FITS_CAPTION = ("eps: median relative error on the recorded windows; no fit: chosen ids at fewer than two pass "
                "sizes n >= 2")

def _gbps(value: float, ceiling: float) -> str:
    return f"{value:.1f} ({value / ceiling:.0%})"

def table1(doc: Any) -> Rows:
    """Table 1: per n, the ceiling (sampled between that n's rounds where the bench did, else the run's), each
    kernel's beta in GB/s (% of that ceiling), r(n), u(n), the faster kernel, and our dedup kernel's FLOP rate
    (where the bench recorded it: a rate that keeps rising with n while the share of the ceiling falls marks the
    compute-bound regime, many tokens per expert)."""
    kernels = doc["kernels"]
    labels = [k if k == v["kind"] else f"{k} ({v['kind']})" for k, v in kernels.items()]
    flops = kernels.get("dedup", {}).get("gflops")
    peak = doc.get("matmul_peak_gflops")
    rate = lambda v: f"{v:.0f}" + (f" ({v / peak:.0%})" if peak else "")  # noqa: E731
    rows = []
    for n in map(str, doc["n"]):
        ceiling = doc.get("ceiling_by_n_gbps", {}).get(n, doc["ceiling_gbps"])
        r, u = doc["r"].get(n), doc["u"][n]
        faster = "same kernel" if n == "1" else "-" if r is None else "dedup" if u < r else "slot"
        rows.append([n, f"{ceiling:.1f}", *[_gbps(v["beta_gbps"][n], ceiling) for v in kernels.values()],
                     "-" if r is None else f"{r:.3f}", f"{u:.3f}", faster, *([rate(flops[n])] if flops else [])])
    return ["n", "ceiling", *labels, "r(n)", "u(n)", "faster", *(["dedup GFLOP/s"] if flops else [])], rows

def fits_table(doc: Any) -> Rows:
    """The fits per layer and kernel: equation, t_op, first-read bandwidth, re-read cost c_re/c_u, c_t, eps."""
    fmt = lambda v, spec: "-" if v is None else format(v, spec)  # noqa: E731
    rows = []
    for layer, per_kernel in doc["fits"].items():
        for kernel, f in per_kernel.items():
            if f is None:
                rows.append([layer, kernel, "no fit", *["-"] * 5])
                continue
            c_t = f.get("c_t_s_per_token")
            rows.append([layer, kernel, f["equation"], fmt(f["t_op_s"] * 1e3, ".3f"),
                         fmt(f.get("first_read_gbps", f.get("union_gbps")), ".1f"), fmt(f.get("re_read_cost"), ".3f"),
                         fmt(None if c_t is None else c_t * 1e3, ".3f"), fmt(f["eps"], ".3f")])
    return ["layer", "kernel", "eq.", "t_op ms", "1/c_u or 1/c_g GB/s", "c_re/c_u", "c_t ms/token", "eps"], rows


def rich_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[str]], caption: str | None = None) -> Table:
    """Rows of formatted cells as a rich table, numbers right-aligned; a cell too wide for its column folds onto
    the next line instead of being cut. Every text is taken literally (a "[k]" is no rich markup) with its control
    characters as escapes, so a name read from a file cannot colour or move the terminal."""
    plain = lambda text: None if text is None else Text(printable(str(text)))  # noqa: E731
    table = Table(title=plain(title), caption=plain(caption))
    for name in columns:
        table.add_column(plain(name), justify="right", overflow="fold")
    for row in rows:
        table.add_row(*map(plain, row))
    return table


def bench_tables(doc: Any) -> list[Table]:
    """Table 1 (table1) and the fits per layer (fits_table) of a bench as rich tables."""
    batch = doc.get("batch", 1)
    titles = (f"Table 1: effective bandwidth on requested bytes, GB/s (% of ceiling): {doc['model']} {doc['dtype']}, "
              f"MoE layers {', '.join(map(str, doc['layers']))}"
              + (f"; passes of B = {batch} sequences, n = B x a sequence's tokens" if batch > 1 else ""),
              "Fits on chosen ids, n >= 2: (4) t = t_op + c_u U b + c_re (nm - U) b;  (E.1) t = t_op + c_g U b + c_t n")
    return [rich_table(title, *rows, caption=caption)
            for title, caption, rows in zip(titles, (TABLE1_CAPTION, FITS_CAPTION), (table1(doc), fits_table(doc)))]

"""The HTML pieces of the report page (moespec.report.html): its style sheet, escaping, tables, name-value facts,
embedded figures and the one-line notes (what is not shown, what is wrong with the inputs).

The page's content is at most PAGE_PX CSS pixels wide (moespec.report.figures), and a figure is shown at one CSS
pixel per image pixel up to that width (figures.page_scale), so that its text keeps the size the figure
module chose for it."""

from __future__ import annotations

import base64
import html
import io
import re
from typing import Any, Iterable, Sequence

from moespec import printable
from moespec.defaults import POLICIES
from moespec.report.figures import FIG_DPI, MS, PAGE_PX

CSS = f"""
body {{ font-family: system-ui, sans-serif; max-width: {PAGE_PX}px; margin: 2em auto; padding: 0 1em; color: #222; }}
h1 {{ font-size: 1.6em; }} h2 {{ border-bottom: 1px solid #ccc; padding-bottom: .2em; margin-top: 2em; }}
table {{ border-collapse: collapse; margin: .8em 0; font-size: .88em; }}
th, td {{ border: 1px solid #ccc; padding: .25em .6em; text-align: right; }}
th {{ background: #f3f3f3; }} td.text, th.text {{ text-align: left; }}
caption {{ caption-side: bottom; font-size: .85em; color: #555; text-align: left; padding-top: .3em; }}
figure {{ margin: 1em 0; }} figure img {{ max-width: 100%; box-sizing: border-box; border: 1px solid #eee; }}
figcaption {{ font-size: .92em; color: #333; max-width: 60em; }}
p.missing {{ background: #fff6e0; border-left: 4px solid #e0a000; padding: .5em .8em; }}
p.warning {{ background: #fdecea; border-left: 6px solid #b01c1c; padding: .6em .9em; font-weight: 700; }}
p.note {{ color: #444; }}
code {{ font-family: ui-monospace, "DejaVu Sans Mono", monospace; font-size: .9em; background: #f5f5f5;
        padding: 0 .2em; }}
.holds {{ color: #17752a; font-weight: 600; }} .fails {{ color: #b01c1c; font-weight: 600; }}
"""


BACKQUOTED = re.compile(r"`([^`]*)`")  # a command in a warning's text


class Markup(str):
    """A table cell that is already HTML (everything else is escaped)."""


VERDICT = {True: Markup('<span class="holds">holds</span>'), False: Markup('<span class="fails">fails</span>'),
           None: Markup('<span>not applicable</span>')}


# control characters HTML forbids (C0 but tab, newline and carriage return; DEL; C1): shown as their escapes
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


def escape(value: Any) -> str:
    """`value` as HTML text: Markup as it is, anything else escaped, control characters as their escapes."""
    if isinstance(value, Markup):
        return value
    return html.escape(_CONTROL.sub(lambda c: printable(c.group()), str(value)))


def table(columns: Sequence[str] | None, rows: Iterable[Sequence[str]], caption: str | None = None,
          text_columns: int = 0) -> str:
    """A table of formatted cells (no header row when `columns` is None); the first `text_columns` columns are
    left-aligned text."""
    cls = lambda i: ' class="text"' if i < text_columns else ""  # noqa: E731
    head = "" if columns is None else \
        "<thead><tr>" + "".join(f"<th{cls(i)}>{escape(c)}</th>" for i, c in enumerate(columns)) + "</tr></thead>"
    body = "".join("<tr>" + "".join(f"<td{cls(i)}>{escape(c)}</td>" for i, c in enumerate(row)) + "</tr>"
                   for row in rows)
    cap = f"<caption>{escape(caption)}</caption>" if caption else ""
    return f"<table>{cap}{head}<tbody>{body}</tbody></table>"


def facts(items: Iterable[tuple[str, str]]) -> str:
    """Name-value lines as a two-column table."""
    return table(None, items, text_columns=2)


def figure(fig: Any, caption: str) -> str:
    """A matplotlib Figure as an embedded PNG (FIG_DPI, so its width in pixels is its width in inches x FIG_DPI)
    with its caption."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=FIG_DPI)
    data = base64.b64encode(buf.getvalue()).decode("ascii")
    return (f'<figure><img alt="{escape(caption)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{escape(caption)}</figcaption></figure>")


def missing(text: str) -> str:
    """One line saying what is not shown and why."""
    return f'<p class="missing">Not shown: {escape(text)}.</p>'


def warning(text: str) -> str:
    """One bold paragraph at the top of the page: something in the inputs is wrong, and what to do; `commands` in
    backquotes are set as code."""
    return '<p class="warning">' + BACKQUOTED.sub(r"<code>\1</code>", escape(text)) + "</p>"


def note(text: str) -> str:
    """One plain line of fact."""
    return f'<p class="note">{escape(text)}</p>'


def ms(seconds: float | None, spec: str = ".3f") -> str:
    """Seconds shown in milliseconds, '-' for none."""
    return "-" if seconds is None else format(seconds * MS, spec)


def pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def policies(present: Iterable[str]) -> list[str]:
    """The policies among `present`, in POLICIES' order."""
    present = set(present)
    return [p for p in POLICIES if p in present]

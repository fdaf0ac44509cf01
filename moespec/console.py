"""Terminal output the library and the commands share: a console that does not wrap tables in logs, and the
transient progress bar long measurements show on stderr."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


NARROW = 100  # columns of the commands that answer (plan, score): their verdict and tables fit a narrow log


def console(width: int | None = None) -> Console:
    """A rich console; when output is not a terminal (logs, CI), `width` columns wide, by default at least 120 so
    wide tables don't wrap (plan and score print at NARROW)."""
    if width is not None and (isinstance(width, bool) or not isinstance(width, int) or width < 40):
        raise ValueError(f"width must be an integer of at least 40 columns, got {width!r}")
    c = Console()
    return c if c.is_terminal else Console(width=width or max(c.width, 120))


def print_plain(con: Console, lines: Iterable[str]) -> None:
    """Plain text lines as they are: no markup, no highlighting (a verdict's brackets are intervals, not styles)."""
    for line in lines:
        con.print(line, markup=False, highlight=False)


@contextlib.contextmanager
def progress(description: str, total: int, enabled: bool = True) -> Iterator[Any]:
    """A rich progress bar on stderr (transient); yields advance(count). Disabled: a no-op."""
    if not enabled:
        yield lambda count: None
        return
    columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
               TimeElapsedColumn(), TimeRemainingColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(description, total=total)
        yield lambda count: bar.advance(task, count)

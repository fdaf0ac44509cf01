"""Terminal output the library and the commands share: a console that does not wrap tables in logs, and the
transient progress bar long measurements show on stderr."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


def console() -> Console:
    """A rich console at least 120 columns wide when output is not a terminal (logs, CI), so tables don't wrap."""
    c = Console()
    return c if c.is_terminal else Console(width=max(c.width, 120))


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

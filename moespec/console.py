"""Terminal output the library and the commands share: a console that does not wrap tables in logs, the transient
progress bar long measurements show on stderr, and the checked stdout a command prints to."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from moespec import MoespecError
from moespec.formats.files import os_reason


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


def discard_stdout() -> None:
    """Point stdout's descriptor at /dev/null, so what is still buffered for a reader that went away or a full
    device is dropped at exit instead of failing again there."""
    with contextlib.suppress(OSError, ValueError, AttributeError):  # a stream with no descriptor: nothing to drop
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


class _CheckedStdout:
    """A stream whose failed write or flush (a full disk, /dev/full, an I/O error) raises MoespecError naming stdout;
    a reader that went away stays a BrokenPipeError (the command stops quietly). Everything else is the stream's."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)

    def _checked(self, call: Callable[..., Any], *args: Any) -> Any:
        try:
            return call(*args)
        except OSError as e:
            discard_stdout()
            if isinstance(e, BrokenPipeError):
                raise
            raise MoespecError(f"stdout: cannot write the output ({os_reason(e)})") from None

    def write(self, text: str) -> int:
        return self._checked(self.stream.write, text)

    def flush(self) -> None:
        self._checked(self.stream.flush)


@contextlib.contextmanager
def checked_stdout() -> Iterator[None]:
    """stdout for a command's run: every write and the final flush checked (_CheckedStdout), and a character its
    encoding lacks (PYTHONIOENCODING=ascii, a C locale) written as an escape instead of failing."""
    stream = sys.stdout
    if getattr(stream, "errors", None) == "strict" and hasattr(stream, "reconfigure"):
        stream.reconfigure(errors="backslashreplace")
    sys.stdout = _CheckedStdout(stream)
    try:
        yield
    finally:
        try:
            sys.stdout.flush()  # the final flush too, after a refusal as well: what was printed before it
        finally:
            sys.stdout = stream

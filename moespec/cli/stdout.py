"""The stdout a command prints to: every write and the final flush checked, so a full disk or an I/O error ends the
command with one line and exit 2 rather than a truncated answer and exit 0 (moespec.cli.main)."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

from moespec import MoespecError
from moespec.formats.files import os_reason


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

"""What every test of bad input asserts (issue 14): the command ends with exit code 2 and one line on stderr, no
traceback, and the files it was given or asked to write are as they were. Shared by the bad-input test modules
(test modules do not import each other)."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import runpy
import sys
from types import ModuleType
from pathlib import Path

from moespec import cli


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file under `folder` with its size and modification time: compare before and after a command."""
    return {str(p): (p.lstat().st_size, p.lstat().st_mtime_ns) for p in sorted(folder.rglob("*"))}


def contents(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` with its bytes: compare before and after a command that must change nothing."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def one_line(err: str, *words: str) -> str:
    """`err` is one line, no traceback, holding every one of `words`; returns it stripped."""
    err = err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    for word in words:
        assert word in err, err
    return err


def run_cli(argv: list[str]) -> tuple[int, str]:
    """`moespec argv`'s exit code (argparse's too) and stderr, stdout dropped."""
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        try:
            code = cli.main([str(a) for a in argv])
        except SystemExit as e:
            code = e.code
    return code, err.getvalue()


def load_script(script: Path) -> ModuleType:
    """A benchmarks/ script imported as a module, its folder first on sys.path while it loads (it imports the scripts
    beside it, as Python puts its folder first when it runs)."""
    sys.path.insert(0, str(script.parent))
    try:
        spec = importlib.util.spec_from_file_location(script.stem, script)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(script.parent))
    return module


def run_script(script: Path, argv: list, capsys) -> tuple[int, str]:
    """`python script argv` (a benchmarks/ script) run in this process, its folder first on sys.path as Python puts
    it there: the exit code and stderr (stdout dropped). An exception other than SystemExit propagates: the test
    fails on what would have been a traceback."""
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = [str(script), *map(str, argv)]
    sys.path.insert(0, str(script.parent))
    try:
        runpy.run_path(str(script), run_name="__main__")
        code = 0
    except SystemExit as e:
        code = 0 if e.code is None else e.code
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
    return code, capsys.readouterr().err


def refused(argv: list[str], capsys, folder: Path | None = None) -> str:
    """Run `moespec argv`; assert exit code 2, one line on stderr without a traceback, nothing on stdout and, with
    `folder`, no file under it created or changed. Returns the line."""
    before = None if folder is None else snapshot(folder)
    try:
        code = cli.main([str(a) for a in argv])
    except SystemExit as e:  # argparse's own one-line errors
        code = e.code
    captured = capsys.readouterr()
    assert code == 2, (code, captured.err)
    err = one_line(captured.err)
    assert captured.out == ""
    if folder is not None:
        assert snapshot(folder) == before
    return err

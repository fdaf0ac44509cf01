"""Small I/O helpers every stage shares: atomic writes (temp file + rename, so a crash never leaves a
half-written result) and the provenance block every result file carries (device, dtype, versions, time,
the exact command)."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shlex
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator

from moespec import __version__


def atomic_write(path: str | os.PathLike, write: Callable[[Path], None]) -> Path:
    """Call `write(tmp)` on a temporary path in the target's folder, then rename it onto `path`.

    The rename is atomic on POSIX, so readers see either the old file or the whole new one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=path.suffix)
    os.close(fd)
    try:
        write(Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_json(path: str | os.PathLike, obj: Any) -> Path:
    """Atomically write `obj` as indented JSON."""
    return atomic_write(path, lambda p: p.write_text(json.dumps(obj, indent=1) + "\n"))


def parse_ints(text: str, flag: str, least: int, most: int | None = None, what: str = "values") -> list[int]:
    """'1-9' or '1,2,9' -> sorted distinct integers in least..most; one line naming the flag otherwise."""
    from moespec import MoespecError

    try:
        if "-" in text:
            lo, hi = (int(v) for v in text.split("-"))
            if lo > hi:
                raise MoespecError(f"{flag} {text}: empty range (start above end)")
            values = list(range(lo, hi + 1))
        else:
            values = sorted({int(v) for v in text.split(",")})
    except ValueError:
        raise MoespecError(f"{flag} {text!r}: give a range like 1-9 or a list like 1,2,9") from None
    if values[0] < least or (most is not None and values[-1] > most):
        raise MoespecError(f"{flag} {text}: {what} must be >= {least}" if most is None else
                           f"{flag} {text}: {what} must lie in {least}..{most}")
    return values


def read_json(path: str | os.PathLike, what: str) -> Any:
    """The JSON document in `path` (a `what` file); one line naming the file when it is missing or unreadable."""
    from moespec import MoespecError

    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise MoespecError(f"{path}: no such {what} file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise MoespecError(f"{path}: not readable JSON ({' '.join(str(e).split())[:120]})") from None


def provenance(device: str = "cpu", dtype: str | None = None) -> dict[str, Any]:
    """Who made a result and how: device, dtype, library versions, UTC timestamp and the exact command."""
    versions = {"moespec": __version__, "python": platform.python_version()}
    for name in ("numpy", "torch", "transformers", "triton"):
        module = sys.modules.get(name)
        if module is not None:
            versions[name] = getattr(module, "__version__", "?")
    if "torch" in sys.modules and sys.modules["torch"].version.cuda:
        versions["cuda"] = sys.modules["torch"].version.cuda
    return {
        "device": device,
        "host": f"{platform.machine()} {platform.processor() or platform.system()}, {os.cpu_count()} cores",
        "dtype": dtype,
        "versions": versions,
        "timestamp": datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
        "command": shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]]),
    }


def console():
    """A rich console at least 120 columns wide when output is not a terminal (logs, CI), so tables don't wrap."""
    from rich.console import Console

    c = Console()
    return c if c.is_terminal else Console(width=max(c.width, 120))


@contextlib.contextmanager
def progress(description: str, total: int, enabled: bool = True) -> Iterator[Any]:
    """A rich progress bar on stderr (transient); yields advance(count). Disabled: a no-op."""
    if not enabled:
        yield lambda count: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
               TimeElapsedColumn(), TimeRemainingColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(description, total=total)
        yield lambda count: bar.advance(task, count)


PLOT_FORMATS = ("png", "pdf", "svg")  # what matplotlib writes without extra backends


def plot_format(path: str) -> str:
    """The image format named by a --plot path's suffix; one clear error line for anything else."""
    from moespec import MoespecError

    fmt = path.rsplit(".", 1)[-1].lower() if "." in path else ""
    if fmt not in PLOT_FORMATS:
        raise MoespecError(f"--plot {path}: the file name must end in one of .{', .'.join(PLOT_FORMATS)}")
    return fmt


class Checkpoint:
    """Finished units of one long job (a bench, an engine run) in OUT.partial, rewritten atomically after every
    unit, so an interrupted job resumes without losing finished work. `config` is everything that changes what a
    unit measures: a checkpoint made with another config is refused rather than mixed in."""

    def __init__(self, out: str | os.PathLike, config: dict[str, Any], resume: bool, kind: str) -> None:
        from moespec import MoespecError

        self.path = Path(f"{out}.partial")
        self.config, self.format = config, f"moespec-{kind}-partial"
        self.units: dict[str, Any] = {}
        if resume and self.path.exists():
            try:
                saved = json.loads(self.path.read_text())
            except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
                raise MoespecError(f"{self.path}: unreadable checkpoint ({type(e).__name__}); rerun without "
                                   f"--resume") from None
            if not isinstance(saved, dict) or saved.get("format") != self.format \
                    or not isinstance(saved.get("config"), dict) or not isinstance(saved.get("units"), dict):
                raise MoespecError(f"{self.path}: not a moespec {kind} checkpoint; rerun without --resume")
            if saved["config"] != config:
                diff = sorted(k for k in config | saved["config"] if config.get(k) != saved["config"].get(k))
                raise MoespecError(f"{self.path}: made with other settings ({', '.join(diff)} differ); rerun "
                                   f"with those settings or without --resume")
            self.units = saved["units"]

    def save(self, key: str, unit: Any) -> None:
        self.units[key] = unit
        write_json(self.path, {"format": self.format, "config": self.config, "units": self.units})

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


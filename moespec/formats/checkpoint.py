"""OUT.partial/: the finished units of one long job (a trace, a bench, an engine run), so an interrupted job
resumes without losing finished work.

The folder holds `state.json` (the checkpoint's kind, its format version and `config`: everything that changes
what a unit measures) and one file per finished unit, written atomically when the unit finishes: `<key>.json` for
a JSON unit (bench and run), `<key>.npz` for arrays (the tracer's documents). Rerunning the job resumes a folder
made with the same config; one made with another config is refused rather than mixed in or silently dropped
(--fresh drops it). A damaged JSON unit (unreadable, or failing the job's check of its contents) is refused in one
line naming it, not dropped and measured again: units are written atomically, so a damaged one means something
else wrote into the folder, and a job's units depend on each other (the rounds kept at a pinned level and the
level's unit; all verify rounds are one unit), so re-measuring one alone could mix two states of the machine.
The tracer's arrays are routing, not times: a damaged one is traced again (load_arrays). The job removes the
folder once its result file is written. Each unit's random draws come from the seed and its key (unit_rng), so a
resumed job measures what a clean one would.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import numpy as np

from moespec import MoespecError
from moespec.formats.files import atomic_write, read_json, write_json

VERSION = 2  # 1: bench/run kept one JSON file OUT.partial, the tracer a folder of its own layout
_UNSAFE = re.compile(r"[^A-Za-z0-9_.,=-]+")  # a unit key -> a file name
FRESH = "--fresh"  # the flag (config field `fresh`) that drops an earlier run's units instead of resuming them
# a unit key's prefix -> the check of such a unit's contents, raising MoespecError naming `where` (the unit)
UnitChecks = Mapping[str, Callable[[Any, str], None]]


class Interrupted(KeyboardInterrupt):
    """A job with a checkpoint was interrupted (Ctrl-C); the message says where its finished units are kept and
    how to resume. A KeyboardInterrupt still, so whoever catches those catches it."""


def unit_rng(seed: int, key: str) -> np.random.Generator:
    """The random generator of one unit: drawn from the seed and the unit's key, never from the order units run
    in, so a resumed job draws for its remaining units what a clean run with that seed draws."""
    return np.random.default_rng([seed, *hashlib.sha256(key.encode()).digest()[:8]])


def require(ok: bool, where: str, problem: str) -> None:
    """A unit check's one step (UnitChecks): MoespecError naming the unit and the problem unless `ok`."""
    if not ok:
        raise MoespecError(f"{where}: {problem}")


def is_count(x: Any) -> bool:
    """A whole number >= 0 (not a bool), as units count rounds, steps and tokens."""
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


class Checkpoint:
    """The finished units of the job writing `out`, kept in `out`.partial/. `kind` names the job ("bench", "run",
    "trace"). A folder made with the same config is resumed; one made with another config is refused in one line
    naming the settings that differ, unless `fresh` drops it (FRESH). Use it as a context manager around the
    job's units: an interruption then ends with one line saying how to resume (Interrupted). `checks` (a job of
    JSON units) checks every resumed unit by its key's prefix; a unit of no listed prefix, or one failing its
    check, is refused in one line naming its file."""

    def __init__(self, out: str | os.PathLike, config: dict[str, Any], kind: str, fresh: bool = False,
                 checks: UnitChecks | None = None) -> None:
        out = Path(out)
        self.folder = out.with_name(out.name + ".partial")
        self.config, self.kind = config, kind
        state = {"format": f"moespec-{kind}-partial", "version": VERSION, "config": config}
        self.dropped = self.folder.exists() and fresh  # an earlier run's units, dropped by request
        if self.folder.exists() and not fresh:
            saved = self._read_state()
            if saved.get("config") != config:
                old = saved.get("config") if isinstance(saved.get("config"), dict) else {}
                diff = sorted(k for k in config | old if config.get(k) != old.get(k))
                raise MoespecError(f"{self.folder}: an unfinished run with other inputs, made with other "
                                   f"settings ({', '.join(diff)} differ); rerun with those to resume it, or add "
                                   f"{FRESH} to drop it")
        else:
            self.remove()
            write_json(self.folder / "state.json", state)
        self.units: dict[str, Any] = {}
        for path in sorted(self.folder.glob("*.json")):
            if path.name != "state.json" and not path.name.startswith("."):  # not a write under way
                key, unit = self._read_unit(path, checks)
                self.units[key] = unit

    def describe(self) -> str | None:
        """One line on what the job starts from, when it is not from nothing: units resumed or dropped."""
        finished = sum(1 for p in self.folder.iterdir() if p.suffix in (".json", ".npz") and p.name != "state.json"
                       and not p.name.startswith("."))  # not a write under way
        if finished:
            return f"resuming: {finished} finished unit(s) in {self.folder} ({FRESH} starts over)"
        if self.dropped:
            return f"starting over ({FRESH}): the units of an earlier run in {self.folder} were dropped"
        return None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 tb: TracebackType | None) -> None:
        if isinstance(error, KeyboardInterrupt) and not isinstance(error, Interrupted):
            raise Interrupted(f"finished units kept in {self.folder}; rerun the same command to resume") from None

    def _read_state(self) -> dict[str, Any]:
        try:
            saved = read_json(self.folder / "state.json", "checkpoint state")
        except MoespecError as e:
            raise MoespecError(f"{self.folder}: unreadable checkpoint ({e}); rerun with {FRESH}") from None
        if not isinstance(saved, dict) or saved.get("format") != f"moespec-{self.kind}-partial" \
                or saved.get("version") != VERSION:
            raise MoespecError(f"{self.folder}: not a moespec {self.kind} checkpoint of this version; rerun with "
                               f"{FRESH}")
        return saved

    def _read_unit(self, path: Path, checks: UnitChecks | None) -> tuple[str, Any]:
        """The key and contents of the JSON unit in `path`, checked (class docstring); one line naming the file and
        saying how to start over otherwise."""
        try:
            doc = read_json(path, "checkpoint unit")
            key = doc.get("key") if isinstance(doc, dict) and set(doc) == {"key", "unit"} else None
            if not isinstance(key, str) or self._file(key, ".json") != path:
                raise MoespecError(f"{path}: not a {{key, unit}} object of this folder")
            check = next((c for prefix, c in (checks or {}).items() if key.startswith(prefix)), None)
            if checks is not None and check is None:
                raise MoespecError(f"{path}: {key!r} is no unit a {self.kind} keeps")
            if check is not None:
                check(doc["unit"], f"{path} ({key})")
        except MoespecError as e:
            raise MoespecError(f"{e}: a damaged checkpoint unit; rerun with {FRESH} to start over") from None
        return key, doc["unit"]

    def _file(self, key: str, suffix: str) -> Path:
        return self.folder / f"{_UNSAFE.sub('_', key)}{suffix}"

    def save(self, key: str, unit: Any) -> None:
        """Keep a finished JSON unit."""
        self.units[key] = unit
        write_json(self._file(key, ".json"), {"key": key, "unit": unit})

    def save_arrays(self, key: str, **arrays: np.ndarray) -> None:
        """Keep a finished unit of arrays."""
        def write(tmp: Path) -> None:
            with tmp.open("wb") as f:
                np.savez(f, **arrays)
        atomic_write(self._file(key, ".npz"), write)

    def load_arrays(self, key: str) -> dict[str, np.ndarray] | None:
        """A finished unit of arrays, or None when it still has to be done (or its file is damaged)."""
        try:
            with np.load(self._file(key, ".npz")) as f:
                return {name: f[name] for name in f.files}
        except (OSError, KeyError, ValueError, EOFError, zipfile.BadZipFile):
            return None

    def remove(self) -> None:
        """Drop the folder (the job's result file is written, or the job starts over)."""
        if self.folder.is_dir() and not self.folder.is_symlink():
            shutil.rmtree(self.folder, ignore_errors=True)
        elif self.folder.is_file():  # a version-1 checkpoint file
            self.folder.unlink()

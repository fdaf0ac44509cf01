"""OUT.partial/: the finished units of one long job (a trace, a bench, an engine run), so an interrupted job
resumes without losing finished work.

The folder holds `state.json` (the checkpoint's kind, its format version and `config`: everything that changes
what a unit measures) and one file per finished unit, written atomically when the unit finishes: `<key>.json` for
a JSON unit (bench and run), `<key>.npz` for arrays (the tracer's documents). A checkpoint made with another
config is refused rather than mixed in; the job removes the folder once its result file is written.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from moespec import MoespecError
from moespec.formats.files import atomic_write, write_json

VERSION = 2  # 1: bench/run kept one JSON file OUT.partial, the tracer a folder of its own layout
_UNSAFE = re.compile(r"[^A-Za-z0-9_.,=-]+")  # a unit key -> a file name


class Checkpoint:
    """The finished units of the job writing `out`, kept in `out`.partial/. `kind` names the job ("bench", "run",
    "trace"); `resume=False` starts over (an earlier folder is removed), `resume=True` keeps the units of a folder
    made with the same config and refuses one made with another (`start_over` says how to drop it)."""

    def __init__(self, out: str | os.PathLike, config: dict[str, Any], resume: bool, kind: str,
                 start_over: str = "rerun without --resume") -> None:
        out = Path(out)
        self.folder = out.with_name(out.name + ".partial")
        self.config, self.kind = config, kind
        state = {"format": f"moespec-{kind}-partial", "version": VERSION, "config": config}
        self.stale = self.folder.exists() and not resume  # an earlier run's units, about to be dropped
        if self.folder.exists() and resume:
            saved = self._read_state()
            if saved.get("config") != config:
                old = saved.get("config") if isinstance(saved.get("config"), dict) else {}
                diff = sorted(k for k in config | old if config.get(k) != old.get(k))
                raise MoespecError(f"{self.folder}: an unfinished run with other inputs, made with other "
                                   f"settings ({', '.join(diff)} differ); rerun with those, or {start_over}")
        else:
            self.remove()
            write_json(self.folder / "state.json", state)
        self.units: dict[str, Any] = {}
        for path in sorted(self.folder.glob("*.json")):
            if path.name != "state.json":
                unit = json.loads(path.read_text())
                self.units[unit["key"]] = unit["unit"]

    def _read_state(self) -> dict[str, Any]:
        try:
            saved = json.loads((self.folder / "state.json").read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise MoespecError(f"{self.folder}: unreadable checkpoint ({type(e).__name__}); rerun without "
                               f"--resume") from None
        if not isinstance(saved, dict) or saved.get("format") != f"moespec-{self.kind}-partial" \
                or saved.get("version") != VERSION:
            raise MoespecError(f"{self.folder}: not a moespec {self.kind} checkpoint of this version; rerun "
                               f"without --resume")
        return saved

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
        except (OSError, KeyError, ValueError):
            return None

    def remove(self) -> None:
        if self.folder.is_dir() and not self.folder.is_symlink():
            shutil.rmtree(self.folder, ignore_errors=True)
        elif self.folder.is_file():  # a version-1 checkpoint file
            self.folder.unlink()

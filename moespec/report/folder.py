"""A job's folder of artifacts as the report reads it: each file of ARTIFACTS loaded by its format's only loader,
or one line why it cannot be used."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from moespec import MoespecError
from moespec.formats.benchfile import load_bench
from moespec.formats.demofile import DRAFTING_FILE, load_demo, load_drafting
from moespec.formats.planfile import load_plan
from moespec.formats.runsfile import load_runs
from moespec.formats.trace import load_trace

DEFAULT_NAME = "report.html"


# The engine's two runs files: the run scored against the plan, and the verify-only run that calibrated it.
RUNS, RUNS_VERIFY = "runs.json", "runs-verify.json"


# file in DIR -> (the command that writes it, its validating loader)
ARTIFACTS: dict[str, tuple[str, Callable[[Path], Any]]] = {
    "trace.npz": ("moespec synth or moespec trace", load_trace),
    "bench.json": ("moespec bench", load_bench),
    "plan.json": ("moespec plan", load_plan),
    RUNS: ("moespec run --plan", load_runs),
    RUNS_VERIFY: ("moespec run --no-throughput", load_runs),
    "demo.json": ("moespec demo", load_demo),
    DRAFTING_FILE: ("moespec demo (its drafting step on the trained pair)", load_drafting),
}


# ---- the artifacts -------------------------------------------------------------------------------------------
@dataclass
class Folder:
    """What DIR holds: each artifact read and validated (trace.npz: a Trace), or one line why it is not used."""
    path: Path
    docs: dict[str, Any]
    problems: dict[str, str]

    def missing(self, *names: str) -> str | None:
        """One line naming each of `names` the report cannot use and why; None when all are there."""
        lines = [self.problems[name] for name in names if name not in self.docs]
        return "; ".join(lines) if lines else None


def load_folder(path: str | Path) -> Folder:
    """Read every artifact of ARTIFACTS present in `path`; a missing or unreadable one is recorded as a problem.
    Raises MoespecError when `path` is not a folder or holds no readable artifact."""
    folder = Path(path)
    if not folder.is_dir():
        raise MoespecError(f"{path}: no such folder")
    docs: dict[str, Any] = {}
    problems: dict[str, str] = {}
    errors: list[str] = []  # the loaders' one-line errors (each names its file)
    for name, (writer, load) in ARTIFACTS.items():
        if not (folder / name).is_file():
            problems[name] = f"{name} is missing from {folder} (written by {writer})"
            continue
        try:
            docs[name] = load(folder / name)
        except MoespecError as e:
            errors.append(str(e))
            problems[name] = f"{name} is present but unreadable: {e}"
    if not docs:
        raise MoespecError(errors[0] if errors else
                           f"{path}: no moespec artifact here (none of {', '.join(ARTIFACTS)})")
    return Folder(folder, docs, problems)
